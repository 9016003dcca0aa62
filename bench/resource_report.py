#!/usr/bin/env python3
"""The resources of every step's kernels as a markdown table (cuobjdump; occupancy from a GPU run's
`flash-steps resources --json`): `cmake --build build --target resource_report`, or `python3
bench/resource_report.py --step DIR=OBJ[:OBJ...] [--runtime FILE]`. Where each column comes from: bench/README.md.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from fs_results import MarkerError, load_json, parser, update_between_markers

BEGIN = "<!-- resources:begin -->"
END = "<!-- resources:end -->"
RESERVED_SMEM = 1024  # per block, sm_80 and later
RUNTIME_ENV = "FLASH_STEPS_RESOURCES_JSON"
LAUNCH_FIELDS = ("threads", "dynamic_smem", "blocks_per_sm", "warps_per_sm", "max_warps_per_sm", "occupancy")
# The runtime's columns: each launch's value once, in launch order.
RUNTIME_COLUMNS = (lambda x: str(x["threads"]), lambda x: str(x["dynamic_smem"]), lambda x: str(x["blocks_per_sm"]),
                   lambda x: f"{100 * x['occupancy']:.0f} % ({x['warps_per_sm']} of {x['max_warps_per_sm']} warps)")


# ---- parsing cuobjdump -------------------------------------------------------------------------

def parse_resource_usage(text: str) -> list[dict]:
    """`cuobjdump --dump-resource-usage`: one dict per (arch, kernel) with REG, STACK, SHARED, LOCAL."""
    out, arch, func = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if m := re.match(r"arch = sm_(\d+)", s):
            arch = int(m.group(1))
        elif m := re.match(r"Function (\S+):$", s):
            func = m.group(1)
        elif func and s.startswith("REG:"):
            fields = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", s))
            out.append({"arch": arch, "kernel": func, "registers": int(fields.get("REG", 0)),
                        "stack": int(fields.get("STACK", 0)), "shared": int(fields.get("SHARED", 0)),
                        "local": int(fields.get("LOCAL", 0))})
            func = None
    return out


def parse_sass_local(text: str) -> dict[tuple, dict]:
    """`cuobjdump -sass`: {(arch, kernel): {"ldl": n, "stl": n}}: local-memory loads and stores."""
    out, arch, func = {}, None, None
    for line in text.splitlines():
        if m := re.search(r"code for sm_(\d+)", line):
            arch = int(m.group(1))
        elif m := re.match(r"\s*Function : (\S+)", line):
            func = (arch, m.group(1))
            out[func] = {"ldl": 0, "stl": 0}
        elif func and (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?(LDL|STL)\b", line)):
            out[func][m.group(1).lower()] += 1
    return out


# ---- names ---------------------------------------------------------------------------------------

def demangle(names: list[str]) -> dict[str, str]:
    """c++filt when it exists, else the mangled names."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = res.stdout.splitlines()
    return dict(zip(names, lines)) if res.returncode == 0 and len(lines) == len(names) else {n: n for n in names}


def short_name(demangled: str) -> str:
    """'void fs::(anonymous namespace)::scores_kernel<__half>(__half const*, ...)' -> 'scores_kernel<__half>'."""
    s = demangled.strip()
    if s.endswith(")"):  # drop the parameter list: the last parenthesised group at depth 0
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    if s.startswith("void "):
        s = s[5:]
    depth, cut = 0, 0
    for i, c in enumerate(s):  # drop namespaces: everything up to the last '::' outside template arguments
        depth += {"<": 1, ">": -1}.get(c, 0)
        if depth == 0 and s.startswith("::", i):
            cut = i + 2
    return s[cut:]


# ---- the report ----------------------------------------------------------------------------------

def cuobjdump(tool: str, flag: str, obj: str) -> str:
    res = subprocess.run([tool, flag, obj], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{tool} {flag} {obj}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def collect(tool: str, steps: list[tuple[str, list[str]]]) -> tuple[list[dict], list[str]]:
    """Rows for every kernel of every step object, and warnings (e.g. no SASS because nvdisasm is missing)."""
    rows, warnings = [], []
    for step, objs in steps:
        for obj in objs:
            usage = parse_resource_usage(cuobjdump(tool, "--dump-resource-usage", obj))
            try:
                sass = parse_sass_local(cuobjdump(tool, "-sass", obj))
            except RuntimeError as e:
                sass = None
                warnings.append(f"no SASS for {Path(obj).name} ({e}); LDL/STL not counted")
            for u in usage:
                local = (sass or {}).get((u["arch"], u["kernel"])) or {}
                rows.append(dict(u, step=step, object=obj, ldl=local.get("ldl"), stl=local.get("stl")))
    names = demangle(sorted({r["kernel"] for r in rows}))
    for r in rows:
        r["name"] = short_name(names[r["kernel"]])
    rows.sort(key=lambda r: (r["step"], r["arch"] or 0, r["name"]))
    return rows, warnings


def merge_runtime(rows: list[dict], runtime: dict) -> list[str]:
    """r["launches"]: the launches `flash-steps resources --json` reported for each row's kernel (same step
    directory, mangled name and architecture), each once, with LAUNCH_FIELDS and "step". Returns notes on
    what did not fit: steps that refused or failed, kernels launched but not in the objects."""
    notes = []
    arch = runtime.get("compute_capability")
    by_kernel = {(r["step"], r["kernel"]): r for r in rows if arch is None or r["arch"] == arch}
    for r in rows:
        r["launches"] = []
    for s in runtime.get("steps", []):
        if s.get("status") not in ("ok", None):
            notes.append(f"`{s['id']}` {s['status']}: {s.get('reason', '').rstrip('.')}")
            continue
        if not s.get("kernels"):
            notes.append(f"`{s['id']}` lists no kernels (Plan::kernels is empty), so its occupancy is not known")
        for k in s.get("kernels", []):
            row = by_kernel.get((s.get("dir", ""), k.get("mangled", "")))
            if row is None:
                notes.append(f"`{s['id']}` launches `{short_name(k.get('name') or k.get('mangled') or '?')}`, "
                             "which is not in the object files given")
                continue
            launch = {key: k.get(key) for key in LAUNCH_FIELDS}
            if launch not in [{key: x.get(key) for key in launch} for x in row["launches"]]:
                row["launches"].append(dict(launch, step=s["id"]))
    return notes


def describe_problem(p: dict) -> str:
    return (f"batch {p.get('batch')}, seqlen {p.get('seqlen_q')}"
            + (f"/{p.get('seqlen_k')}" if p.get("seqlen_k") != p.get("seqlen_q") else "")
            + f", {p.get('heads_q')} heads, head_dim {p.get('head_dim')}, {p.get('dtype')}"
            + (", causal" if p.get("causal") else ""))


def markdown(rows: list[dict], warnings: list[str], source: str, runtime: dict | None = None,
             runtime_notes: list[str] = ()) -> str:
    head = ("| step | kernel | arch | registers / thread | static smem (B) | stack (B) | local ld / st (SASS) |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |")
    if runtime is not None:
        head = (head[0] + " threads / block | dynamic smem (B) | blocks / SM | occupancy |",
                head[1] + " ---: | ---: | ---: | ---: |")
    lines = [f"<!-- generated by bench/resource_report.py ({source}); do not edit by hand -->", "", *head]
    for r in rows:
        static = max(0, r["shared"] - RESERVED_SMEM) if r["shared"] else 0
        local = "–" if r["ldl"] is None else f"{r['ldl']} / {r['stl']}"
        line = (f"| `{r['step']}` | `{r['name']}` | sm_{r['arch']} | {r['registers']} | {static} | "
                f"{r['stack']} | {local} |")
        if runtime is not None:
            line += "".join(f" {' / '.join(dict.fromkeys(map(fmt, r.get('launches', [])))) or '–'} |"
                            for fmt in RUNTIME_COLUMNS)
        lines.append(line)
    lines += ["",
              "Registers, static shared memory and stack frame: `cuobjdump --dump-resource-usage` (static shared "
              "memory without the 1 KiB reserved per block). A spill shows as a stack frame and as local loads and "
              "stores (LDL/STL) in the SASS; the build also passes `-Xptxas --warn-on-spills`."]
    if runtime is None:
        lines.append("Occupancy depends on the block size and dynamic shared memory a step's plan chooses at run "
                     "time: run `flash-steps resources` on a GPU (`--json` to a file, then `--runtime FILE` here; "
                     "`bench/run_all.sh` does both).")
    else:
        lines.append(f"Threads, dynamic shared memory, blocks per SM and occupancy (resident warps per SM over the "
                     f"SM's limit): the CUDA runtime (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`) for the "
                     f"launches each step's plan makes at {describe_problem(runtime.get('problem', {}))} on "
                     f"{runtime.get('device', 'an unknown device')} (`flash-steps resources`, commit "
                     f"`{runtime.get('commit', 'unknown')}`, {runtime.get('date', 'unknown date')}). `–`: not "
                     "launched at that problem (another head_dim, dtype or configuration).")
        for n in runtime_notes:
            lines.append(f"Note: {n}.")
    for w in warnings:
        lines.append(f"Note: {w}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--step", action="append", default=[], metavar="DIR=OBJ[:OBJ...]",
                    help="a step directory and its object files (repeatable)")
    ap.add_argument("--cuobjdump", default="", help="cuobjdump to use (default: the one on PATH)")
    ap.add_argument("--out", default="", help="write the markdown here (default: print it)")
    ap.add_argument("--notes", default="", help=f"also rewrite this file between {BEGIN} and {END}, if it has them")
    ap.add_argument("--runtime", default=os.environ.get(RUNTIME_ENV, ""),
                    help=f"`flash-steps resources --json` output: the occupancy of the launches (default: ${RUNTIME_ENV})")
    args = ap.parse_args(argv)

    tool = args.cuobjdump or shutil.which("cuobjdump")
    if not tool or not Path(tool).exists():
        print("resource_report.py: cuobjdump not found (it comes with the CUDA toolkit; pass --cuobjdump PATH)",
              file=sys.stderr)
        return 1
    steps = [(name, [o for o in objs.split(":") if o]) for name, _, objs in (s.partition("=") for s in args.step)]
    for spec, (name, files) in zip(args.step, steps):
        if not name or not files:
            print(f"resource_report.py: --step expects DIR=OBJ[:OBJ...], got '{spec}'", file=sys.stderr)
            return 2
    if not steps:
        print("resource_report.py: no --step given", file=sys.stderr)
        return 2
    runtime = None
    if args.runtime:
        try:
            runtime = load_json(args.runtime)
            if not isinstance(runtime, dict) or runtime.get("tool") != "flash-steps resources":
                raise ValueError("not the output of `flash-steps resources --json`")
        except (OSError, ValueError) as e:
            print(f"resource_report.py: --runtime {args.runtime}: {e}", file=sys.stderr)
            return 1
    rows, warnings = collect(tool, steps)
    runtime_notes = merge_runtime(rows, runtime) if runtime is not None else []
    version = re.search(r"release ([\d.]+)", subprocess.run([tool, "--version"], capture_output=True, text=True).stdout)
    table = markdown(rows, warnings, f"cuobjdump {version.group(1)}" if version else "cuobjdump", runtime,
                     runtime_notes)
    if args.out:
        Path(args.out).write_text(table)
        print(f"resource_report.py: wrote {args.out} ({len(rows)} kernels)", file=sys.stderr)
    else:
        print(table, end="")
    if args.notes:
        notes = Path(args.notes)
        try:
            changed = update_between_markers(notes, table, BEGIN, END)
            print(f"resource_report.py: {notes} {'rewritten' if changed else 'already up to date'} "
                  "between the resources markers", file=sys.stderr)
        except (OSError, MarkerError):
            print(f"resource_report.py: {notes} has no lines {BEGIN} / {END}; left alone", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
