#!/usr/bin/env python3
"""The pictures of the notes, drawn from the steps' own index math: `python3 bench/figures.py [--only 04 06]
[--out-dir DIR] [--runner PATH]` writes notes/figures/*.png. How the maps are the steps' own: bench/README.md.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

from fs_results import REPO, RESULTS, hbm_ceiling, key_band, parser, pyplot, save_figure

OUT = REPO / "notes" / "figures"

# ---- causal alignment (common/flash_steps.h; PyTorch's is_causal=True) ---------------------------

def sees(i: int, j: int, seqlen_q: int, seqlen_k: int, align: str) -> bool:
    """Whether query row i may attend to key j. "bottom-right": this project, FlashAttention >= 2.1
    (j <= i + seqlen_k - seqlen_q); "top-left": PyTorch SDPA's is_causal=True and the CuTe-DSL
    FlashAttention-2 example (j <= i)."""
    return j <= (i + seqlen_k - seqlen_q if align == "bottom-right" else i)


# ---- the online softmax (notes/02) --------------------------------------------------------------

def online_states(scores, values):
    """The state (m, l, o) after each key of the recurrence of note 02, one scalar value per key."""
    m, l, o, out = -math.inf, 0.0, 0.0, []
    for s, v in zip(scores, values):
        m_new = max(m, s)
        c = math.exp(m - m_new)  # exp(-inf) = 0 at the first key
        l = l * c + math.exp(s - m_new)
        o = o * c + math.exp(s - m_new) * v
        m = m_new
        out.append((m, l, o))
    return out


def merge(a, b):
    """The state of the union of two disjoint sets of keys (note 02's exercise)."""
    m = max(a[0], b[0])
    ca, cb = math.exp(a[0] - m), math.exp(b[0] - m)
    return m, a[1] * ca + b[1] * cb, a[2] * ca + b[2] * cb


ELL = r"$\ell$"  # DejaVu Sans has no ℓ; mathtext draws it
EXAMPLE_SCORES = [0.5, 2.0, 1.0, 3.0, 0.2, 2.5, 3.5, 1.5]
EXAMPLE_VALUES = [1.0, -1.0, 2.0, 0.0, 3.0, 1.0, -2.0, 1.0]


# ---- step 03's thread grid (steps/03_smem_tiling/traits.h, Traits<128>) --------------------------

class Step03:
    HEAD_DIM, BLOCK_Q, BLOCK_KV, NUM_THREADS, GROUP = 128, 64, 64, 256, 16
    ROW_GROUPS = NUM_THREADS // GROUP                                    # 16
    THREAD_ROWS, THREAD_COLS = BLOCK_Q // ROW_GROUPS, HEAD_DIM // GROUP  # 4, 8
    q_row = staticmethod(lambda t, i: t // Step03.GROUP + Step03.ROW_GROUPS * i)
    key = staticmethod(lambda t, j: t % Step03.GROUP + Step03.GROUP * j)
    o_col = staticmethod(lambda t: t % Step03.GROUP * Step03.THREAD_COLS)


def _owner_map(cols: int, column):
    """[BLOCK_Q][cols]: thread t at rows q_row(t, i), i < THREAD_ROWS, and columns column(t, j), j < cols/GROUP."""
    owner = [[-1] * cols for _ in range(Step03.BLOCK_Q)]
    for t in range(Step03.NUM_THREADS):
        for i in range(Step03.THREAD_ROWS):
            for j in range(cols // Step03.GROUP):
                owner[Step03.q_row(t, i)][column(t, j)] = t
    return owner


def s_owner_map():
    """[64][64]: the thread that computes each element of the block's S tile (q_row x key)."""
    return _owner_map(Step03.BLOCK_KV, Step03.key)


def o_owner_map():
    """[64][HEAD_DIM]: the thread that accumulates each element of the block's O tile."""
    return _owner_map(Step03.HEAD_DIM, lambda t, c: Step03.o_col(t) + c)


# ---- shared-memory layouts and banks (steps/03 and 04 traits.h; common/bank_model.h) -------------

LAYOUTS = ("row-major", "padded", "swizzled")


def layout_offset(layout: str, row: int, col: int, cols: int = 128) -> int:
    """Element offset of (row, col) in a [rows, cols] tile of 2-byte elements: RowMajorLayout
    (steps/03_smem_tiling/traits.h), Padded16Layout = PaddedLayout<COLS, 8> and Swizzled128Layout
    (steps/04_bank_conflicts/traits.h)."""
    if layout == "row-major":
        return row * cols + col
    if layout == "padded":
        return row * (cols + 8) + col
    if layout == "swizzled":
        chunk = col // 8
        return row * cols + ((chunk ^ (row % 8)) * 8) + col % 8
    raise ValueError(layout)


def bank_of(byte_address: int) -> int:
    return byte_address // 4 % 32


def bank_map(layout: str, rows: int = 8, cols: int = 128):
    """[rows][cols/8]: the first bank of each 16-byte chunk, as `flash-steps banks` prints it."""
    return [[bank_of(layout_offset(layout, r, 8 * c, cols) * 2) for c in range(cols // 8)] for r in range(rows)]


def wavefronts(byte_addresses, width: int) -> int:
    """common/bank_model.h's rule for one warp instruction: lanes are served in phases of 128 bytes
    (32, 16 or 8 lanes for 4-, 8- or 16-byte accesses); a phase takes as many wavefronts as the
    most distinct 4-byte words any one bank must deliver."""
    per_phase = 128 // width
    total = 0
    for p in range(0, len(byte_addresses), per_phase):
        words = {}
        for a in byte_addresses[p:p + per_phase]:
            for w in range(a // 4, (a + width) // 4):
                words.setdefault(w % 32, set()).add(w)
        total += max(len(s) for s in words.values())
    return total


def k_read_wavefronts(layout: str, chunk: int = 0) -> int:
    """Step 03/04's read of K in S = Q·Kᵀ by one warp: lane l reads 16 bytes of key key(l, 0) at
    column 8·chunk (lanes l and l + 16 read the same address)."""
    return wavefronts([layout_offset(layout, Step03.key(l, 0), 8 * chunk) * 2 for l in range(32)], 16)


# ---- mma.sync.m16n8k16 fragments and ldmatrix (steps/06_ldmatrix_mma/traits.h, frag::) -----------


def mma_a(lane, reg, half):
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 8 * (reg // 2) + 2 * t + half


def mma_b(lane, reg, half):
    g, t = lane // 4, lane % 4
    return 8 * reg + 2 * t + half, g


def mma_c(lane, i):
    g, t = lane // 4, lane % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def ldmatrix_x4_quadrants(lane):
    m = lane // 8
    return 8 * (m % 2) + lane % 8, 8 * (m // 2)


def lane_grid(rows, cols, cells):
    """[rows][cols] of (lane, label) from an iterable of (lane, label, (row, col))."""
    grid = [[None] * cols for _ in range(rows)]
    for lane, label, (r, c) in cells:
        grid[r][c] = (lane, label)
    return grid


def c_fragment():
    return lane_grid(16, 8, ((l, f"d{i}", mma_c(l, i)) for l in range(32) for i in range(4)))


def a_fragment():
    return lane_grid(16, 16, ((l, f"a{r}", mma_a(l, r, h)) for l in range(32) for r in range(4) for h in range(2)))


def b_fragment():
    return lane_grid(16, 8, ((l, f"b{r}", mma_b(l, r, h)) for l in range(32) for r in range(2) for h in range(2)))


# ---- step 07's work split (steps/07_flash_attention2/traits.h) -----------------------------------


def kv_tiles_for(q0, q_rows, block_kv, seqlen_q, seqlen_k, causal):
    """(count, unmasked): tiles [0, count) hold a key some row of the query tile may see, tiles
    [0, unmasked) only keys every row sees."""
    end = full = seqlen_k
    if causal:
        diagonal = seqlen_k - seqlen_q
        last_row_end, first_row_end = q0 + q_rows + diagonal, q0 + 1 + diagonal
        end = min(max(last_row_end, 0), seqlen_k)
        full = min(max(first_row_end, 0), seqlen_k)
    return (end + block_kv - 1) // block_kv, full // block_kv


def block_tile(block, q_tiles):
    """(head, query tile) of block x of the 1-D grid (07b on): a head's tiles together, the last first."""
    return block // q_tiles, q_tiles - 1 - block % q_tiles


def tile_classes(seqlen_q, seqlen_k, block_q, block_kv, causal):
    """[query tile][kv tile] -> ("skipped" | "masked" | "full", visit number or None), 07b's order:
    a query tile visits kv tiles count - 1 down to 0, the masked ones first."""
    q_tiles = (seqlen_q + block_q - 1) // block_q
    k_tiles = (seqlen_k + block_kv - 1) // block_kv
    out = []
    for qt in range(q_tiles):
        q0 = qt * block_q
        count, unmasked = kv_tiles_for(q0, min(block_q, seqlen_q - q0), block_kv, seqlen_q, seqlen_k, causal)
        row = []
        for kt in range(k_tiles):
            if kt >= count:
                row.append(("skipped", None))
            else:
                row.append(("masked" if kt >= unmasked else "full", count - 1 - kt))
        out.append(row)
    return out


# ---- drawing (matplotlib is imported only here) ---------------------------------------------------

FIGURES: dict[str, list] = {}  # "NN" -> the functions that draw note NN's figures, each fn(out, runner)


class Unavailable(Exception):
    """What a figure is drawn from is not there; the message says what is missing and how to get it."""


def _drawn(name: str, *grid, rect=None, source=None, **kw):
    """Makes draw(fig, axes) a figure of note name[:2]: fn(out, runner) draws it on pyplot().subplots(*grid, **kw),
    lays it out within rect and writes out/name. With a source, draw(fig, axes, source(runner)) draws what the
    flash-steps runner at `runner` prints, and a source that raises Unavailable leaves the figure out, saying why."""
    def wrap(draw):
        def fn(out: Path, runner: str | None = None):
            try:
                data = () if source is None else (source(runner),)
            except Unavailable as e:
                print(f"figures.py: {name} not drawn: {e}", file=sys.stderr)
                return
            fig, axes = pyplot().subplots(*grid, **kw)
            draw(fig, axes, *data)
            fig.tight_layout(rect=rect)
            save_figure(fig, out / name, bbox_inches="tight", pad_inches=0.15)
            print(f"figures.py: wrote {out / name}", file=sys.stderr)
        FIGURES.setdefault(name[:2], []).append(fn)
        return fn
    return wrap


def _box(ax, x, y, width=1, height=1, **style):
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((x, y), width, height, **style))


def _shade(ax, values, colors):
    """values[r][c], 0 to 7, as cells of the 8 colors, row 0 on top."""
    from matplotlib.colors import ListedColormap
    ax.imshow(values, cmap=ListedColormap(colors[:8]), vmin=-0.5, vmax=7.5, extent=(0, len(values[0]), len(values), 0),
              interpolation="nearest")


def _canvas(ax, xlim, ylim):
    """A drawing area without axes, x over xlim and y over ylim (a descending ylim puts its first value at the
    bottom: y grows downwards)."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")


def _grid_axes(ax, rows, cols, xlabel, ylabel, step_x=1, step_y=1, ylabels=None, aspect="equal"):
    """Axes over rows x cols unit cells, row 0 on top, every step_x-th column and step_y-th row numbered."""
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect(aspect)
    ax.set_xticks([c + 0.5 for c in range(0, cols, step_x)])
    ax.set_xticklabels([str(c) for c in range(0, cols, step_x)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(0, rows, step_y)])
    ax.set_yticklabels(ylabels or [str(r) for r in range(0, rows, step_y)], fontsize=7)
    if xlabel is not None:
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(length=0)


@_drawn("01_causal_alignment.png", 2, 2, figsize=(9.5, 6.8), rect=(0, 0, 1, 0.96))
def fig_01(fig, axes):
    """Causal alignment when seqlen_q != seqlen_k."""
    cases = [(3, 5, "bottom-right"), (3, 5, "top-left"), (5, 3, "bottom-right"), (5, 3, "top-left")]
    names = {"bottom-right": "this project, FlashAttention ≥ 2.1:\nbottom-right, j ≤ i + Sk − Sq",
             "top-left": "PyTorch SDPA is_causal=True, CuTe-DSL example:\ntop-left, j ≤ i"}
    for ax, (sq, sk, align) in zip(axes.flat, cases):
        for i in range(sq):
            visible = [sees(i, j, sq, sk, align) for j in range(sk)]
            for j in range(sk):
                _box(ax, j, i, facecolor="tab:blue" if visible[j] else "0.9", edgecolor="white", linewidth=2)
            if not any(visible):
                ax.text(sk / 2, i + 0.5, "no key: O = 0, LSE = −inf", ha="center", va="center", fontsize=8,
                        color="tab:red")
        _grid_axes(ax, sq, sk, "key j", "query i")
        ax.set_title(f"Sq = {sq}, Sk = {sk} — {names[align]}", fontsize=8.5)
    fig.suptitle("Causal masks with seqlen_q ≠ seqlen_k: blue = query row i sees key j", fontsize=10)


@_drawn("02_online_softmax.png", 1, 2, figsize=(11.5, 4.2), gridspec_kw={"width_ratios": [1.25, 1]})
def fig_02(fig, axes):
    """The online-softmax state key by key, and the merge of two states."""
    (ax1, ax2), s, v = axes, EXAMPLE_SCORES, EXAMPLE_VALUES
    states = online_states(s, v)
    xs = list(range(len(s)))
    ax1.bar(xs, s, color="0.75", label="score sⱼ (already scaled)")
    ms = [st[0] for st in states]
    ax1.step(xs, ms, where="mid", color="tab:red", linewidth=2, label="running max mⱼ")
    prev = -math.inf
    for j, m in enumerate(ms):
        if m > prev and j > 0:
            ax1.annotate(f"rescale ×e^({prev:g}−{m:g})\n= {math.exp(prev - m):.3f}", (j, m), xytext=(0, 14),
                         textcoords="offset points", ha="center", fontsize=7, color="tab:red")
        prev = m
    for j, (m, l, o) in enumerate(states):
        ax1.text(j, -0.55, f"{ELL}={l:.3f}\nõ={o:.3f}", ha="center", va="top", fontsize=6.5)
    ax1.set_xticks(xs)
    ax1.set_xticklabels([f"key {j}" for j in xs], fontsize=7)
    ax1.set_ylim(-1.6, 5.0)
    ax1.axhline(0, color="black", linewidth=0.5)
    ax1.set_title(f"One pass over the keys: the state (mⱼ, {ELL}ⱼ, õⱼ) after each key\n"
                  "(the factor is exactly 1 wherever the max did not grow)", fontsize=9)
    ax1.legend(fontsize=7, loc="upper left", frameon=False)

    a = online_states(s[:4], v[:4])[-1]
    b = online_states(s[4:], v[4:])[-1]
    merged = merge(a, b)
    whole = states[-1]
    ax2.axis("off")
    lines = [
        ("keys 0–3 → state A", f"m_a = {a[0]:g}   {ELL}_a = {a[1]:.4f}   õ_a = {a[2]:.4f}", "tab:blue"),
        ("keys 4–7 → state B", f"m_b = {b[0]:g}   {ELL}_b = {b[1]:.4f}   õ_b = {b[2]:.4f}", "tab:green"),
        ("merge", f"m = max(m_a, m_b)\n{ELL} = {ELL}_a·e^(m_a−m) + {ELL}_b·e^(m_b−m)\nõ = õ_a·e^(m_a−m) + õ_b·e^(m_b−m)", "black"),
        ("merged", f"m = {merged[0]:g}   {ELL} = {merged[1]:.4f}   õ = {merged[2]:.4f}", "tab:purple"),
        ("one pass, keys 0–7", f"m = {whole[0]:g}   {ELL} = {whole[1]:.4f}   õ = {whole[2]:.4f}", "tab:red"),
        ("result", f"O = õ / {ELL} = {whole[2] / whole[1]:.4f},   LSE = m + log {ELL} = {whole[0] + math.log(whole[1]):.4f}",
         "black"),
    ]
    y = 0.95
    for head, body, color in lines:
        ax2.text(0.0, y, head, fontsize=8.5, fontweight="bold", color=color, va="top", transform=ax2.transAxes)
        ax2.text(0.0, y - 0.06, body, fontsize=8, family="monospace", va="top", transform=ax2.transAxes)
        y -= 0.13 + 0.045 * body.count("\n")
    ax2.set_title("Two disjoint sets of keys, merged: the same state as one pass\n"
                  "(vⱼ = " + ", ".join(f"{x:g}" for x in v) + ")", fontsize=9)


@_drawn("03_thread_grid.png", 1, 3, figsize=(16, 5.8), gridspec_kw={"width_ratios": [1, 1, 2]}, rect=(0, 0, 1, 0.95))
def fig_03(fig, axes):
    """Step 03's 16 x 16 thread grid over S and O."""
    (ax1, ax2, ax3), s_owner, o_owner = axes, s_owner_map(), o_owner_map()
    highlight = {0: "tab:red", 17: "tab:blue"}
    for ax, owner, numbered in ((ax1, s_owner, False), (ax2, [row[:16] for row in s_owner[:16]], True),
                                (ax3, o_owner, False)):  # ax2: the corner of S, each element's thread written
        _shade(ax, [[t // 32 for t in row] for row in owner], pyplot().get_cmap("Pastel2").colors)  # the warps
        for r, row in enumerate(owner):
            for c, t in enumerate(row):
                if t in highlight:
                    _box(ax, c, r, facecolor=highlight[t], edgecolor="none")
                if numbered:
                    ax.text(c + 0.5, r + 0.5, str(t), ha="center", va="center", fontsize=5.5,
                            color="white" if t in highlight else "black")
    _grid_axes(ax1, Step03.BLOCK_Q, Step03.BLOCK_KV, "key (column of S)", "query row", step_x=8, step_y=8)
    _grid_axes(ax2, 16, 16, "key", "query row")
    _grid_axes(ax3, Step03.BLOCK_Q, Step03.HEAD_DIM, "head dim (column of O)", "query row", step_x=16, step_y=8)
    ax1.set_title("S [64 × 64]: thread t computes rows t/16 + 16i\nand keys t%16 + 16j, i, j = 0..3\n"
                  "(red: thread 0, blue: thread 17; colour: warp)", fontsize=8.5)
    ax2.set_title("S, rows 0–15 × keys 0–15: the thread of each\nelement; a row belongs to one half-warp,\n"
                  "a key to one thread of each half-warp", fontsize=8.5)
    ax3.set_title("O [64 × 128] (head_dim 128): thread t accumulates its 4 rows ×\ncolumns 8·(t%16) … +7: "
                  "a half-warp covers whole rows of O", fontsize=8.5)
    fig.suptitle("Step 03: the block's 256 threads as a 16 × 16 grid (q_row, key and o_col of "
                 "steps/03_smem_tiling/traits.h)", fontsize=10)


@_drawn("04_bank_maps.png", 1, 3, figsize=(13, 5.0), rect=(0, 0, 1, 0.9))
def fig_04(fig, axes):
    """Bank groups of a K tile under the three layouts, and the K read of one phase."""
    titles = {"row-major": "03: row-major [64][128]", "padded": "04_pad: rows 16 bytes longer",
              "swizzled": "04_swizzle: chunk c at c ⊕ (row % 8)"}
    for ax, layout in zip(axes, LAYOUTS):
        banks = bank_map(layout, rows=8)
        _shade(ax, [[b // 4 for b in row[:8]] for row in banks], pyplot().get_cmap("tab10").colors)  # groups of 4 banks
        for r in range(8):
            for c in range(8):
                ax.text(c + 0.5, r + 0.5, str(banks[r][c]), ha="center", va="center", fontsize=8)
        _box(ax, 0, 0, 1, 8, fill=False, edgecolor="black", linewidth=2.5)
        _grid_axes(ax, 8, 8, "16-byte chunk of the row (8 head dims)", "key row")
        w = k_read_wavefronts(layout)
        ax.set_title(f"{titles[layout]}\nthe K read (boxed: one phase): {w // 4} wavefront{'s' if w > 4 else ''} "
                     f"per phase,\n{w} per warp instruction (ideal 4)", fontsize=8.5)
    fig.suptitle("First bank of each 16-byte chunk of a K tile at head_dim 128 (colour: its group of 4 banks; "
                 "chunks 8–15 repeat 0–7).\nThe K read of S = Q·Kᵀ: 8 lanes read the same chunk of 8 keys "
                 "(common/bank_model.h's rule)", fontsize=10)


# The timelines' kinds of span and their colours ("wait" hatched).
SPAN_COLOURS = {"barrier": "0.3", "copy": "tab:orange", "wait": "white", "compute": "tab:blue", "buffer": "lightsteelblue",
                "gemm": "tab:blue", "softmax": "tab:orange", "rescale": "tab:green", "load": "tab:purple",
                "tile": "tab:blue", "epilogue": "tab:green", "gap": "tab:gray"}


def _gantt(ax, rows, spans, title, until):
    """rows: labels top to bottom; spans: (row, start, length, kind, text)."""
    for row, start, length, kind, text in spans:
        y, hatch = rows.index(row), "//" if kind == "wait" else None
        _box(ax, start, y + 0.15, length, 0.7, facecolor=SPAN_COLOURS[kind], edgecolor="black", linewidth=0.6,
             hatch=hatch)
        if text:
            ax.text(start + length / 2, y + 0.5, text, ha="center", va="center", fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1} if hatch else None)
    ax.set_ylim(len(rows), 0)
    ax.set_xlim(0, until)
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_xticks([])
    ax.set_xlabel("time →", fontsize=8)
    ax.set_title(title, fontsize=9)


def _gantt_panels(axes, panels):
    """panels: (rows, spans, title) drawn by _gantt on one time axis, the end of the longest."""
    until = max(start + length for _, spans, _ in panels for _, start, length, _, _ in spans) + 0.3
    for ax, (rows, spans, title) in zip(axes, panels):
        _gantt(ax, rows, spans, title, until)


CP_ASYNC_PROFILES = {"04_swizzle": "ncu-04_swizzle-f562aa8199a8.txt", "05_cp_async": "ncu-05_cp_async-f562aa8199a8.txt"}


def ncu_summary(path: Path) -> dict[str, float]:
    """The numbers of a bench/profile.sh summary (lines "name   value unit"), by name: "duration" in ms,
    the stall shares in % of warp cycles."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^(duration|stall: [^,]+?)(?:, %[^0-9]*?)?\s{2,}([0-9.]+) (?:ms|%)\s*$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def tile_periods(results: Path = RESULTS) -> dict[str, dict[str, float]]:
    """One K/V tile of step 04 and of step 05 to scale: the period is the kernel's measured duration (04's
    is 1), split by the warps' measured stall shares into the wait for the global load (long
    scoreboard), the barriers, and the rest (issuing: loads, stores, FMAs)."""
    profiles = {step: ncu_summary(results / name) for step, name in CP_ASYNC_PROFILES.items()}
    base = profiles["04_swizzle"]["duration"]
    out = {}
    for step, p in profiles.items():
        period = p["duration"] / base
        wait = period * p["stall: long scoreboard"] / 100
        barrier = period * p["stall: barrier"] / 100
        out[step] = {"period": period, "load wait": wait, "barrier": barrier, "rest": period - wait - barrier}
    return out


@_drawn("05_cp_async_timeline.png", 2, 1, figsize=(12, 5.2), rect=(0, 0, 1, 0.95))
def fig_05(fig, axes):
    """cp.async double buffering as a timeline, to scale (tile_periods)."""
    tp, (ax1, ax2), tiles = tile_periods(), axes, 4
    a, b = tp["04_swizzle"], tp["05_cp_async"]

    def share(p, part):
        return f"{100 * p[part] / p['period']:.1f} %"

    spans, t = [], 0.0
    for n in range(tiles):  # step 04: barrier, LDG and its exposed wait, STS + compute
        half, rest0 = a["barrier"] / 2, t + a["barrier"] + a["load wait"]
        spans += [("warps", t, half, "barrier", ""), ("global → registers", t + half, a["load wait"], "copy", ""),
                  ("warps", t + half, a["load wait"], "wait", ""), ("warps", rest0 - half, half, "barrier", ""),
                  ("warps", rest0, a["rest"], "compute", f"STS + compute tile {n}"),
                  ("shared buffer", rest0, a["rest"], "buffer", f"write, read tile {n}")]
        t += a["period"]
    until = t * 1.01
    _gantt(ax1, ["global → registers", "shared buffer", "warps"], spans,
           f"step 04 (04_swizzle): each tile waits for its own load (hatched: long scoreboard, {share(a, 'load wait')} "
           f"of the warps' cycles) and at two barriers (grey, {share(a, 'barrier')})", until)

    spans, t = [], 0.0
    for n in range(tiles):  # step 05: one barrier, then compute while the next tile's copy is in flight
        start = t + b["barrier"]
        spans += [("warps", t, b["barrier"], "barrier", ""), ("warps", start, b["rest"], "compute", f"compute tile {n}"),
                  (f"buffer {n % 2}", start, b["rest"], "buffer", f"read tile {n}")]
        if n + 1 < tiles:
            spans.append(("copies in flight (cp.async)", start, b["rest"] * 0.6, "copy", f"K{n + 1}, V{n + 1} → buf {(n + 1) % 2}"))
        t += b["period"]
    _gantt(ax2, ["copies in flight (cp.async)", "buffer 0", "buffer 1", "warps"], spans,
           f"step 05: the next tile is copied while this one is computed: no load wait, one barrier "
           f"({share(b, 'barrier')}); the 4 tiles take {b['period'] / a['period']:.3f}× the time", until)
    fig.suptitle("To scale: a tile's period is the kernel's ncu duration (2 × 16 × 2048, d 128, fp16), split by the "
                 "warps' stall shares; the copy's length (orange, top of step 05) is not measured",
                 fontsize=9)


def _fragment(ax, grid, title, color_of):
    for r, row in enumerate(grid):
        for c, (lane, reg) in enumerate(row):
            _box(ax, c, r, facecolor=color_of(reg), edgecolor="white", linewidth=0.8)
            ax.text(c + 0.5, r + 0.5, f"T{lane}\n{reg}", ha="center", va="center", fontsize=5.5)
    _grid_axes(ax, len(grid), len(grid[0]), "column", "row")
    ax.set_title(title, fontsize=8.5)


@_drawn("06_fragments.png", 1, 4, figsize=(16, 5.6), gridspec_kw={"width_ratios": [8, 16, 8, 5]}, rect=(0, 0, 1, 0.94))
def fig_06(fig, axes):
    """mma.sync.m16n8k16 fragments and the ldmatrix.x4 addresses."""
    colors = pyplot().get_cmap("tab10").colors
    reg_color = {"a0": colors[0], "a1": colors[1], "a2": colors[2], "a3": colors[3],
                 "b0": colors[0], "b1": colors[1], "d0": colors[0], "d1": colors[0], "d2": colors[1], "d3": colors[1]}

    def light(c, k=0.55):
        return tuple(1 - (1 - x) * (1 - k) for x in c)

    for ax, grid, title in zip(axes, (c_fragment(), a_fragment(), b_fragment()), (
            "C / D, 16 × 8 fp32 (S, O)\nlane T, register d0–d3",
            "A, 16 × 16 (Q; P = two C tiles side by side)\nlane T, register a0–a3 (two 16-bit halves each)",
            "B, 16 × 8 (rows = k): Kᵀ, V\nlane T, register b0–b1")):
        _fragment(ax, grid, title, lambda reg: light(reg_color[reg]))
    ax = axes[3]
    for r in range(16):
        for half in range(2):
            lane = next(l for l in range(32) if ldmatrix_x4_quadrants(l) == (r, 8 * half))
            m = lane // 8
            _box(ax, half * 2.5, r, 2.5, 1, facecolor=light(colors[m]), edgecolor="white")
            ax.text(half * 2.5 + 1.25, r + 0.5, f"lane {lane} → r{m}", ha="center", va="center", fontsize=6)
    _grid_axes(ax, 16, 5, None, None, aspect="auto")
    ax.set_xticks([1.25, 3.75])
    ax.set_xticklabels(["cols 0–7", "cols 8–15"], fontsize=7)
    ax.set_title("ldmatrix.x4 over 16 × 16: the lane\nthat gives each 16-byte row's address\n"
                 "→ the register it fills (= a0–a3)", fontsize=8.5)
    fig.suptitle("mma.sync.aligned.m16n8k16 fragments (PTX ISA; frag:: of steps/06_ldmatrix_mma/traits.h): "
                 "g = lane / 4 picks the row, lane % 4 the column pair", fontsize=10)


@_drawn("07_partition_and_tiles.png", 1, 3, figsize=(15, 6.2), gridspec_kw={"width_ratios": [1.05, 1.4, 1.4]})
def fig_07(fig, axes):
    """FlashAttention-2's block/warp partition, and the skipped, masked and full tiles."""
    colors, ax = pyplot().get_cmap("Pastel1").colors, axes[0]
    block_q, block_kv, head_dim, warps = 128, 48, 128, 4
    # Q tile (rows x head dims), K tile as columns of S, S and O per warp.
    for w in range(warps):
        for mi in range(2):
            y = 32 * w + 16 * mi
            for x, width in ((0, 40), (50, 24), (84, 40)):
                _box(ax, x, y, width, 16, facecolor=colors[w], edgecolor="white")
        ax.text(20, 32 * w + 16, f"warp {w}\nrows {32 * w}–{32 * w + 31}\n(m16 tiles 0, 1)", ha="center",
                va="center", fontsize=7)
    _box(ax, 50, -30, 24, 26, facecolor="0.85", edgecolor="black")
    ax.text(62, -17, f"K tile t\n{block_kv} keys", ha="center", va="center", fontsize=7)
    ax.text(20, -6, f"Q tile [{block_q} × {head_dim}]\nin q_smem", ha="center", va="bottom", fontsize=7.5)
    ax.text(62, block_q + 4, f"S = Q·Kᵀ\n[32 × {block_kv}] per warp\nin registers", ha="center", va="top",
            fontsize=7.5)
    ax.text(104, block_q + 4, f"O [32 × {head_dim}] per warp\nin registers (o_acc)", ha="center", va="top",
            fontsize=7.5)
    ax.text(104, -17, "V tile t\nread by P·V", ha="center", va="center", fontsize=7)
    _box(ax, 84, -30, 40, 26, facecolor="0.85", edgecolor="black")
    _canvas(ax, (-2, 126), (block_q + 26, -34))
    ax.set_aspect("equal")
    ax.set_title("07g at head_dim 128 (kD128_S2): one block = 128 query rows,\n4 warps × 32 rows; K/V tiles of 48 keys "
                 "stream past", fontsize=8.5)

    cases = [(axes[1], 1024, 1024, True), (axes[2], 1024, 1024, False)]
    face = {"skipped": "white", "masked": "tab:orange", "full": "tab:blue"}
    for ax, sq, sk, causal in cases:
        classes = tile_classes(sq, sk, block_q, block_kv, causal)
        q_tiles, k_tiles = len(classes), len(classes[0])
        for qt, row in enumerate(classes):
            for kt, (kind, visit) in enumerate(row):
                _box(ax, kt, qt, facecolor=face[kind], edgecolor="0.6", linewidth=0.5)
                if visit is not None:
                    ax.text(kt + 0.5, qt + 0.5, str(visit), ha="center", va="center", fontsize=5.5,
                            color="white" if kind == "full" else "black")
        launch = {block_tile(x, q_tiles)[1]: x for x in range(q_tiles)}
        _grid_axes(ax, q_tiles, k_tiles, f"K/V tile ({block_kv} keys; the last holds {sk - (k_tiles - 1) * block_kv} "
                   "real keys)", "", step_x=3, ylabels=[f"q tile {qt} (block {launch[qt]})" for qt in range(q_tiles)],
                   aspect="auto")
        ax.set_title(f"Sq = Sk = {sq}, {'causal' if causal else 'not causal'}, 128 × {block_kv} tiles: "
                     "blue full,\norange masked, white never loaded; the number is the visit order (07b on)",
                     fontsize=8.5)


# ---- step 08: wgmma matrix descriptors (steps/08_tma_wgmma/traits.h; PTX ISA "Matrix Descriptor Format")

ROW_BYTES_08 = 128  # a shared row of 64 fp16/bf16 head dims, 128-byte swizzled


def matrix_descriptor(start: int, lbo: int, sbo: int) -> int:
    """traits.h's matrix_descriptor: start, LBO and SBO as (x & 0x3FFFF) >> 4 at bits 0, 16 and 32; 128-byte
    swizzle (1) at bits 62-63."""
    field = lambda x: (x & 0x3FFFF) >> 4  # noqa: E731
    return field(start) | field(lbo) << 16 | field(sbo) << 32 | 1 << 62


def k_major_step_offset(rows: int, ks: int) -> int:
    """Where k16 step ks starts in a K-major tile of `rows` rows: column block ks / 4, then 32 bytes a step."""
    return ks // 4 * rows * ROW_BYTES_08 + ks % 4 * 32


@_drawn("08_tma_ring.png", figsize=(12, 3.0))
def fig_08(fig, ax):
    """Step 08's two-stage K/V ring: which stage and barrier parity each visit uses (schematic)."""
    stages, visits, length = 2, 6, 4.0
    t = 2.0  # the prologue: Q and the first two K/V tiles in flight before anyone waits
    spans = [("TMA (thread 0)", 0.0, t, "copy", "Q, K0 V0, K1 V1"), ("stage 0", 0.0, t, "copy", "landing: K0, V0"),
             ("stage 1", 0.0, t + length, "copy", "landing: K1, V1")]
    for v in range(visits):
        stage, parity = v % stages, (v // stages) % 2
        spans.append(("warpgroups", t, length, "compute", f"visit {v}: wait parity {parity}"))
        spans.append((f"stage {stage}", t, length, "buffer", f"read: K{v}, V{v} (fill {v // stages})"))
        if v + stages < visits:
            # released by the block barrier at the end of the visit, refilled with visit v + stages
            spans.append(("TMA (thread 0)", t + length, 0.9, "copy", f"K{v + stages} V{v + stages}"))
            spans.append((f"stage {stage}", t + length, length, "copy", f"landing: K{v + stages}, V{v + stages}"))
        t += length
    _gantt(ax, ["TMA (thread 0)", "stage 0", "stage 1", "warpgroups"], spans,
           "Step 08: visit t reads stage t % 2 and waits for phase parity (t / 2) % 2; the barrier at its end "
           "frees the stage for visit t + 2 (schematic)", t + 0.5)


@_drawn("08_descriptors.png", 1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1, 1.1]})
def fig_08_descriptors(fig, axes, block_kv: int = 128):
    """The two wgmma operand layouts of step 08 in shared memory, and what LBO and SBO measure in each."""
    (ax, bx), cmap = axes, pyplot().get_cmap("tab10")
    # (a) K-major Q or K: rows of 128 bytes (64 head dims), 16-byte chunks stored at chunk ^ (row % 8)
    rows = 16
    for r in range(rows):
        for p in range(8):
            logical = p ^ (r % 8)
            _box(ax, p, r, facecolor=cmap(logical // 2), alpha=0.35 + 0.5 * (logical % 2), edgecolor="white")
            ax.text(p + 0.5, r + 0.5, str(logical), ha="center", va="center", fontsize=7)
    _grid_axes(ax, rows, 8, "16-byte chunk stored at (physical position)", "row (query or key)")
    for r0 in (0, 8):
        _box(ax, 0, r0, 8, 8, fill=False, lw=1.6, ec="black")
    ax.annotate("", (8.35, 8), (8.35, 0), arrowprops={"arrowstyle": "->", "lw": 1}, annotation_clip=False)
    ax.text(8.5, 4, f"SBO = {8 * ROW_BYTES_08} bytes:\nthe next 8 rows", fontsize=8, va="center")
    ax.text(8.5, 11, "LBO unused with the\n128-byte swizzle\n(16 bytes, encoded 1)", fontsize=8, va="center")
    ax.set_title("K-major Q, K: an atom of 8 rows × 128 bytes (box); the digit is the logical chunk\n"
                 "(k16 step ks reads chunks 2·ks % 8, +1: it starts 32·(ks % 4) bytes into the row)", fontsize=8.5)
    # (b) MN-major V: [key][dim] rows; 64 head dims a column block, block_kv rows each
    step, side = 1.7, 2.85  # the second band's x (a gap for LBO's label), and where the side notes start
    bx.set_xlim(0, 4.0)
    bx.set_ylim(block_kv / 8 + 1.6, -0.3)
    for b in range(2):
        for g in range(block_kv // 8):
            _box(bx, b * step, g, 1.0, 1.0, fc=cmap(b + 2), alpha=0.3 + 0.4 * (g // 2 % 2), ec="white")
        bx.text(b * step + 0.5, block_kv / 8 + 0.9, f"head dims {64 * b}-{64 * b + 63}\n(starts +{b * block_kv * ROW_BYTES_08} bytes)",
                ha="center", va="center", fontsize=7.5)
    bx.annotate("", (step, block_kv / 16), (1.0, block_kv / 16), arrowprops={"arrowstyle": "->", "lw": 1})
    bx.text((1.0 + step) / 2, block_kv / 16 + 0.4, f"LBO =\n{block_kv}·128\n= {block_kv * ROW_BYTES_08}\nbytes", ha="center",
            va="top", fontsize=7.5)
    bx.annotate("", (side - 0.08, 1), (side - 0.08, 0), arrowprops={"arrowstyle": "->", "lw": 1})
    bx.text(side, 0.5, f"SBO = {8 * ROW_BYTES_08} bytes:\nthe next 8 keys", fontsize=7.5, va="center")
    bx.text(side, 3.0, f"k16 step kk:\nkeys 16kk …,\n+{16 * ROW_BYTES_08}·kk bytes", fontsize=7.5, va="center")
    bx.set_yticks([g + 0.5 for g in range(0, block_kv // 8, 2)])
    bx.set_yticklabels([f"keys {8 * g}-{8 * g + 7}" for g in range(0, block_kv // 8, 2)], fontsize=7)
    bx.set_xticks([])
    bx.set_title(f"MN-major V (imm-trans-b = 1), BLOCK_KV = {block_kv}: bands of 8 keys × 128 bytes,\n"
                 "two bands (one shade) a k16 step", fontsize=8.5)


# ---- step 09: the consumers' schedules (schematic; notes/09, "The schedule, drawn") ------------------

GEMM, SOFTMAX, RESCALE = 1.0, 1.6, 0.4  # schematic lengths: one batch of wgmma, the softmax of S, O's rescale


def schedule_09(variant: str, tiles: int = 3, consumers: int = 2,
                gemm: float = GEMM) -> list[tuple[str, float, float, str, str]]:
    """(row, start, length, kind, label) of the consumers and the tensor cores over `tiles` K/V tiles, by the
    kernel's loop (kernel.cuh, `turn`): turn k issues S(k) and P·V(k-1), waits, then runs the softmax of S(k)
    and O's rescale. The tensor cores take the products in the order they were issued. 09a: nothing orders
    the consumers (here all start together); 09b: ping-pong, a consumer issues only after the one before it
    in the rotation issued its turn; 09c (and 09e, with three consumers): as 09b, and it waits for S(k)
    alone, so the softmax runs under P·V(k-1). `gemm`: the length of one batch of wgmma (half at head_dim 64
    of what it is at 128, the softmax the same)."""
    spans, tensor_free, last_issue, ready = [], 0.0, 0.0, [0.0] * consumers
    for k in range(tiles + 1):  # the last turn has P·V(tiles - 1) only
        for c in range(consumers):
            issue = ready[c] if variant == "09a" else max(ready[c], last_issue)
            last_issue = issue
            done = {}
            for job, tile in (("S", k), ("PV", k - 1)):
                if 0 <= tile < tiles:
                    start = max(tensor_free, issue)
                    tensor_free = done[job] = start + gemm
                    spans.append(("tensor cores", start, gemm, "gemm", f"{'S' if job == 'S' else 'PV'}{tile} c{c}"))
            waited = done["S"] if variant in ("09c", "09e") and "S" in done else max(done.values())
            if waited > issue:
                spans.append((f"consumer {c}", issue, waited - issue, "wait", "wait" if waited - issue > 0.5 else ""))
            if "S" not in done:
                ready[c] = waited
                continue
            spans.append((f"consumer {c}", waited, SOFTMAX, "softmax", f"softmax S{k}"))
            rescale = max(waited + SOFTMAX, done.get("PV", 0.0))  # O is rescaled once P·V(k-1) is in it
            spans.append((f"consumer {c}", rescale, RESCALE, "rescale", f"O,P{k}"))
            ready[c] = rescale + RESCALE
    return spans


def ring_state(t: int, stages: int) -> dict:
    """Visit t of a ring of `stages` (steps/09_warp_specialized/traits.h: kv_stage, kv_parity,
    waits_for_release, release_parity): its stage, its fill of that stage, the full barrier's parity the
    consumers wait for, and the empty barrier's parity the producer waits for before the copy (None: fill 0
    finds the stage empty)."""
    fill = t // stages
    return {"stage": t % stages, "fill": fill, "full_parity": fill % 2,
            "empty_parity": (fill - 1) % 2 if t >= stages else None}


@_drawn("09_ring_phases.png", figsize=(12, 3.2))
def fig_09_ring(fig, ax, stages: int = 2, visits: int = 8):
    """The index/phase view of step 09's K/V ring: for each visit, stage, fill and the parities waited for."""
    rows = ["stage (t % S)", "fill n (t / S)", "consumers wait full[stage], parity n % 2",
            "producer waits empty[stage], parity (n − 1) % 2"]
    colours = pyplot().get_cmap("Pastel1").colors
    for t in range(visits):
        r = ring_state(t, stages)
        cells = [str(r["stage"]), str(r["fill"]), str(r["full_parity"]),
                 "–  (fill 0: empty)" if r["empty_parity"] is None else str(r["empty_parity"])]
        for y, text in enumerate(cells):
            _box(ax, t, y, facecolor=colours[r["stage"] % len(colours)], edgecolor="white", linewidth=1.5)
            ax.text(t + 0.5, y + 0.5, text, ha="center", va="center", fontsize=8)
    _grid_axes(ax, len(rows), visits, "visit t (a K/V tile the block reads)", "", ylabels=rows, aspect="auto")
    ax.set_title(f"Step 09's K/V ring (S = {stages} stages) as index and phase: the consumers wait for phase n of "
                 "the stage's full barrier, the producer for phase n − 1 of its empty one", fontsize=9)


@_drawn("09_schedules.png", 3, 1, figsize=(12, 7.2))
def fig_09(fig, axes):
    """Step 09's consumer schedules: 09a unordered, 09b ping-pong, 09c intra-warpgroup overlap (schematic)."""
    titles = {"09a": "09a: a turn issues S(k) and P·V(k−1) and waits for both; nothing orders the two consumers "
                     "(here they start together)",
              "09b": "09b ping-pong: a consumer issues only after the other has issued its turn (named barriers)",
              "09c": "09c: as 09b, waiting for S(k) alone: the softmax of S(k) runs under P·V(k−1)"}
    _gantt_panels(axes, [(["consumer 0", "consumer 1", "tensor cores"], schedule_09(v), f"{title} (schematic)")
                         for v, title in titles.items()])


@_drawn("09_three_consumers.png", 2, 1, figsize=(12, 5.6))
def fig_09_three(fig, axes):
    """09e at head_dim 64: the same turns with two consumers and with three, products half as long (schematic)."""
    panels = (("09c", 2, "09c/09d at head_dim 64: two consumers; a softmax outlasts the other consumer's turn, "
                         "and the tensor cores wait"),
              ("09e", 3, "09e: three consumers; two softmaxes run under the third's turn"))
    drawn = []
    for variant, n, title in panels:
        spans = schedule_09(variant, 4, n, GEMM / 2)
        busy = sum(length for row, _, length, _, _ in spans if row == "tensor cores") / max(s + l for _, s, l, _, _ in spans)
        drawn.append(([f"consumer {c}" for c in range(n)] + ["tensor cores"], spans,
                      f"{title} (schematic; tensor cores busy {100 * busy:.0f} % of the time)"))
    _gantt_panels(axes, drawn)


# Schematic lengths of a tile's life on one SM (notes/09, Appendix L): a TMA load's latency, the main loop of
# one query tile, its epilogue (O through q_smem to global memory), a block's exit and the next block's start
# (launch, barrier init, setmaxnreg), which 09e pays on every tile: one 214 KB block fills an SM.
LOAD, TILE, EPILOGUE, BLOCK_GAP = 1.0, 5.0, 1.0, 0.8


def schedule_09f(persistent: bool, tiles: int = 3) -> list[tuple[str, float, float, str, str]]:
    """(row, start, length, kind, label) of one SM's producer and consumers over `tiles` query tiles. 09e
    (persistent False): a block per tile; its producer loads Q(n) and K(0) together, the consumers wait, run
    the tile and its epilogue, the block exits and the next one starts. 09f: one block runs every tile; the
    producer issues K(0) of tile n + 1 while tile n runs (a stage is free before its last turn), and Q(n + 1)
    once every consumer has read q_smem for O(n) (q_empty), so only Q's latency is left between two tiles."""
    spans, q_at = [], 0.0  # q_at: when the producer issues Q(n)
    for n in range(tiles):
        spans.append(("producer", q_at, LOAD, "load", f"Q{n}" if persistent and n > 0 else f"Q{n} K{n}(0)"))
        spans.append(("consumers", q_at, LOAD, "wait", "wait"))
        begin = q_at + LOAD
        spans.append(("consumers", begin, TILE, "tile", f"tile {n}"))
        if persistent and n + 1 < tiles:
            spans.append(("producer", begin + TILE - 2 * LOAD, LOAD, "load", f"K{n + 1}(0)"))
        spans.append(("consumers", begin + TILE, EPILOGUE, "epilogue", f"O{n}"))
        q_at = begin + TILE + EPILOGUE  # 09f: q_empty completes as the epilogue ends
        if not persistent:
            spans.append(("block", q_at, BLOCK_GAP, "gap", "exit, next block"))
            q_at += BLOCK_GAP
    return spans


@_drawn("09f_persistent.png", 2, 1, figsize=(12, 4.4))
def fig_09f(fig, axes):
    """09e's block per tile against 09f's persistent block, one SM over three query tiles (schematic)."""
    _gantt_panels(axes, [(["producer", "consumers", "block"], schedule_09f(False), "09e: one block per query tile; the "
                          "next block starts when this one has exited, then loads Q and K(0) (schematic)"),
                         (["producer", "consumers"], schedule_09f(True), "09f: one block per SM; K(0) of the next tile "
                          "streams in during this one, Q once O has left q_smem (schematic)")])


# ---- step 10: split-KV (steps/10_decoding/traits.h, num_splits_for) ------------------------------

DECODE_BLOCK_KV, DECODE_SLOTS = 64, 264  # head_dim 128's tile row: 64 keys a tile, 2 blocks an SM x 132 SMs
DECODE_SEQLEN_FILES = "decode-seqlen-*-c4e3c724db60.json"  # flash-steps --decode at b8 h32/8, seqlen_k 1k-128k
DECODE_CEILINGS = "ceilings-20261130-224051.json"  # the H200's measured ceilings, the same GPU as those runs


def num_splits_for(base_blocks: int, tiles: int, slots: int = DECODE_SLOTS, max_splits: int = 128) -> int:
    """traits.h's heuristic: the fewest splits within 10 % of the best cost, cost(s) = waves of blocks x tiles
    a block reads, where base_blocks (batch x heads_kv, one block a K/V head) already fill the GPU: 1."""
    if base_blocks <= 0 or base_blocks >= slots or tiles <= 1:
        return 1
    def cost(s):
        return -(-base_blocks * s // slots) * -(-tiles // s)
    most = min(tiles, max_splits)
    best = min(cost(s) for s in range(1, most + 1))
    return next((s for s in range(1, most + 1) if 10 * cost(s) <= 11 * best), 1)


def decode_runs(results: Path = RESULTS) -> list[dict]:
    """The decoding runs (the runner's JSON) of DECODE_SEQLEN_FILES, by seqlen_k."""
    import json
    return sorted((json.loads(path.read_text()) for path in results.glob(DECODE_SEQLEN_FILES)),
                  key=lambda run: run["problem"]["seqlen_k"])


def _passed(runs: list[dict], field: str) -> dict[str, list[tuple[int, float]]]:
    """{step: [(seqlen_k, its row's `field`)]} of the steps that passed."""
    out: dict[str, list[tuple[int, float]]] = {}
    for run in runs:
        for r in run["rows"]:
            if r["status"] == "PASS":
                out.setdefault(r["id"], []).append((run["problem"]["seqlen_k"], r[field]))
    return out


def decode_rates(results: Path = RESULTS) -> dict[str, list[tuple[int, float]]]:
    """{step: [(seqlen_k, GB/s)]} from the decoding runs, the steps that passed."""
    return _passed(decode_runs(results), "gbs")


def decode_times(results: Path = RESULTS) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, float]]]:
    """({step: [(seqlen_k, ms)]} of the steps that passed, [(seqlen_k, ms to read K and V once at the HBM read
    ceiling)]) from the same decoding runs as decode_rates."""
    runs, tbs = decode_runs(results), hbm_read_tbs()
    floor = [(run["problem"]["seqlen_k"], run["problem"]["kv_bytes"] / (tbs * 1e12) * 1e3) for run in runs]
    return _passed(runs, "ms"), floor


def hbm_read_tbs() -> float:
    """The measured HBM read ceiling (TB/s) of DECODE_CEILINGS."""
    return hbm_ceiling(RESULTS / DECODE_CEILINGS)["tbs"]


@_drawn("10_split_kv.png", 1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1.25, 1]})
def fig_10(fig, axes):
    """Step 10: one sequence's keys cut into splits, merged by their LSEs; and time against seqlen_k."""
    ax, bx = axes
    # (a) b1 sk131072 h32/8: 8 blocks (one per K/V head) would fill 8 of the 264 slots
    tiles = -(-131072 // DECODE_BLOCK_KV)
    splits = num_splits_for(8, tiles)
    per = -(-tiles // splits)
    colours = pyplot().get_cmap("tab20").colors
    for s in range(splits):
        _box(ax, s * per, 0, min(per, tiles - s * per), 1, color=colours[s % 20], lw=0)
    ax.text(tiles / 2, 1.35, f"one K/V head's {tiles} tiles of {DECODE_BLOCK_KV} keys (seqlen_k 131072), "
            f"cut into {splits} splits of {per} tiles: {8 * splits} blocks instead of 8", ha="center", fontsize=8)
    for s, x_text in ((0, tiles * 0.12), (1, tiles * 0.32), (splits - 1, tiles * 0.88)):
        ax.annotate(f"split {s}: O_{s}, LSE_{s}", ((s + 0.5) * per, 0), (x_text, -1.1), ha="center",
                    fontsize=7, arrowprops={"arrowstyle": "->", "lw": 0.6})
    ax.text(tiles * 0.6, -1.1, "…", ha="center", fontsize=9)
    ax.text(tiles / 2, -2.3, "combine: LSE = log Σₛ exp(LSE_s),   O = Σₛ exp(LSE_s − LSE) · O_s", ha="center",
            fontsize=9, bbox={"boxstyle": "round", "fc": "whitesmoke", "ec": "gray"})
    _canvas(ax, (-tiles * 0.02, tiles * 1.02), (-2.9, 1.8))
    ax.set_title(f"split-KV (b1 h32/8, the heuristic's {splits} splits: steps/10_decoding/traits.h)", fontsize=9)
    # (b) time against seqlen_k, b8 h32/8, from the runs, over the time K and V take at the HBM read ceiling
    times, floor = decode_times()
    for step, colour in (("10_decoding", "tab:red"), ("09d_tile_sizes", "tab:blue"),
                         ("07g_flash_attention2", "tab:green"), ("05_cp_async", "tab:gray")):
        if step in times:
            xs, ys = zip(*times[step])
            bx.plot(xs, [y * 1000 for y in ys], "o-", color=colour, label=step, lw=1.2, ms=4)
    xs, ys = zip(*floor)
    bx.plot(xs, [y * 1000 for y in ys], "--", color="black", lw=0.8,
            label=f"K and V read once at the HBM read ceiling, {hbm_read_tbs():.2f} TB/s")
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("seqlen_k (keys per sequence)", fontsize=8)
    bx.set_ylabel("time per launch, µs (log)", fontsize=8)
    bx.set_title("one new token, b8 h32/8 d128 fp16 (bench/results/decode-seqlen-*.json)", fontsize=9)
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3, which="both")


# ---- step 10: the paged cache (steps/10_decoding/traits.h, copy_row; kernel.cuh's page lookup) -----------

PAGED_LENGTHS, PAGED_PAGE_SIZE = (56, 23, 40), 16  # the figure's batch: keys per sequence, keys per page
PAGED_TABLE = ((7, 2, 9, 4), (0, 11, -1, -1), (5, 3, 10, -1))  # its block table (-1: never read)
PAGED_POOL = 12  # pages in the figure's cache
DECODE_COPIES = {64: (128, 4), 128: (64, 4), 256: (64, 4)}  # head_dim: (BLOCK_KV, warps) of its first kConfigs row


def paged_slot(b: int, j: int, table=PAGED_TABLE, page_size: int = PAGED_PAGE_SIZE) -> tuple[int, int]:
    """(page, row): key j of sequence b is row j % page_size of page block_table[b][j / page_size]."""
    return table[b][j // page_size], j % page_size


def rows_per_thread(head_dim: int, block_kv: int, warps: int) -> int:
    """traits.h's ROWS_PER_THREAD: a thread copies one 16-byte chunk of that many consecutive keys."""
    return block_kv // (warps * 32 // (head_dim // 8))


def thread_pages(head_dim: int, page_size: int, tile: int = 0) -> list[set[int]]:
    """For each group of threads that copy the same keys (copy_row), the pages those keys of K/V tile `tile` lie in."""
    block_kv, warps = DECODE_COPIES[head_dim]
    rows = rows_per_thread(head_dim, block_kv, warps)
    return [{(tile * block_kv + g * rows + r) // page_size for r in range(rows)} for g in range(block_kv // rows)]


@_drawn("10_paged_cache.png", 1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
def fig_10_paged(fig, axes):
    """Step 10's paged cache: the block table of three sequences and the pool it points into; the keys of a
    head_dim 256 tile that each group of threads copies, against pages of 16, 48 and 24 keys."""
    ax, bx = axes
    colours = ("tab:blue", "tab:orange", "tab:green")
    owner = {page: b for b, row in enumerate(PAGED_TABLE) for page in row if page >= 0}
    for b, row in enumerate(PAGED_TABLE):  # (a) the block table, then the pool of pages
        ax.text(-0.2, 2.5 - b, f"seq {b}: {PAGED_LENGTHS[b]} keys", ha="right", va="center", fontsize=8)
        for i, page in enumerate(row):
            used = page >= 0
            _box(ax, i, 2 - b, ec="black", lw=0.6, fc=colours[b] if used else "0.9", alpha=0.45 if used else 1)
            ax.text(i + 0.5, 2.5 - b, str(page), ha="center", va="center", fontsize=8, color="black" if used else "0.5")
    ax.text(2, -0.45, f"block_table, pages of {PAGED_PAGE_SIZE} keys\n(−1: past the sequence, never read)",
            ha="center", va="top", fontsize=8)
    for page in range(PAGED_POOL):
        x = 5.5 + page * 0.75
        b = owner.get(page)
        keys = 0 if b is None else min(PAGED_PAGE_SIZE, PAGED_LENGTHS[b] - PAGED_TABLE[b].index(page) * PAGED_PAGE_SIZE)
        _box(ax, x, 0, 0.65, 3, ec="black", lw=0.6, fc="white")
        if keys:
            filled = 3 * keys / PAGED_PAGE_SIZE
            _box(ax, x, 3 - filled, 0.65, filled, lw=0, fc=colours[b], alpha=0.45)
        ax.text(x + 0.325, -0.3, str(page), ha="center", fontsize=7)
    for i, page in enumerate(PAGED_TABLE[0]):
        ax.annotate("", (5.5 + page * 0.75 + 0.325, 3.05), (i + 0.5, 2.95),
                    arrowprops={"arrowstyle": "->", "lw": 0.6, "color": colours[0],
                                "connectionstyle": "arc3,rad=-0.25"})
    ax.text(5.5 + PAGED_POOL * 0.375, -0.45, f"the pool: {PAGED_POOL} pages of ({PAGED_PAGE_SIZE}, heads_kv, head_dim),\n"
            "each filled from the top; any page, in any order", ha="center", va="top", fontsize=8)
    _canvas(ax, (-3.2, 5.5 + PAGED_POOL * 0.75 + 0.2), (-1.1, 4.6))
    ax.set_title("key j of sequence b: row j % page_size of page block_table[b][j / page_size]", fontsize=9)
    rows = rows_per_thread(256, *DECODE_COPIES[256])  # (b) one K/V tile at head_dim 256
    block_kv = DECODE_COPIES[256][0]
    for c, page_size in enumerate((16, 48, 24)):
        x = c * 3
        for key in range(block_kv):
            _box(bx, x, key, 1, 1, lw=0, fc=("0.75", "0.92")[key // page_size % 2])
        for g, pages in enumerate(thread_pages(256, page_size)):
            split = len(pages) > 1
            _box(bx, x + 1.15, g * rows + 0.5, 0.35, rows - 1, lw=0, fc="tab:red" if split else "tab:green")
            bx.text(x + 1.65, g * rows + rows / 2, f"{len(pages)} page" + "s" * split, va="center", fontsize=7,
                    color="tab:red" if split else "black")
        refused = page_size % 16 != 0
        bx.text(x + 1, block_kv + 2, f"pages of {page_size}" + ("\n(refused)" if refused else ""), ha="center",
                va="top", fontsize=8, color="tab:red" if refused else "black")
    bx.set_xlim(-0.5, 9)
    bx.set_ylim(block_kv + 9, -1)
    bx.set_yticks(range(0, block_kv + 1, rows))
    bx.tick_params(labelsize=7, length=0)
    bx.set_xticks([])
    bx.set_ylabel("key of the 64-key tile", fontsize=8)
    for side in ("top", "right", "bottom"):
        bx.spines[side].set_visible(False)
    bx.set_title(f"head_dim 256: each group of 32 threads copies {rows} consecutive keys after one block-table\n"
                 "lookup (grey bands: pages; a bar: a group's keys, green in one page, red in two)", fontsize=9)


# ---- step 11: the backward's dataflow (steps/11_backward/kernel.cuh's header) ------------------------

# (name, x, y, kind, text): the tensors and the computations of one K/V block's loop over query tiles.
BACKWARD_NODES = [
    ("Q", 0, 4, "input", "Q"), ("K", 0, 3, "input", "K"), ("V", 0, 2, "input", "V"), ("dO", 0, 1, "input", "dO"),
    ("O", 0, 0, "input", "O"), ("LSE", 0, -0.8, "input", "LSE (forward)"),
    ("pre", 1.6, -0.4, "kernel", "preprocess_kernel\nD = rowsum(dO ∘ O)\nLSE₂ = LSE·log₂e"),
    ("P", 3.2, 4.0, "step", "Sᵀ = K·Qᵀ\nPᵀ = exp2(Sᵀ·scale·log2(e) − LSE₂)\n(recomputed)"),
    ("dP", 3.2, 1.7, "step", "dPᵀ = V·dOᵀ\ndSᵀ = Pᵀ ∘ (dPᵀ − D)"),
    ("dV", 5.2, 4.6, "output", "dV += Pᵀ·dO\n(registers)"), ("dK", 5.2, 2.9, "output", "dK += dSᵀ·Q\n(registers)"),
    ("dQ", 5.2, 1.0, "output", "dQ += dS·K\nfp32 atomics, or (deterministic)\na second kernel over K/V tiles"),
]
BACKWARD_EDGES = [("Q", "P"), ("K", "P"), ("LSE", "pre"), ("dO", "pre"), ("O", "pre"), ("pre", "P"), ("pre", "dP"),
                  ("V", "dP"), ("dO", "dP"), ("P", "dP"), ("P", "dV"), ("dO", "dV"), ("dP", "dK"), ("Q", "dK"),
                  ("dP", "dQ"), ("K", "dQ")]


@_drawn("11_backward_dataflow.png", figsize=(12, 5.6))
def fig_11(fig, ax):
    """Step 11's dataflow: what a K/V block recomputes and accumulates from the forward's tensors."""
    style = {"input": ("whitesmoke", "gray"), "kernel": ("lightyellow", "goldenrod"),
             "step": ("lightsteelblue", "tab:blue"), "output": ("honeydew", "tab:green")}
    boxes, where = {}, {name: (x, y) for name, x, y, _, _ in BACKWARD_NODES}
    for name, x, y, kind, text in BACKWARD_NODES:
        face, edge = style[kind]
        boxes[name] = ax.text(x, y, text, ha="center", va="center", fontsize=8,
                              bbox={"boxstyle": "round", "fc": face, "ec": edge, "pad": 0.4})
    for a, b in BACKWARD_EDGES:  # from the edge of one box to the edge of the other
        vertical = abs(where[a][0] - where[b][0]) < 0.1
        down = where[a][1] > where[b][1]
        start, end = ((0.5, 0.0), (0.5, 1.0)) if vertical and down else ((1.0, 0.5), (0.0, 0.5))
        ax.annotate("", xy=end, xycoords=boxes[b], xytext=start, textcoords=boxes[a],
                    arrowprops={"arrowstyle": "->", "lw": 0.7, "color": "0.45", "shrinkA": 2, "shrinkB": 2,
                                "connectionstyle": "arc3,rad=0.0"})
    _canvas(ax, (-0.7, 6.3), (-1.3, 5.3))
    ax.set_title("Step 11: a block owns BLOCK_KV keys of one K/V head and loops over the query tiles that read "
                 "them; P is rebuilt from the LSE, never stored", fontsize=9)



# ---- step 12: where each operand of the five products lives (steps/12_hopper_backward/traits.h) ------

# (product, A, where A is, B, where B is): one warpgroup's products for one query tile, as the kernel issues them.
HOPPER_BACKWARD_PRODUCTS = [
    ("Sᵀ = K·Qᵀ   [64 keys × BLOCK_Q]", "K (its 64 keys)", "smem", "Q", "smem"),
    ("dPᵀ = V·dOᵀ  [64 keys × BLOCK_Q]", "V (its 64 keys)", "smem", "dO", "smem"),
    ("dV += Pᵀ·dO  [64 keys × d]", "Pᵀ = exp2(Sᵀ·c − LSE₂)", "regs", "dO", "smem-mn"),
    ("dK += dSᵀ·Q  [64 keys × d]", "dSᵀ = Pᵀ ∘ (dPᵀ − D)", "regs", "Q", "smem-mn"),
    ("dQ = dS·K   [64 × 64 tile]", "dS (both warpgroups' dSᵀ)", "smem-mn", "K", "smem-mn"),
]
HOPPER_OPERAND_STYLE = {"smem": ("lightsteelblue", "shared memory, K-major"),
                        "smem-mn": ("lavender", "shared memory, MN-major (imm-trans 1)"),
                        "regs": ("honeydew", "registers: the accumulators of Sᵀ / dPᵀ, rounded in place")}


@_drawn("12_operands.png", figsize=(12, 4.6))
def fig_12(fig, ax):
    """Step 12: each product's A and B, and where wgmma reads them from, for one warpgroup and one query tile."""
    from matplotlib.patches import Patch
    n = len(HOPPER_BACKWARD_PRODUCTS)
    for i, (product, a, a_at, b, b_at) in enumerate(HOPPER_BACKWARD_PRODUCTS):
        y = n - 1 - i
        ax.text(0.0, y, product, ha="left", va="center", fontsize=9, family="monospace")
        for x, text, at in ((5.2, a, a_at), (8.4, b, b_at)):
            ax.text(x, y, text, ha="center", va="center", fontsize=8,
                    bbox={"boxstyle": "round", "fc": HOPPER_OPERAND_STYLE[at][0], "ec": "0.5", "pad": 0.35})
    ax.text(5.2, n - 0.35, "A", ha="center", fontsize=9, weight="bold")
    ax.text(8.4, n - 0.35, "B", ha="center", fontsize=9, weight="bold")
    ax.annotate("", xy=(5.2, 1.75), xytext=(5.2, 3.25), arrowprops={"arrowstyle": "->", "color": "tab:green", "lw": 1})
    ax.text(5.35, 2.5, "same thread,\nsame registers", fontsize=7, color="tab:green", va="center")
    ax.annotate("", xy=(5.2, 0.3), xytext=(6.3, 1.0), arrowprops={"arrowstyle": "->", "color": "tab:purple", "lw": 1,
                                                                  "connectionstyle": "arc3,rad=-0.3"})
    ax.text(6.45, 0.55, "dSᵀ stored [key][query]\n(4-byte stores)", fontsize=7, color="tab:purple")
    ax.legend(handles=[Patch(fc=f, ec="0.5", label=l) for f, l in HOPPER_OPERAND_STYLE.values()], loc="lower center",
              bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=7, frameon=False)
    _canvas(ax, (-0.2, 9.8), (-0.6, n))
    ax.set_title("Step 12: keys are the rows of every product but dQ, so Pᵀ and dSᵀ leave their accumulators as "
                 "wgmma's register A operand", fontsize=9)

# ---- step 12: who owns which tile, and dQ's path (steps/12_hopper_backward/traits.h) --------------------

HOPPER_BACKWARD_BLOCK_KV, HOPPER_BACKWARD_DQ_TILE = 128, 64  # BLOCK_KV, DQ_TILE
HOPPER_BACKWARD_CONFIGS = ((64, 128), (128, 64))  # kConfigs: (HEAD_DIM, BLOCK_Q)


def hopper_dq_tile(wg: int, block_q: int) -> tuple[int, int]:
    """(row tile, column block) of warpgroup wg's 64 x 64 dQ tile: traits.h's dq_tile_of."""
    return (wg, 0) if block_q // HOPPER_BACKWARD_DQ_TILE > 1 else (0, wg)


@_drawn("12_ownership.png", 1, 3, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.1, 1.1]})
def fig_12_ownership(fig, axes):
    """Step 12: the keys each warpgroup owns (rows of Sᵀ, dPᵀ, dK, dV), its 64 x 64 tile of the block's dQ at
    each head_dim, and the path dQ takes to memory."""
    colors = ("#c6dbef", "#fdd0a2")
    ax = axes[0]
    for wg in range(2):
        _box(ax, 0, 64 * wg, 1, 64, fc=colors[wg], ec="0.3")
        ax.text(0.5, 64 * wg + 32, f"warpgroup {wg}\nkeys {64 * wg}-{64 * wg + 63}", ha="center", va="center",
                fontsize=8)
    ax.text(1.15, 64, "rows of Sᵀ, dPᵀ\n(its accumulators),\ndK and dV\n(in its registers\nall the loop)",
            va="center", fontsize=7.5)
    _canvas(ax, (-0.1, 1.9), (HOPPER_BACKWARD_BLOCK_KV + 4, -14))
    ax.set_title(f"a block: {HOPPER_BACKWARD_BLOCK_KV} keys of one K/V head", fontsize=9)
    for ax, (head_dim, block_q) in zip(axes[1:], HOPPER_BACKWARD_CONFIGS):
        for wg in range(2):
            row, col = hopper_dq_tile(wg, block_q)
            t = HOPPER_BACKWARD_DQ_TILE
            _box(ax, col * t, row * t, t, t, fc=colors[wg], ec="0.3")
            ax.text(col * t + t / 2, row * t + t / 2, f"warpgroup {wg}\nqueries {row * t}-{row * t + t - 1}\n"
                    f"dims {col * t}-{col * t + t - 1}", ha="center", va="center", fontsize=7.5)
        ax.set_xlim(-4, 132)
        ax.set_ylim(132, -4)
        ax.set_aspect("equal")
        ax.set_xlabel("head dims", fontsize=8)
        ax.set_ylabel("query rows of the tile", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(f"dQ of one visit at head_dim {head_dim}: [{block_q} × {head_dim}]", fontsize=9)
    fig.text(0.5, -0.06, "dQ's path: each warpgroup stores its dSᵀ rows to shared memory → block barrier → its dQ "
             "tile = dS·K (wgmma, both operands from shared memory, all 128 keys)\n→ red.global.add.v2.f32 into the "
             "fp32 accumulator every block of the head adds to → after the main kernel, step 11's conversion kernel "
             "scales it and writes dQ", ha="center", fontsize=8.5)


# ---- step 13: the capped logit and its slope (common/step/softcap.h) --------------------------------

def capped_logit(c: float, softcap: float) -> float:
    """softcap·tanh(c / softcap) of a logit c (softcap 0: c), as the references compute it."""
    return softcap * math.tanh(c / softcap) if softcap > 0 else c


def capped_slope(c: float, softcap: float) -> float:
    """d capped_logit / dc = 1 - tanh²(c / softcap): the factor the backward applies to dS."""
    return 1 - math.tanh(c / softcap) ** 2 if softcap > 0 else 1.0


@_drawn("13_softcap.png", 1, 2, figsize=(11.5, 4.0))
def fig_13(fig, axes):
    """Step 13a: what softcapping does to a logit (left) and to its gradient (right)."""
    ax, bx = axes
    xs = [x / 10 for x in range(-400, 401)]
    ax.plot(xs, xs, color="0.6", lw=1, ls="--", label="no cap")
    bx.plot(xs, [1.0] * len(xs), color="0.6", lw=1, ls="--", label="no cap")
    for softcap, color in ((5, "tab:red"), (15, "tab:orange"), (30, "tab:blue")):
        ax.plot(xs, [capped_logit(x, softcap) for x in xs], color=color, label=f"softcap {softcap}")
        bx.plot(xs, [capped_slope(x, softcap) for x in xs], color=color, label=f"softcap {softcap}")
    ax.set_xlabel("logit c = scale·q·k", fontsize=8)
    ax.set_ylabel("softcap·tanh(c / softcap): what the softmax sees", fontsize=8)
    ax.set_title("forward: logits squeezed into (-softcap, softcap)", fontsize=9)
    bx.set_xlabel("logit c = scale·q·k", fontsize=8)
    bx.set_ylabel("1 - tanh²(c / softcap): the factor on dS", fontsize=8)
    bx.set_title("backward: dS scaled by the slope, ~0 where a logit is capped", fontsize=9)
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
        a.tick_params(labelsize=7)


# ---- step 13b: the K/V tiles a band visits (common/step/window.h, through flash-steps explain) ---------------

WINDOW_SHAPE = (2048, 2048, 128, 128)  # seqlen_q, seqlen_k, BLOCK_Q, BLOCK_KV of the figure's three panels
WINDOW_PANELS = ((True, None), (True, (512, 0)), (False, (256, 256)))  # (causal, window) of each panel
WINDOW_STEP = "13b_window"  # whose explain prints the maps
_MAP_HEADER = re.compile(r"^\s*map seqlen_q=(\d+) seqlen_k=(\d+) block_q=(\d+) block_kv=(\d+) causal=([01]) "
                         r"window=(off|-?\d+,-?\d+)\s*$")
_MAP_ROW = re.compile(r"^\s*q(\d+) ([.MF]+)\s*$")


def tile_map(seqlen_q: int, seqlen_k: int, block_q: int, block_kv: int, causal: bool,
             window: tuple[int, int] | None) -> list[str]:
    """The forward's tile map from the definition alone (fs_results.key_band), by brute force: for each query
    tile (its real rows) one character per K/V tile (block_kv keys, those past seqlen_k seen by no row): '.' when
    no (row, key) pair is visible (the tile is skipped), 'F' when every pair is (it runs without a mask), 'M'
    otherwise (masked). What `flash-steps explain --step 13b_window` prints from common/step/window.h."""
    lo, hi = key_band(seqlen_q, seqlen_k, causal, window)
    rows = []
    for q0 in range(0, seqlen_q, block_q):
        line = ""
        for k0 in range(0, seqlen_k, block_kv):
            seen = {j < seqlen_k and lo <= j - i <= hi for i in range(q0, min(q0 + block_q, seqlen_q))
                    for j in range(k0, k0 + block_kv)}
            line += "F" if seen == {True} else "." if seen == {False} else "M"
        rows.append(line)
    return rows


def parse_tile_maps(text: str) -> dict[tuple, list[str]]:
    """The tile maps in explain's text, whatever surrounds them: {(seqlen_q, seqlen_k, block_q, block_kv, causal,
    window or None): rows as tile_map gives them}, from each line `map seqlen_q=... window=L,R` (or window=off)
    and the `qNN <one of . M F per K/V tile>` lines under it. ValueError for a map whose rows are not all there."""
    maps, lines = {}, text.splitlines()
    for n, line in enumerate(lines):
        header = _MAP_HEADER.match(line)
        if not header:
            continue
        sq, sk, bq, bkv, causal = (int(x) for x in header.groups()[:5])
        window = None if header[6] == "off" else tuple(int(x) for x in header[6].split(","))
        rows = []
        for row in lines[n + 1:]:
            found = _MAP_ROW.match(row)
            if not found or int(found[1]) != len(rows):
                break
            rows.append(found[2])
        shape = (-(-sq // bq), -(-sk // bkv))
        if (len(rows), {len(r) for r in rows}) != (shape[0], {shape[1]}):
            raise ValueError(f"explain's {line.strip()!r} has {len(rows)} rows of lengths "
                             f"{sorted({len(r) for r in rows})}; it must have {shape[0]} rows q00, q01, ... of "
                             f"{shape[1]} tiles each")
        maps[(sq, sk, bq, bkv, bool(causal), window)] = rows
    return maps


def explain_text(runner: str | None, step: str) -> str:
    """What `flash-steps explain --step STEP` prints; Unavailable when the runner is not built or fails."""
    path = Path(runner) if runner else None
    if path is None or not (path.is_file() and os.access(path, os.X_OK)):
        raise Unavailable(f"no flash-steps runner at {runner} (build it: cmake --build build --target flash-steps; or "
                          "give --runner PATH or $FLASH_STEPS_RUNNER)")
    out = subprocess.run([str(path), "explain", "--step", step], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        why = next((ln.strip() for ln in (out.stderr + out.stdout).splitlines() if ln.strip()),
                   f"exit status {out.returncode}")
        raise Unavailable(f"`{path} explain --step {step}` failed: {why}")
    return out.stdout


def window_panels(text: str) -> list[list[str]]:
    """The maps of the figure's panels (WINDOW_PANELS at WINDOW_SHAPE) in explain's text; Unavailable naming
    the first one it lacks."""
    maps = parse_tile_maps(text)
    for causal, window in WINDOW_PANELS:
        if (*WINDOW_SHAPE, causal, window) not in maps:
            raise Unavailable(f"`flash-steps explain --step {WINDOW_STEP}` prints no map seqlen_q={WINDOW_SHAPE[0]} "
                              f"seqlen_k={WINDOW_SHAPE[1]} block_q={WINDOW_SHAPE[2]} block_kv={WINDOW_SHAPE[3]} "
                              f"causal={int(causal)} window={'off' if window is None else '%d,%d' % window}")
    return [maps[(*WINDOW_SHAPE, causal, window)] for causal, window in WINDOW_PANELS]


def band_text(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int] | None) -> str:
    """The keys j row i sees, as a formula: "i − 512 ≤ j ≤ i" (key_band)."""
    lo, hi = key_band(seqlen_q, seqlen_k, causal, window)

    def at(x):
        return "i" if x == 0 else f"i + {x:g}" if x > 0 else f"i − {-x:g}"
    if lo == -math.inf and hi == math.inf:
        return "every key j"
    return " ≤ ".join(([at(lo)] if lo > -math.inf else []) + ["j"] + ([at(hi)] if hi < math.inf else []))


WINDOW_COLORS = {".": ("0.88", "skipped: never loaded"), "M": ("tab:orange", "masked: some scores set to −∞"),
                 "F": ("tab:blue", "full: run without a mask")}


@_drawn("13_window.png", 1, 3, figsize=(15, 5.6), rect=(0, 0.05, 1, 0.95),
        source=lambda runner: window_panels(explain_text(runner, WINDOW_STEP)))
def fig_13_window(fig, axes, panels):
    """Step 13b: the K/V tiles each query tile's forward skips, masks or runs without a mask, under three bands,
    as `flash-steps explain --step 13b_window` prints them from common/step/window.h."""
    from matplotlib.patches import Patch
    sq, sk, block_q, block_kv = WINDOW_SHAPE
    for ax, (causal, window), rows in zip(axes, WINDOW_PANELS, panels):
        for qt, row in enumerate(rows):
            for kt, kind in enumerate(row):
                _box(ax, kt, qt, facecolor=WINDOW_COLORS[kind][0], edgecolor="white", linewidth=0.6)
        _grid_axes(ax, len(rows), len(rows[0]), f"K/V tile ({block_kv} keys)", f"query tile ({block_q} rows)",
                   step_x=2, step_y=2)
        counts = {kind: sum(row.count(kind) for row in rows) for kind in WINDOW_COLORS}
        name = ("causal" if causal else "not causal") + (f", window ({window[0]}, {window[1]})" if window else "")
        ax.set_title(f"{name}: {band_text(sq, sk, causal, window)}\n{counts['F']} full, {counts['M']} masked, "
                     f"{counts['.']} skipped of {len(rows) * len(rows[0])} tiles", fontsize=9)
    fig.legend(handles=[Patch(facecolor=color, label=label) for color, label in WINDOW_COLORS.values()],
               loc="lower center", ncol=3, fontsize=8.5, frameon=False)
    fig.suptitle(f"Step 13b: the tiles one head's forward visits, seqlen {sq}, {block_q} × {block_kv} tiles "
                 f"(flash-steps explain --step {WINDOW_STEP}, from common/step/window.h)", fontsize=10)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out-dir", default=str(OUT), help="where the PNGs go (default: notes/figures)")
    ap.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="the notes whose figures to draw")
    ap.add_argument("--runner", default=os.environ.get("FLASH_STEPS_RUNNER") or str(REPO / "build" / "flash-steps"),
                    help="the flash-steps runner whose explain output the figures of its maps are drawn from "
                    "(default: $FLASH_STEPS_RUNNER, else build/flash-steps); without it they are left out")
    args = ap.parse_args(argv)
    try:
        pyplot()
    except ImportError:
        print("figures.py: matplotlib is not installed (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for draw in (draw for key in args.only or sorted(FIGURES) for draw in FIGURES[key]):
        draw(out, args.runner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
