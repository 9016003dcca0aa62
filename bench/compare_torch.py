#!/usr/bin/env python3
"""Every flash-steps step beside PyTorch's scaled_dot_product_attention, on the same tensors, in one
process, timed the same way.

    python3 bench/compare_torch.py                     the sweep: seqlen 512 ... 16k, head_dim 64 and
                                                       128, causal off and on, fp16 and bf16
    python3 bench/compare_torch.py --quick             a handful of shapes, about a minute
    python3 bench/compare_torch.py --seqlens 4096 --head-dims 128 --dtypes bf16 --causal on

The sweep is the library's (common/sweep.h, through fs_sweep_*): every shape holds B*N = 16384
tokens and H*d = 2048 channels (16 heads at head_dim 128, 32 at 64), so every shape moves the same
Q/K/V bytes and only the quadratic cost of attention grows along it. Q, K, V are (B, N, H, d)
tensors drawn as 0.25 + N(0, 1) (never zeros); our steps get their data_ptr() and strides through
the C ABI of common/flash_steps.h (the flash_steps package of python/), SDPA gets (B, H, N, d)
views of the same memory (q.transpose(1, 2)), which is the layout FlashAttention reads natively.

Timing, identical for every implementation: one checked launch, one timed probe launch, then
warm-up and --iters launches, each bracketed by its own pair of CUDA events, with the L2 flushed
(a buffer twice the L2's size is written) and a short GPU sleep before each, so that the host-side
cost of the call (ctypes or PyTorch dispatch) is hidden behind queued work and only GPU time is
measured. The median is reported, with min and max. A launch that takes, or by FLOP-scaling the
previous shape would take, more than --max-launch-ms is skipped with that reason; slow launches
get fewer iterations (at least --min-iters) so that one measurement stays near --budget-ms.

Check: batch 0, the first two heads, against an fp64 reference computed here (O and LSE, with the
tolerance of common/compare.h, asked of the library with fs_tolerance: |err| <= 2u*max|V| + 2u*|ref|,
u = 2^-11 for fp16 and 2^-8 for bf16); no NaN or infinity anywhere in O; and every element of O
within twice that tolerance of PyTorch's flash output.

Decoding (--decode): one or four new tokens per sequence against a KV cache, the shapes of issue 14
(batch x seqlen_k, heads q/kv: 1 x 131072 32/8, 8 x 32768 32/8, 64 x 4096 32/8, 128 x 2048 64/8,
16 x 16384 32/32; head_dim 128; fp16 and bf16; seqlen_q 1 and 4), every sequence at seqlen_k keys.
The caches are (B, seqlen_k, H_kv, d); SDPA flash and cuDNN read them as (B, H, N, d) views with
enable_gqa=True; the steps with a decoding entry (fs_run_decode) read them as they are and again
from paged copies (pages of 16, 64 and 256 keys, scattered by a seeded shuffle, found through a
block table); the other steps (--steps, default 07g, 08, 09, 10) through fs_run where they accept
the problem. Reported: GB/s of K and V read (B*seqlen_k*H_kv*d*2 bytes each, fs_decode_kv_bytes) and
the % of the HBM read ceiling of the newest bench/results/ceilings-*.json (--ceilings), the ratio to
cuDNN, and a paged row against the contiguous one. Non-causal by default (the bytes read are the
same; --decode-causal for bottom-right causal, SDPA through torch.nn.attention.bias.causal_lower_right).

    python3 bench/compare_torch.py --decode              every shape, about a minute on an H200
    python3 bench/compare_torch.py --decode --decode-shapes 8x32768x32x8 --dtypes fp16 --decode-seqlens-q 1

Backward (--backward): the sweep from seqlen 1024 on (d 64 and 128, causal off and on, fp16 and bf16),
the same Q, K, V and dO for everyone, only the backward timed. Our steps with a backward pass
(fs_step_has_backward) start from O and LSE of one forward of ours (--forward-step, default the newest
step that accepts the shape) and are timed at deterministic 0 and again at 1 (column "<nn> det"); a
launch is one fs_run_backward, which includes the step's own preprocessing (D = rowsum(dO*O)) and the
conversion of its dQ accumulator. SDPA (flash, cuDNN, memory-efficient) runs its forward once with
requires_grad, on (B, H, N, d) views of leaf (B, N, H, d) tensors; a launch is then
torch.autograd.grad(o, (q_view, k_view, v_view), dO, retain_graph=True): exactly the backward node of
SDPA (with its own preprocessing), no forward, no transpose or accumulation into .grad, and dO is given
in O's own strides so that no backend copies it to another layout inside the timed call. PyTorch's
autograd dispatch is hidden behind the queued GPU work as above. TFLOP/s by fs_backward_flops (2.5 x
the forward's FLOPs). Check: batch 0, heads 0 and 1, dQ, dK, dV against an fp32 reference computed
here (P recomputed, TF32 off); each gradient must be within fs_backward_bound(dtype, ref_err,
max|exact|) = 2*ref_err + u*max|exact|, where ref_err is the error of the first SDPA backend (flash by
default) against the same reference; no NaN or infinity anywhere; a deterministic row must give the
same bits on a second run. Results go to bench/results/compare_torch_backward-<UTC date>.json and .csv.

    python3 bench/compare_torch.py --backward                 every shape
    python3 bench/compare_torch.py --backward --quick         seqlen 1k, 2k, 4k at d 128, fp16

FLOPs: fs_problem_flops (4*B*H*Sq*Sk*d, halved when causal). For the steps of each shape, x_step01
and x_prev (the speed-up over step 01 and over the previous step) come from fs_speedups, the rule
the runner uses. Results go to bench/results/compare_torch-<UTC date>.json and .csv with the GPU,
driver, CUDA/PyTorch/cuDNN versions, date and commit; a compact table is printed last.
bench/plot.py turns them into plots and the README table.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import fs_results

REPO = fs_results.REPO
sys.path.insert(0, str(REPO / "python"))  # the flash_steps package, also without pip install -e

import flash_steps  # noqa: E402  (the one ctypes layer of common/flash_steps.h)

INPUT_OFFSET, INPUT_SIGMA = 0.25, 1.0  # as common/workload.h
TORCH_BACKENDS = ("flash", "cudnn", "efficient", "math")


def load_library(path):
    """The package's library (path: --lib; None: $FLASH_STEPS_LIB, else the repository's build dirs), made
    the package's own, so that flash_steps.forward / backward / attention call the same one."""
    return flash_steps.library(path)


def steps_of(lib) -> list[dict]:
    """The registered steps as dicts (they go into the results files)."""
    return [dataclasses.asdict(s) for s in lib.steps()]


def refusal(check, *args) -> str:
    """"" when check(*args) accepts, else the library's sentence (a step that cannot run a problem)."""
    try:
        check(*args)
    except flash_steps.InvalidArgument as e:
        return e.message
    return ""


def problem_for_tensors(q, k, v, o, causal: bool):
    """The fs_problem of (B, N, H, d) tensors with their own strides (flash_steps.forward_problem)."""
    return flash_steps.forward_problem("compare_torch", q, k, v, o, causal, None)


def sweep_shape(lib, seqlen: int, head_dim: int, causal: bool, dtype: str, tokens: int) -> dict:
    """The sweep's shape at (seqlen, head_dim): batch and heads from fs_sweep_shape; raises
    ValueError (flash_steps.InvalidArgument) with the library's sentence when they do not divide."""
    batch, heads = lib.sweep_shape(tokens, seqlen, head_dim)
    return {"batch": batch, "seqlen": seqlen, "heads": heads, "head_dim": head_dim, "causal": causal, "dtype": dtype}


def shape_flops(lib, s: dict) -> float:
    """The forward FLOPs of a sweep shape {"batch", "seqlen", "heads", "head_dim", "causal", "dtype"}."""
    return lib.flops(lib.problem(s["batch"], s["seqlen"], s["seqlen"], s["heads"], s["heads"], s["head_dim"],
                                 s["dtype"], s["causal"]))


# ---- shapes ------------------------------------------------------------------------------------

def shape_key(s: dict) -> tuple:
    return (s["batch"], s["seqlen"], s["heads"], s["head_dim"], s["causal"], s["dtype"])


def describe(s: dict) -> str:
    return (f"b{s['batch']} h{s['heads']} n{s['seqlen']} d{s['head_dim']} {s['dtype']}"
            + (" causal" if s["causal"] else ""))


def sweep_shapes(lib, seqlens, head_dims, causals, dtypes, tokens: int) -> list[dict]:
    """Grouped by (head_dim, causal, dtype), seqlen ascending: each launch is judged from the last."""
    return [sweep_shape(lib, n, d, c, t, tokens) for d in head_dims for c in causals for t in dtypes
            for n in sorted(seqlens)]


def resolve_sweep(args, lib) -> None:
    """The sweep's lists and token count where the command line left them out: the library's full
    sweep, or its quick one with --quick."""
    sweep = lib.sweep(args.quick)
    for name in ("seqlens", "head_dims", "dtypes"):
        if getattr(args, name) is None:
            setattr(args, name, sweep[name])
    if args.tokens is None:
        args.tokens = lib.sweep_tokens()


# ---- environment -------------------------------------------------------------------------------

def git_commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def cudnn_version(v) -> str:
    """cuDNN 9 reports major*10000 + minor*100 + patch (91900 is 9.19.0)."""
    if not v:
        return "none"
    v = int(v)
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else str(v)


def environment(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2 ** 30, 1),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "cudnn": cudnn_version(torch.backends.cudnn.version()),
        "python": platform.python_version(),
    }
    try:
        import triton  # noqa: F401  (only its version is recorded)
        env["triton"] = triton.__version__
    except ImportError:
        pass
    return env


# ---- measuring ---------------------------------------------------------------------------------

class Timer:
    """CUDA events around each launch; the L2 flushed and a short GPU sleep before each."""

    def __init__(self, torch, l2_bytes: int, sleep_us: float):
        self.torch = torch
        self.flush = torch.empty(max(2 * l2_bytes, 2 << 20), dtype=torch.uint8, device="cuda")
        self.sleep_cycles = int(sleep_us * 2000)  # about 2 GHz
        self.has_sleep = hasattr(torch.cuda, "_sleep")

    def times(self, fn, n: int) -> list[float]:
        torch = self.torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (start, stop) in enumerate(events):
            self.flush.fill_(i & 0xFF)
            if self.has_sleep and self.sleep_cycles > 0:
                torch.cuda._sleep(self.sleep_cycles)
            start.record()
            fn()
            stop.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(stop) for start, stop in events]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def reference_slice(torch, q, k, v, causal: bool, scale: float, heads: int, chunk: int = 1024):
    """fp64 O (heads, N, d) and LSE (heads, N) of batch 0, heads [0, heads), bottom-right causal."""
    qs = q[0, :, :heads].transpose(0, 1).double()
    ks = k[0, :, :heads].transpose(0, 1).double()
    vs = v[0, :, :heads].transpose(0, 1).double()
    sq, sk = qs.shape[1], ks.shape[1]
    out = torch.empty_like(qs)
    lse = torch.empty(heads, sq, dtype=torch.float64, device=q.device)
    for r0 in range(0, sq, chunk):
        r1 = min(sq, r0 + chunk)
        s = torch.matmul(qs[:, r0:r1], ks.transpose(1, 2)) * scale
        if causal:
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(sk, device=q.device)[None, :]
            s.masked_fill_(j > i + (sk - sq), float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a row with no key: O = 0, LSE = -inf
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        out[:, r0:r1] = torch.where(l > 0, torch.matmul(p, vs) / l.clamp_min(1e-300), torch.zeros_like(out[:, r0:r1]))
        lse[:, r0:r1] = (m + torch.log(l)).squeeze(-1)
    return out, lse


def compare(torch, o_bnhd, lse_bhn, ref, tol: tuple[float, float, float], o_flash_bnhd=None) -> dict:
    """The check of the module docstring. o_bnhd is (B, N, H, d); lse_bhn (B, H, N) fp32 or None;
    tol = (atol, rtol, lse_tol) from Library.tolerance."""
    ref_o, ref_lse = ref
    heads = ref_o.shape[0]
    atol, rtol, lse_tol = tol
    got = o_bnhd[0, :, :heads].transpose(0, 1).double()
    finite = torch.isfinite(got)
    err = (got - ref_o).abs()
    bad = (~finite) | (err > atol + rtol * ref_o.abs())
    res = {
        "max_abs_err": float(torch.where(finite, err, torch.zeros_like(err)).max()),
        "mismatches": int(bad.sum()),
        "nonfinite": int((~torch.isfinite(o_bnhd)).sum()),
    }
    if lse_bhn is not None:
        g = lse_bhn[0, :heads].double()
        want_inf = torch.isinf(ref_lse)
        lerr = (g - ref_lse).abs()
        ok = torch.where(want_inf, g == ref_lse, torch.isfinite(g) & (lerr <= lse_tol * (1 + ref_lse.abs())))
        res["max_lse_err"] = float(torch.where(want_inf | ~torch.isfinite(g), torch.zeros_like(lerr), lerr).max())
        res["mismatches"] += int((~ok).sum())
    if o_flash_bnhd is not None:
        a = o_bnhd.float()
        b = o_flash_bnhd.float()
        diff = (a - b).abs()
        res["max_abs_diff_flash"] = float(torch.nan_to_num(diff, nan=float("inf")).max())
        res["mismatches_vs_flash"] = int((~(diff <= 2 * (atol + rtol * b.abs()))).sum())
    res["pass"] = res["mismatches"] == 0 and res["nonfinite"] == 0 and res.get("mismatches_vs_flash", 0) == 0
    return res


def fmt_err(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


# ---- the sweep ---------------------------------------------------------------------------------

class Sweep:
    """Runs every implementation on every shape; keeps, per implementation, its last measured launch
    so that a launch that would be too slow is skipped before it runs."""

    def __init__(self, torch, lib, args, steps: list[dict], backends: list[str], env: dict,
                 ladder: dict):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.torch, self.F, self.sdpa_kernel = torch, F, sdpa_kernel
        self.sdp = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        self.lib, self.args, self.ladder_key = lib, args, shape_key(ladder)
        # PyTorch first: our steps are then also compared with its flash output.
        self.impls = [("torch_" + b, "torch", b) for b in backends] + [(s["id"], "step", s["id"]) for s in steps]
        self.timer = Timer(torch, env["l2_bytes"] or (64 << 20), args.sleep_us)
        self.stream = torch.cuda.current_stream().cuda_stream
        self.last: dict[str, dict] = {}  # impl -> {(d, causal, dtype) or "any": (flops, ms)}
        self.limit_ms = args.max_launch_ms  # per shape: larger at the ladder shape

    def shape(self, si: int, shape: dict) -> list[dict]:
        torch, args = self.torch, self.args
        B, N, H, D = shape["batch"], shape["seqlen"], shape["heads"], shape["head_dim"]
        causal, dtype = shape["causal"], shape["dtype"]
        gen = torch.Generator(device="cuda")
        gen.manual_seed(args.seed + si)  # a fresh draw for every shape

        def draw():  # (B, N, H, d), offset + sigma * N(0, 1), rounded to the dtype
            x = torch.randn(B, N, H, D, device="cuda", dtype=torch.float32, generator=gen)
            return (x * INPUT_SIGMA + INPUT_OFFSET).to(torch.float16 if dtype == "fp16" else torch.bfloat16)

        t = {"q": draw(), "k": draw(), "v": draw()}
        t["o"] = torch.empty_like(t["q"])
        t["lse"] = torch.empty(B, H, N, dtype=torch.float32, device="cuda")
        scale = 1.0 / math.sqrt(D)
        t["ref"] = reference_slice(torch, t["q"], t["k"], t["v"], causal, scale, min(H, 2))
        t["tol"] = self.lib.tolerance(dtype, float(t["v"].abs().max()))
        t["o_flash"] = None
        prob = problem_for_tensors(t["q"], t["k"], t["v"], t["o"], causal)
        flops = self.lib.flops(prob)
        # The README's ladder needs every step at the ladder shape, the slow ones included.
        self.limit_ms = args.ladder_max_launch_ms if shape_key(shape) == self.ladder_key else args.max_launch_ms
        rows = []
        for impl, kind, what in self.impls:
            row = dict(shape, impl=impl, kind=kind, flops=flops, status="", reason="")
            rows.append(row)
            try:
                if kind == "step":
                    self.step(row, what, prob, t)
                else:
                    self.backend(row, what, t, causal, scale)
            except Exception as e:  # one implementation's failure must not end the sweep
                msg = fmt_err(e)
                unsupported = kind == "torch" and ("No available kernel" in msg or "not supported" in msg.lower())
                row.update(status="unsupported" if unsupported else "error", reason=msg)
        add_ratios(rows)
        add_speedups(self.lib, rows)
        return rows

    def step(self, row: dict, step_id: str, prob, t: dict) -> None:
        why = refusal(self.lib.check, step_id, prob)
        if why:
            row.update(status="refused", reason=why)
            return
        ws_bytes = self.lib.workspace_size(step_id, prob)
        ws = self.torch.empty(ws_bytes, dtype=self.torch.uint8, device=t["o"].device) if ws_bytes else None
        fn = self.lib.runner(step_id, prob, t["q"].data_ptr(), t["k"].data_ptr(), t["v"].data_ptr(),
                             t["o"].data_ptr(), t["lse"].data_ptr(), ws.data_ptr() if ws is not None else 0,
                             ws_bytes, self.stream)

        def checked():
            t["o"].fill_(float("nan"))  # poisoned: an element the step does not write fails the check
            t["lse"].fill_(float("nan"))
            fn()
            self.torch.cuda.synchronize()
            return compare(self.torch, t["o"], t["lse"], t["ref"], t["tol"], t["o_flash"])
        self.measure(row, fn, checked)

    def backend(self, row: dict, backend: str, t: dict, causal: bool, scale: float) -> None:
        torch, args = self.torch, self.args
        if backend == "math":
            need = 3 * row["batch"] * row["heads"] * row["seqlen"] ** 2 * 4  # scores, probabilities, a copy
            cap = min(args.math_max_gib * 2 ** 30, 0.5 * torch.cuda.mem_get_info()[0])
            if need > cap:
                row.update(status="skipped", reason=f"the math backend needs about {need / 2 ** 30:.0f} GiB for the "
                           f"B*H*N*N scores, over the {cap / 2 ** 30:.0f} GiB allowed (--math-max-gib)")
                return
        qt, kt, vt = (t[n].transpose(1, 2) for n in ("q", "k", "v"))  # (B, H, N, d) views of the same memory
        sdpa = self.F.scaled_dot_product_attention
        out = {}

        def fn():
            out["o"] = sdpa(qt, kt, vt, is_causal=causal, scale=scale)

        def checked():
            fn()
            torch.cuda.synchronize()
            o = out.pop("o").transpose(1, 2)  # back to (B, N, H, d)
            if backend == "flash":
                t["o_flash"] = o
            return compare(torch, o, None, t["ref"], t["tol"])
        with self.sdpa_kernel([self.sdp[backend]]):
            self.measure(row, fn, checked)

    def measure(self, row: dict, fn, checked) -> None:
        """Skip if too slow; one checked launch; one timed probe; warm-up; the timed launches."""
        args = self.args
        flops, group, limit = row["flops"], (row["head_dim"], row["causal"], row["dtype"]), self.limit_ms
        prev = self.last.setdefault(row["impl"], {})
        base = prev.get(group) or prev.get("any")
        if base and base[1] * flops / base[0] > limit:
            row.update(status="skipped", reason=f"a launch would take about {base[1] * flops / base[0]:.0f} ms "
                       f"(scaled by FLOPs from the last shape measured), over the limit of {limit:g} ms "
                       "(--max-launch-ms)")
            return
        chk = checked()
        row.update(chk)
        probe = self.timer.times(fn, 1)[0]
        prev[group] = prev["any"] = (flops, probe)
        if probe > limit:
            row.update(status="skipped", probe_ms=probe,
                       reason=f"one launch took {probe:.0f} ms, over the limit of {limit:g} ms (--max-launch-ms)")
            return
        n = max(args.min_iters, min(args.iters, int(args.budget_ms / max(probe, 1e-3))))
        warmup = min(args.warmup, int(args.budget_ms / max(probe, 1e-3)))  # slow launches: checked + probe suffice
        if warmup:
            self.timer.times(fn, warmup)
        ts = self.timer.times(fn, n)
        ms = median(ts)
        prev[group] = prev["any"] = (flops, ms)
        row.update(status="ok" if chk["pass"] else "fail", ms=ms, min_ms=min(ts), max_ms=max(ts), iters=n,
                   tflops=flops / (ms * 1e-3) / 1e12)
        if not chk["pass"]:
            row["reason"] = chk.get("why") or (
                f"check failed: {chk['mismatches']} elements outside tolerance of the fp64 reference, "
                f"{chk['nonfinite']} non-finite, {chk.get('mismatches_vs_flash', 0)} outside twice the "
                f"tolerance of PyTorch flash")


def plan_shapes(args, lib) -> tuple[list[dict], dict]:
    """The shapes to measure, ladder shape first when the sweep lacks it, and the ladder shape.
    Raises ValueError with the library's sentence for a seqlen or head_dim the sweep's rule refuses."""
    resolve_sweep(args, lib)
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    shapes = sweep_shapes(lib, args.seqlens, args.head_dims, causals, args.dtypes, args.tokens)
    ladder = sweep_shape(lib, args.ladder_seqlen, args.ladder_head_dim, args.ladder_causal, args.ladder_dtype,
                         args.tokens)
    if shape_key(ladder) not in {shape_key(s) for s in shapes}:
        shapes.insert(0, ladder)
    return shapes, ladder


def check_backends(backends: list[str]) -> None:
    """Raises ValueError naming the --backends values that are not SDPA backends."""
    unknown = [b for b in backends if b not in TORCH_BACKENDS]
    if unknown:
        raise ValueError(f"--backends: unknown {', '.join(unknown)} (known: {', '.join(TORCH_BACKENDS)})")


def result_head(mode: str | None, date, commit: str, env: dict, lib) -> dict:
    """The fields every results file of compare_torch starts with (mode: None for the forward sweep)."""
    head = {"tool": "compare_torch"}
    if mode:
        head["mode"] = mode
    head.update({"schema": 1, "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "environment": env,
                 "library": lib.path})
    return head


def run(args) -> int:
    try:
        lib = load_library(args.lib)
    except flash_steps.LibraryNotFound as e:
        print(f"compare_torch: {e.message} (or pass --lib)", file=sys.stderr)
        return 1
    steps = [s for s in steps_of(lib) if s["has_forward"]]  # a backward-only step has no forward pass to sweep
    if args.steps:
        wanted = [s.strip() for s in args.steps.split(",") if s.strip()]
        steps = [s for s in steps if any(s["id"].startswith(w) for w in wanted)]
    backends = [b for b in args.backends.split(",") if b]
    try:
        check_backends(backends)
        shapes, ladder = plan_shapes(args, lib)
    except ValueError as e:
        print(f"compare_torch: {e}", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    env = environment(torch)
    sweep = Sweep(torch, lib, args, steps, backends, env, ladder)
    date = datetime.datetime.now(datetime.timezone.utc)
    commit = args.commit or git_commit()
    result = {
        **result_head(None, date, commit, env, lib),
        "timing": {"statistic": "median", "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
                   "budget_ms": args.budget_ms, "max_launch_ms": args.max_launch_ms,
                   "ladder_max_launch_ms": args.ladder_max_launch_ms, "l2_flush": True,
                   "sleep_us": args.sleep_us, "events": "one pair per launch"},
        "flops": "fs_problem_flops: 4*B*H*Sq*Sk*d, halved when causal",
        "speedups": "fs_speedups: x_step01 over 01_naive, x_prev over the fastest row of the previous step number",
        "ladder": ladder,
        "steps": steps,
        "backends": backends,
        "complete": False,
        "rows": [],
    }
    print(f"compare_torch {commit} on {env['gpu']} (driver {env['driver']}, CUDA {env['cuda']}, torch "
          f"{env['torch']}, cuDNN {env['cudnn']}): {len(shapes)} shapes x {len(sweep.impls)} implementations",
          file=sys.stderr, flush=True)
    out_base = Path(args.out_dir) / f"compare_torch-{date.strftime('%Y%m%d-%H%M%S')}"
    return measure_shapes(
        result, shapes, sweep, out_base, CSV_FIELDS,
        heading=lambda shape: f"{describe(shape)}  ({shape_flops(lib, shape) / 1e9:.0f} GFLOP, ",
        cell=lambda r: (f"{label(r['impl'])} {r['tflops']:.1f}" + ("!" if r["status"] == "fail" else "")
                        if r.get("tflops") else f"{label(r['impl'])} {r['status']}"),
        table=print_table)


def measure_shapes(result: dict, shapes: list, sweep, out_base: Path, fields: list[str], heading, cell,
                   table, after_shape=None) -> int:
    """Measures every shape with sweep.shape(index, shape), appending its rows to result["rows"] with a
    progress line per shape on stderr ("[i/n] <heading>t s so far)" and one cell(row) per row), writes
    the JSON and CSV (fields) even when the run is interrupted, prints table(result), and returns the
    exit status: 1 when a row failed its check or errored, else 0."""
    t0 = time.time()
    try:
        for si, shape in enumerate(shapes):
            print(f"[{si + 1}/{len(shapes)}] {heading(shape)}{time.time() - t0:.0f} s so far)", file=sys.stderr,
                  flush=True)
            rows = sweep.shape(si, shape)
            result["rows"] += rows
            print("    " + "  ".join(cell(r) for r in rows), file=sys.stderr, flush=True)
            if after_shape:
                after_shape()
        result["complete"] = True
    finally:  # what was measured is written even when the run is interrupted
        result["wall_s"] = round(time.time() - t0, 1)
        write_results(result, out_base, fields)
    table(result)
    return 1 if any(r["status"] in ("fail", "error") for r in result["rows"]) else 0


def add_ratios(rows: list[dict]) -> None:
    """x_flash, x_cudnn = PyTorch's time / this implementation's time, within one shape's rows."""
    base = {r["impl"]: r["ms"] for r in rows if r["kind"] == "torch" and r.get("ms")}
    for r in rows:
        if r.get("ms"):
            for key, impl in (("x_flash", "torch_flash"), ("x_cudnn", "torch_cudnn")):
                if base.get(impl):
                    r[key] = base[impl] / r["ms"]


def add_speedups(lib, rows: list[dict]) -> None:
    """x_step01 and x_prev of the step rows of one shape, by the library's rule (fs_speedups); set
    only where there is something to compare."""
    steps = [r for r in rows if r["kind"] == "step"]
    timed = [r["ms"] if r.get("status") in ("ok", "fail") and r.get("ms") else 0.0 for r in steps]
    for r, (x01, xprev) in zip(steps, lib.speedups([r["impl"] for r in steps], timed)):
        if x01 > 0:
            r["x_step01"] = x01
        if xprev > 0:
            r["x_prev"] = xprev


CSV_FIELDS = ["date", "commit", "gpu", "impl", "kind", "batch", "seqlen", "heads", "head_dim", "causal", "dtype", "flops", "status",
              "ms", "min_ms", "max_ms", "iters", "tflops", "x_step01", "x_prev", "x_flash", "x_cudnn", "max_abs_err",
              "max_lse_err", "max_abs_diff_flash", "mismatches", "nonfinite", "pass", "reason"]


def write_results(result: dict, out_base: Path, fields: list[str] = CSV_FIELDS) -> None:
    out_base.parent.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out_base.with_suffix(".json"), out_base.with_suffix(".csv")
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    common = {"date": result["date"], "commit": result["commit"], "gpu": result["environment"].get("gpu", "")}
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in result["rows"]:
            w.writerow({**common, **r})
    print(f"compare_torch: wrote {json_path} and {csv_path}", file=sys.stderr, flush=True)


def label(impl: str) -> str:
    """A column heading: the step id, or pt:<backend> for PyTorch."""
    return impl.replace("torch_", "pt:")[:10]


def print_table(result: dict, labeler=label) -> None:
    """TFLOP/s, one line per shape, one column per step and for PyTorch flash and cuDNN (the files have
    every backend); '-' not timed (refused, skipped, unsupported), '!' check failed. labeler(impl): the
    column heading."""
    rows = result["rows"]
    impls = []
    for r in rows:
        if r["impl"] not in impls and r["impl"] not in ("torch_efficient", "torch_math"):
            impls.append(r["impl"])
    shapes = []
    for r in rows:
        if shape_key(r) not in [shape_key(s) for s in shapes]:
            shapes.append(r)
    print(f"\nTFLOP/s (median), {result['environment'].get('gpu', '')}, commit {result['commit']}, {result['date']}"
          "   - = not run (refused/skipped),  ! = check failed")
    head = f"{'shape':34}" + "".join(f"{labeler(i):>11}" for i in impls)
    print(head)
    by = {(shape_key(r), r["impl"]): r for r in rows}
    for s in shapes:
        line = f"{describe(s):34}"
        for i in impls:
            r = by.get((shape_key(s), i))
            if r and r.get("tflops"):
                cell = f"{r['tflops']:.1f}" + ("!" if r["status"] == "fail" else "")
            else:
                cell = "-"
            line += f"{cell:>11}"
        print(line)
    problems = [r for r in rows if r["status"] in ("fail", "error")]
    for r in problems[:20]:
        print(f"  {r['impl']} {describe(r)}: {r['status']}: {r['reason']}")


# ---- decoding (--decode) ----------------------------------------------------------------------

# Issue 14's shapes: (batch, seqlen_k, heads_q, heads_kv).
DECODE_SHAPES = ((1, 131072, 32, 8), (8, 32768, 32, 8), (64, 4096, 32, 8), (128, 2048, 64, 8), (16, 16384, 32, 32))
DECODE_DEFAULT_STEPS = "07g,08,09,10"


def parse_decode_shape(text: str) -> tuple[int, int, int, int]:
    """"8x32768x32x8" -> (batch, seqlen_k, heads_q, heads_kv); ValueError with the rule otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--decode-shapes expects BATCHxSEQLEN_KxHEADS_QxHEADS_KV (positive integers), got '{text}'")
    b, sk, hq, hkv = (int(p) for p in parts)
    if hq % hkv:
        raise ValueError(f"--decode-shapes: heads_q ({hq}) is not a multiple of heads_kv ({hkv}) in '{text}'")
    return b, sk, hq, hkv


def decode_shapes(args) -> list[dict]:
    """Every (shape, seqlen_q, dtype) of the decoding run, the issue's order."""
    shapes = [parse_decode_shape(t) for t in args.decode_shapes] if args.decode_shapes else list(DECODE_SHAPES)
    out = []
    for dtype in args.dtypes or ["fp16", "bf16"]:
        for sq in args.decode_seqlens_q:
            for b, sk, hq, hkv in shapes:
                out.append({"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
                            "head_dim": args.decode_head_dim, "dtype": dtype, "causal": args.decode_causal and sq > 1})
    return out


def decode_describe(s: dict) -> str:
    return (f"b{s['batch']} sk{s['seqlen_k']} h{s['heads_q']}/{s['heads_kv']} sq{s['seqlen_q']} d{s['head_dim']} "
            f"{s['dtype']}" + (" causal" if s["causal"] else ""))


def decode_key(s: dict) -> tuple:
    return tuple(s[k] for k in ("batch", "seqlen_k", "heads_q", "heads_kv", "seqlen_q", "head_dim", "dtype", "causal"))


def hbm_ceiling(path: str | None) -> dict:
    """{"tbs", "path", "device"} of the HBM read ceiling (hbm_read) in `path`, else in the newest
    bench/results/ceilings-*.json; {} when there is none."""
    path = path or fs_results.newest(fs_results.RESULTS, "ceilings-*.json")
    if not path:
        return {}
    c = fs_results.load_ceilings(path)
    v = c["values"].get("hbm_read")
    return {"tbs": v["value"], "path": str(path), "device": c["device"]} if v else {}


def page_table(torch, batch: int, pages_per_seq: int, seed: int):
    """A block table (batch, pages_per_seq) int32 on the CPU: a seeded shuffle of all batch*pages_per_seq
    pages, so that a sequence's neighbouring pages are far apart in the cache."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.randperm(batch * pages_per_seq, generator=gen).to(torch.int32).view(batch, pages_per_seq)


def paged_copy(torch, cache, table, page_size: int):
    """The (num_pages, page_size, H, d) copy of a (B, N, H, d) cache under `table`: page table[b][i] holds keys
    i*page_size ... of sequence b (the last page zero-padded)."""
    b, n, h, d = cache.shape
    per_seq = table.shape[1]
    padded = cache.new_zeros(b, per_seq * page_size, h, d)
    padded[:, :n] = cache
    pages = cache.new_empty(b * per_seq, page_size, h, d)
    pages[table.reshape(-1).long().to(cache.device)] = padded.view(b * per_seq, page_size, h, d)
    return pages


class DecodeSweep:
    """Every implementation on every decoding shape, on the same tensors; one checked launch, then timed."""

    def __init__(self, torch, lib, args, steps: list[dict], backends: list[str], env: dict, hbm: dict):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.torch, self.F, self.sdpa_kernel = torch, F, sdpa_kernel
        self.sdp = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        self.lib, self.args, self.steps, self.backends, self.hbm = lib, args, steps, backends, hbm
        self.timer = Timer(torch, env["l2_bytes"] or (64 << 20), args.sleep_us)
        self.stream = torch.cuda.current_stream().cuda_stream

    def shape(self, si: int, shape: dict) -> list[dict]:
        torch, args = self.torch, self.args
        b, sq, sk, hq, hkv, d = (shape[k] for k in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"))
        causal, dtype = shape["causal"], shape["dtype"]
        gen = torch.Generator(device="cuda")
        gen.manual_seed(args.seed + si)

        def draw(*size):  # offset + sigma * N(0, 1), rounded to the dtype
            x = torch.randn(*size, device="cuda", dtype=torch.float32, generator=gen)
            return (x * INPUT_SIGMA + INPUT_OFFSET).to(torch.float16 if dtype == "fp16" else torch.bfloat16)

        t = {"q": draw(b, sq, hq, d), "k": draw(b, sk, hkv, d), "v": draw(b, sk, hkv, d)}
        t["o"] = torch.empty_like(t["q"])
        t["lse"] = torch.empty(b, hq, sq, dtype=torch.float32, device="cuda")
        scale = 1.0 / math.sqrt(d)
        # The fp64 reference of batch 0, query heads 0 and 1, each with the KV head it reads.
        heads = min(hq, 2)
        kv_of = torch.tensor([h // (hq // hkv) for h in range(heads)], device="cuda")
        t["ref"] = reference_slice(torch, t["q"][0:1], t["k"][0:1].index_select(2, kv_of),
                                   t["v"][0:1].index_select(2, kv_of), causal, scale, heads)
        t["tol"] = self.lib.tolerance(dtype, float(t["v"].abs().max()))
        t["o_flash"] = None
        prob = self.lib.decode_problem(b, sq, sk, hq, hkv, d, dtype, causal)
        kv_bytes = self.lib.decode_kv_bytes(prob)
        rows = []

        def new_row(impl, kind, entry, page_size=0):
            row = dict(shape, impl=impl, kind=kind, entry=entry, page_size=page_size, kv_bytes=kv_bytes, status="",
                       reason="")
            rows.append(row)
            return row

        def guarded(row, body):
            try:
                body()
            except Exception as e:  # one implementation's failure must not end the run
                msg = fmt_err(e)
                unsupported = row["kind"] == "torch" and ("No available kernel" in msg or "not supported" in msg.lower())
                row.update(status="unsupported" if unsupported else "error", reason=msg)

        for backend in self.backends:  # PyTorch first: our steps are then also compared with its flash output
            row = new_row("torch_" + backend, "torch", "sdpa")
            guarded(row, lambda: self.backend(row, backend, t, causal, scale, hq != hkv))
        for step in self.steps:
            if step["decodes"]:
                for page_size in [0] + list(args.page_sizes):
                    row = new_row(step["id"], "step", "decode", page_size)
                    guarded(row, lambda: self.decode_step(row, step["id"], shape, t, page_size, si))
            else:
                row = new_row(step["id"], "step", "forward")
                guarded(row, lambda: self.forward_step(row, step["id"], t, causal))
        add_decode_ratios(rows)
        return rows

    def backend(self, row: dict, backend: str, t: dict, causal: bool, scale: float, gqa: bool) -> None:
        torch = self.torch
        qt, kt, vt = (t[n].transpose(1, 2) for n in ("q", "k", "v"))  # (B, H, N, d) views of the same memory
        mask = None
        if causal:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(qt.shape[2], kt.shape[2])
        sdpa, out = self.F.scaled_dot_product_attention, {}
        kwargs = {"enable_gqa": True} if gqa else {}

        def fn():
            out["o"] = sdpa(qt, kt, vt, attn_mask=mask, scale=scale, **kwargs)

        def checked():
            fn()
            torch.cuda.synchronize()
            o = out.pop("o").transpose(1, 2)  # back to (B, N, H, d)
            if backend == "flash":
                t["o_flash"] = o
            return compare(torch, o, None, t["ref"], t["tol"])
        with self.sdpa_kernel([self.sdp[backend]]):
            self.measure(row, fn, checked)

    def decode_step(self, row: dict, step_id: str, shape: dict, t: dict, page_size: int, si: int) -> None:
        torch, lib = self.torch, self.lib
        b, sk = shape["batch"], shape["seqlen_k"]
        prob = lib.decode_problem(b, shape["seqlen_q"], sk, shape["heads_q"], shape["heads_kv"], shape["head_dim"],
                                  shape["dtype"], shape["causal"], page_size)
        why = refusal(lib.decode_check, step_id, prob)
        if why:
            row.update(status="refused", reason=why)
            return
        k, v, table = t["k"], t["v"], None
        if page_size:
            table_cpu = page_table(torch, b, prob.max_pages_per_seq, self.args.seed + 1000 * si + page_size)
            k, v = paged_copy(torch, t["k"], table_cpu, page_size), paged_copy(torch, t["v"], table_cpu, page_size)
            table = table_cpu.to("cuda")
        ws_bytes = lib.decode_workspace_size(step_id, prob)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
        fn = lib.decode_runner(step_id, prob, t["q"].data_ptr(), k.data_ptr(), v.data_ptr(),
                               table.data_ptr() if table is not None else 0, 0, t["o"].data_ptr(), t["lse"].data_ptr(),
                               ws.data_ptr() if ws is not None else 0, ws_bytes, self.stream)
        self.measure(row, fn, lambda: self.checked_step(fn, t))

    def forward_step(self, row: dict, step_id: str, t: dict, causal: bool) -> None:
        lib = self.lib
        prob = problem_for_tensors(t["q"], t["k"], t["v"], t["o"], causal)
        why = refusal(lib.check, step_id, prob)
        if why:
            row.update(status="refused", reason=why)
            return
        ws_bytes = lib.workspace_size(step_id, prob)
        ws = self.torch.empty(ws_bytes, dtype=self.torch.uint8, device="cuda") if ws_bytes else None
        fn = lib.runner(step_id, prob, t["q"].data_ptr(), t["k"].data_ptr(), t["v"].data_ptr(), t["o"].data_ptr(),
                        t["lse"].data_ptr(), ws.data_ptr() if ws is not None else 0, ws_bytes, self.stream)
        self.measure(row, fn, lambda: self.checked_step(fn, t))

    def checked_step(self, fn, t: dict) -> dict:
        t["o"].fill_(float("nan"))  # poisoned: an element the step does not write fails the check
        t["lse"].fill_(float("nan"))
        fn()
        self.torch.cuda.synchronize()
        return compare(self.torch, t["o"], t["lse"], t["ref"], t["tol"], t["o_flash"])

    def measure(self, row: dict, fn, checked) -> None:
        """One checked launch, one timed probe, warm-up, the timed launches; GB/s of K and V read."""
        args = self.args
        chk = checked()
        row.update(chk)
        probe = self.timer.times(fn, 1)[0]
        n = max(args.min_iters, min(args.iters, int(args.budget_ms / max(probe, 1e-3))))
        warmup = min(args.warmup, int(args.budget_ms / max(probe, 1e-3)))
        if warmup:
            self.timer.times(fn, warmup)
        ts = self.timer.times(fn, n)
        ms = median(ts)
        gbs = row["kv_bytes"] / (ms * 1e-3) / 1e9
        row.update(status="ok" if chk["pass"] else "fail", ms=ms, min_ms=min(ts), max_ms=max(ts), iters=n, gbs=gbs)
        if self.hbm:
            row["hbm_pct"] = 100 * gbs / (self.hbm["tbs"] * 1e3)
        if not chk["pass"]:
            row["reason"] = (f"check failed: {chk['mismatches']} elements outside tolerance of the fp64 reference, "
                             f"{chk['nonfinite']} non-finite, {chk.get('mismatches_vs_flash', 0)} outside twice the "
                             f"tolerance of PyTorch flash")


def add_decode_ratios(rows: list[dict]) -> None:
    """x_cudnn, x_flash = PyTorch's time / this row's time (the same bytes: the bandwidth ratio), and for a
    paged row x_contiguous = the time of the same step on the contiguous cache / its time."""
    base = {r["impl"]: r["ms"] for r in rows if r["kind"] == "torch" and r.get("ms")}
    contiguous = {r["impl"]: r["ms"] for r in rows if r["kind"] == "step" and not r["page_size"] and r.get("ms")}
    for r in rows:
        if not r.get("ms"):
            continue
        for key, impl in (("x_flash", "torch_flash"), ("x_cudnn", "torch_cudnn")):
            if base.get(impl):
                r[key] = base[impl] / r["ms"]
        if r["page_size"] and contiguous.get(r["impl"]):
            r["x_contiguous"] = contiguous[r["impl"]] / r["ms"]


def decode_label(r: dict) -> str:
    """A column heading: pt:<backend>, the step id's number part, and pN for a paged cache."""
    if r["kind"] == "torch":
        return label(r["impl"])
    return r["impl"].split("_")[0] + (f" p{r['page_size']}" if r["page_size"] else "")


DECODE_CSV_FIELDS = ["date", "commit", "gpu", "impl", "kind", "entry", "page_size", "batch", "seqlen_q", "seqlen_k",
                     "heads_q", "heads_kv", "head_dim", "dtype", "causal", "kv_bytes", "status", "ms", "min_ms",
                     "max_ms", "iters", "gbs", "hbm_pct", "x_cudnn", "x_flash", "x_contiguous", "max_abs_err",
                     "max_lse_err", "max_abs_diff_flash", "mismatches", "nonfinite", "pass", "reason"]


def print_decode_table(result: dict) -> None:
    """GB/s of K and V read (median), one line per shape; then the % of the HBM ceiling and x cuDNN of the
    steps with a decoding entry. '-' not run (refused, unsupported), '!' check failed."""
    rows = result["rows"]
    labels, shapes = [], []
    for r in rows:
        if decode_label(r) not in labels and r["impl"] not in ("torch_efficient", "torch_math"):
            labels.append(decode_label(r))
        if decode_key(r) not in [decode_key(s) for s in shapes]:
            shapes.append(r)
    by = {(decode_key(r), decode_label(r)): r for r in rows}
    hbm = result.get("hbm") or {}
    print(f"\nGB/s of K+V read (median), {result['environment'].get('gpu', '')}, commit {result['commit']}, "
          f"{result['date']}   - = not run,  ! = check failed")
    print(f"{'shape':40}" + "".join(f"{x:>10}" for x in labels))
    for s in shapes:
        line = f"{decode_describe(s):40}"
        for x in labels:
            r = by.get((decode_key(s), x))
            cell = "-"
            if r and r.get("gbs"):
                cell = f"{r['gbs']:.0f}" + ("!" if r["status"] == "fail" else "")
            line += f"{cell:>10}"
        print(line)
    decoding = [x for x in labels if any(r["kind"] == "step" and r["entry"] == "decode" and decode_label(r) == x
                                         for r in rows)]
    if decoding:
        print(f"\n% of the HBM read ceiling ({hbm.get('tbs', 0):.2f} TB/s, {hbm.get('path', 'none')}) / x cuDNN / "
              "x contiguous (paged)")
        print(f"{'shape':40}" + "".join(f"{x:>20}" for x in decoding))
        for s in shapes:
            line = f"{decode_describe(s):40}"
            for x in decoding:
                r = by.get((decode_key(s), x))
                if not r or not r.get("gbs"):
                    line += f"{'-':>20}"
                    continue
                cell = f"{r.get('hbm_pct', 0):.0f}%" + (f" {r['x_cudnn']:.2f}x" if r.get("x_cudnn") else "")
                cell += f" {r['x_contiguous']:.2f}" if r.get("x_contiguous") else ""
                line += f"{cell:>20}"
            print(line)
    for r in [r for r in rows if r["status"] in ("fail", "error")][:20]:
        print(f"  {r['impl']} {decode_describe(r)} page {r['page_size']}: {r['status']}: {r['reason']}")


def run_decode(args) -> int:
    try:
        lib = load_library(args.lib)
    except flash_steps.LibraryNotFound as e:
        print(f"compare_torch: {e.message} (or pass --lib)", file=sys.stderr)
        return 1
    wanted = [w.strip() for w in (args.steps or DECODE_DEFAULT_STEPS).split(",") if w.strip()]
    steps = [s for s in steps_of(lib) if s["has_forward"] and any(s["id"].startswith(w) for w in wanted)]
    backends = [b for b in args.backends.split(",") if b]
    try:
        check_backends(backends)
        shapes = decode_shapes(args)
        hbm = hbm_ceiling(args.ceilings)
    except (ValueError, OSError, fs_results.CeilingsError) as e:
        print(f"compare_torch: {e}", file=sys.stderr)
        return 2

    import torch

    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    env = environment(torch)
    sweep = DecodeSweep(torch, lib, args, steps, backends, env, hbm)
    date = datetime.datetime.now(datetime.timezone.utc)
    commit = args.commit or git_commit()
    result = {
        **result_head("decode", date, commit, env, lib),
        "timing": {"statistic": "median", "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
                   "budget_ms": args.budget_ms, "l2_flush": True, "sleep_us": args.sleep_us,
                   "events": "one pair per launch"},
        "bytes": "fs_decode_kv_bytes: batch*seqlen_k*heads_kv*head_dim*2 bytes of K, as many of V",
        "hbm": hbm,
        "page_sizes": list(args.page_sizes),
        "steps": steps,
        "backends": backends,
        "complete": False,
        "rows": [],
    }
    print(f"compare_torch --decode {commit} on {env['gpu']} (driver {env['driver']}, CUDA {env['cuda']}, torch "
          f"{env['torch']}, cuDNN {env['cudnn']}): {len(shapes)} shapes; HBM read ceiling "
          f"{hbm.get('tbs', 0):.2f} TB/s from {hbm.get('path', 'no ceilings file')}", file=sys.stderr, flush=True)
    out_base = Path(args.out_dir) / f"compare_torch-decode-{date.strftime('%Y%m%d-%H%M%S')}"
    return measure_shapes(
        result, shapes, sweep, out_base, DECODE_CSV_FIELDS,
        heading=lambda shape: f"{decode_describe(shape)}  (",
        cell=lambda r: (f"{decode_label(r)} {r['gbs']:.0f}" + ("!" if r["status"] == "fail" else "")
                        if r.get("gbs") else f"{decode_label(r)} {r['status']}"),
        table=print_decode_table, after_shape=torch.cuda.empty_cache)


# ---- the backward pass (--backward) ------------------------------------------------------------

def backward_label(impl: str) -> str:
    """A column heading: pt:<backend>, or the step id's number part with ' det' for deterministic = 1."""
    if impl.startswith("torch_"):
        return label(impl)
    return impl.split("_")[0] + (" det" if impl.endswith(DETERMINISTIC_SUFFIX) else "")


DETERMINISTIC_SUFFIX = ":det"  # the impl of a step's deterministic row: "11_backward:det"


def reference_backward_slice(torch, q, k, v, d_o, causal: bool, scale: float, heads: int, chunk: int = 1024):
    """fp32 dQ (heads, Sq, d), dK and dV (heads, Sk, d) of batch 0, heads [0, heads), from the inputs alone
    (P recomputed, D = rowsum(P∘dP)), bottom-right causal, in row chunks, with TF32 off. The sweep has
    heads_q = heads_kv, so query head h reads K/V head h."""
    qs, ks, vs, dos = (x[0, :, :heads].transpose(0, 1).float() for x in (q, k, v, d_o))
    sq, sk = qs.shape[1], ks.shape[1]
    dq, dk, dv = torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vs)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for r0 in range(0, sq, chunk):
            r1 = min(sq, r0 + chunk)
            s = torch.matmul(qs[:, r0:r1], ks.transpose(1, 2)) * scale
            if causal:
                i = torch.arange(r0, r1, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                s.masked_fill_(j > i + (sk - sq), float("-inf"))
            m = s.amax(dim=-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m)
            l = p.sum(dim=-1, keepdim=True)
            p = torch.where(l > 0, p / l.clamp_min(1e-30), torch.zeros_like(p))  # a row with no key: P = 0
            dp = torch.matmul(dos[:, r0:r1], vs.transpose(1, 2))
            ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
            dq[:, r0:r1] = torch.matmul(ds, ks) * scale
            dk += torch.matmul(ds.transpose(1, 2), qs[:, r0:r1]) * scale
            dv += torch.matmul(p.transpose(1, 2), dos[:, r0:r1])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"dq": dq, "dk": dk, "dv": dv}


def gradient_errors(torch, grads: dict, exact: dict) -> dict:
    """{name: (max |grad - exact| over the slice, max |exact|)} for dq, dk, dv given as full (B, N, H, d)
    tensors, and "nonfinite": the count of NaN/inf in the full tensors. A non-finite element counts as an
    infinite error."""
    out = {"nonfinite": 0}
    for name, g in grads.items():
        ex = exact[name]
        got = g[0, :, :ex.shape[0]].transpose(0, 1).float()
        err = torch.nan_to_num((got - ex).abs(), nan=float("inf"))
        out[name] = (float(err.max()), float(ex.abs().max()))
        out["nonfinite"] += int((~torch.isfinite(g)).sum())
    return out


class BackwardSweep(Sweep):
    """On every shape, the same Q, K, V and dO: SDPA's backward for each backend, and each step with a
    backward pass at deterministic 0 and 1 from O and LSE of one forward of ours. Only the backward is
    timed (module docstring); each is checked against an fp32 reference by fs_backward_bound."""

    def __init__(self, torch, lib, args, steps: list[dict], backends: list[str], env: dict):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.torch, self.F, self.sdpa_kernel = torch, F, sdpa_kernel
        self.sdp = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        self.lib, self.args = lib, args
        self.impls = ([("torch_" + b, "torch", b) for b in backends]
                      + [(s["id"] + (DETERMINISTIC_SUFFIX if det else ""), "step", (s["id"], det))
                         for s in steps for det in (False, True)])
        self.timer = Timer(torch, env["l2_bytes"] or (64 << 20), args.sleep_us)
        self.stream = torch.cuda.current_stream().cuda_stream
        self.last: dict[str, dict] = {}
        self.limit_ms = args.max_launch_ms
        self.ref_err, self.ref_impl = None, ""  # per shape: the first SDPA backend's errors, and its name

    def shape(self, si: int, shape: dict) -> list[dict]:
        torch, args, lib = self.torch, self.args, self.lib
        self.ref_err, self.ref_impl = None, ""
        B, N, H, D = shape["batch"], shape["seqlen"], shape["heads"], shape["head_dim"]
        causal, dtype = shape["causal"], shape["dtype"]
        gen = torch.Generator(device="cuda")
        gen.manual_seed(args.seed + si)

        def draw():  # (B, N, H, d), offset + sigma * N(0, 1), rounded to the dtype
            x = torch.randn(B, N, H, D, device="cuda", dtype=torch.float32, generator=gen)
            return (x * INPUT_SIGMA + INPUT_OFFSET).to(torch.float16 if dtype == "fp16" else torch.bfloat16)

        t = {"q": draw(), "k": draw(), "v": draw(), "d_o": draw()}
        scale = 1.0 / math.sqrt(D)
        t["exact"] = reference_backward_slice(torch, t["q"], t["k"], t["v"], t["d_o"], causal, scale, min(H, 2))
        flops = backward_shape_flops(lib, shape)
        rows = []
        for impl, kind, what in self.impls:
            row = dict(shape, impl=impl, kind=kind, flops=flops, status="", reason="",
                       deterministic=bool(kind == "step" and what[1]))
            rows.append(row)
            try:
                if kind == "step":
                    self.step_backward(row, what[0], what[1], t, causal, scale)
                else:
                    self.backend_backward(row, what, t, causal, scale)
            except Exception as e:  # one implementation's failure must not end the sweep
                msg = fmt_err(e)
                unsupported = kind == "torch" and ("No available kernel" in msg or "not supported" in msg.lower())
                row.update(status="unsupported" if unsupported else "error", reason=msg)
        add_ratios(rows)
        return rows

    def judged(self, dtype: str, errors: dict, own_reference: bool) -> dict:
        """The check's fields of a row: per gradient its error and fs_backward_bound(dtype, ref_err, max|exact|)
        with ref_err the reference backend's error (the reference backend itself passes by definition)."""
        res = {"nonfinite": errors["nonfinite"], "ref_impl": ""}
        failed = []
        max_exact = max(errors[name][1] for name in ("dq", "dk", "dv"))  # the problem's scale (fs_backward_bound)
        for name in ("dq", "dk", "dv"):
            err = errors[name][0]
            res[name + "_err"] = err
            if own_reference:
                continue
            ref = self.ref_err
            if ref is None:
                failed.append(f"{name}: no SDPA backend gave the reference error")
                continue
            res["ref_impl"] = self.ref_impl
            res[name + "_bound"] = bound = self.lib.backward_bound(dtype, ref[name][0], max_exact)
            if not err <= bound:
                failed.append(f"{name} error {err:.3g} over the bound {bound:.3g}")
        if errors["nonfinite"]:
            failed.append(f"{errors['nonfinite']} non-finite elements")
        res["pass"] = not failed
        if failed:
            res["why"] = "check failed: " + "; ".join(failed) + (
                f" (fs_backward_bound: 2*ref_err + u*max|exact|, ref_err of {self.ref_impl} against the fp32 "
                "reference)" if self.ref_impl else "")
        return res

    def backend_backward(self, row: dict, backend: str, t: dict, causal: bool, scale: float) -> None:
        torch = self.torch
        leaves = [t[n].detach().requires_grad_() for n in ("q", "k", "v")]
        qt, kt, vt = (x.transpose(1, 2) for x in leaves)  # (B, H, N, d) views of the same memory
        out = {}
        with self.sdpa_kernel([self.sdp[backend]]):
            o = self.F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)  # the graph, once
            d_o = torch.empty_like(o)  # dO in O's own layout, so that no backend copies it to match
            d_o.copy_(t["d_o"].transpose(1, 2))

            def fn():
                out["g"] = torch.autograd.grad(o, (qt, kt, vt), d_o, retain_graph=True)

            def checked():
                fn()
                torch.cuda.synchronize()
                grads = dict(zip(("dq", "dk", "dv"), (g.transpose(1, 2) for g in out.pop("g"))))
                errors = gradient_errors(torch, grads, t["exact"])
                first = self.ref_err is None
                if first:  # the first backend that gives gradients (flash by default) sets ref_err
                    self.ref_err, self.ref_impl = errors, row["impl"]
                return self.judged(row["dtype"], errors, own_reference=first)
            self.measure(row, fn, checked)
        out.clear()

    def step_backward(self, row: dict, step_id: str, deterministic: bool, t: dict, causal: bool, scale: float) -> None:
        torch, lib = self.torch, self.lib
        if "o" not in t:  # our forward, once per shape: O and LSE for every backward step
            fwd = self.args.forward_step or None
            t["o"], t["lse"] = flash_steps.forward(t["q"], t["k"], t["v"], causal, scale, fwd)
            t["forward_step"] = fwd or flash_steps.default_step(
                "forward", problem_for_tensors(t["q"], t["k"], t["v"], t["o"], causal))
            t["dq"], t["dk"], t["dv"] = (torch.empty_like(t[n]) for n in ("q", "k", "v"))
        row["forward_step"] = t["forward_step"]
        prob = flash_steps.backward_problem("compare_torch", t["q"], t["k"], t["v"], t["o"], t["lse"], t["d_o"],
                                            t["dq"], t["dk"], t["dv"], causal, scale, deterministic)
        why = refusal(lib.backward_check, step_id, prob)
        if why:
            row.update(status="refused", reason=why)
            return
        ws_bytes = lib.backward_workspace_size(step_id, prob)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
        fn = lib.backward_runner(step_id, prob, *(t[n].data_ptr() for n in ("q", "k", "v", "o", "lse", "d_o", "dq",
                                                                             "dk", "dv")),
                                 ws.data_ptr() if ws is not None else 0, ws_bytes, self.stream)
        grads = {n: t[n] for n in ("dq", "dk", "dv")}

        def run_poisoned():
            for g in grads.values():
                g.fill_(float("nan"))  # an element the step does not write fails the check
            fn()
            torch.cuda.synchronize()

        def checked():
            run_poisoned()
            res = self.judged(row["dtype"], gradient_errors(torch, grads, t["exact"]), own_reference=False)
            if deterministic:  # bitwise the same on a second run
                first = {n: g.clone() for n, g in grads.items()}
                run_poisoned()
                res["repeatable"] = all(torch.equal(first[n].view(torch.int16), g.view(torch.int16))
                                        for n, g in grads.items())
                if not res["repeatable"]:
                    res["pass"] = False
                    res["why"] = ((res.get("why", "") + "; ") if res.get("why") else "") + \
                        "deterministic = 1 gave other bits on a second run"
            return res
        self.measure(row, fn, checked)


BACKWARD_CSV_FIELDS = ["date", "commit", "gpu", "impl", "kind", "deterministic", "batch", "seqlen", "heads", "head_dim",
                       "causal", "dtype", "flops", "status", "ms", "min_ms", "max_ms", "iters", "tflops", "x_flash",
                       "x_cudnn", "forward_step", "dq_err", "dq_bound", "dk_err", "dk_bound", "dv_err", "dv_bound",
                       "ref_impl", "nonfinite", "repeatable", "pass", "reason"]


def backward_shape_flops(lib, s: dict) -> float:
    """fs_backward_flops of a sweep shape."""
    return lib.backward_flops(lib.backward_problem(s["batch"], s["seqlen"], s["seqlen"], s["heads"], s["heads"],
                                                   s["head_dim"], s["dtype"], s["causal"]))


def backward_shapes(args, lib) -> list[dict]:
    """The sweep's shapes for --backward: the library's sweep from seqlen 1024 on (issue 15: N 1k-16k)
    unless --seqlens says otherwise, grouped by (head_dim, causal, dtype), seqlen ascending."""
    given = args.seqlens is not None
    resolve_sweep(args, lib)
    if not given:
        args.seqlens = [n for n in args.seqlens if n >= 1024]
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    return sweep_shapes(lib, args.seqlens, args.head_dims, causals, args.dtypes, args.tokens)


def run_backward(args) -> int:
    try:
        lib = load_library(args.lib)
    except flash_steps.LibraryNotFound as e:
        print(f"compare_torch: {e.message} (or pass --lib)", file=sys.stderr)
        return 1
    wanted = [w.strip() for w in args.steps.split(",") if w.strip()]
    steps = [s for s in steps_of(lib) if s["has_backward"] and (not wanted or any(s["id"].startswith(w)
                                                                                  for w in wanted))]
    backends = [b for b in args.backends.split(",") if b]
    try:
        check_backends(backends)
        shapes = backward_shapes(args, lib)
    except ValueError as e:
        print(f"compare_torch: {e}", file=sys.stderr)
        return 2
    if not steps:
        print("compare_torch: no registered step has a backward pass" + (f" among --steps {args.steps}" if wanted
                                                                         else "") + "; only SDPA is measured",
              file=sys.stderr)

    import torch

    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    env = environment(torch)
    sweep = BackwardSweep(torch, lib, args, steps, backends, env)
    date = datetime.datetime.now(datetime.timezone.utc)
    commit = args.commit or git_commit()
    result = {
        **result_head("backward", date, commit, env, lib),
        "timing": {"statistic": "median", "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
                   "budget_ms": args.budget_ms, "max_launch_ms": args.max_launch_ms, "l2_flush": True,
                   "sleep_us": args.sleep_us, "events": "one pair per launch",
                   "timed": "the backward alone: fs_run_backward from our forward's O and LSE; SDPA: "
                            "torch.autograd.grad(o, (q, k, v), dO, retain_graph=True) on one forward's graph, "
                            "dO in O's layout"},
        "flops": "fs_backward_flops: 2.5 x fs_problem_flops (5 matrix products instead of 2)",
        "check": "batch 0, heads 0-1 against an fp32 reference; each gradient within fs_backward_bound(dtype, "
                 "ref_err, max|exact|) = 2*ref_err + u*max|exact|, ref_err = the first SDPA backend's error "
                 "(flash by default)",
        "steps": steps,
        "backends": backends,
        "complete": False,
        "rows": [],
    }
    print(f"compare_torch --backward {commit} on {env['gpu']} (driver {env['driver']}, CUDA {env['cuda']}, torch "
          f"{env['torch']}, cuDNN {env['cudnn']}): {len(shapes)} shapes x {len(sweep.impls)} implementations",
          file=sys.stderr, flush=True)
    out_base = Path(args.out_dir) / f"compare_torch_backward-{date.strftime('%Y%m%d-%H%M%S')}"
    return measure_shapes(
        result, shapes, sweep, out_base, BACKWARD_CSV_FIELDS,
        heading=lambda shape: f"{describe(shape)}  ({backward_shape_flops(lib, shape) / 1e9:.0f} GFLOP backward, ",
        cell=lambda r: (f"{backward_label(r['impl'])} {r['tflops']:.1f}" + ("!" if r["status"] == "fail" else "")
                        if r.get("tflops") else f"{backward_label(r['impl'])} {r['status']}"),
        table=lambda result: print_table(result, labeler=backward_label), after_shape=torch.cuda.empty_cache)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lib", help="path of libflash_steps.so (default: $FLASH_STEPS_LIB, else build/libflash_steps.so, "
                    "else the first build*/libflash_steps.so that loads)")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"), help="where the JSON and CSV go")
    ap.add_argument("--commit", default="", help="the commit measured (default: git describe, when .git exists)")
    ap.add_argument("--quick", action="store_true", help="the library's quick sweep (seqlen 1k, 2k, 4k; d 128; fp16); "
                    "fewer launches")
    ap.add_argument("--seqlens", type=int, nargs="+", help="default: the library's sweep, 512 ... 16384")
    ap.add_argument("--head-dims", type=int, nargs="+", help="default: the library's sweep, 128 and 64")
    ap.add_argument("--dtypes", nargs="+", choices=["fp16", "bf16"], help="default: the library's sweep, fp16 and bf16")
    ap.add_argument("--causal", choices=["off", "on", "both"], default="both")
    ap.add_argument("--tokens", type=int, help="B*N of every shape (default: the library's, 16384)")
    ap.add_argument("--steps", default="", help="only the steps whose id starts with one of these (comma-separated)")
    ap.add_argument("--backends", help="PyTorch SDPA backends to time (default: all of them; flash,cudnn with --decode, "
                    "flash,cudnn,efficient with --backward)")
    ap.add_argument("--iters", type=int, default=20, help="timed launches per measurement (at most)")
    ap.add_argument("--min-iters", type=int, default=5, help="timed launches per measurement (at least)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed launches before the timed ones")
    ap.add_argument("--budget-ms", type=float, default=500, help="aim for this much GPU time per measurement")
    ap.add_argument("--max-launch-ms", type=float, default=100,
                    help="skip a launch that takes (or would take) longer than this, e.g. the naive steps at long N")
    ap.add_argument("--ladder-max-launch-ms", type=float, default=5000,
                    help="the same limit at the ladder shape, where every step should be timed")
    ap.add_argument("--math-max-gib", type=float, default=16, help="memory the math backend may use")
    ap.add_argument("--sleep-us", type=float, default=50, help="GPU sleep before each timed launch (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ladder-seqlen", type=int, default=2048, help="the README ladder's shape (B = tokens / N)")
    ap.add_argument("--ladder-head-dim", type=int, default=128)
    ap.add_argument("--ladder-dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--ladder-causal", action="store_true")
    ap.add_argument("--decode", action="store_true",
                    help="the decoding shapes of issue 14 instead of the sweep (see above); --steps defaults to "
                    + DECODE_DEFAULT_STEPS + ", --backends to flash,cudnn, --dtypes to fp16 bf16")
    ap.add_argument("--decode-shapes", nargs="+", metavar="BxSKxHQxHKV",
                    help="decoding shapes, e.g. 8x32768x32x8 (default: the issue's five)")
    ap.add_argument("--decode-seqlens-q", type=int, nargs="+", default=[1, 4], help="new tokens per sequence")
    ap.add_argument("--decode-head-dim", type=int, default=128)
    ap.add_argument("--decode-causal", action="store_true",
                    help="bottom-right causal for seqlen_q > 1 (SDPA: causal_lower_right); default off")
    ap.add_argument("--page-sizes", type=int, nargs="*", default=[16, 64, 256],
                    help="paged copies of the cache for the steps with a decoding entry (none: contiguous only)")
    ap.add_argument("--backward", action="store_true",
                    help="the backward pass instead of the forward (see above): the sweep from seqlen 1024, every "
                    "step with a backward at deterministic 0 and 1, --backends defaults to flash,cudnn,efficient")
    ap.add_argument("--forward-step", default="",
                    help="--backward: the step whose O and LSE the backward steps start from (default: the newest "
                    "step that accepts the shape)")
    ap.add_argument("--ceilings", help="the ceilings file whose hbm_read gives the %% of HBM (default: the newest "
                    "bench/results/ceilings-*.json)")
    args = ap.parse_args(argv)
    if args.decode and args.backward:
        ap.error("--decode and --backward are two different runs; give one")
    if args.backends is None:
        args.backends = ("flash,cudnn" if args.decode else "flash,cudnn,efficient" if args.backward
                         else ",".join(TORCH_BACKENDS))
    if args.quick:
        args.iters = min(args.iters, 10)
        args.warmup = min(args.warmup, 1)
        args.budget_ms = min(args.budget_ms, 200)
        args.max_launch_ms = min(args.max_launch_ms, 50)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_decode(args) if args.decode else run_backward(args) if args.backward else run(args)


if __name__ == "__main__":
    sys.exit(main())
