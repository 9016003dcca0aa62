#!/usr/bin/env python3
"""Does a new template flag leave the old kernels alone? `python3 bench/ptx_twins.py OLD.ptx NEW.ptx` pairs
every kernel of NEW with its twin in OLD and compares their PTX, no GPU needed.

A kernel of NEW whose demangled name ends in a `false` template argument that its OLD twin lacks (step 13b
added `bool WINDOW` after `bool SOFTCAP`) is paired with OLD's kernel of the name without it; a kernel of
NEW with the flag `true` has no twin and is skipped; every other kernel is paired by name. Two bodies are
the same when they are equal once each kernel's own name and its basic-block label numbers ($L__BB<n>_,
numbered by the kernel's place in the file) are set aside. Identical PTX gives identical SASS (ptxas is
deterministic for the same input and flags), so a flag whose false side is identical costs nothing.

Build the two PTX files from one translation unit, old and new source, with the same flags and the same
struct layouts (copy the new common/forward/problem.h into the old tree when a struct only grew), and
without -lineinfo, whose line numbers differ: e.g.
    nvcc -I<tree> -I<tree>/common -O3 -DNDEBUG -arch=compute_90a --expt-relaxed-constexpr -std=c++20 \\
         -x cu -ptx <tree>/steps/13_features/step.cu -o new.ptx
Exit status: 0 every pair identical, 1 a pair differs or a kernel of NEW has no twin, 2 bad arguments.
"""
from __future__ import annotations

import re
import subprocess
import sys

from fs_results import parser

ENTRY = re.compile(r"\.visible \.entry (\w+)\(.*?\n\}\n", re.S)
LABEL = re.compile(r"\$L__BB\d+_")


def kernels(ptx: str) -> dict[str, str]:
    """{mangled name: body with its own name and its label numbers set aside}."""
    return {m[1]: LABEL.sub("$L__BB_", m[0].replace(m[1], "KERNEL")) for m in ENTRY.finditer(ptx)}


def demangled(names: list[str]) -> dict[str, str]:
    """{mangled: demangled}, by one c++filt call."""
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def twin(name: str, old_names: set[str]) -> str | None:
    """The demangled name of NEW kernel `name`'s twin in OLD, or None (its trailing flag is true)."""
    if name in old_names:
        return name
    dropped = re.sub(r", (true|false)>\(", lambda m: ">(" if m[1] == "false" else m[0], name, count=1)
    return dropped if dropped != name and dropped in old_names else None


def compare(old_ptx: str, new_ptx: str) -> tuple[list[str], list[str], list[str]]:
    """(identical, different, without a twin): demangled names of NEW's kernels."""
    old, new = kernels(old_ptx), kernels(new_ptx)
    old_by = {d: m for m, d in demangled(list(old)).items()}
    same, differ, alone = [], [], []
    for mangled, name in demangled(list(new)).items():
        if re.search(r", true>\(", name) and name not in old_by:
            continue  # the flag's new side: nothing to compare with
        found = twin(name, set(old_by))
        if found is None:
            alone.append(name)
        else:
            (same if old[old_by[found]] == new[mangled] else differ).append(name)
    return same, differ, alone


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("old", help="PTX of the old source")
    ap.add_argument("new", help="PTX of the new source, the same translation unit and flags")
    args = ap.parse_args(argv)
    try:
        old_ptx, new_ptx = (open(p, encoding="utf-8").read() for p in (args.old, args.new))
    except OSError as e:
        print(f"ptx_twins.py: {e}", file=sys.stderr)
        return 2
    same, differ, alone = compare(old_ptx, new_ptx)
    for name in differ:
        print(f"different: {name}")
    for name in alone:
        print(f"no twin:   {name}")
    print(f"{len(same)} kernels identical to their twins, {len(differ)} different, {len(alone)} without a twin")
    return 0 if same and not differ and not alone else 1


if __name__ == "__main__":
    sys.exit(main())
