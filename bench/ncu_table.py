#!/usr/bin/env python3
"""The Nsight Compute metrics the notes cite (`--list-metrics`, `--drop-unknown LOG`), and a table of them:
`python3 bench/ncu_table.py REPORT.csv [--csv-out FILE]` on `ncu --csv --page raw` output (bench/profile.sh).
"""
from __future__ import annotations

import csv
import re
import sys

from fs_results import parser

# (metric, what the notes call it). Names checked against Nsight Compute 2025.x metric lists.
METRICS = [
    ("gpu__time_duration.sum", "duration"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput, % of peak"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak"),
    ("dram__bytes_read.sum", "DRAM bytes read"),
    ("dram__bytes_write.sum", "DRAM bytes written"),
    ("lts__t_bytes.sum", "L2 bytes"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe (HMMA) active, %"),
    ("smsp__inst_executed_pipe_tensor_op_hmma.sum", "HMMA instructions"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "shared load wavefronts"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "shared load bank conflicts"),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "shared store wavefronts"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "shared store bank conflicts"),
    ("sm__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum", "ldmatrix wavefronts"),
    ("sm__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum", "ldmatrix bank conflicts"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "local-memory bytes loaded (spills)"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "local-memory bytes stored (spills)"),
    ("smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct", "stall: long scoreboard, % of warp cycles"),
    ("smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct", "stall: short scoreboard, %"),
    ("smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct", "stall: MIO throttle, %"),
    ("smsp__warp_issue_stalled_barrier_per_warp_active.pct", "stall: barrier, %"),
    ("smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct", "stall: math pipe throttle, %"),
    ("smsp__warp_issue_stalled_wait_per_warp_active.pct", "stall: wait, %"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue slots busy, %"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy, %"),
    ("sm__maximum_warps_per_active_cycle_pct", "theoretical occupancy, %"),
    ("launch__registers_per_thread", "registers / thread"),
    ("launch__shared_mem_per_block_static", "static shared memory / block"),
    ("launch__shared_mem_per_block_dynamic", "dynamic shared memory / block"),
    ("launch__block_size", "block size"),
    ("launch__grid_size", "grid size"),
    ("launch__occupancy_limit_registers", "block limit: registers"),
    ("launch__occupancy_limit_shared_mem", "block limit: shared memory"),
]


def drop_unknown(names: list[str], log: str) -> list[str]:
    """The names that no ==ERROR== line of ncu's log mentions."""
    errors = [line for line in log.splitlines() if "==ERROR==" in line]
    return [n for n in names if not any(n in line or re.search(r"\b" + re.escape(n.split(".")[0]) + r"\b", line)
                                        for line in errors)]


def number(text: str):
    """ncu prints 1,234,567 or 12.5 or n/a; returns a float, or the text when it is not a number."""
    t = text.strip()
    if re.fullmatch(r"-?[\d,]+(\.\d+)?([eE][-+]?\d+)?", t):
        return float(t.replace(",", ""))
    return t


def parse_raw_csv(text: str) -> tuple[list[dict], dict]:
    """`ncu --import R --csv --page raw`: rows (one per profiled launch) and the units row."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # drops ==PROF== lines and app output
    reader = list(csv.reader(lines))
    if len(reader) < 2:
        return [], {}
    header, units = reader[0], reader[1]
    has_units = not any(isinstance(number(u), float) for u in units if u.strip())
    data = reader[2:] if has_units else reader[1:]
    unit_of = dict(zip(header, units)) if has_units else {}
    return [dict(zip(header, r)) for r in data if len(r) == len(header)], unit_of


def last_launch_per_kernel(rows: list[dict]) -> list[dict]:
    """The runner launches a step once to check it and once to time it: the last launch of each kernel,
    in the order the kernels first ran."""
    def launch_id(r):
        v = number(r.get("ID", ""))
        return v if isinstance(v, float) else 0.0
    return list({r.get("Kernel Name", "?"): r for r in sorted(rows, key=launch_id)}.values())


def human(value, unit: str) -> str:
    if not isinstance(value, float):
        return value or "–"
    if unit in ("nsecond", "ns"):
        return f"{value / 1e3:.1f} us" if value < 1e6 else f"{value / 1e6:.3f} ms"
    if unit in ("usecond", "us"):
        return f"{value:.1f} us" if value < 1e3 else f"{value / 1e3:.3f} ms"
    if unit in ("msecond", "ms"):
        return f"{value:.3f} ms"
    if unit in ("byte", "Kbyte", "Mbyte", "Gbyte"):
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}[unit]
        b = value * scale
        for div, suffix in ((1e9, " GB"), (1e6, " MB"), (1e3, " kB")):
            if b >= div:
                return f"{b / div:.2f}{suffix}"
        return f"{b:.0f} B"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def table(rows: list[dict], units: dict, metrics=METRICS) -> str:
    kernels = last_launch_per_kernel(rows)
    if not kernels:
        return "no kernel was profiled (did the step refuse the shape, or did the kernel filter match nothing?)\n"
    names = [k.get("Kernel Name", "?") for k in kernels]
    width = max(len(label) for _, label in metrics) + 2
    colw = max(16, max(len(n) for n in names) + 2)
    out = [f"{'metric':{width}}" + "".join(f"{n:>{colw}}" for n in names)]
    for m, label in metrics:
        if not any(m in k for k in kernels):
            continue
        out.append(f"{label:{width}}" + "".join(f"{human(number(k.get(m, '')), units.get(m, '')):>{colw}}"
                                                   for k in kernels))
    missing = [m for m, _ in metrics if not any(m in k for k in kernels)]
    if missing:
        out.append("not collected: " + ", ".join(missing))
    return "\n".join(out) + "\n"


def tidy_csv(rows: list[dict], units: dict, path: str, metrics=METRICS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "id", "metric", "label", "unit", "value"])
        for k in last_launch_per_kernel(rows):
            for m, label in metrics:
                if m in k:
                    v = number(k[m])
                    w.writerow([k.get("Kernel Name", "?"), k.get("ID", ""), m, label, units.get(m, ""),
                                f"{v:g}" if isinstance(v, float) else v])


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("report", nargs="?", help="CSV from `ncu --import R.ncu-rep --csv --page raw`")
    ap.add_argument("--csv-out", help="also write kernel, metric, unit, value rows here")
    ap.add_argument("--list-metrics", action="store_true")
    ap.add_argument("--metrics", help="comma-separated metric list (default: the built-in one)")
    ap.add_argument("--drop-unknown", metavar="LOG", help="print the metric list less the ones ncu's log rejected")
    args = ap.parse_args(argv)
    labels = dict(METRICS)
    metrics = [(n, labels.get(n, n)) for n in (args.metrics.split(",") if args.metrics else labels) if n]
    if args.list_metrics:
        print(",".join(n for n, _ in metrics))
        return 0
    if args.drop_unknown:
        with open(args.drop_unknown, errors="replace") as f:
            print(",".join(drop_unknown([n for n, _ in metrics], f.read())))
        return 0
    if not args.report:
        ap.error("give a report CSV, --list-metrics or --drop-unknown")
    with open(args.report, errors="replace") as f:
        rows, units = parse_raw_csv(f.read())
    print(table(rows, units, metrics), end="")
    if args.csv_out:
        tidy_csv(rows, units, args.csv_out, metrics)
        print(f"ncu_table.py: wrote {args.csv_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
