#!/usr/bin/env python3
"""Plots and the README results table from the files in bench/results/: `python3 bench/plot.py [--compare FILE]
[--runner FILE] [--ceilings FILE]` (`--table-only`: print it, no matplotlib). Inputs, roofline: bench/README.md.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from fs_results import (CEILING_LABELS, REPO, RESULTS, CeilingsError, MarkerError, backend_label, describe,
                        load_ceilings, load_json, newest, parser, pyplot, same_gpu, save_figure, step_number, timed,
                        update_between_markers)

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
BACKENDS = ("torch_flash", "torch_cudnn", "torch_efficient", "torch_math", "fa4")  # the rows' impl, in table order
RATIOS = (("pct_flash", "torch_flash", "PyTorch flash"), ("pct_cudnn", "torch_cudnn", "cuDNN"), ("pct_fa4", "fa4", "FA4"))


# ---- reading -----------------------------------------------------------------------------------

def shape_of(row: dict) -> tuple:
    return (row["batch"], row["seqlen"], row["heads"], row["head_dim"], bool(row["causal"]), row["dtype"])


def describe_shape(s: dict) -> str:
    return (f"batch {s['batch']} × {s['heads']} heads × seqlen {s['seqlen']} × head_dim {s['head_dim']}, "
            f"{s['dtype']}, {'causal' if s['causal'] else 'not causal'}")


def ceiling_id(unit: str, dtype: str) -> str:
    """The ceilings file's id of a unit at a dtype: fma_f32, mma_sync_f16, wgmma_bf16, ..."""
    return unit if unit == "fma_f32" else f"{unit}_{ {'fp16': 'f16', 'bf16': 'bf16'}.get(dtype, dtype)}"


def tensor_ceilings(ceilings: dict | None, dtype: str) -> list[tuple[str, float, str]]:
    """(label, TFLOP/s, unit) of the tensor-core ceilings for this dtype in the ceilings file, mma.sync first."""
    values = (ceilings or {}).get("values", {})
    return [(CEILING_LABELS[ceiling_id(unit, dtype)], c["value"], unit) for unit in ("mma_sync", "wgmma")
            if (c := values.get(ceiling_id(unit, dtype))) and c["unit"] == "TFLOP/s"]


def label(impl: str, meta: dict | None = None) -> str:
    """A backend's name ("PyTorch SDPA cuDNN", "FA4 4.0.0b36": its version from the results), or the step id."""
    return backend_label(impl.removeprefix("torch_"), (meta or {}).get("environment")) if impl in BACKENDS else impl


# ---- the ladder --------------------------------------------------------------------------------

def ladder_from_compare(compare: dict) -> dict:
    """{"shape", "steps": [row...] in registry order, "backends": {impl: row}} at the ladder shape (the
    backends: SDPA's, kind "torch", and FA4's, kind "fa4")."""
    shape = compare["ladder"]
    rows = [r for r in compare["rows"] if shape_of(r) == shape_of(shape)]
    by_impl = {r["impl"]: r for r in rows}
    step_ids = [s["id"] for s in compare.get("steps", [])] or [r["impl"] for r in rows if r["kind"] == "step"]
    steps = [dict(by_impl[i], id=i) for i in step_ids if i in by_impl]
    backends = {r["impl"]: r for r in rows if r["kind"] != "step"}
    flops = next((r["flops"] for r in rows if r.get("flops")), None)
    return {"shape": shape, "flops": flops, "steps": steps, "backends": backends}


def ladder_from_runner(runner: dict) -> dict:
    """The same from `flash-steps --json` (no PyTorch rows; the cuBLAS baseline is left out)."""
    p = runner["problem"]
    shape = {"batch": p["batch"], "seqlen": p["seqlen_q"], "heads": p["heads_q"], "head_dim": p["head_dim"],
             "causal": bool(p["causal"]), "dtype": p["dtype"]}
    steps = [{"id": r["id"], "impl": r["id"], "status": {"PASS": "ok", "FAIL": "fail"}.get(r["status"], "refused"),
              "reason": r.get("reason", ""), **{k: r.get(k) if r["status"] in ("PASS", "FAIL") else None
                                                for k in ("ms", "tflops", "x_prev", "x_step01")}}
             for r in runner["rows"] if r["id"] != "cublas"]
    return {"shape": shape, "flops": p.get("flops"), "steps": steps, "backends": {}}


def ladder_columns(ladder: dict, ceilings: list[tuple[str, float, str]] = (), rows=None) -> list[dict]:
    """Per step (or row of `rows`) the table's numbers; a % of a ceiling is None off the row's own unit."""
    out = []
    for s in ladder["steps"] if rows is None else rows:
        c = {"id": s.get("id", s["impl"]), "status": s.get("status", ""), "reason": s.get("reason", "")}
        if timed(s):
            ms = s["ms"]
            c.update(ms=ms, tflops=s["tflops"], x_prev=s.get("x_prev") or None, x_01=s.get("x_step01") or None)
            for key, impl, _ in RATIOS:
                base = ladder["backends"].get(impl)
                c[key] = 100 * base["ms"] / ms if timed(base) else None
            unit = compute_unit(c["id"]) if s.get("kind", "step") == "step" else None
            c["pct_ceilings"] = [100 * s["tflops"] / value if u == unit else None for _, value, u in ceilings]
        out.append(c)
    return out


def _f(x, fmt: str, unit: str = "") -> str:
    return "–" if x is None else format(x, fmt) + unit


def _failed_for(ids: list[str], otherwise: str) -> str:
    return "**failed** for " + ", ".join(f"`{i}`" for i in ids) if ids else otherwise


def previous_note(cols: list[dict]) -> str:
    """What "× previous" divides (fs_speedups' rule): the fastest row of the step number before, named where
    that number has more than one row (05 is set against the faster of 04's two layouts)."""
    keys: dict[str, list[dict]] = {}
    for c in cols:
        if "ms" in c and c["id"][:1].isdigit():
            keys.setdefault(step_number(c["id"]), []).append(c)
    order, named = list(keys), []
    for before, after in zip(order, order[1:]):
        if len(keys[before]) > 1:
            best = min(keys[before], key=lambda c: c["ms"])
            rows, these = (" and ".join(f"`{c['id']}`" for c in keys[k]) for k in (before, after))
            named.append(f"{these} against `{best['id']}`, the faster of {rows}")
    return ("× previous: the time of the fastest row of the step number before, over this row's (`fs_speedups`)"
            + ("; " + "; ".join(named) if named else "") + ".")


def ladder_table(ladder: dict, meta: dict, source: str, runner: dict | None = None,
                 images: tuple[str, ...] = (), ceilings: dict | None = None) -> str:
    """The markdown between the README markers. `ceilings`: load_ceilings() of this GPU, or None (no columns)."""
    env, shape = meta.get("environment", {}), ladder["shape"]
    lines = [f"<!-- generated by bench/plot.py from {source}; do not edit by hand -->", ""]
    versions = ", ".join([f"{name} {env[k]}" for k, name in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "PyTorch"),
                                                              ("cudnn", "cuDNN")) if env.get(k)]
                         + [f"FA4 {env.get('fa4')}"] * (env.get("fa4") not in (None, "none")))
    gpu = env.get("gpu") or meta.get("device", "unknown GPU")
    date = meta.get("date", "")
    when = f"{date[:10]} {date[11:16]} UTC" if len(date) >= 16 else (date or "unknown date")
    lines.append(f"**{gpu}**" + (f" ({versions})" if versions else "") +
                 f", {when}, commit `{meta.get('commit', 'unknown')}`.")
    timing = meta.get("timing", {})
    gflop = f"{ladder['flops'] / 1e9:.0f} GFLOP" if ladder.get("flops") else "FLOPs not in the file"
    backends = ladder["backends"]
    others = "PyTorch SDPA" + (" and FlashAttention-4" if "fa4" in backends else "")
    lines.append(f"Shape: {describe_shape(shape)}; {gflop} (4·B·H·N²·d"
                 + (", halved for causal" if shape["causal"] else "") + "). "
                 f"Median of up to {timing.get('iters', '?')} launches, CUDA events, L2 flushed before each"
                 + (f"; {others} timed in the same process on the same tensors." if backends else "."))
    peaks = tensor_ceilings(ceilings, shape["dtype"])
    ratios = [r for r in RATIOS if r[1] != "fa4" or timed(backends.get("fa4"))]
    lines += ["", "| step | ms | TFLOP/s | × previous | × step 01 |" + "".join(f" % of {n} |" for *_, n in ratios)
              + "".join(f" % of {p[0]} |" for p in peaks),
              "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * (len(ratios) + len(peaks))]

    def line(name: str, c: dict, speedups: bool) -> str:
        x = f" {_f(c['x_prev'], '.2f', '×')} | {_f(c['x_01'], '.1f', '×')} |" if speedups else " | |"
        return (f"| {name} | {c['ms']:.3f} | {c['tflops']:.1f} |{x}" + "".join(f" {_f(c[k], '.0f', ' %')} |"
                                                                           for k, *_ in ratios)
                + "".join(f" {_f(v, '.0f', ' %')} |" for v in c["pct_ceilings"]))
    cols = ladder_columns(ladder, peaks)
    lines += [line(f"`{c['id']}`" + (" ✗" if c["status"] == "fail" else ""), c, True) for c in cols if "ms" in c]
    lines += [line(label(c["id"], meta), c, False) for c in
              ladder_columns(ladder, peaks, [backends[i] for i in BACKENDS if i in backends]) if "ms" in c]
    lines.append("")
    if peaks:
        lines.append("Ceilings (" + ", ".join(f"{p[0]} {p[1]:.0f} TFLOP/s" for p in peaks)
                     + f"): measured on this GPU by `flash_steps_ceilings` (`{ceilings['source']}`, commit "
                     f"`{ceilings.get('commit') or 'unknown'}`); each step against the unit it computes on.")
    lines.append(previous_note(cols))
    untimed = [c for c in cols if "ms" not in c]
    if untimed:
        lines.append("Not timed at this shape: " + "; ".join(
            f"`{c['id']}` ({c['status'] or 'not run'}: {c['reason'].rstrip('.')})" for c in untimed) + ".")
    failed = [c["id"] for c in cols if c["status"] == "fail"]
    lines.append(f"Check (fp64 reference, and PyTorch flash where it ran): {_failed_for(failed, 'every timed step passed')}.")
    if runner is not None:
        r_fail = [r["id"] for r in runner.get("rows", []) if r.get("id") != "cublas" and r.get("status") in ("FAIL", "ERROR")]
        lines.append(f"`flash-steps --json` ({describe_shape(ladder_from_runner(runner)['shape'])}, commit "
                     f"`{runner.get('commit', '?')}`): "
                     f"{_failed_for(r_fail, 'every step that ran passed its check against the reference')}.")
    lines += roofline_table(ladder, ceilings)
    alt = {"ladder": "TFLOP/s of every step at this shape", "sweep": "TFLOP/s against seqlen, every step and backend",
           "roofline": "every step against the roofline of the measured ceilings"}
    for img in images:
        lines += ["", f"![{alt.get(Path(img).stem, Path(img).stem)}]({img})"]
    return "\n".join(lines) + "\n"


# ---- the roofline --------------------------------------------------------------------------------
# One hue per unit in every figure: the CUDA cores purple, mma.sync blue, wgmma green.
UNIT_COLORS = {"fma_f32": "tab:purple", "mma_sync": "tab:blue", "wgmma": "tab:green"}


def compute_unit(step_id: str) -> str | None:
    """The unit a step computes on, by its number: 01-05 FP32 FMA on the CUDA cores; 06, 07 (07a-07g), 10 and
    11 mma.sync; 08, 09 (09a-09f), 12 and 13 (Hopper's, sm_90a) wgmma. None for an id without a number (no
    compute ceiling)."""
    if not step_id[:2].isdigit():
        return None
    n = int(step_id[:2])
    return "fma_f32" if n <= 5 else "wgmma" if n in (8, 9, 12, 13) else "mma_sync"


ELEMENT_BYTES = {"fp16": 2, "bf16": 2}
S_PASSES_01 = 6  # note 01: S written by kernel 1, read 3 times and written once by kernel 2, read by kernel 3


def minimum_bytes(shape: dict, step_id: str) -> float:
    """The DRAM bytes a step cannot avoid at this shape: Q, K and V read once and O written once (the
    LSE, 4 bytes per row, is left out: under 0.5 % of them at head_dim >= 64), plus, for step 01, the
    fp32 S matrix it stores, S_PASSES_01 times over. A model, not a measurement."""
    b, n, h, d = shape["batch"], shape["seqlen"], shape["heads"], shape["head_dim"]
    h_kv, n_k = shape.get("heads_kv", h), shape.get("seqlen_k", n)
    total = ELEMENT_BYTES[shape["dtype"]] * d * (2 * b * n * h + 2 * b * n_k * h_kv)
    if step_id.startswith("01"):
        total += S_PASSES_01 * b * h * n * n_k * 4
    return float(total)


def compute_ceiling(ceilings: dict | None, step_id: str, dtype: str) -> tuple[str, float] | None:
    """(label, TFLOP/s) of the unit the step computes on, from the ceilings file, or None."""
    unit = compute_unit(step_id)
    cid = ceiling_id(unit, dtype) if ceilings and unit else None
    c = ceilings["values"].get(cid) if cid else None
    return (CEILING_LABELS.get(cid, cid), c["value"]) if c else None


def roofline_rows(ladder: dict, ceilings: dict | None) -> list[dict]:
    """Per timed step its place under the roof, the lower of HBM × FLOP/byte and its unit's ceiling; [] without
    an hbm_read ceiling."""
    hbm = (ceilings or {}).get("values", {}).get("hbm_read")
    flops = ladder.get("flops")
    if not hbm or not flops:
        return []
    out = []
    for s in filter(timed, ladder["steps"]):
        nbytes = minimum_bytes(ladder["shape"], s["id"])
        ai = flops / nbytes
        memory_roof = ai * hbm["value"]  # TB/s × FLOP/byte = TFLOP/s
        compute = compute_ceiling(ceilings, s["id"], ladder["shape"]["dtype"])
        roof = min(memory_roof, compute[1]) if compute else memory_roof
        out.append({"id": s["id"], "flops": flops, "bytes": nbytes, "intensity": ai, "tflops": s["tflops"],
                    "memory_roof": memory_roof, "compute": compute, "roof": roof,
                    "bound": "memory" if roof == memory_roof else "compute", "pct_roof": 100 * s["tflops"] / roof})
    return out


def roofline_table(ladder: dict, ceilings: dict | None) -> list[str]:
    rows = roofline_rows(ladder, ceilings)
    if not rows:
        return []
    hbm = ceilings["values"]["hbm_read"]["value"]
    lines = ["", "Roofline (`bench/results/roofline.png`): each step against the ceiling of the unit it computes on "
             f"and the HBM roof, {hbm:.2f} TB/s (`hbm_read`) × its FLOP per byte. Bytes: the minimum DRAM traffic, "
             "Q, K, V read once and O written once; step 01 also moves its fp32 S "
             f"{S_PASSES_01} times (written, read 3 times and written by the softmax, read by P·V). "
             "A model, not a measured byte count.", "",
             "| step | GB moved (model) | FLOP / byte | HBM roof TFLOP/s | compute ceiling | % of the lower |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        compute = f"{r['compute'][0]} {r['compute'][1]:.1f}" if r["compute"] else "–"
        lines.append(f"| `{r['id']}` | {r['bytes'] / 1e9:.3f} | {r['intensity']:.0f} | {r['memory_roof']:.0f} | "
                     f"{compute} | {r['pct_roof']:.1f} % |")
    return lines


# ---- plots (matplotlib is imported only here) ---------------------------------------------------

# A ceiling in a dark shade of its unit's hue (UNIT_COLORS): no baseline's colour (FA4 is orange).
CEILING_STYLES = {"mma_sync": {"color": "navy", "linestyle": "-."},
                  "wgmma": {"color": "darkgreen", "linestyle": (0, (1, 1))}}
BACKEND_STYLES = {"torch_flash": {"color": "black", "marker": "s", "linestyle": "--"},
                  "torch_cudnn": {"color": "tab:red", "marker": "^", "linestyle": "--"},
                  "torch_efficient": {"color": "gray", "marker": "v", "linestyle": ":"},
                  "torch_math": {"color": "silver", "marker": "x", "linestyle": ":"},
                  "fa4": {"color": "tab:orange", "marker": "D", "linestyle": "--"}}


# A family of steps a colour map, by the unit it computes on (UNIT_COLORS' hues): the CUDA-core steps 01-05
# in purples, mma.sync's 06-07 (and 10, 11) in blues, wgmma's 08-09 (and 12, 13) in greens, darker the later
# the step, and a marker of its own inside the family, so that two sub-steps of one shade apart can be told
# apart; the baselines keep their own colours (black, red, orange, grey: BACKEND_STYLES).
FAMILY_STYLES = {"fma_f32": "Purples", "mma_sync": "Blues", "wgmma": "Greens"}
STEP_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")


def step_styles(plt, step_ids: list[str]) -> dict[str, dict]:
    """A line style per step: its family's colour map (FAMILY_STYLES) shaded by its place in the family, and
    that place's marker (STEP_MARKERS)."""
    families: dict[str, list[str]] = {}
    for i in step_ids:
        families.setdefault(compute_unit(i) or "mma_sync", []).append(i)
    styles = {}
    for unit, ids in families.items():
        cmap = plt.get_cmap(FAMILY_STYLES[unit])
        for k, i in enumerate(ids):
            styles[i] = {"color": cmap(0.45 + 0.5 * k / max(1, len(ids) - 1)),
                         "marker": STEP_MARKERS[k % len(STEP_MARKERS)], "linestyle": "-"}
    return styles


def plot_sweep(compare: dict, path: Path, ceilings: dict | None = None) -> None:
    """TFLOP/s against seqlen: a panel per (dtype, head_dim, causal), a line per implementation, the ceilings."""
    plt = pyplot()
    rows = [r for r in compare["rows"] if timed(r)]
    panels = sorted({(r["dtype"], -r["head_dim"], bool(r["causal"])) for r in rows})
    if not panels:
        raise ValueError("no timed rows to plot")
    dtypes = sorted({p[0] for p in panels}, key=lambda t: (t != "fp16", t))  # fp16 on top
    combos = sorted({(p[1], p[2]) for p in panels})
    fig, axes = plt.subplots(len(dtypes), len(combos), squeeze=False, sharey=True)  # sized once the legend is known
    step_ids = [s["id"] for s in compare.get("steps", [])]
    impls = step_ids + list(BACKENDS)
    styles = step_styles(plt, step_ids)
    styles.update(BACKEND_STYLES)
    handles = {}
    token_counts = {r["batch"] * r["seqlen"] for r in rows}
    tokens = token_counts.pop() if len(token_counts) == 1 else None
    for a, dtype in enumerate(dtypes):
        for b, (neg_d, causal) in enumerate(combos):
            ax = axes[a][b]
            sel = [r for r in rows if r["dtype"] == dtype and r["head_dim"] == -neg_d and bool(r["causal"]) == causal]
            for impl in impls:
                pts = sorted((r["seqlen"], r["tflops"]) for r in sel if r["impl"] == impl)
                if pts:
                    (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], markersize=4, label=label(impl, compare),
                                      **styles.get(impl, {}))
                    handles.setdefault(impl, line)
            for name, value, unit in tensor_ceilings(ceilings, dtype):
                line = ax.axhline(value, linewidth=0.8, **CEILING_STYLES[unit])
                handles.setdefault(f"{name.split()[0]} ceiling (the panel's dtype)", line)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")  # 01 to FA4 spans nearly three decades; a linear axis flattens steps 01-07
            ticks = sorted({r["seqlen"] for r in rows})
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks], fontsize=8)
            ax.minorticks_off()
            ax.set_title(f"{dtype}, d = {-neg_d}, {'causal' if causal else 'not causal'}", fontsize=10)
            ax.set_xlabel(f"seqlen (B·N = {tokens})" if tokens else "seqlen")
            if b == 0:
                ax.set_ylabel("TFLOP/s (log scale)")
            ax.grid(True, which="both", alpha=0.3)
    order = [i for i in impls if i in handles] + [k for k in handles if k.endswith("ceiling (the panel's dtype)")]
    fig.legend([handles[i] for i in order], [label(i, compare) for i in order], loc="lower center",
               ncol=min(6, len(order)), fontsize=8, frameon=False)
    env = compare.get("environment", {})
    fig.suptitle(f"Forward attention, TFLOP/s — {env.get('gpu', '')}, {compare.get('date', '')[:10]}, "
                 f"commit {compare.get('commit', '')}", fontsize=10)
    legend_in = 0.5 + 0.17 * -(-len(order) // 6)  # the legend's rows, in inches below the panels
    height = 3.6 * len(dtypes) + legend_in
    fig.set_size_inches(4.2 * len(combos), height)
    fig.tight_layout(rect=(0, legend_in / height, 1, 1 - 0.3 / height))
    save_figure(fig, path)


def _title(ladder: dict, meta: dict) -> str:
    return (f"{describe(ladder['shape'])} — {meta.get('environment', {}).get('gpu', meta.get('device', ''))}, "
            f"{meta.get('date', '')[:10]}, {meta.get('commit', '')}")


def plot_ladder(ladder: dict, meta: dict, path: Path, ceilings: dict | None = None) -> None:
    """A bar per step (TFLOP/s, log scale) at the ladder shape; the backends and the ceilings as lines."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter
    cols = [c for c in ladder_columns(ladder) if "ms" in c]
    if not cols:
        raise ValueError("no timed step at the ladder shape")
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(cols) + 2), 4.5))
    xs = range(len(cols))
    # The bars in front of the baselines' lines, each value inside its bar's top, where no line crosses it.
    bars = ax.bar(xs, [c["tflops"] for c in cols], color="tab:blue", zorder=3)
    for bar, c in zip(bars, cols):
        ax.annotate(f"{c['tflops']:.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height() / 1.08),
                    ha="center", va="top", fontsize=8, color="white", zorder=4)
    for impl in ("torch_flash", "torch_cudnn", "fa4"):
        r = ladder["backends"].get(impl)
        if timed(r):
            ax.axhline(r["tflops"], color=BACKEND_STYLES[impl]["color"], linestyle="--", linewidth=1, zorder=1,
                       label=f"{label(impl, meta)}: {r['tflops']:.0f}")
    peaks = tensor_ceilings(ceilings, ladder["shape"]["dtype"])
    for name, value, unit in peaks:
        ax.axhline(value, linewidth=0.8, label=f"{name} ceiling: {value:.0f}", zorder=1, **CEILING_STYLES[unit])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    lowest = min(c["tflops"] for c in cols)
    highest = max([c["tflops"] for c in cols] + [p[1] for p in peaks]
                  + [r["tflops"] for r in ladder["backends"].values() if timed(r)])
    ax.set_ylim(lowest / 2, highest * 8)  # room for the legend above the highest line
    ax.set_xticks(list(xs))
    ax.set_xticklabels([c["id"] for c in cols], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.set_title(_title(ladder, meta), fontsize=9)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def label_heights(ys: list[float], gap: float, top: float = math.inf) -> list[float]:
    """Heights for labels wanted at ys (ascending), at least gap apart and none above top: labels that would
    overlap form a run, spaced by gap and centred on the mean of their points, so that a label stays as near
    its point as its neighbours allow; then the highest labels are pushed down under top, as far as needed."""
    runs: list[list[float]] = []  # each run: the wanted heights of its labels
    for y in ys:
        runs.append([y])
        while len(runs) > 1 and _run_bottom(runs[-2], gap) + gap * len(runs[-2]) > _run_bottom(runs[-1], gap):
            last = runs.pop()
            runs[-1] += last
    heights = [_run_bottom(run, gap) + gap * i for run in runs for i in range(len(run))]
    for i in reversed(range(len(heights))):
        heights[i] = min(heights[i], top if i == len(heights) - 1 else heights[i + 1] - gap)
    return heights


def _run_bottom(run: list[float], gap: float) -> float:
    return sum(run) / len(run) - gap * (len(run) - 1) / 2


def plot_roofline(ladder: dict, meta: dict, path: Path, ceilings: dict | None = None) -> None:
    """Log-log roofline: the roofs of the ceilings file, every timed step at its FLOP per byte, labelled."""
    plt = pyplot()
    rows = roofline_rows(ladder, ceilings)
    if not rows:
        raise ValueError("no hbm_read ceiling or no timed step: nothing to draw a roofline with")
    hbm = ceilings["values"]["hbm_read"]["value"]
    fig, ax = plt.subplots(figsize=(11, 6.5))
    xs = [2.0 ** (k / 8) for k in range(0, 8 * 15 + 1)]  # 1 ... 32768 FLOP/byte
    for unit, color in UNIT_COLORS.items():
        cid = ceiling_id(unit, ladder["shape"]["dtype"])
        c = ceilings["values"].get(cid)
        if c:
            ax.plot(xs, [min(c["value"], x * hbm) for x in xs], color=color, linewidth=1.5,
                    label=f"{CEILING_LABELS.get(cid, cid)} {c['value']:.1f} TFLOP/s, HBM {hbm:.2f} TB/s")
    ax.plot(xs, [x * hbm for x in xs], color="0.6", linestyle=":", linewidth=1)
    groups: dict[float, list[dict]] = {}
    for r in rows:
        groups.setdefault(round(r["intensity"], 6), []).append(r)
    y_lim = (0.3, 4000)
    decade_pt = ax.get_position().height * fig.get_figheight() * 72 / math.log10(y_lim[1] / y_lim[0])
    gap = 1.45 * 7 / decade_pt  # decades between two labels of one column: 1.45 lines of 7-point text
    for column in groups.values():
        column = sorted(column, key=lambda r: r["tflops"])
        wanted = [math.log10(r["tflops"]) for r in column]
        for r, y in zip(column, label_heights(wanted, gap, top=math.log10(y_lim[1]) - gap)):
            color = UNIT_COLORS.get(compute_unit(r["id"]), "black")
            x = r["intensity"]
            ax.plot([x], [r["tflops"]], marker="o", color=color, markersize=5, linestyle="none")
            ax.plot([x, x * 2.2], [r["tflops"], 10 ** y], color=color, linewidth=0.5, zorder=1)  # behind every label
            ax.text(x * 2.2, 10 ** y, f"{r['id']}: {r['tflops']:.1f} ({r['pct_roof']:.1f} % of its roof)", fontsize=7,
                    va="center", color=color, zorder=3, bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(*y_lim)
    ax.set_xlabel("arithmetic intensity: FLOPs over the minimum DRAM bytes (Q, K, V read once, O written once; "
                  "step 01 also its S)", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", frameon=False)
    ax.set_title(f"Roofline: {_title(ladder, meta)}; ceilings {ceilings.get('source', '')}", fontsize=8.5)
    fig.tight_layout()
    save_figure(fig, path, bbox_inches="tight")


# ---- command line ------------------------------------------------------------------------------

def relative(path: Path, base: Path = REPO) -> str:
    """path from base (the repository, or the README that links it), with forward slashes."""
    try:
        return os.path.relpath(Path(path).resolve(), base).replace(os.sep, "/")
    except ValueError:
        return str(path)


def choose_ceilings(explicit: str | None, results: Path, gpu: str) -> dict | None:
    """--ceilings, else the newest ceilings-*.json, loaded if measured on the results' GPU, else None (said on
    stderr); CeilingsError for a --ceilings file that cannot be used."""
    path = Path(explicit) if explicit else newest(results, "ceilings-*.json")
    if path is None:
        print(f"plot.py: no ceilings-*.json in {results} (flash_steps_ceilings measures them on a GPU); "
              "the plots and the table have no ceiling lines or columns", file=sys.stderr)
        return None
    try:
        ceilings = load_ceilings(path)
    except (OSError, ValueError) as e:
        if explicit:
            raise CeilingsError(f"{path}: {e}") from e
        print(f"plot.py: {path} left out ({e}); no ceiling lines or columns", file=sys.stderr)
        return None
    if not same_gpu(ceilings["device"], gpu):
        message = f"{path} was measured on {ceilings['device']}, the results on {gpu}"
        if explicit:
            raise CeilingsError(message)
        print(f"plot.py: {message}; no ceiling lines or columns", file=sys.stderr)
        return None
    for cid, reason in sorted(ceilings["left_out"].items()):
        print(f"plot.py: {path.name} has no {cid} ceiling: {reason}", file=sys.stderr)
    ceilings["source"] = relative(path)
    return ceilings


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--results", default=str(RESULTS), help="where the input files are")
    ap.add_argument("--compare", help="compare_torch JSON (default: the newest compare_torch-<date>.json, not --decode's)")
    ap.add_argument("--runner", help="flash-steps --json output (default: the newest runner-*.json)")
    ap.add_argument("--ceilings", help="flash_steps_ceilings JSON (default: the newest ceilings-*.json)")
    ap.add_argument("--out-dir", help="where the PNGs go (default: --results)")
    ap.add_argument("--readme", default=str(REPO / "README.md"), help="the file whose results markers are rewritten")
    ap.add_argument("--no-readme", action="store_true", help="leave the README alone")
    ap.add_argument("--no-plots", action="store_true",
                    help="tables only (no matplotlib needed); links the PNGs already in --out-dir")
    ap.add_argument("--table-only", action="store_true", help="print the table and change nothing")
    args = ap.parse_args(argv)

    results = Path(args.results)
    compare_path = Path(args.compare) if args.compare else newest(results, "compare_torch-[0-9]*.json")
    runner_path = Path(args.runner) if args.runner else newest(results, "runner-*.json")
    if compare_path is None and runner_path is None:
        print(f"plot.py: no compare_torch-*.json or runner-*.json in {results} (run bench/run_all.sh)",
              file=sys.stderr)
        return 1
    compare = load_json(compare_path) if compare_path else None
    runner = None
    if runner_path:
        try:
            runner = load_json(runner_path)
        except (OSError, ValueError) as e:
            if compare is None:
                raise
            print(f"plot.py: {runner_path} left out: {e}", file=sys.stderr)
    if compare is not None:
        ladder, meta, source = ladder_from_compare(compare), compare, compare_path
    else:
        ladder, meta, source = ladder_from_runner(runner), runner, runner_path
    out_dir = Path(args.out_dir) if args.out_dir else results
    readme = Path(args.readme)
    try:
        ceilings = choose_ceilings(args.ceilings, results, meta.get("environment", {}).get("gpu") or meta.get("device", ""))
    except CeilingsError as e:
        print(f"plot.py: --ceilings {e}", file=sys.stderr)
        return 1

    images = []
    names = ("ladder.png", "roofline.png", "sweep.png")  # in the README's order
    if args.no_plots:  # link the plots already drawn from these files, where they are
        images = [out_dir / n for n in names if (out_dir / n).exists()]
    elif not args.table_only:
        out_dir.mkdir(parents=True, exist_ok=True)
        jobs = [(plot_ladder, (ladder, meta), out_dir / "ladder.png"),
                (plot_roofline, (ladder, meta), out_dir / "roofline.png")]
        if compare is not None:
            jobs.append((plot_sweep, (compare,), out_dir / "sweep.png"))
        for fn, fn_args, path in jobs:
            try:
                fn(*fn_args, path, ceilings)
            except ValueError as e:  # nothing timed to draw: the table still says why
                print(f"plot.py: no {path.name}: {e}", file=sys.stderr)
                continue
            images.append(path)
            print(f"plot.py: wrote {path}", file=sys.stderr)
    table = ladder_table(ladder, meta, relative(source), runner if compare is not None else None,
                         tuple(relative(p, readme.resolve().parent) for p in images), ceilings)
    print(table, end="")
    if args.table_only or args.no_readme:
        return 0
    try:
        changed = update_between_markers(readme, table, BEGIN, END)
    except MarkerError as e:
        print(f"plot.py: {readme}: {e}; add the two lines {BEGIN} and {END} where the results belong",
              file=sys.stderr)
        return 1
    print(f"plot.py: {readme} {'rewritten between the results markers' if changed else 'already up to date'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
