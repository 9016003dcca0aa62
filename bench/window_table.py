#!/usr/bin/env python3
"""Step 13b's measured tables (note 13, "13b — measured" and Appendix F), from the files of one GPU
session: `python3 bench/window_table.py [--sweep DIR] [--compare CSV ...]`. No GPU, PyTorch or matplotlib.

--sweep is a folder of bench/window_sweep.sh (one runner JSON per shape and pass; default
bench/results/window-13b-4aaf4a7). From it: each window's TFLOP/s over 13b's own TFLOP/s without a window
on the same shape (a causal window over full causal, the two-sided (512, 512) over full non-causal),
and 13b without a window over step 09f (forward) or 12c (backward) in the same run. TFLOP/s count the
visible pairs (fs_problem_flops), so a window's row and a full one compare work done per second.

--compare are CSVs of bench/compare_torch.py [--backward] from the same session (default: the
2026-12-06 ones: windows (1024, 0) and (4096, 0), and none, forward and backward). From them: 13b over
FlashAttention-4 (their `x_fa4`), and each implementation's windowed TFLOP/s over its own full causal
ones. Rows below seqlen 4096 are left out (the forward files have one at 2048, not causal).

With explain-13b_window.txt in the sweep folder (`flash-steps explain --step 13b_window` of the same
tree), the forward's K/V visits per query tile at seqlen 16384, and a model with a fixed cost per query
tile fitted to the measured (1024, 0) ratio (note 13, Appendix F): arithmetic, not a profile.

The table rows are printed as the note has them; tests/python/test_window_table.py checks that they are.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from fs_results import RESULTS, parser

SWEEP = RESULTS / "window-13b-4aaf4a7"
COMPARE = ["compare_torch-20261206-014135.csv", "compare_torch_backward-20261206-014151.csv",
           "compare_torch-20261206-014232.csv", "compare_torch-20261206-014251.csv",
           "compare_torch_backward-20261206-014313.csv"]
BASE = {"forward": "09f_persistent", "backward": "12c_bulk_dq"}
STEP = "13b_window"
# The forward's query tile (rows) at these head_dims: step 09's causal tiles, which a window keeps
# (note 13, Appendix A). It turns explain's tiles per head into visits per query tile.
BLOCK_Q = {64: 192, 128: 128}
FA4_COLUMNS = [(128, 4096), (128, 16384), (64, 4096), (64, 16384)]


def band_of(window, causal: bool) -> str:
    """'causal', 'full', or the window as '(L, R)'."""
    if window:
        return "({}, {})".format(*window)
    return "causal" if causal else "full"


def k(n: int) -> str:
    return f"{n // 1024}k"


def load_sweep(folder: Path) -> dict:
    """{(pass, head_dim, seqlen, band): {step id: TFLOP/s}} of every runner JSON in the folder."""
    out = {}
    for f in sorted(folder.glob("*.out")):
        d = json.loads(f.read_text())
        p = d["problem"]
        key = (d.get("mode", "forward"), p["head_dim"], p["seqlen_q"], band_of(p.get("window"), p["causal"]))
        out[key] = {r["id"]: r["tflops"] for r in d["rows"] if r["status"] == "PASS"}
    return out


def load_compare(paths: list[Path]) -> dict:
    """{(pass, impl, head_dim, seqlen, band): row} of compare_torch CSVs, impl as the files name it
    ('13b_window', '13b_window:det', 'fa4', ...)."""
    out = {}
    for path in paths:
        mode = "backward" if "backward" in path.name else "forward"
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["status"] != "ok" or int(r["seqlen"]) < 4096:
                    continue
                window = (r["window_left"], r["window_right"]) if r["window_left"] else None
                out[(mode, r["impl"], int(r["head_dim"]), int(r["seqlen"]), band_of(window, r["causal"] == "True"))] = r
    return out


def window_ratios(s: dict, mode: str, d: int, band: str, base: str) -> list[tuple[int, float]]:
    """[(seqlen, 13b's band TFLOP/s over its base band's)] where the sweep has both."""
    out = []
    for n in sorted({key[2] for key in s}):
        w, f = s.get((mode, d, n, band), {}), s.get((mode, d, n, base), {})
        if STEP in w and STEP in f:
            out.append((n, w[STEP] / f[STEP]))
    return out


def dots(values) -> str:
    return " · ".join(f"{v:.3f}" for v in values)


def span(values) -> str:
    """Lowest–highest of the values."""
    values = list(values)
    return f"{min(values):.3f}–{max(values):.3f}"


def near_one(values) -> int:
    """How many of the values are within 2 % of 1."""
    return sum(abs(v - 1) <= 0.02 for v in values)


def core_table(s: dict, c: dict) -> list[str]:
    """The note's table: (1024, 0) and (4096, 0) over full causal, and 13b over FA4 with (1024, 0)."""
    lines = ["| pass, head_dim | (1024, 0) / causal, N 4k · 8k · 16k | (4096, 0) / causal, 8k · 16k "
             "| 13b / FA4, (1024, 0), 4k · 16k |", "| --- | --- | --- | --- |"]
    for mode in ("forward", "backward"):
        for d in (128, 64):
            fa4 = [float(c[key]["x_fa4"]) for n in (4096, 16384) if (key := (mode, STEP, d, n, "(1024, 0)")) in c]
            lines.append(f"| {mode}, {d} | {dots(r for _, r in window_ratios(s, mode, d, '(1024, 0)', 'causal'))} | "
                         f"{dots(r for _, r in window_ratios(s, mode, d, '(4096, 0)', 'causal'))} | {dots(fa4)} |")
    return lines


def ranges(s: dict) -> list[str]:
    """Each band's lowest and highest ratio over its base (window / full), (512, 512) over full per shape, and
    13b features-off over 09f / 12c."""
    lines = ["window / full (causal; (512, 512): non-causal), seqlen 4096 and above, lowest–highest:"]
    for band, base in (("(1024, 0)", "causal"), ("(4096, 0)", "causal"), ("(512, 512)", "full")):
        rs = [r for mode in ("forward", "backward") for d in (128, 64) for _, r in window_ratios(s, mode, d, band, base)]
        lines.append(f"  {band}: {span(rs)} over {len(rs)} shapes")
    lines += ["", "(512, 512) / full, N 4k · 8k · 16k:"]
    for mode in ("forward", "backward"):
        for d in (128, 64):
            lines.append(f"  {mode}, head_dim {d}: {dots(r for _, r in window_ratios(s, mode, d, '(512, 512)', 'full'))}")
    lines += ["", f"{STEP} without a window over step 09f (forward) or 12c (backward), same run:"]
    both = []
    for mode in ("forward", "backward"):
        rs = [(rows[STEP] / rows[BASE[mode]], f"head_dim {d}, {k(n)}, {band}")
              for (m, d, n, band), rows in sorted(s.items())
              if m == mode and band in ("causal", "full") and BASE[mode] in rows and STEP in rows]
        outside = "; ".join(f"{r:.3f} ({what})" for r, what in rs if abs(r - 1) > 0.02)
        lines.append(f"  {mode}: {span(r for r, _ in rs)}, {near_one(r for r, _ in rs)} of {len(rs)} within 2 %"
                     + (f"; outside: {outside}" if outside else ""))
        both += rs
    lines.append(f"  both: {span(r for r, _ in both)}, {near_one(r for r, _ in both)} of {len(both)} within 2 %")
    return lines


def fa4_table(c: dict) -> list[str]:
    head = " | ".join(f"d{d} {k(n)}" for d, n in FA4_COLUMNS)
    lines = [f"| pass | band | ratio | {head} |", "| --- | --- | --- |" + " --- |" * len(FA4_COLUMNS)]
    for mode, impls in (("forward", [STEP]), ("backward", [STEP, STEP + ":det"])):
        for band in ("(1024, 0)", "(4096, 0)", "causal"):
            for impl in impls:
                cells = [c[key]["x_fa4"] for d, n in FA4_COLUMNS if (key := (mode, impl, d, n, band)) in c]
                if cells:
                    label = "13b / FA4" + (", deterministic" if impl.endswith(":det") else "")
                    lines.append(f"| {mode} | {band} | {label} | " + " | ".join(f"{float(x):.3f}" for x in cells) + " |")
            if band == "causal":
                continue
            for impl, label in (("fa4", "FA4: band / its full causal"), (STEP, "13b: band / its full causal")):
                cells = []
                for d, n in FA4_COLUMNS:
                    w, f = c.get((mode, impl, d, n, band)), c.get((mode, impl, d, n, "causal"))
                    cells.append(f"{float(w['tflops']) / float(f['tflops']):.3f}" if w and f else "–")
                if any(x != "–" for x in cells):
                    lines.append(f"| {mode} | {band} | {label} | " + " | ".join(cells) + " |")
    return lines


def explain_rows(text: str) -> dict:
    """{(head_dim, band): (tiles visited, masked, visible share of the computed scores)} of explain's
    "Seqlen 16384, one head" table."""
    rows = {}
    for m in re.finditer(r"^\s+(\d+)\s+(causal \((\d+), 0\)|causal|full \(512, 512\)|full)\s+(\d+) \((\d+)\)\s+([\d.]+) %",
                         text, re.M):
        band = f"({m[3]}, 0)" if m[3] else ("(512, 512)" if "512" in m[2] else m[2])
        rows[(int(m[1]), band)] = (int(m[4]), int(m[5]), float(m[6]) / 100)
    return rows


def model_table(text: str, s: dict, n: int = 16384) -> list[str]:
    """A query tile costs x + v (x a fixed cost, v its K/V visits, in visits): a band's TFLOP/s over causal
    is (s_b v_b) / (s_c v_c) · (x + v_c) / (x + v_b). x solves that for the measured (1024, 0) ratio; the
    last column is what it predicts for (4096, 0) beside the measurement."""
    rows = explain_rows(text)
    bands = ("causal", "(1024, 0)", "(4096, 0)")
    lines = ["| head_dim | visits per query tile: causal · (1024, 0) · (4096, 0) | of them masked "
             "| (1024, 0) / causal: x = 0 · measured | x | (4096, 0) / causal: predicted · measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    for d in (128, 64):
        if not all((d, b) in rows for b in bands):
            continue
        q_tiles = -(-n // BLOCK_Q[d])
        v = {b: rows[(d, b)][0] / q_tiles for b in bands}
        masked = {b: rows[(d, b)][1] / q_tiles for b in bands}
        share = {b: rows[(d, b)][2] for b in bands}
        causal = s.get(("forward", d, n, "causal"), {}).get(STEP)
        measured = {b: s.get(("forward", d, n, b), {}).get(STEP) for b in bands[1:]}
        if not (causal and all(measured.values())):
            continue
        work = {b: share[b] * v[b] / (share["causal"] * v["causal"]) for b in bands[1:]}
        def predicted(b, x):
            return work[b] * (x + v["causal"]) / (x + v[b])
        r = measured["(1024, 0)"] / causal
        a = r / work["(1024, 0)"]                      # (x + v_c) / (x + v_b) must equal a
        x = (v["causal"] - a * v["(1024, 0)"]) / (a - 1)
        lines.append(f"| {d} | {' · '.join(f'{v[b]:.1f}' for b in bands)} | {' · '.join(f'{masked[b]:.2f}' for b in bands)} "
                     f"| {predicted('(1024, 0)', 0.0):.3f} · {r:.3f} | {x:.1f} "
                     f"| {predicted('(4096, 0)', x):.3f} · {measured['(4096, 0)'] / causal:.3f} |")
    return lines


def report(sweep: Path, compare: list[Path]) -> str:
    s = load_sweep(sweep)
    c = load_compare(compare)
    out = ["13b with a window over 13b without, same shape and run (TFLOP/s on visible pairs), and over "
           "FlashAttention-4:", ""] + core_table(s, c) + [""] + ranges(s)
    if c:
        out += ["", "Against FlashAttention-4, compare_torch.py of the same session:", ""] + fa4_table(c)
    explain = sweep / "explain-13b_window.txt"
    if explain.is_file():
        out += ["", "Forward, seqlen 16384: visits per query tile (explain) and a fixed cost x per query tile:", ""]
        out += model_table(explain.read_text(), s)
    return "\n".join(out)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sweep", default=str(SWEEP), help="a folder of bench/window_sweep.sh (default: %(default)s)")
    ap.add_argument("--compare", nargs="*", default=[str(RESULTS / f) for f in COMPARE],
                    help="compare_torch CSVs of the same session (default: the 2026-12-06 ones)")
    args = ap.parse_args(argv)
    print(report(Path(args.sweep), [Path(p) for p in args.compare]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
