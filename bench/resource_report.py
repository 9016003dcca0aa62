#!/usr/bin/env python3
"""The compiler's resource report of every step's kernels, as a markdown table.

    cmake --build build --target resource_report          writes build/resource_report.md
    python3 bench/resource_report.py --step 01_naive=build/steps/.../step.cu.o [--step ...]
        [--cuobjdump PATH] [--out FILE] [--notes notes/README.md] [--launch bench/launch_config.json]

For each step object it runs `cuobjdump --dump-resource-usage` (registers per thread, static shared
memory, stack frame per kernel), `cuobjdump -sass` (local-memory loads and stores, LDL/STL: the
instructions a spill or a local array turns into) and `cuobjdump -elf` (the block size a kernel
declares with __launch_bounds__). From these it computes the theoretical occupancy for the
architecture's limits.

What the object file does not say: the block size a kernel is launched with (unless it declares
__launch_bounds__) and the dynamic shared memory of its launches. Without them the occupancy column
is the bound that registers alone allow, and says so; an optional JSON file (--launch) supplies
them: [{"step": "06", "kernel": "regex", "threads": 128, "dynamic_smem": 49152}, ...].

cuobjdump's SHARED includes the 1 KiB that sm_80 and later reserve per block whenever a kernel uses
shared memory; the table shows the kernel's own static shared memory (SHARED - 1 KiB) and the
occupancy counts the reserved 1 KiB for every block.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- resources:begin -->"
END = "<!-- resources:end -->"
RESERVED_SMEM = 1024  # per block, sm_80 and later

# Per SM: registers, shared memory usable by blocks, threads, blocks; register allocation unit per warp.
LIMITS = {
    80: {"regs": 65536, "smem": 164 * 1024, "threads": 2048, "blocks": 32, "reg_unit": 256, "smsp": 4},
    86: {"regs": 65536, "smem": 100 * 1024, "threads": 1536, "blocks": 16, "reg_unit": 256, "smsp": 4},
    89: {"regs": 65536, "smem": 100 * 1024, "threads": 1536, "blocks": 24, "reg_unit": 256, "smsp": 4},
    90: {"regs": 65536, "smem": 228 * 1024, "threads": 2048, "blocks": 32, "reg_unit": 256, "smsp": 4},
}


# ---- parsing cuobjdump -------------------------------------------------------------------------

def parse_resource_usage(text: str) -> list[dict]:
    """`cuobjdump --dump-resource-usage`: one dict per (arch, kernel) with REG, STACK, SHARED, LOCAL."""
    out, arch = [], None
    func = None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"arch = sm_(\d+)", s)
        if m:
            arch = int(m.group(1))
            continue
        m = re.match(r"Function (\S+):$", s)
        if m:
            func = m.group(1)
            continue
        if func and s.startswith("REG:"):
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
        m = re.search(r"code for sm_(\d+)", line)
        if m:
            arch = int(m.group(1))
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            func = (arch, m.group(1))
            out[func] = {"ldl": 0, "stl": 0}
            continue
        if func:
            m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?(LDL|STL)\b", line)
            if m:
                out[func][m.group(1).lower()] += 1
    return out


def parse_launch_bounds(text: str) -> dict[str, int]:
    """`cuobjdump -elf`: {kernel: threads} from EIATTR_REQNTID (exact) or EIATTR_MAX_THREADS (bound)."""
    out, func, attr = {}, None, None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"\.nv\.info\.(\S+)$", s)
        if m:
            func, attr = m.group(1), None
            continue
        if func is None:
            continue
        m = re.match(r"Attribute:\s+(\w+)", s)
        if m:
            attr = m.group(1)
            continue
        m = re.match(r"Value:\s+(.*)", s)
        if m and attr in ("EIATTR_REQNTID", "EIATTR_MAX_THREADS"):
            dims = [int(x, 16) for x in m.group(1).split() if x.startswith("0x")]
            if dims:
                n = 1
                for d in dims:
                    n *= d
                if attr == "EIATTR_REQNTID" or func not in out:
                    out[func] = n
            attr = None
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


# ---- occupancy -----------------------------------------------------------------------------------

def occupancy(arch: int, registers: int, static_smem: int, threads: int | None, dynamic_smem: int | None) -> dict:
    """Theoretical resident warps per SM and what limits them (the CUDA occupancy calculator's rules)."""
    lim = LIMITS.get(arch)
    if lim is None:
        return {"text": f"no limits known for sm_{arch}"}
    max_warps = lim["threads"] // 32
    regs_per_warp = -(-max(registers, 1) * 32 // lim["reg_unit"]) * lim["reg_unit"]
    # registers are allocated per SM sub-partition: each holds regs/smsp registers
    warps_by_regs = min(max_warps, lim["smsp"] * ((lim["regs"] // lim["smsp"]) // regs_per_warp))
    if threads is None:
        pct = 100 * warps_by_regs / max_warps
        smem_note = ""
        if static_smem:
            smem_note = f"; static shared memory allows ≤ {lim['smem'] // (static_smem + RESERVED_SMEM)} blocks"
        return {"warps": warps_by_regs, "pct": pct, "limit": "registers",
                "text": f"≤ {pct:.0f} % ({warps_by_regs} warps; registers alone{smem_note})"}
    warps_per_block = -(-threads // 32)
    smem = static_smem + (dynamic_smem or 0) + RESERVED_SMEM
    limits = {
        "registers": warps_by_regs // warps_per_block,
        "shared memory": lim["smem"] // smem,
        "threads": max_warps // warps_per_block,
        "blocks": lim["blocks"],
    }
    blocks = min(limits.values())
    limit = ", ".join(k for k, v in limits.items() if v == blocks)
    warps = blocks * warps_per_block
    pct = 100 * warps / max_warps
    note = "" if dynamic_smem is not None else "; dynamic shared memory unknown"
    return {"warps": warps, "pct": pct, "blocks": blocks, "limit": limit,
            "text": f"{pct:.0f} % ({blocks} blocks × {warps_per_block} warps; {limit}{note})"}


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
            bounds = parse_launch_bounds(cuobjdump(tool, "-elf", obj))
            for u in usage:
                local = sass.get((u["arch"], u["kernel"])) if sass is not None else None
                rows.append(dict(u, step=step, object=obj, ldl=local["ldl"] if local else None,
                                 stl=local["stl"] if local else None, bound_threads=bounds.get(u["kernel"])))
    names = demangle(sorted({r["kernel"] for r in rows}))
    for r in rows:
        r["name"] = short_name(names[r["kernel"]])
    rows.sort(key=lambda r: (r["step"], r["arch"] or 0, r["name"]))
    return rows, warnings


def apply_launch_config(rows: list[dict], config: list[dict]) -> None:
    for r in rows:
        r["threads"], r["dynamic_smem"], r["threads_from"] = r["bound_threads"], None, (
            "__launch_bounds__" if r["bound_threads"] else None)
        for c in config:
            if r["step"].startswith(str(c.get("step", ""))) and re.search(c.get("kernel", ".*"), r["name"]):
                if "threads" in c:
                    r["threads"], r["threads_from"] = int(c["threads"]), "launch config"
                if "dynamic_smem" in c:
                    r["dynamic_smem"] = int(c["dynamic_smem"])
                break


def markdown(rows: list[dict], warnings: list[str], source: str) -> str:
    lines = [f"<!-- generated by bench/resource_report.py ({source}); do not edit by hand -->", "",
             "| step | kernel | arch | registers / thread | static smem (B) | stack (B) | local ld / st (SASS) "
             "| threads / block | dynamic smem (B) | theoretical occupancy |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        static = max(0, r["shared"] - RESERVED_SMEM) if r["shared"] else 0
        occ = occupancy(r["arch"] or 0, r["registers"], static, r.get("threads"), r.get("dynamic_smem"))
        local = "–" if r["ldl"] is None else f"{r['ldl']} / {r['stl']}"
        threads = "?" if not r.get("threads") else str(r["threads"])
        dyn = "?" if r.get("dynamic_smem") is None else str(r["dynamic_smem"])
        lines.append(f"| `{r['step']}` | `{r['name']}` | sm_{r['arch']} | {r['registers']} | {static} | "
                     f"{r['stack']} | {local} | {threads} | {dyn} | {occ['text']} |")
    lines += ["",
              "Registers, static shared memory and stack frame: `cuobjdump --dump-resource-usage` (static shared "
              "memory without the 1 KiB reserved per block). A spill shows as a stack frame and as local loads and "
              "stores (LDL/STL) in the SASS; the build also passes `-Xptxas --warn-on-spills`. Occupancy follows the "
              "occupancy calculator (registers allocated per warp in units of 256, per SM sub-partition; 1 KiB of "
              "shared memory reserved per block) for the architecture's limits (sm_90: 65536 registers, 228 KiB "
              "shared memory, 2048 threads, 32 blocks per SM). `?`: not in the object file: the block size is known "
              "only from `__launch_bounds__` or a launch config (bench/resource_report.py --launch), and dynamic "
              "shared memory only from the launch; where they are unknown the occupancy is the bound that registers "
              "alone allow."]
    for w in warnings:
        lines.append(f"Note: {w}.")
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, content: str) -> str:
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the markers '{BEGIN}' and '{END}' were not found")
    return text[: i + len(BEGIN)] + "\n" + content + text[j:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--step", action="append", default=[], metavar="DIR=OBJ[:OBJ...]",
                    help="a step directory and its object files (repeatable)")
    ap.add_argument("--cuobjdump", default="", help="cuobjdump to use (default: the one on PATH)")
    ap.add_argument("--out", default="", help="write the markdown here (default: print it)")
    ap.add_argument("--notes", default="", help=f"also rewrite this file between {BEGIN} and {END}, if it has them")
    ap.add_argument("--launch", default="", help="JSON list of {step, kernel (regex), threads, dynamic_smem}")
    args = ap.parse_args(argv)

    tool = args.cuobjdump or shutil.which("cuobjdump")
    if not tool or not Path(tool).exists():
        print("resource_report.py: cuobjdump not found (it comes with the CUDA toolkit; pass --cuobjdump PATH)",
              file=sys.stderr)
        return 1
    steps = []
    for spec in args.step:
        name, _, objs = spec.partition("=")
        files = [o for o in objs.split(":") if o]
        if not name or not files:
            print(f"resource_report.py: --step expects DIR=OBJ[:OBJ...], got '{spec}'", file=sys.stderr)
            return 2
        steps.append((name, files))
    if not steps:
        print("resource_report.py: no --step given", file=sys.stderr)
        return 2
    rows, warnings = collect(tool, steps)
    config = json.loads(Path(args.launch).read_text()) if args.launch and Path(args.launch).exists() else []
    apply_launch_config(rows, config)
    version = re.search(r"release ([\d.]+)", subprocess.run([tool, "--version"], capture_output=True, text=True).stdout)
    table = markdown(rows, warnings, f"cuobjdump {version.group(1)}" if version else "cuobjdump")
    if args.out:
        Path(args.out).write_text(table)
        print(f"resource_report.py: wrote {args.out} ({len(rows)} kernels)", file=sys.stderr)
    else:
        print(table, end="")
    if args.notes:
        notes = Path(args.notes)
        text = notes.read_text() if notes.exists() else ""
        if BEGIN in text and END in text:
            new = replace_between_markers(text, table)
            if new != text:
                notes.write_text(new)
            print(f"resource_report.py: {notes} {'rewritten' if new != text else 'already up to date'} "
                  "between the resources markers", file=sys.stderr)
        else:
            print(f"resource_report.py: {notes} has no lines {BEGIN} / {END}; left alone", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
