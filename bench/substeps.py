#!/usr/bin/env python3
"""One readable kernel per sub-step: `python3 bench/substeps.py [--write | --check]`.

Steps 07, 09, 12 and 13 build their lettered sub-steps (07a ... 07g, 09a ... 09f, 12a ... 12c, 13a ... 13c) from one
kernel.cuh, where `if constexpr (Tr::has(kIdea))` (step 13: its template flags) marks each idea's code, so `diff` of two sub-steps is impossible on the
files themselves. This script writes notes/substeps/<id>.cuh for every sub-step: the kernel with the
branches of the ideas it does not have pruned and those of the ideas it has kept, and the helpers a later
idea brings folded to what they are without it (07e's vote goes, 07f's exp2_ is exp2f), so that

    diff notes/substeps/07b_work_order.cuh notes/substeps/07c_ldmatrix_pipeline.cuh

shows 07c's one idea. A comment that says what changes with a sub-step is tagged `// From 07c: …` or
`// Before 07c: …`; a view keeps it only where it is true, so no view speaks of a later sub-step. The views
are generated, never edited; `--check` (a ctest entry) fails when one is stale. An idea is on in sub-step
IDEAS when IDEAS >= its value in traits.h's `enum Idea`.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ptx_twins
from fs_results import REPO, parser

OUT = REPO / "notes" / "substeps"


def fold(idea: str, without: str):
    """A fold's value: the matched text itself where `idea` is on, `without` where it is off."""
    return lambda on: r"\g<0>" if on[idea] else without


# Step 13's views drop the template parameters of the flags they do not have, and the static_assert that names
# one; step.cu passes every flag, so `--ptx` compiles step 13's views with these folds left out (views()).
VARLEN_PARAM, VARLEN_ASSERT, WINDOW_PARAM = r", bool VARLEN = false>", r"\n[^\n]*static_assert\(!VARLEN[^\n]*", r", bool WINDOW>"
O_PARAM = r", T\* __restrict__ o\) \{"  # the forward's output pointer, which only 13c's packed batch writes through
SIGNATURE_FOLDS = {VARLEN_PARAM, VARLEN_ASSERT, WINDOW_PARAM, O_PARAM}
# The steps whose sub-steps share one kernel, and folds of their own beyond Tr::has(): 09c's idea is
# softmax_under_pv(Tr::IDEAS, ...) (traits.h), which is false before kIntraOverlap.
# Before 07g a sub-step has only two K/V buffers (traits.h's has_config: kD64 and kD128_K32), so its
# view drops the one-buffer pipeline, which 07g's table brings.
STEPS = {
    "07_flash_attention2": {
        r"Tr::KV_STAGES == 2": fold("kHeadDimTable", "true"),
        r"Tr::KV_STAGES == 1": fold("kHeadDimTable", "false"),
        # From 07b step 06's per-row mask in the softmax loop is gone, and the row and last key it compared with.
        r"\n *const int row = q0 \+ [^\n]*\n *const int last_key = [^\n]*":
            lambda on: "" if on["kWorkOrder"] else r"\g<0>",
        # Before 07f exp2_ is exp2f.
        r"\n// 2\^x\. (?:[^\n]*\n)*?\}\n(?=\n)": fold("kFastExp2", ""),
        r"exp2_<Tr>\(": fold("kFastExp2", "exp2f("),
    },
    "09_warp_specialized": {
        r"softmax_under_pv\(Tr::IDEAS, HAS_S, HAS_PV\)": lambda on: "HAS_S && HAS_PV" if on["kIntraOverlap"] else "false",
        r"q_load_position\(Tr::IDEAS, x\.kv_tiles, n\)": fold("kPersistent", "0"),
    },
    "12_hopper_backward": {},
    # Step 13's features are template flags (SOFTCAP, WINDOW, VARLEN) that the host picks per problem, not
    # Tr::has(): 13a's view is the kernel with WINDOW false, its declarations, its header and the band
    # dropped; 13a's and 13b's have VARLEN false and its declarations and header dropped (its comments are
    # tagged `// From 13c:`).
    "13_features": {
        r'\n#include "common/step/varlen\.h"': fold("kVarlen", ""),
        r'\n#include "common/step/window\.h"': fold("kWindow", ""),
        r"\n *Band band;[^\n]*|\n *x\.band = band;": fold("kWindow", ""),
        VARLEN_PARAM: fold("kVarlen", ">"),
        VARLEN_ASSERT: fold("kVarlen", ""),
        O_PARAM: fold("kVarlen", ") {"),
        r"if constexpr \(VARLEN\)": fold("kVarlen", "if constexpr (false)"),
        r"\bVARLEN \? ": fold("kVarlen", "false ? "),
        WINDOW_PARAM: fold("kWindow", ">"),
        r"\n[^\n]*\b(?:band_of|diagonals_of)\([^\n]*": fold("kWindow", ""),
        r"if constexpr \(WINDOW\)": fold("kWindow", "if constexpr (false)"),
        # What 13c's packed batch adds to the work item and the coordinates, zero without it: the sequence's
        # first rows (q_start, k_start; k_row0 in the backward's epilogue) and the tensor maps' batch
        # coordinate `tb` (b); the backward's block coordinates, assigned in two branches, are constants again.
        r"\n *int q_start, k_start, tb;|\n *x\.q_start = 0, x\.k_start = 0;|\n *int q_start = 0, k_start = 0;[^\n]*|"
        r"\n *const int tb = [^\n]*|\n *const int64_t k_row0 = [^\n]*": fold("kVarlen", ""),
        r", x\.tb = x\.b;": fold("kVarlen", ";"),
        r"x\.q_start \+ |x\.k_start \+ |(?<![\w.])q_start \+ |(?<![\w.])k_start \+ ": fold("kVarlen", ""),
        r"\bx\.tb\b": fold("kVarlen", "x.b"),
        r"(?<=[(, ])tb(?=[,)])": fold("kVarlen", "b"),
        r"\bk_row0\b": fold("kVarlen", "0"),
        r"\n *const int64_t lse_at = [^\n]*": fold("kVarlen", ""),
        r"lse\[lse_at \+ ": fold("kVarlen", "lse[int64_t(x.bh) * seqlen_q + "),
        r"\n *bool by_box = c \* ROWS_PER_WARPGROUP < x\.q_rows;": fold("kVarlen", ""),
        r"if \(t == 0 && by_box\)": fold("kVarlen", "if (t == 0 && c * ROWS_PER_WARPGROUP < x.q_rows)"),
        r"int seqlen_q = int\(f\.seqlen_q\), seqlen_k = int\(f\.seqlen_k\), kv0, b, h_kv;\n *const int head_dim":
            fold("kVarlen", "const int seqlen_q = int(f.seqlen_q), seqlen_k = int(f.seqlen_k), head_dim"),
        r"(?<=\n)( *)(kv0 = int\(blockIdx|b = int\(bh_kv)": fold("kVarlen", r"\1const int \2"),
        r"(?<=\n)( *)(Band band = band_of\(f\);)": fold("kVarlen", r"\1const \2"),  # 13c reassigns it per sequence
        # What 13b's band adds, without it: the first K/V tile of a work item (0) and the masked visits at its
        # bottom (none); the backward's query-tile run and mask flag, reassigned only for a band, are constants.
        r"kv_first, |, masked_bottom(?=;)|\n *x\.kv_first = 0, x\.masked_bottom = 0;|x\.kv_first \+ |"
        r"\n *const int unmasked_end = [^\n]*": fold("kWindow", ""),
        r"k < unmasked_end;": fold("kWindow", "k < x.kv_tiles;"),
        r"(?<=\n)( *)(int first_tile|int tiles_per_head|bool masked) = ": fold("kWindow", r"\1const \2 = "),
    },
}


# `--ptx` compiles each view with its step's own step.cu in place of kernel.cuh and compares the PTX of its
# sub-step's kernels (those whose demangled names carry its IDEAS here, and those that carry none) with the
# PTX of the kernel itself: a view is the code its sub-step runs, not a paraphrase.
IDEAS_IN_NAME = {
    "07_flash_attention2": r"Traits<[^<>]*, (\d+)> >",
    "09_warp_specialized": r"Traits<[^<>]*, (\d+)> >",
    "12_hopper_backward": r"hopper_backward_kernel<[^,]+, \d+, \d+, (\d+), ",
}
# Step 13's kernels carry its flags instead, WINDOW and VARLEN last (SOFTCAP, before them, is 13a's, which
# every view has): a view is compared on the kernels whose flags are all among its sub-step's ideas.
FLAGS_IN_NAME = {"13_features": (r"step13::[^(]*, (true|false), (true|false)>\(", ("kWindow", "kVarlen"))}


def compared_on(step: str, demangled: str, ideas: int, value: dict[str, int]) -> bool:
    """Whether the view of sub-step IDEAS of `step` is compared on the kernel of this demangled name: one of its
    sub-step's (IDEAS_IN_NAME: that IDEAS; FLAGS_IN_NAME: only flags of ideas it has, `value` giving each idea's
    number), or one that carries neither."""
    if step in IDEAS_IN_NAME:
        return (n := re.search(IDEAS_IN_NAME[step], demangled)) is None or int(n[1]) == ideas
    pattern, flags = FLAGS_IN_NAME[step]
    n = re.search(pattern, demangled)
    return n is None or all(on == "false" or value[flag] <= ideas for on, flag in zip(n.groups(), flags))


def step_ptx(step: str, nvcc: str, kernel: str | None = None) -> dict[str, str]:
    """ptx_twins.kernels() of steps/<step>/step.cu compiled to PTX (sm_90a), with `kernel` (a view's text) found
    in place of its kernel.cuh when given."""
    with tempfile.TemporaryDirectory() as tree:
        if kernel is not None:
            (Path(tree) / "steps" / step).mkdir(parents=True)
            (Path(tree) / "steps" / step / "kernel.cuh").write_text(kernel)
        return ptx_twins.kernels(ptx_twins.compile_ptx(nvcc, REPO / "steps" / step / "step.cu", tree))


def compare_ptx(nvcc: str, all_views: dict[str, str]) -> list[tuple[str, int, list[str]]]:
    """(sub-step, kernels compared, the demangled names of those whose PTX differs from the step's own) for every
    view of IDEAS_IN_NAME's and FLAGS_IN_NAME's steps."""
    # Every compile at once, as many as the machine has cores (each nvcc runs one front end).
    steps = [*IDEAS_IN_NAME, *FLAGS_IN_NAME]
    subs = {step: ideas_of(REPO / "steps" / step) for step in steps}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        own = {step: pool.submit(step_ptx, step, nvcc) for step in steps}
        compiled = {sid: pool.submit(step_ptx, step, nvcc, all_views[sid]) for step in steps for _, _, sid in subs[step]}
        out = []
        for step in steps:
            kernels = own[step].result()
            names = ptx_twins.demangled(list(kernels))
            value = {name: v for name, v, _ in subs[step]}
            for _, ideas, sid in subs[step]:
                view = compiled[sid].result()
                compared = [m for m, d in names.items() if compared_on(step, d, ideas, value)]
                out.append((sid, len(compared), [names[m] for m in compared if view.get(m) != kernels[m]]))
    return out


def ideas_of(step: Path) -> list[tuple[str, int, str]]:
    """(enum name, value, sub-step id) of traits.h's `enum Idea`, the ids as step.cu registers them."""
    traits, registered = (step / "traits.h").read_text(), (step / "step.cu").read_text()
    enum = re.search(r"enum Idea : int \{(.*?)\};", traits, re.S).group(1)
    out = []
    for name, value, prefix in re.findall(r"(k\w+) = (\d+),\s*// (\d\d[a-z])", enum):
        ids = re.findall(rf'"({prefix}_\w+)"', registered)
        out.append((name, int(value), ids[0] if ids else prefix))
    return out


def _statement_end(text: str, i: int) -> int:
    """The index just past the statement starting at text[i] (after whitespace): a { block } or up to
    its ';' at depth 0 (an if without else, a call)."""
    while text[i].isspace():
        i += 1
    depth = 0
    opening = text[i] == "{"
    for j in range(i, len(text)):
        c = text[j]
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
            if opening and depth == 0:
                return j + 1
        elif c == ";" and depth == 0 and not opening:
            return j + 1
    raise ValueError(f"no end for the statement at offset {i}")


def _body(text: str) -> str:
    """A statement as it stands in place of its if, without its own indentation: a block's lines
    without their braces and their common indent (preprocessor lines, `#pragma unroll`, stand at column
    0 in the source and are left out of that indent, and kept at column 0)."""
    text = text.strip()
    if not text.startswith("{"):
        return text
    lines = text[1:-1].strip("\n").split("\n")
    code = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    cut = min((len(line) - len(line.lstrip()) for line in code), default=0)
    return "\n".join(line.lstrip() if line.lstrip().startswith("#") else line[cut:] for line in lines).strip()


def _drop_later_entries(source: str, on: dict[str, bool]) -> str:
    """The kernel's header lists every idea (`//   07c kLdmatrixPipeline  …` and its indented
    continuation lines); a view keeps the entries of the ideas it has, so that the diff of two views
    shows the new idea's entry beside its code."""
    out, dropping = [], False
    for line in source.split("\n"):
        entry = re.match(r"^//\s+\d\d[a-z] (k\w+)\s", line)
        if entry and entry.group(1) in on:
            dropping = not on[entry.group(1)]
        elif dropping and not re.match(r"^//\s{10,}\S", line):
            dropping = False
        if not dropping:
            out.append(line)
    return "\n".join(out)


TAG = re.compile(r"// (From|Before) (\d\d[a-z]): ")


def _tagged_comments(source: str, on: dict[str, bool]) -> str:
    """A comment that says what changes with a sub-step carries a tag, `// From 07d: …` (true once 07d's
    idea is on) or `// Before 07d: …` (true until then), on a line of its own, where the comment lines
    under it that continue its text (the same indent, `// ` and a word) belong to it, or after code on the
    line; a blank `//`, or a line indented further inside the comment (a diagram's), ends the block. A view
    keeps such a comment only where it is true, and drops a kept Before tag's words, so that no view speaks
    of a later sub-step. Tags
    of another step's sub-steps stay as they are; a tag of this step's number that names no sub-step is an
    error."""
    out, dropping = [], None  # dropping: the indent of the comment block being dropped
    for line in source.split("\n"):
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        if dropping is not None:
            if indent == dropping and re.match(r"// \S", stripped) and not TAG.match(stripped):
                continue
            dropping = None
        m = TAG.search(line)
        if m is not None and m.group(2) not in on and any(key[:2] == m.group(2)[:2] for key in on):
            raise ValueError(f"substeps.py: a comment is tagged {m.group(2)}, which is no sub-step: {stripped}")
        if m is None or m.group(2) not in on:
            out.append(line)
            continue
        true = on[m.group(2)] == (m.group(1) == "From")
        if stripped.startswith("//"):  # a comment block of its own
            if not true:
                dropping = indent
                continue
        elif not true:  # a comment after code
            out.append(line[:m.start()].rstrip())
            continue
        if m.group(1) == "Before":
            rest = line[m.end():]  # a sentence's first word capitalized, a name (dV, exp2f) as it is
            line = line[:m.start()] + "// " + (rest[:1].upper() + rest[1:] if re.match(r"[a-z]+[\s',]", rest) else rest)
        out.append(line)
    return "\n".join(out)


def prune(source: str, on: dict[str, bool], folds: dict, matched: set | None = None) -> str:
    """The source with its tagged comments kept or dropped (_tagged_comments), every Tr::has(kX) outside
    comments and each fold replaced by its value, then every `if constexpr (true) A [else B]` (or
    `(false)`) replaced by A or B (or nothing), as is a plain `if (true) A` left by a condition the
    constants decide; no two blank lines left side by side. `on` holds each idea's enum name and its
    sub-step's number and letter ("07d")."""
    source = _drop_later_entries(source, on)
    source = _tagged_comments(source, on)
    for regex, value in folds.items():
        source, n = re.subn(regex, value(on), source)
        if n and matched is not None:
            matched.add(regex)
    source = "\n".join(line if line.lstrip().startswith("//") else  # comments keep naming the idea
                       re.sub(r"Tr::has\((k\w+)\)", lambda m: m.group(0) if m.group(1) not in on  # another step's
                              else "true" if on[m.group(1)] else "false", line)
                       for line in source.split("\n"))
    # What the constants leave: `true ? a : b`, `!true || x` (x), `if (!false || x) {` (if (true) {).
    source = re.sub(r"true \? ([^:;]+?) : [^;]+?;", r"\1;", source)
    source = re.sub(r"false \? [^:;]+? : ([^;]+?);", r"\1;", source)
    source = re.sub(r"!true \|\| ", "", source)
    source = re.sub(r"\(!false \|\| .*\) \{", "(true) {", source)
    # `if constexpr (!true)`, `(MASKED && false)`, `(MASKED && true)` (MASKED).
    source = re.sub(r"if constexpr \(!(true|false)\)", lambda m: "if constexpr (true)" if m[1] == "false" else "if constexpr (false)", source)
    source = re.sub(r"\((\w+) && true\)", r"(\1)", source)
    source = re.sub(r"\(\w+ && false\)", "(false)", source)
    # Every `if constexpr (true|false) A [else B]`, and every plain `if (true) A` the constants left, is
    # replaced by A or B (or nothing).
    pattern = re.compile(r"if (?:constexpr )?\((true|false)\)")
    while (m := pattern.search(source)) is not None:
        keep = m.group(1) == "true"
        then_end = _statement_end(source, m.end())
        rest = source[then_end:]
        else_m = re.match(r"\s*else\b", rest)
        else_start = else_end = None
        if else_m:
            else_start = then_end + else_m.end()
            else_end = _statement_end(source, else_start)
        chosen = source[m.end():then_end] if keep else (source[else_start:else_end] if else_m else "")
        end = else_end if else_m else then_end
        line_start = source.rfind("\n", 0, m.start()) + 1
        indent = source[line_start:m.start()]
        body = _body(chosen)
        # Each line at the if's indent plus its own; preprocessor lines at column 0, as in the source.
        replacement = "\n".join(line if line.startswith("#") or not line else indent + line
                                for line in body.split("\n"))
        if not replacement:  # the whole line goes
            after = end + 1 if source[end:end + 1] == "\n" else end
            source = source[:line_start] + source[after:]
        else:
            source = source[:line_start] + replacement + source[end:]
    return re.sub(r"\n\n\n+", "\n\n", source)  # what a pruned block stood between


def views(steps: Path = REPO / "steps", compilable: bool = False) -> dict[str, str]:
    """{sub-step id: its view (a banner, then the pruned kernel)}, for every sub-step of STEPS; `compilable`
    keeps the template parameters step.cu passes (SIGNATURE_FOLDS left out), for --ptx."""
    out = {}
    for step_name, folds in STEPS.items():
        if compilable:
            folds = {regex: value for regex, value in folds.items() if regex not in SIGNATURE_FOLDS}
        step = steps / step_name
        ideas = ideas_of(step)
        kernel = (step / "kernel.cuh").read_text()
        previous, matched = None, set()
        for _, value, sid in ideas:
            on = {key: value >= v for name, v, sid_of in ideas for key in (name, sid_of[:3])}
            pruned = prune(kernel, on, folds, matched)
            banner = (f"// Generated by bench/substeps.py from steps/{step_name}/kernel.cuh for {sid} (IDEAS = {value}):\n"
                      "// the branches of the ideas after it pruned, their helpers folded. Do not edit; diff it "
                      "against the sub-step before.\n")
            code = pruned.split("#pragma once", 1)[-1]  # below the header, whose list grows with every idea
            if code == previous:  # the idea is in traits.h or step.cu (a tile table), not in the kernel
                banner += (f"// {sid}'s idea changes no line of the kernel: it is in steps/{step_name}/traits.h and "
                           "step.cu (the tile table its plan chooses from).\n")
            out[sid], previous = banner + pruned, code
        if set(folds) - matched:  # a fold written for text the kernel no longer has folds nothing, silently
            raise ValueError(f"substeps.py: no sub-step of {step_name} matches {sorted(set(folds) - matched)}")
    return out


def main(argv=None) -> int:
    ap = parser(__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write notes/substeps/<id>.cuh")
    mode.add_argument("--check", action="store_true", help="exit 1 when a view in notes/substeps/ is stale")
    mode.add_argument("--ptx", metavar="NVCC", help="compile each view with NVCC in place of its kernel (step 13's "
                      "with the flags step.cu passes) and exit 1 when one sub-step's kernels differ from the kernel's "
                      "own PTX")
    ap.add_argument("--out-dir", default=str(OUT), help="where the views are (default: notes/substeps)")
    args = ap.parse_args(argv)
    out = Path(args.out_dir)
    if args.ptx:
        results = compare_ptx(args.ptx, views(compilable=True))
        for sid, count, differ in results:
            print(f"{sid}: {count - len(differ)} of {count} kernels compile to the kernel's own PTX")
            for name in differ:
                print(f"    different: {name}")
        return 1 if any(differ for _, _, differ in results) or not results else 0
    stale = []
    for sid, text in views().items():
        path = out / f"{sid}.cuh"
        if args.write:
            out.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"substeps.py: wrote {path}", file=sys.stderr)
        elif args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            print(f"{path}: {len(text.splitlines())} lines")
    if stale:
        print("substeps.py: stale (run `python3 bench/substeps.py --write`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
