#!/usr/bin/env python3
"""What a packed batch costs, measured in one run on the same tensors: a packed batch of 64
sequences with lengths drawn uniformly from [128, 8192] (FlashAttention's varlen layout, step 13c_varlen) against
an equal-length batch of 64 sequences at the mean length (the same step's dense kernels), and both against
FlashAttention-4 (flash_attn_varlen_func, flash_attn_func) where it imports; forward and backward, TFLOP/s on the
pairs each sequence really has. `python3 bench/varlen_bench.py [--head-dims 128] [--causal on] [--passes fwd]
[--window 1024,0] [--softcap 30]`. How it measures, checks and writes: bench/README.md.

The table's two ratios: ours varlen over ours dense at the mean length (what packing costs), and ours varlen over
FA4 varlen (TFLOP/s on the same pairs). The exit status is 1 when one of our rows failed its check or errored.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import random
import sys
import time

import fs_results as fr

sys.path.insert(0, str(fr.REPO / "python"))  # the flash_steps package, also without pip install -e

import flash_steps  # noqa: E402  (needs neither PyTorch nor a GPU to import)

TOOL = "varlen_bench"
STEP = "13c_varlen"  # the sub-step with variable-length batches; dense problems run its dense kernels
PASSES = ("fwd", "bwd")
BACKWARD_FACTOR = 2.5  # fs_backward_flops: 2.5 x the forward's (common/backward/rules.cpp), compare_torch --backward's
OURS, FA4 = "ours", "fa4"
LAYOUTS = ("varlen", "dense")
CHECK_CHUNK_ROWS = 1 << 15  # the whole-tensor comparison with FA4's output, in chunks of rows (fp32 temporaries)
CSV_FIELDS = ("date commit gpu direction impl layout step head_dim heads_q heads_kv causal window_left window_right softcap "
              "dtype sequences total_tokens max_len mean_len flops status ms min_ms max_ms iters tflops x_dense x_fa4 "
              "max_abs_err max_lse_err mismatches nonfinite max_abs_diff_fa4 mismatches_vs_fa4 dq_err dq_ratio dk_err "
              "dk_ratio dv_err dv_ratio ref_impl pass reason").split()


# ---- the lengths and the work -----------------------------------------------------------------------

def draw_lengths(sequences: int, min_len: int, max_len: int, seed: int) -> list[int]:
    """`sequences` lengths uniform in [min_len, max_len] (both included), from random.Random(seed): the same seed
    gives the same lengths on every machine and Python 3."""
    rng = random.Random(seed)
    return [rng.randint(min_len, max_len) for _ in range(sequences)]


def offsets(lengths: list[int]) -> list[int]:
    """cu_seqlens: 0, then the running sum of the lengths (len(lengths) + 1 int32s)."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def mean_length(lengths: list[int]) -> int:
    """The mean length rounded to the nearest integer, halves up (the equal-length batch's seqlen)."""
    return (2 * sum(lengths) + len(lengths)) // (2 * len(lengths))


def checked_sequences(lengths: list[int], count: int) -> list[int]:
    """The sequences whose output is checked against the exact reference, at most `count`, ascending: the first and
    the last (the two ends of the packed tensors), the shortest and the longest, then evenly spaced others."""
    n = len(lengths)
    picks = [0, n - 1, lengths.index(min(lengths)), lengths.index(max(lengths))]
    picks += [round(i * (n - 1) / (count + 1)) for i in range(1, count + 1)] + list(range(n))
    return sorted(list(dict.fromkeys(picks))[:max(count, 0)])


class Stand:
    """What flash_steps' checks read of a tensor (shape, stride(), dtype, device, data_ptr()), without one: the
    problem of a shape whose FLOPs are counted before (or without) any tensor."""

    def __init__(self, shape, dtype: str):
        self.shape, self.dtype, self.device = tuple(shape), dtype, "cuda:0"

    def stride(self):
        return tuple(math.prod(self.shape[i + 1:]) for i in range(len(self.shape)))

    def data_ptr(self) -> int:
        return 256  # aligned and not NULL; never read


def stand_in_problem(lengths: list[int], heads_q: int, heads_kv: int, head_dim: int, dtype: str, causal: bool,
                   window=None, softcap: float = 0.0):
    """The fs_problem of the packed batch of these lengths (contiguous tensors), as the package makes it."""
    total, dt = sum(lengths), {"fp16": "torch.float16", "bf16": "torch.bfloat16"}[dtype]
    q, kv = Stand((total, heads_q, head_dim), dt), Stand((total, heads_kv, head_dim), dt)
    cu = Stand((len(lengths) + 1,), "torch.int32")
    return flash_steps.varlen_problem(TOOL, q, kv, kv, None, cu, cu, max(lengths), max(lengths), causal, None,
                                      softcap=softcap, window=window)


def varlen_flops(lib, lengths: list[int], heads_q: int, heads_kv: int, head_dim: int, dtype: str, causal: bool,
                 window=None) -> float:
    """fs_varlen_flops: the forward's FLOPs of the packed batch, each sequence on its own lengths (4·heads_q·d per
    visible pair; causal without a window: L²/2 pairs, FlashAttention's convention; with a window: exactly)."""
    cu = offsets(lengths)
    return lib.varlen_flops(stand_in_problem(lengths, heads_q, heads_kv, head_dim, dtype, causal, window), cu, cu)


def dense_flops(lib, batch: int, seqlen: int, heads_q: int, heads_kv: int, head_dim: int, dtype: str, causal: bool,
                window=None) -> float:
    """fs_problem_flops of the equal-length batch, by the same rule."""
    return lib.flops(lib.problem(batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype, causal, window=window))


# ---- the command line ---------------------------------------------------------------------------------

def passes_arg(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not chosen or any(p not in PASSES for p in chosen):
        raise argparse.ArgumentTypeError(f"--passes expects fwd, bwd or fwd,bwd, got '{text}'")
    return chosen


def heads_of(args, head_dim: int) -> tuple[int, int]:
    """(heads_q, heads_kv) at this head_dim: --heads (default 2048 // head_dim: 2048 channels, as the sweep's
    shapes), --kv-heads (default heads_q). ValueError when heads_q is no multiple of heads_kv."""
    hq = args.heads or max(2048 // head_dim, 1)
    hkv = args.kv_heads or hq
    if hq % hkv:
        raise ValueError(f"heads_q {hq} (head_dim {head_dim}) is not a multiple of --kv-heads {hkv}")
    return hq, hkv


def parse_args(argv=None):
    ap = fr.parser(__doc__)
    fr.add_run_arguments(ap, "JSON and CSV")
    add = ap.add_argument
    add("--sequences", type=int, default=64, help="sequences in the packed batch (default 64)")
    add("--min-len", type=int, default=128, help="shortest length drawn (default 128)")
    add("--max-len", type=int, default=8192, help="longest length drawn (default 8192)")
    add("--seed", type=int, default=0, help="random.Random's seed for the lengths; the tensors' generator too")
    add("--dtype", choices=["fp16", "bf16"], default="fp16")
    add("--head-dims", type=int, nargs="+", default=[128, 64])
    add("--heads", type=int, help="query heads (default 2048 // head_dim)")
    add("--kv-heads", type=int, help="K/V heads (default: as many as query heads; fewer: GQA)")
    add("--causal", choices=list(fr.CAUSALS), default="both", help="bottom-right per sequence (default both)")
    add("--window", type=fr.window_arg, metavar="L,R", help="a sliding window for every shape, FlashAttention's "
        "window_size (-1: unbounded on that side; a negative L goes after '=': --window=-1,32)")
    add("--softcap", type=float, default=0.0, help="logit softcapping softcap*tanh(s/softcap) (default 0: off)")
    add("--passes", type=passes_arg, default=PASSES, help="fwd, bwd or fwd,bwd (default both)")
    add("--step", default=STEP, help=f"our step, for the packed and the equal-length batch (default {STEP})")
    add("--no-fa4", action="store_true", help="leave FlashAttention-4 out even where it imports")
    add("--iters", type=int, default=20, help="timed launches per implementation (the median is reported)")
    add("--warmup", type=int, default=3, help="untimed launches before the timed ones")
    add("--sleep-us", type=float, default=50, help="GPU sleep before each timed launch (0: none)")
    add("--check-sequences", type=int, default=4, help="sequences checked against the exact reference: the first, "
        "the last, the shortest, the longest, then evenly spaced ones (default 4)")
    args = ap.parse_args(argv)
    if args.sequences < 1:
        ap.error("--sequences must be at least 1")
    if not 1 <= args.min_len <= args.max_len:
        ap.error(f"--min-len and --max-len must satisfy 1 <= min <= max, got {args.min_len} and {args.max_len}")
    if args.max_len > 2 ** 31 - 1 or args.sequences * args.max_len > 2 ** 31 - 1:
        ap.error("the packed batch must have fewer than 2^31 rows (cu_seqlens are int32)")
    if any(d < 8 or d % 8 for d in args.head_dims):
        ap.error("--head-dims must be multiples of 8")
    if args.heads is not None and args.heads < 1 or args.kv_heads is not None and args.kv_heads < 1:
        ap.error("--heads and --kv-heads must be at least 1")
    if args.softcap < 0 or not math.isfinite(args.softcap):
        ap.error("--softcap must be finite and >= 0 (0: off)")
    if args.iters < 1 or args.warmup < 0 or args.check_sequences < 0:
        ap.error("--iters must be at least 1, --warmup and --check-sequences at least 0")
    try:
        for d in args.head_dims:
            heads_of(args, d)
    except ValueError as e:
        ap.error(str(e))
    return args


# ---- the table ------------------------------------------------------------------------------------------

def describe(r: dict) -> str:
    """A shape in a few characters: "d128 h16/16 fp16 causal window 1024,0 softcap 30"."""
    return (f"d{r['head_dim']} h{r['heads_q']}/{r['heads_kv']} {r['dtype']}" + " causal" * bool(r["causal"])
            + (f" window {r['window_left']},{r['window_right']}" if r.get("window_left") is not None else "")
            + (f" softcap {r['softcap']:g}" if r.get("softcap") else ""))


def shape_key(r: dict) -> tuple:
    return r["head_dim"], r["causal"]


def add_ratios(rows: list[dict]) -> None:
    """Within one shape and pass: x_dense = ours varlen / ours dense (TFLOP/s) on our varlen row and FA4 varlen /
    FA4 dense on FA4's; x_fa4 = ours / FA4 of the same layout (TFLOP/s: the same FLOPs, so FA4's ms / ours)."""
    by = {(r["impl"], r["layout"]): r for r in rows if fr.timed(r)}
    for (impl, layout), r in by.items():
        if layout == "varlen" and (impl, "dense") in by:
            r["x_dense"] = r["tflops"] / by[(impl, "dense")]["tflops"]
        if impl == OURS and (FA4, layout) in by:
            r["x_fa4"] = r["tflops"] / by[(FA4, layout)]["tflops"]


def cell(r: dict | None) -> str:
    if not r:
        return "-"
    if not fr.timed(r):
        return r["status"] or "-"
    return f"{r['tflops']:.1f}" + "!" * (r["status"] == "fail")


def ratio_cell(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def table(result: dict) -> str:
    """The run's tables, one per pass: per shape, TFLOP/s (median) of ours varlen, ours dense at the mean length,
    their ratio, FA4 varlen, ours / FA4, FA4 dense; then the rows that failed or errored. ! = check failed."""
    env, lines = result["environment"], []
    rows = result["rows"]
    head = (f"{'shape':34}{'ours varlen':>12}{'ours dense':>12}{'varlen/dense':>14}{'FA4 varlen':>12}"
            f"{'ours/FA4':>12}{'FA4 dense':>11}")
    for ps in result["passes"]:
        mine = [r for r in rows if r["direction"] == ps]
        if not mine:
            continue
        name = "forward" if ps == "fwd" else "backward"
        lines.append(f"\n{name}: TFLOP/s (median, real pairs), step {result['step']}, "
                     f"{env.get('gpu', '')}, commit {result['commit']}, {result['date']}; {result['sequences']} "
                     f"sequences of {result['min_len']}-{result['max_len']} (total {result['total_tokens']}, mean "
                     f"{result['mean_len']}) vs {result['sequences']} x {result['mean_len']}" + (
                         f"; fa4 = {fr.backend_label('fa4', env)}" if env.get("fa4") not in (None, "none") else ""))
        lines.append(head)
        for key in dict.fromkeys(shape_key(r) for r in mine):
            by = {(r["impl"], r["layout"]): r for r in mine if shape_key(r) == key}
            ours = by.get((OURS, "varlen"))
            first = next(iter(by.values()))
            lines.append(f"{describe(first):34}{cell(ours):>12}{cell(by.get((OURS, 'dense'))):>12}"
                         f"{ratio_cell((ours or {}).get('x_dense')):>14}"
                         f"{cell(by.get((FA4, 'varlen'))):>12}"
                         f"{ratio_cell((ours or {}).get('x_fa4')):>12}"
                         f"{cell(by.get((FA4, 'dense'))):>11}")
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    for r in [r for r in rows if r["status"] in ("fail", "error", "refused")][:20]:
        lines.append(f"  {r['direction']} {r['impl']} {r['layout']} {describe(r)}: {r['status']}: {r['reason']}")
    return "\n".join(lines)


# ---- the measurement ------------------------------------------------------------------------------------

class Bench:
    """The tensors of one head_dim (packed and equal-length, drawn once), then, per causal flag and pass, every
    implementation checked once and timed, interleaved."""

    def __init__(self, torch, lib, args, env: dict, lengths: list[int], fa4_varlen):
        self.torch, self.lib, self.args, self.lengths = torch, lib, args, lengths
        self.fa4_varlen = fa4_varlen  # flash_attn.cute.flash_attn_varlen_func, or None
        self.fa4_dense = fr.Backend(torch, "fa4") if fa4_varlen else None
        self.timer = fr.Timer(torch, env["l2_bytes"] or (64 << 20), args.sleep_us)
        self.stream = torch.cuda.current_stream().cuda_stream
        self.cu = offsets(lengths)
        self.checked = checked_sequences(lengths, args.check_sequences)
        self.mean, self.max = mean_length(lengths), max(lengths)
        self.features = {"softcap": args.softcap, "window": args.window}

    # ---- tensors ----

    def tensors(self, hi: int, head_dim: int) -> dict:
        torch, args = self.torch, self.args
        hq, hkv = heads_of(args, head_dim)
        draw = fr.drawer(torch, args.seed * 1000 + hi, args.dtype)
        total, b, n = self.cu[-1], len(self.lengths), self.mean
        t = {"head_dim": head_dim, "heads_q": hq, "heads_kv": hkv, "scale": 1.0 / math.sqrt(head_dim),
             "varlen": {"q": draw(total, hq, head_dim), "k": draw(total, hkv, head_dim),
                        "v": draw(total, hkv, head_dim), "d_o": draw(total, hq, head_dim)},
             "dense": {"q": draw(b, n, hq, head_dim), "k": draw(b, n, hkv, head_dim), "v": draw(b, n, hkv, head_dim),
                       "d_o": draw(b, n, hq, head_dim)}}
        t["cu"] = torch.tensor(self.cu, dtype=torch.int32, device="cuda")
        # the reference's heads: query heads 0-1 (no GQA), or every query head of K/V head 0 (GQA)
        group = hq // hkv
        t["ref_heads"] = min(hq, 2) if group == 1 else group
        t["kv_of"] = torch.tensor([h // group for h in range(t["ref_heads"])], device="cuda")
        return t

    def pieces(self, t: dict, layout: str, x) -> list[tuple]:
        """(label, slice as a (1, L, H, d) view) of the checked sequences of a packed tensor, or batch 0 of a dense
        one; x given as (total, H, d) or (B, N, H, d)."""
        if layout == "dense":
            return [(0, x[0:1])]
        return [(s, x[self.cu[s]:self.cu[s + 1]].unsqueeze(0)) for s in self.checked]

    def lse_piece(self, layout: str, lse, s):
        return lse[0:1] if layout == "dense" else lse[:, self.cu[s]:self.cu[s + 1]].unsqueeze(0)

    def references(self, t: dict, layout: str, causal: bool, backward: bool) -> dict:
        """{sequence: exact reference} of the checked sequences (fs_results.reference: fp64 O and LSE, or fp32
        gradients; with GQA dK and dV of K/V head 0 summed over its query heads)."""
        torch, x, out = self.torch, t[layout], {}
        parts = {n: dict(self.pieces(t, layout, x[n])) for n in ("q", "k", "v", "d_o")}
        for s, q in parts["q"].items():
            k, v = (parts[n][s].index_select(2, t["kv_of"]) for n in ("k", "v"))
            ref = fr.reference(torch, q, k, v, causal, t["scale"], t["ref_heads"],
                               d_o=parts["d_o"][s] if backward else None, **self.features)
            if backward and t["heads_q"] != t["heads_kv"]:
                ref["dk"], ref["dv"] = (ref[n].sum(0, keepdim=True) for n in ("dk", "dv"))
            out[s] = ref
        return out

    # ---- the checks ----

    def forward_check(self, t: dict, layout: str, o, lse, refs: dict, tol, other=None) -> dict:
        """O (and LSE) of every checked sequence against the fp64 reference within fs_tolerance (fs_results.compare),
        no NaN or infinity anywhere in O, and, where `other` (FA4's O) is given, every element within twice the
        tolerance of it."""
        torch, res = self.torch, {"max_abs_err": 0.0, "mismatches": 0}
        o_parts = dict(self.pieces(t, layout, o))
        for s, ref in refs.items():
            c = fr.compare(torch, o_parts[s], None if lse is None else self.lse_piece(layout, lse, s), ref, tol)
            res["max_abs_err"] = max(res["max_abs_err"], c["max_abs_err"])
            if "max_lse_err" in c:
                res["max_lse_err"] = max(res.get("max_lse_err", 0.0), c["max_lse_err"])
            res["mismatches"] += c["mismatches"]
        res["nonfinite"] = int((~torch.isfinite(o)).sum())
        why = []
        if res["mismatches"] or res["nonfinite"]:
            why.append(f"{res['mismatches']} elements of sequences {sorted(refs)} outside fs_tolerance of the fp64 "
                       f"reference, {res['nonfinite']} non-finite")
        if other is not None:
            atol, rtol, _ = tol
            a, b = o.reshape(-1, o.shape[-1]), other.reshape(-1, other.shape[-1])
            worst, bad = 0.0, 0
            for r0 in range(0, a.shape[0], CHECK_CHUNK_ROWS):
                x, y = a[r0:r0 + CHECK_CHUNK_ROWS].float(), b[r0:r0 + CHECK_CHUNK_ROWS].float()
                diff = torch.nan_to_num((x - y).abs(), nan=float("inf"))
                worst = max(worst, float(diff.max()))
                bad += int((~(diff <= 2 * (atol + rtol * y.abs()))).sum())
            res.update(max_abs_diff_fa4=worst, mismatches_vs_fa4=bad)
            if bad:
                why.append(f"{bad} elements outside twice the tolerance of FlashAttention-4's output")
        res["pass"] = not why
        if why:
            res["why"] = "check failed: " + "; ".join(why)
        return res

    def gradient_errors(self, t: dict, layout: str, grads, refs: dict) -> dict:
        """{sequence: fs_results.gradient_errors of (dQ, dK, dV) on it}."""
        parts = [dict(self.pieces(t, layout, g)) for g in grads]
        return {s: fr.gradient_errors(self.torch, {n: p[s] for n, p in zip(("dq", "dk", "dv"), parts)}, ref)
                for s, ref in refs.items()}

    def sdpa_errors(self, t: dict, layout: str, causal: bool, refs: dict) -> dict | None:
        """The reference error of the bound when FA4 gave none: PyTorch SDPA flash's gradients of each checked
        sequence alone; None where SDPA cannot run the problem (a window or softcapping)."""
        if self.args.window is not None or self.args.softcap:
            return None
        torch, be, x = self.torch, fr.Backend(self.torch, "flash"), t[layout]
        parts = {n: dict(self.pieces(t, layout, x[n])) for n in ("q", "k", "v", "d_o")}
        out = {}
        try:
            with be.context():
                for s, ref in refs.items():
                    inputs = [be.view(parts[n][s].detach().requires_grad_()) for n in ("q", "k", "v")]
                    o = be(*inputs, causal, t["scale"])
                    grads = torch.autograd.grad(o, inputs, be.view(parts["d_o"][s]))
                    out[s] = fr.gradient_errors(torch, dict(zip(("dq", "dk", "dv"), (be.view(g) for g in grads))),
                                                ref)
        except Exception:  # SDPA flash cannot run it (head_dim, GPU): the gradients are then not judged
            return None
        return out

    def judged(self, errors: dict, ref_errors: dict | None, ref_impl: str, nonfinite: int,
               own_reference: bool = False) -> dict:
        """Each gradient of each checked sequence within fs_backward_bound(dtype, ref_err, max|exact|) (ref_err:
        the reference implementation's error on that sequence), no NaN or infinity in the whole gradients. The
        row keeps per gradient its largest error and its largest error / bound (<= 1 passes). own_reference: the
        row is the reference implementation (FA4), which passes by definition unless it has NaN or infinity."""
        res, failed = {"nonfinite": nonfinite, "ref_impl": ref_impl if ref_errors else ""}, []
        for name in ("dq", "dk", "dv"):
            res[name + "_err"] = max(e[name][0] for e in errors.values())
        if ref_errors:
            for name in ("dq", "dk", "dv"):
                ratios = []
                for s, e in errors.items():
                    max_exact = max(e[n][1] for n in ("dq", "dk", "dv"))
                    bound = self.lib.backward_bound(self.args.dtype, ref_errors[s][name][0], max_exact)
                    ratios.append(e[name][0] / bound if bound > 0 else (0.0 if e[name][0] == 0 else math.inf))
                res[name + "_ratio"] = max(ratios)
                if not res[name + "_ratio"] <= 1:
                    failed.append(f"{name} error {res[name + '_ratio']:.3g}x its bound")
        if nonfinite:
            failed.append(f"{nonfinite} non-finite elements")
        res["pass"] = not failed
        if failed:
            res["why"] = "check failed: " + "; ".join(failed) + (
                f" (fs_backward_bound: 2*ref_err + u*max|exact|, ref_err of {ref_impl})" if ref_errors else "")
        elif not ref_errors and not own_reference:
            res["reason"] = ("gradients not judged: neither FA4 nor SDPA flash (no window, no softcap) gave the "
                             "reference error; their errors against the fp32 reference are recorded")
        return res

    # ---- the launches ----

    def runner(self, step: str, p, *tensors):
        """fs_run or fs_run_backward (by p's type) of `step` on these tensors, ctypes conversions done once."""
        n = self.lib.workspace_size(step, p)
        ws = self.torch.empty(n, dtype=self.torch.uint8, device="cuda") if n else None
        fn = self.lib.runner(step, p, *(x.data_ptr() for x in tensors), workspace=ws.data_ptr() if ws is not None
                             else 0, workspace_bytes=n, stream=self.stream)
        fn.keep = (ws,) + tensors
        return fn

    def fa4_call(self, t: dict, layout: str, q, k, v, causal: bool):
        """FlashAttention-4's O: flash_attn_varlen_func on the packed tensors, flash_attn_func (fs_results.Backend)
        on the dense ones; softcap and window_size (None: unbounded) only where given, as compare_torch.py calls it."""
        if layout == "dense":
            return self.fa4_dense(q, k, v, causal, t["scale"], **self.features)
        extra = {"softcap": self.args.softcap} if self.args.softcap else {}
        if self.args.window is not None:
            extra["window_size"] = tuple(None if x < 0 else x for x in self.args.window)
        out = self.fa4_varlen(q, k, v, cu_seqlens_q=t["cu"], cu_seqlens_k=t["cu"], max_seqlen_q=self.max,
                              max_seqlen_k=self.max, softmax_scale=t["scale"], causal=causal, **extra)
        return out[0] if isinstance(out, tuple) else out  # (out, lse)

    def problem(self, t: dict, layout: str, causal: bool, tensors: dict, backward: bool):
        x, f = tensors, self.features
        if layout == "varlen":
            if backward:
                return flash_steps.varlen_backward_problem(
                    TOOL, x["q"], x["k"], x["v"], x["o"], x["lse"], x["d_o"], x["dq"], x["dk"], x["dv"], t["cu"],
                    t["cu"], self.max, self.max, causal, t["scale"], False, **f)
            return flash_steps.varlen_problem(TOOL, x["q"], x["k"], x["v"], x["o"], t["cu"], t["cu"], self.max,
                                              self.max, causal, t["scale"], lse=x["lse"], **f)
        if backward:
            return flash_steps.backward_problem(TOOL, x["q"], x["k"], x["v"], x["o"], x["lse"], x["d_o"], x["dq"],
                                                x["dk"], x["dv"], causal, t["scale"], False, **f)
        return flash_steps.forward_problem(TOOL, x["q"], x["k"], x["v"], x["o"], causal, t["scale"], lse=x["lse"], **f)

    def forward_plan(self, t: dict, row: dict, refs: dict, tol, fa4_out: dict):
        """(launch, checked) of one forward row; FA4's rows leave their O in fa4_out for ours to be compared with."""
        torch, layout, causal, x = self.torch, row["layout"], row["causal"], t[row["layout"]]
        if row["impl"] == FA4:
            box = {}

            def fn():
                box["o"] = self.fa4_call(t, layout, x["q"], x["k"], x["v"], causal)

            def checked():
                fn()
                torch.cuda.synchronize()
                fa4_out[layout] = box.pop("o")
                return self.forward_check(t, layout, fa4_out[layout], None, refs, tol)
            return fn, checked
        mine = dict(x, o=torch.empty_like(x["q"]))
        mine["lse"] = torch.empty((t["heads_q"], self.cu[-1]) if layout == "varlen" else
                                  (len(self.lengths), t["heads_q"], self.mean), dtype=torch.float32, device="cuda")
        p = self.problem(t, layout, causal, mine, backward=False)
        self.lib.check(row["step"], p)  # InvalidArgument: the step refuses the problem (its sentence)
        if layout == "varlen":
            self.lib.check_offsets(p, self.stream)
        fn = self.runner(row["step"], p, *(mine[n] for n in ("q", "k", "v", "o", "lse")))

        def checked():
            for y in (mine["o"], mine["lse"]):
                y.fill_(float("nan"))  # an element the step does not write fails the check
            fn()
            torch.cuda.synchronize()
            return self.forward_check(t, layout, mine["o"], mine["lse"], refs, tol, fa4_out.get(layout))
        return fn, checked

    def backward_plan(self, t: dict, row: dict, refs: dict, ref_errors: dict):
        """(launch, checked) of one backward row: FA4's, torch.autograd.grad on one forward's graph (retain_graph, dO
        in O's layout); ours, fs_run_backward from our forward's O and LSE (deterministic 0). FA4's rows leave their
        errors in ref_errors, the reference error of our bound."""
        torch, layout, causal, x = self.torch, row["layout"], row["causal"], t[row["layout"]]
        if row["impl"] == FA4:
            inputs = [x[n].detach().requires_grad_() for n in ("q", "k", "v")]
            o = self.fa4_call(t, layout, *inputs, causal)
            d_o = torch.empty_like(o)
            d_o.copy_(x["d_o"])
            box = {}

            def fn():
                box["g"] = torch.autograd.grad(o, inputs, d_o, retain_graph=True)

            def checked():
                fn()
                torch.cuda.synchronize()
                grads = box.pop("g")
                errors = self.gradient_errors(t, layout, grads, refs)
                ref_errors[layout] = errors
                return self.judged(errors, None, "", sum(int((~torch.isfinite(g)).sum()) for g in grads),
                                   own_reference=True)
            return fn, checked
        step = row["step"]
        mine = dict(x)
        if layout == "varlen":
            mine["o"], mine["lse"] = flash_steps.varlen_forward(x["q"], x["k"], x["v"], t["cu"], t["cu"], self.max,
                                                                self.max, causal, t["scale"], step, **self.features)
        else:
            mine["o"], mine["lse"] = flash_steps.forward(x["q"], x["k"], x["v"], causal, t["scale"], step,
                                                         **self.features)
        mine.update(dq=torch.empty_like(x["q"]), dk=torch.empty_like(x["k"]), dv=torch.empty_like(x["v"]))
        p = self.problem(t, layout, causal, mine, backward=True)
        self.lib.check(step, p)
        fn = self.runner(step, p, *(mine[n] for n in ("q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv")))

        def checked():
            grads = (mine["dq"], mine["dk"], mine["dv"])
            for g in grads:
                g.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            errors = self.gradient_errors(t, layout, grads, refs)
            ref, ref_impl = ref_errors.get(layout), "fa4"
            if ref is None:
                ref, ref_impl = self.sdpa_errors(t, layout, causal, refs), "torch_flash"
            return self.judged(errors, ref, ref_impl, sum(int((~torch.isfinite(g)).sum()) for g in grads))
        return fn, checked

    # ---- one shape ----

    def rows_of(self, t: dict, ps: str, causal: bool) -> list[dict]:
        window = self.args.window
        base = {"direction": ps, "head_dim": t["head_dim"], "heads_q": t["heads_q"], "heads_kv": t["heads_kv"],
                "causal": causal, "window_left": window[0] if window else None,
                "window_right": window[1] if window else None, "softcap": self.args.softcap, "dtype": self.args.dtype,
                "sequences": len(self.lengths)}
        factor = BACKWARD_FACTOR if ps == "bwd" else 1.0
        args = (t["heads_q"], t["heads_kv"], t["head_dim"], self.args.dtype, causal, window)
        flops = {"varlen": factor * varlen_flops(self.lib, self.lengths, *args),
                 "dense": factor * dense_flops(self.lib, len(self.lengths), self.mean, *args)}
        sizes = {"varlen": (self.cu[-1], self.max, self.mean), "dense": (len(self.lengths) * self.mean, self.mean,
                                                                         self.mean)}
        impls = ([FA4] if self.fa4_varlen else []) + [OURS]  # FA4 first: ours is compared with its output
        return [dict(base, impl=impl, layout=layout, step=self.args.step if impl == OURS else "",
                     total_tokens=sizes[layout][0], max_len=sizes[layout][1], mean_len=sizes[layout][2],
                     flops=flops[layout], status="", reason="") for impl in impls for layout in LAYOUTS]

    def shape(self, t: dict, ps: str, causal: bool) -> list[dict]:
        rows = self.rows_of(t, ps, causal)
        backward = ps == "bwd"
        refs = {layout: self.references(t, layout, causal, backward) for layout in LAYOUTS}
        tol = self.lib.tolerance(self.args.dtype, max(float(t[layout]["v"].abs().max()) for layout in LAYOUTS))
        shared: dict = {}  # FA4's outputs (forward) or errors (backward) by layout
        ready = []
        for row in rows:
            try:
                fn, checked = (self.backward_plan(t, row, refs[row["layout"]], shared) if backward
                               else self.forward_plan(t, row, refs[row["layout"]], tol, shared))
                res = checked()
                why = res.pop("why", "")
                row.update(res)
                ready.append((row, fn, res["pass"], why))
            except flash_steps.InvalidArgument as e:
                row.update(status="refused", reason=e.message)
            except Exception as e:  # one implementation's failure must not end the run
                failed(row, e)
        self.timed(ready)
        add_ratios(rows)
        return rows

    def timed(self, ready: list) -> None:
        """Warm-up, then --iters launches of each implementation, interleaved (fs_results' time_interleaved): the
        median, min and max of its launches."""
        launches = [(row, fn, self.args.iters, self.args.warmup, contextlib.nullcontext, (passed, why))
                    for row, fn, passed, why in ready]
        fr.time_interleaved(self.timer, launches, failed, lambda row, ms: {"tflops": row["flops"] / (ms * 1e-3) / 1e12})


def failed(row: dict, e: Exception) -> None:
    """One implementation's error, not the run's: its row's status and reason."""
    row.update(status="error", reason=fr.first_line(e))


def fa4_varlen_function(notes: list[str], wanted: bool):
    """flash_attn.cute.flash_attn_varlen_func where FlashAttention-4 imports (and --no-fa4 is not given), else None
    with the note why."""
    if not wanted:
        notes.append("FlashAttention-4 left out (--no-fa4): no fa4 columns")
        return None
    found = fr.fa4()
    if not found["func"]:
        notes.append(found["note"])
        return None
    func = getattr(sys.modules.get("flash_attn.cute"), "flash_attn_varlen_func", None)
    if func is None:
        notes.append(f"FlashAttention-4 {found['version']} has no flash_attn_varlen_func: no fa4 columns")
    return func


def run(args) -> int:
    try:
        lib = flash_steps.library(args.lib)
    except flash_steps.LibraryNotFound as e:
        print(f"{TOOL}: {e.message} (or pass --lib)", file=sys.stderr)
        return 1
    import torch

    if not torch.cuda.is_available():
        print(f"{TOOL}: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    lengths = draw_lengths(args.sequences, args.min_len, args.max_len, args.seed)
    notes: list[str] = []
    fa4_varlen = fa4_varlen_function(notes, not args.no_fa4)
    for note in notes:
        print(f"{TOOL}: {note}", file=sys.stderr, flush=True)
    env = fr.environment(torch)
    bench = Bench(torch, lib, args, env, lengths, fa4_varlen)
    date, commit = datetime.datetime.now(datetime.timezone.utc), args.commit or fr.git_commit()
    result = {**fr.result_head(TOOL, None, date, commit, env, lib.path), "step": args.step,
              "passes": list(args.passes), "sequences": args.sequences, "min_len": args.min_len,
              "max_len": args.max_len, "seed": args.seed, "lengths": lengths, "total_tokens": sum(lengths),
              "mean_len": bench.mean, "longest": bench.max, "checked_sequences": bench.checked,
              "dtype": args.dtype, "window": args.window, "softcap": args.softcap,
              "inputs": f"Q, K, V, dO: {fr.INPUT_OFFSET} + N(0, {fr.INPUT_SIGMA}), torch.Generator(cuda) seeded "
                        "seed * 1000 + the head_dim's index; the dense batch drawn after the packed one",
              "timing": {"statistic": "median", "iters": args.iters, "warmup": args.warmup, "l2_flush": True,
                         "sleep_us": args.sleep_us, "events": "one pair per launch",
                         "order": f"a shape's implementations interleaved, {fr.ROUNDS} rounds, in order then reversed",
                         "fwd": "ours: one fs_run (ctypes arguments converted once); FA4: flash_attn_varlen_func / "
                                "flash_attn_func",
                         "bwd": "ours: one fs_run_backward from our forward's O and LSE, deterministic 0 (its "
                                "preprocessing and dQ conversion included); FA4: torch.autograd.grad(o, (q, k, v), dO, "
                                "retain_graph=True) on one forward's graph"},
              "flops": "forward: fs_varlen_flops (each sequence on its own lengths: 4*heads_q*d per visible pair; "
                       "causal without a window L^2/2 pairs, FlashAttention's convention) and fs_problem_flops for "
                       f"the dense batch; backward: {BACKWARD_FACTOR} x the forward's (fs_backward_flops' rule)",
              "check": "forward: O and LSE of the checked sequences (dense: batch 0), query heads 0-1 (GQA: those of "
                       "K/V head 0), against the fp64 reference within fs_tolerance, no NaN/inf in O, ours within "
                       "twice the tolerance of FA4's O everywhere; backward: dQ, dK, dV of the same against the fp32 "
                       "reference within fs_backward_bound(dtype, ref_err, max|exact|), ref_err FA4's (else SDPA "
                       "flash's) on the same sequence",
              "notes": notes, "complete": False, "rows": []}
    print(f"{TOOL} {commit} on {env['gpu']} (driver {env['driver']}, CUDA {env['cuda']}, torch {env['torch']}, FA4 "
          f"{env['fa4']}): {args.sequences} sequences, lengths {min(lengths)}-{max(lengths)}, total {sum(lengths)}, "
          f"mean {bench.mean}; step {args.step}", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        for hi, d in enumerate(args.head_dims):
            t = bench.tensors(hi, d)
            for causal in fr.CAUSALS[args.causal]:
                for ps in args.passes:
                    rows = bench.shape(t, ps, causal)
                    result["rows"] += rows
                    print(f"[{time.time() - t0:.0f} s] {ps} {describe(rows[0])}: " + "  ".join(
                        f"{r['impl']} {r['layout']} {cell(r)}" for r in rows), file=sys.stderr, flush=True)
                    torch.cuda.empty_cache()
            del t
            torch.cuda.empty_cache()
        result["complete"] = True
    finally:  # what was measured is written even when the run is interrupted
        result["wall_s"] = round(time.time() - t0, 1)
        fr.write_results(result, fr.results_base(args.out_dir, TOOL, date), CSV_FIELDS)
    print(table(result))
    return int(any(r["impl"] == OURS and r["status"] in ("fail", "error") for r in result["rows"]))


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
