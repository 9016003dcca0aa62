#!/usr/bin/env python3
"""The table "What each step changes" in notes/README.md, from the step directories: `python3
bench/step_changes.py` prints it, `--write` rewrites it, `--check` fails when it is stale (bench/README.md).
The rows of sub-steps compare the views bench/substeps.py writes in notes/substeps/.
"""
from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

import fs_results
import substeps

BEGIN = "<!-- step-changes:begin -->"
END = "<!-- step-changes:end -->"
VIEWS = substeps.OUT  # where bench/substeps.py writes the sub-steps' views


def step_dirs(steps: Path) -> list[Path]:
    """The step directories, steps/NN_name, in name order."""
    return sorted(d for d in steps.iterdir() if d.is_dir() and d.name[:2].isdigit())


def base_of(later: Path, dirs: list[Path]) -> Path:
    """The directory a step extends: the one its kernel.cuh names in its header ("Extends step 07 ..."),
    else the one before it."""
    header = kernel_lines(later)[:12]
    named = re.search(r"Extends step (\d\d)", "\n".join(header))
    if named:
        for d in dirs:
            if d.name.startswith(named.group(1) + "_") and d != later:
                return d
    return dirs[dirs.index(later) - 1]


def read_lines(path: Path | None) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines() if path is not None else []


def kernel_lines(step_dir: Path) -> list[str]:
    """A step directory's kernel.cuh, [] where it has none."""
    kernel = step_dir / "kernel.cuh"
    return read_lines(kernel if kernel.is_file() else None)


def count_changes(old: list[str], new: list[str]) -> tuple[int, int]:
    """(lines added, lines removed) to turn old into new."""
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            removed += i2 - i1
        if tag in ("replace", "insert"):
            added += j2 - j1
    return added, removed


def compare_dirs(earlier: Path, later: Path) -> list[dict]:
    """One entry per file that differs: {"name", "added", "removed", "status": "changed"|"new"|"removed"}."""
    a = {f.name: f for f in earlier.iterdir() if f.is_file()}
    b = {f.name: f for f in later.iterdir() if f.is_file()}
    out = []
    for name in sorted(a.keys() | b.keys()):
        added, removed = count_changes(read_lines(a.get(name)), read_lines(b.get(name)))
        if added or removed or (name in a) != (name in b):
            status = "new" if name not in a else "removed" if name not in b else "changed"
            out.append({"name": name, "added": added, "removed": removed, "status": status})
    return out


def lessons_by_dir(lib_path: Path) -> dict[str, list[tuple[str, str]]]:
    """{directory: [(step id, lesson), ...]} from the library's registry."""
    sys.path.insert(0, str(fs_results.REPO / "python"))
    import flash_steps  # the ctypes binding of common/flash_steps.h

    out: dict[str, list[tuple[str, str]]] = {}
    for s in flash_steps.load_library(lib_path).steps():
        out.setdefault(s.dir, []).append((s.id, s.lesson))
    return out


def view_kernels(views: Path) -> dict[str, list[str]]:
    """{sub-step id: its kernel's lines} from the views bench/substeps.py writes (notes/substeps/<id>.cuh;
    its ctest entry keeps them current), without their banner: two lines, three where the idea is not in
    the kernel."""
    out = {}
    for f in sorted(views.glob("*.cuh")):
        lines = read_lines(f)
        out[f.stem] = lines[3 if len(lines) > 2 and "changes no line of the kernel" in lines[2] else 2:]
    return out


def substep_rows(kernels: dict[str, list[str]], lessons: list[tuple[str, str]],
                 entry: tuple[str, list[str], str] | None = None) -> list[str]:
    """The rows of a step's sub-steps, one view (`kernels`, view_kernels) against the next; with `entry`,
    (label, lines, where) of what the first sub-step extends (entry_of), a row for the first one too."""
    said = dict(lessons)
    ids = [sid for sid, _ in lessons if sid in kernels]
    pairs = [(f"`{earlier}`", kernels[earlier], "views in `notes/substeps/`", later)
             for earlier, later in zip(ids, ids[1:])]
    if entry is not None and ids:
        pairs.insert(0, (*entry, ids[0]))
    rows = []
    for label, old, where, later in pairs:
        added, removed = count_changes(old, kernels[later])
        lines = f"`{later}.cuh` +{added} −{removed}" if added or removed else "none in the kernel (traits.h's tile table)"
        rows.append(f"| {label} → `{later}` ({where}) | {lines} | +{added} −{removed} "
                    f"| {said[later].replace('|', chr(92) + '|')} |")
    return rows


def view_ids(step_dir: Path, kernels: dict[str, list[str]], lessons: dict[str, list[tuple[str, str]]]) -> list[str]:
    """The ids of a directory's sub-steps that have a view, in the registry's order."""
    return [sid for sid, _ in lessons.get(step_dir.name, []) if sid in kernels]


def last_view(step_dir: Path, kernels: dict[str, list[str]], lessons: dict[str, list[tuple[str, str]]]) -> str | None:
    """The id of a directory's last sub-step with a view (12c_bulk_dq), None where it has none."""
    ids = view_ids(step_dir, kernels, lessons)
    return ids[-1] if ids else None


def entry_of(earlier: Path, kernels: dict[str, list[str]], lessons: dict[str, list[tuple[str, str]]]
             ) -> tuple[str, list[str], str]:
    """What a directory's first sub-step extends, as (label, lines, where) for substep_rows: the last view
    of the earlier directory where it has views (12c → 13a), else its kernel.cuh (06 → 07a)."""
    last = last_view(earlier, kernels, lessons)
    if last:
        return f"`{last}`", kernels[last], "views in `notes/substeps/`"
    return f"`{earlier.name}`", kernel_lines(earlier), "its `kernel.cuh` against the view in `notes/substeps/`"


def exit_row(earlier: Path, later: Path, kernels: dict[str, list[str]], lessons: dict[str, list[tuple[str, str]]]
             ) -> list[str]:
    """A row for a directory without sub-steps that extends one with them (07 → 08, 10, 11): the earlier
    directory's last view against its kernel.cuh, the diff without the earlier ideas' other branches."""
    last = last_view(earlier, kernels, lessons)
    if not last or last_view(later, kernels, lessons) or not kernel_lines(later):
        return []
    added, removed = count_changes(kernels[last], kernel_lines(later))
    said = "<br>".join(lesson.replace("|", "\\|") for _, lesson in lessons.get(later.name, []))
    return [f"| `{last}` → `{later.name}` (the view in `notes/substeps/` against its `kernel.cuh`) "
            f"| `kernel.cuh` +{added} −{removed} | +{added} −{removed} | {said} |"]


SECTION = re.compile(r"^// ==== the (\w+): step (\d\d[a-z])'s kernel\b")


def kernel_function(lines: list[str]) -> list[str]:
    """The first __global__ function of `lines`, from its template line (if it has one) to the first line
    that starts with '}'; [] where there is none."""
    starts = [i for i, line in enumerate(lines) if line.startswith("__global__")]
    if not starts:
        return []
    g = starts[0]
    first = g - 1 if g > 0 and lines[g - 1].startswith("template") else g
    last = next((i for i in range(g, len(lines)) if lines[i].startswith("}")), len(lines) - 1)
    return lines[first:last + 1]


def sections(view: str, kernels: dict[str, list[str]]) -> list[tuple[str, str, list[str], list[str]]]:
    """A view made of one section per pass, each headed "// ==== the <pass>: step <id>'s kernel" and copied
    from that sub-step's kernel (13a: 09f's forward, 12c's backward): (pass, that sub-step, its __global__
    function, the section's) for each pass; [] for a view without sections."""
    lines = kernels[view]
    marks = [(i, m) for i, line in enumerate(lines) if (m := SECTION.match(line))]
    out = []
    for n, (start, m) in enumerate(marks):
        end = marks[n + 1][0] if n + 1 < len(marks) else len(lines)
        source = next((sid for sid in kernels if sid.startswith(m.group(2) + "_")), None)
        if source is not None:
            out.append((m.group(1), source, kernel_function(kernels[source]), kernel_function(lines[start:end])))
    return out


def section_rows(view: str, kernels: dict[str, list[str]]) -> list[str]:
    """A row per pass of a view with sections (sections()), which `diff` of the whole views mixes together."""
    rows = []
    for name, source, old, new in sections(view, kernels):
        added, removed = count_changes(old, new)
        rows.append(f"| `{source}` → `{view}`, the {name} (the `__global__` function of each view) "
                    f"| `{view}.cuh` +{added} −{removed} | +{added} −{removed} | the {name} alone of the row above |")
    return rows


def section_diffs(view: str, kernels: dict[str, list[str]]) -> str:
    """The unified diff of each pass of a view with sections, what --sections prints."""
    out = []
    for name, source, old, new in sections(view, kernels):
        out += difflib.unified_diff(old, new, f"{source}.cuh (its __global__ function)",
                                    f"{view}.cuh, the {name}", lineterm="")
    return "\n".join(out) + ("\n" if out else "")


def table(steps: Path, lessons: dict[str, list[tuple[str, str]]], views: Path = VIEWS) -> str:
    """The markdown between the markers (without the markers themselves); the sub-steps' rows from `views`."""
    lines = ["<!-- generated by bench/step_changes.py; do not edit by hand -->", "",
             "| from → to | files changed (lines + / −) | + / − | what the later step adds |",
             "| --- | --- | ---: | --- |"]
    dirs = step_dirs(steps)
    kernels = view_kernels(views)
    for later in dirs[1:]:
        earlier = base_of(later, dirs)
        files = compare_dirs(earlier, later)
        listed = ", ".join(f"`{f['name']}`{'' if f['status'] == 'changed' else ' (' + f['status'] + ')'} "
                           f"+{f['added']} −{f['removed']}" for f in files) or "none"
        added, removed = sum(f["added"] for f in files), sum(f["removed"] for f in files)
        said = "<br>".join(f"`{sid}`: " + lesson.replace("|", "\\|")  # a '|' would end the cell
                           for sid, lesson in lessons.get(later.name, [])) or "(no step registered from this directory)"
        lines.append(f"| `{earlier.name}` → `{later.name}` | {listed} | +{added} −{removed} | {said} |")
        lines += substep_rows(kernels, lessons.get(later.name, []), entry_of(earlier, kernels, lessons))
        for first in view_ids(later, kernels, lessons)[:1]:  # the first sub-step, where its diff is the entry's
            lines += section_rows(first, kernels)
        lines += exit_row(earlier, later, kernels, lessons)
    lines += ["", "Lines added and removed from the step a directory extends (its kernel.cuh says which, "
              "\"Extends step NN\"; else the one before) to it (files paired by name and compared line by line; a "
              "file on one side only counts whole): what `diff -ru steps/<from> steps/<to>` shows. Regenerate with "
              "`python3 bench/step_changes.py --write`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = fs_results.parser(__doc__)
    ap.add_argument("--lib", help="libflash_steps.so (default: $FLASH_STEPS_LIB, else build/libflash_steps.so)")
    ap.add_argument("--steps", default=str(fs_results.REPO / "steps"), help="the steps directory")
    ap.add_argument("--notes", default=str(fs_results.REPO / "notes" / "README.md"),
                    help="the file whose step-changes markers hold the table")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the table in --notes")
    mode.add_argument("--check", action="store_true", help="exit 1 when the table in --notes is stale")
    mode.add_argument("--sections", metavar="VIEW", help="print the diff of each pass of a view made of one "
                      "section per pass (13a_softcap: its forward against 09f's kernel, its backward against 12c's)")
    args = ap.parse_args(argv)
    if args.sections:
        kernels = view_kernels(VIEWS)
        if args.sections not in kernels or not sections(args.sections, kernels):
            print(f"step_changes.py: --sections: {args.sections!r} is not a view with one section per pass "
                  f"(notes/substeps/13a_softcap.cuh is one)", file=sys.stderr)
            return 2
        print(section_diffs(args.sections, kernels), end="")
        return 0

    lib = fs_results.library_path(args.lib)
    try:
        lessons = lessons_by_dir(lib)
    except OSError as e:
        print(f"step_changes.py: cannot load {lib} ({e}); build it (cmake --build build) or pass --lib",
              file=sys.stderr)
        return 2
    text = table(Path(args.steps), lessons)
    if not (args.write or args.check):
        print(text, end="")
        return 0
    notes = Path(args.notes)
    try:
        current = fs_results.between_markers(notes.read_text(encoding="utf-8"), BEGIN, END)
    except (OSError, fs_results.MarkerError) as e:
        print(f"step_changes.py: {notes}: {e}; add the two lines {BEGIN} and {END} where the table belongs",
              file=sys.stderr)
        return 2
    if args.check:
        if current == text:
            return 0
        diff = difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                    f"{notes} (as it is)", "the steps as they are now")
        sys.stderr.writelines(diff)
        print(f"step_changes.py: the table in {notes} is stale; run `python3 bench/step_changes.py --write`",
              file=sys.stderr)
        return 1
    changed = fs_results.update_between_markers(notes, text, BEGIN, END)
    print(f"step_changes.py: {notes} {'rewritten' if changed else 'already up to date'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
