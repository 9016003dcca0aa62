#!/usr/bin/env python3
"""Does a new template flag leave the old kernels alone? `python3 bench/ptx_twins.py OLD.ptx NEW.ptx` pairs
every kernel of NEW with its twin in OLD and compares their PTX, no GPU needed.

A kernel of NEW whose demangled name ends in a `false` template argument that its OLD twin lacks (step 13b
added `bool WINDOW` after `bool SOFTCAP`, 13c `bool VARLEN` after `bool WINDOW`: one flag per step, so one
trailing argument is dropped) is paired with OLD's kernel of the name without it; a kernel of NEW with the
flag `true` has no twin and is skipped; every other kernel is paired by name. A NEW kernel may also take
trailing parameters its twin lacks (13c: step 13's forward_kernel gained `T* o`, read only when VARLEN):
its twin is then the OLD kernel whose parameter list is a prefix of its own, and when the body never reads
those parameters their declarations are set aside before the comparison (the output says how many).
Two bodies are the same when they are equal once each kernel's own name and its basic-block label numbers
($L__BB<n>_, numbered by the kernel's place in the file) are set aside. Identical PTX gives identical SASS
(ptxas is deterministic for the same input and flags), so a flag whose false side is identical costs nothing.

Build the two PTX files from one translation unit, old and new source, with the same flags and the same
struct layouts (copy the new common/forward/problem.h into the old tree when a struct only grew), and
without -lineinfo, whose line numbers differ: e.g.
    nvcc -I<tree> -I<tree>/common -O3 -DNDEBUG -arch=compute_90a --expt-relaxed-constexpr -std=c++20 \\
         -x cu -ptx <tree>/steps/13_features/step.cu -o new.ptx
Exit status: 0 every pair identical, 1 a pair differs or a kernel of NEW has no twin, 2 bad arguments.

`python3 bench/ptx_twins.py --parents NVCC` asks the same of step 13 against the kernels it copies: every
instantiation step 13 launches with SOFTCAP, WINDOW and VARLEN false, compiled in one translation unit beside
its twin (09f's warp_specialized_kernel, 12c's hopper_backward_kernel), the namespace of the shared array's
symbol set aside as well. Exit status 0 when every forward is its twin's PTX; the backward's are reported
(their masked exp2 loop stands in two copies, note 13, Appendix E).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from fs_results import REPO, parser

ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)
# The next top-level function: a kernel's text ends at the last "}" line before it. Not at the first "}"
# line: inline asm blocks ("{ .reg .pred p; … }") close with a "}" in column 0 too.
NEXT = re.compile(r"^(?:\.(?:visible|weak|extern)\s+)?\.(?:entry|func)\b", re.M)
LABEL = re.compile(r"\$L__BB\d+_")


def kernels(ptx: str) -> dict[str, str]:
    """{mangled name: body with its own name and its label numbers set aside}."""
    found = {}
    for m in ENTRY.finditer(ptx):
        after = NEXT.search(ptx, m.end())
        text = ptx[m.start():after.start() if after else len(ptx)]
        text = text[:text.rindex("\n}\n") + 3]
        found[m[1]] = LABEL.sub("$L__BB_", text.replace(m[1], "KERNEL"))
    return found


def demangled(names: list[str]) -> dict[str, str]:
    """{mangled: demangled}, by one c++filt call."""
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def extends(new: str, old: str) -> bool:
    """Whether demangled `new` is `old` with trailing function parameters: "f<…>(A, B, C*)" of "f<…>(A, B)"."""
    if not old.endswith(")") or len(new) <= len(old):
        return False
    return new.startswith(old[:-1] if old.endswith("()") else old[:-1] + ", ") and new.endswith(")")


def twin(name: str, old_names: set[str]) -> str | None:
    """The demangled name of NEW kernel `name`'s twin in OLD, or None (its trailing flag is true)."""
    if name in old_names:
        return name
    dropped = re.sub(r", (true|false)>\(", lambda m: ">(" if m[1] == "false" else m[0], name, count=1)
    if dropped != name and dropped in old_names:
        return dropped
    for candidate in dict.fromkeys((dropped, name)):  # with trailing parameters its twin lacks
        found = [old for old in old_names if extends(candidate, old)]
        if found:
            return max(found, key=len)
    return None


def params(body: str) -> list[str]:
    """The parameter declaration lines of a kernel's header, as kernels() leaves it (KERNEL_param_<i>)."""
    return re.findall(r"^\t\.param [^\n]*KERNEL_param_\d+(?:\[\d+\])?,?$", body[:body.index(")")], re.M)


def set_aside(old_body: str, new_body: str) -> tuple[str, int]:
    """NEW's body without the declarations of the trailing parameters its OLD twin lacks, and their count,
    when the body never reads them; else NEW's body unchanged and 0."""
    old_params, new_params = params(old_body), params(new_body)
    extra = new_params[len(old_params):]
    if not extra or [p.rstrip(",") for p in new_params[:len(old_params)]] != [p.rstrip(",") for p in old_params]:
        return new_body, 0
    for line in extra:
        name = re.search(r"KERNEL_param_\d+", line)[0]
        if len(re.findall(re.escape(name) + r"(?!\d)", new_body)) != 1:  # read somewhere past its declaration
            return new_body, 0
    if not old_params:  # "KERNEL()", as ptx writes a kernel without parameters
        start = new_body.index("(")
        return new_body[:start + 1] + new_body[new_body.index("\n)", start) + 1:], len(extra)
    kept = new_params[len(old_params) - 1]
    head, _, rest = new_body.partition(kept)
    return head + kept.rstrip(",") + rest[rest.index("\n)"):], len(extra)


def compare(old_ptx: str, new_ptx: str, aside: dict[str, int] | None = None) -> tuple[list[str], list[str], list[str]]:
    """(identical, different, without a twin): demangled names of NEW's kernels. `aside`, if given, gets
    {NEW kernel: count} for each pair compared with unused trailing parameters of NEW set aside."""
    old, new = kernels(old_ptx), kernels(new_ptx)
    old_by = {d: m for m, d in demangled(list(old)).items()}
    same, differ, alone = [], [], []
    for mangled, name in demangled(list(new)).items():
        if re.search(r", true>\(", name) and name not in old_by:
            continue  # the flag's new side: nothing to compare with
        found = twin(name, set(old_by))
        if found is None:
            alone.append(name)
            continue
        body, n = set_aside(old[old_by[found]], new[mangled])
        if n and aside is not None:
            aside[name] = n
        (same if old[old_by[found]] == body else differ).append(name)
    return same, differ, alone


# --parents: step 13's tile rows (step 09's table at 09f, step 12's) and the twins of its kernels.
FORWARD_ROWS = ("kD64", "kD128", "kD128_N176", "kD192_N112", "kD256_N80", "kD64_Q192")
BACKWARD_ROWS = ((64, 128), (128, 64))
SHARED_ARRAY = re.compile(r"_ZN2fs6step\w+smem_rawE")


def parents_unit() -> str:
    """A translation unit holding every features-off kernel of step 13 and its twin."""
    lines = ['#include "steps/13_features/kernel.cuh"', "namespace fs {", "using namespace step09;"]
    for i, t in enumerate(("__half", "__nv_bfloat16")):
        for row in FORWARD_ROWS:
            tr = f"TraitsOf<{row}, kPersistent>"
            lines.append(f"void* f{i}{row}[] = {{(void*)&warp_specialized_kernel<{t}, {tr}>, "
                         f"(void*)&step13::forward_pass::forward_kernel<{t}, {tr}, false, false, false>}};")
        for d, q in BACKWARD_ROWS:
            for dq in ("true", "false"):
                lines.append(f"void* b{i}{d}{dq}[] = {{(void*)&step12::hopper_backward_kernel<{t}, {d}, {q}, "
                             f"step12::kBulkDq, {dq}>, (void*)&step13::backward_pass::backward_kernel<{t}, {d}, {q}, "
                             f"{dq}, false, false, false>}};")
    return "\n".join(lines + ["}"]) + "\n"


def parent_of(name: str) -> str:
    """The demangled name (no parameters) of the 09f or 12c kernel that step 13's kernel `name` copies."""
    head = name.split("(")[0]
    head = head.replace("step13::forward_pass::forward_kernel", "step09::warp_specialized_kernel")
    head = head.replace(", false, false, false>", " >") if "forward_kernel" in name else head
    return re.sub(r"step13::backward_pass::backward_kernel<(.*), (true|false), false, false, false>$",
                  r"step12::hopper_backward_kernel<\1, 3, \2>", head)


def compile_ptx(nvcc: str, source: Path, first_include: str | None = None) -> str:
    """PTX of `source` (sm_90a, the build's optimization, no -lineinfo), with the repository's include paths
    after `first_include` when given (a folder whose files stand in for the repository's). Raises
    subprocess.CalledProcessError when nvcc fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.ptx"
        includes = ([f"-I{first_include}"] if first_include else []) + [f"-I{REPO}", f"-I{REPO / 'common'}"]
        subprocess.run([nvcc, *includes, "-O3", "-DNDEBUG", "-arch=compute_90a", "--expt-relaxed-constexpr",
                        "-std=c++20", "-x", "cu", "-ptx", str(source), "-o", str(out)],
                       check=True, capture_output=True, text=True)
        return out.read_text()


def parents(nvcc: str) -> int:
    """--parents: prints each pair's verdict; 0 when every forward is identical to its twin."""
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "parents.cu"
        unit.write_text(parents_unit())
        try:
            ptx = compile_ptx(nvcc, unit)
        except subprocess.CalledProcessError as e:
            print(f"ptx_twins.py: {nvcc} failed on the translation unit:\n{e.stderr[-2000:]}", file=sys.stderr)
            return 2
    found = {m: SHARED_ARRAY.sub("smem_raw", body) for m, body in kernels(ptx).items()}
    names = demangled(list(found))
    by_head = {d.split("(")[0]: m for m, d in names.items()}
    same = {"forward": 0, "backward": 0}
    for mangled, name in names.items():
        if "step13" not in name:
            continue
        twin_name = parent_of(name)
        twin_body = found[by_head[twin_name]]
        body, n = set_aside(twin_body, found[mangled])
        pass_ = "forward" if "forward_kernel" in name else "backward"
        if body == twin_body:
            same[pass_] += 1
            print(f"identical: {name.split('(')[0]} = {twin_name} ({n} unused trailing parameters set aside)")
        else:
            print(f"different: {name.split('(')[0]} against {twin_name}: {len(twin_body.splitlines())} and "
                  f"{len(body.splitlines())} PTX lines, ex2.approx {twin_body.count('ex2.approx')} and "
                  f"{body.count('ex2.approx')}, wgmma.mma_async {twin_body.count('wgmma.mma_async')} and "
                  f"{body.count('wgmma.mma_async')}")
    forwards, backwards = 2 * len(FORWARD_ROWS), 4 * len(BACKWARD_ROWS)
    print(f"forward: {same['forward']} of {forwards} identical to 09f's; backward: {same['backward']} of {backwards} "
          "identical to 12c's")
    return 0 if same["forward"] == forwards else 1


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("old", nargs="?", help="PTX of the old source")
    ap.add_argument("new", nargs="?", help="PTX of the new source, the same translation unit and flags")
    ap.add_argument("--parents", metavar="NVCC", help="compare step 13's features-off kernels with 09f's and 12c's")
    args = ap.parse_args(argv)
    if args.parents:
        return parents(args.parents)
    if not (args.old and args.new):
        ap.print_usage(sys.stderr)
        print("ptx_twins.py: give OLD and NEW, or --parents NVCC", file=sys.stderr)
        return 2
    try:
        old_ptx, new_ptx = (Path(p).read_text(encoding="utf-8") for p in (args.old, args.new))
    except OSError as e:
        print(f"ptx_twins.py: {e}", file=sys.stderr)
        return 2
    aside: dict[str, int] = {}
    same, differ, alone = compare(old_ptx, new_ptx, aside)
    note = {name: f" ({n} unused trailing parameter{'s' * (n > 1)} set aside)" for name, n in aside.items()}
    for name in same:
        if name in aside:
            print(f"identical: {name}{note[name]}")
    for name in differ:
        print(f"different: {name}{note.get(name, '')}")
    for name in alone:
        print(f"no twin:   {name}")
    print(f"{len(same)} kernels identical to their twins, {len(differ)} different, {len(alone)} without a twin"
          + (f" ({len(aside)} compared with unused trailing parameters set aside)" if aside else ""))
    return 0 if same and not differ and not alone else 1


if __name__ == "__main__":
    sys.exit(main())
