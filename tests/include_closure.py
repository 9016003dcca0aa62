#!/usr/bin/env python3
"""What a reader of a step meets: the include closure of each step directory's files, the headers of the
project that its step.cu, kernel.cuh and traits.h pull in (system and CUDA headers left out), and their
lines, split into the step's own files and common/.

    python3 tests/include_closure.py                 every step: files and lines of common/ it includes
    python3 tests/include_closure.py --step 01 -v    one step, every file of its closure
    python3 tests/include_closure.py --max-common 500 --step 01
                                                     exit 1 when step 01 includes more lines of common/

An include "x" is looked for where the compiler looks: beside the including file, then in the
repository's root and in common/ (the include directories of cmake/FlashSteps.cmake). The CPU test
`include_closure` (tests/CMakeLists.txt) runs the last command: step 01, the first a learner reads,
pulls at most 500 lines of the harness.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def resolve(name: str, including: Path, repo: Path) -> Path | None:
    for base in (including.parent, repo, repo / "common"):
        path = (base / name).resolve()
        if path.is_file():
            return path
    return None  # a generated or system header


def closure(sources: list[Path], repo: Path) -> set[Path]:
    seen: set[Path] = set()
    todo = [p.resolve() for p in sources]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            found = resolve(name, path, repo)
            if found is not None and found not in seen:
                todo.append(found)
    return seen


def lines(path: Path) -> int:
    return len(path.read_text(errors="replace").splitlines())


def report(step_dir: Path, repo: Path) -> dict:
    files = closure(sorted(p for p in step_dir.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp")), repo)
    common = repo.resolve() / "common"
    rows = sorted((str(p.relative_to(repo.resolve())), lines(p)) for p in files)
    in_common = [(f, n) for f, n in rows if Path(repo, f).resolve().is_relative_to(common)]
    return {"step": step_dir.name, "files": rows, "common_files": len(in_common),
            "common_lines": sum(n for _, n in in_common), "own_lines": sum(n for f, n in rows if (f, n) not in in_common)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(REPO), help="the repository (default: this one)")
    ap.add_argument("--step", help="only the step directories whose name starts with this (e.g. 01)")
    ap.add_argument("--max-common", type=int, help="exit 1 when a step includes more lines of common/")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every file of each closure")
    args = ap.parse_args(argv)
    repo = Path(args.repo)
    dirs = sorted(d for d in (repo / "steps").iterdir() if d.is_dir() and (not args.step or d.name.startswith(args.step)))
    if not dirs:
        print(f"include_closure.py: no step directory under {repo / 'steps'} starts with '{args.step}'", file=sys.stderr)
        return 2
    failed = False
    print(f"{'step':<24}{'lines of the step':>18}{'lines of common/':>18}{'files of common/':>18}")
    for d in dirs:
        r = report(d, repo)
        over = args.max_common is not None and r["common_lines"] > args.max_common
        failed |= over
        print(f"{r['step']:<24}{r['own_lines']:>18}{r['common_lines']:>18}{r['common_files']:>18}"
              + (f"   more than {args.max_common}" if over else ""))
        if args.verbose:
            for f, n in r["files"]:
                print(f"    {n:>6}  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
