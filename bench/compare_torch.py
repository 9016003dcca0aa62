#!/usr/bin/env python3
"""Every flash-steps step beside PyTorch SDPA and FlashAttention-4 (where installed), on the same tensors,
timed and checked the same way: `python3 bench/compare_torch.py [--quick]` (the forward sweep), `--decode`
(against a KV cache), `--backward` or `--training` (forward and backward through autograd); `--softcap X` and
`--window L,R` give every shape logit softcapping or a sliding window (FlashAttention-4 the only backend beside
our steps). How it times and checks, and what it writes: bench/README.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import sys
import time

import fs_results as fr

sys.path.insert(0, str(fr.REPO / "python"))  # the flash_steps package, also without pip install -e

import flash_steps  # noqa: E402  (the one ctypes layer of common/flash_steps.h)

TORCH_BACKENDS = tuple(fr.SDPA_BACKENDS)
OPTIONAL_KINDS = ("fa4",)  # an optional baseline's exception is its cell's error, not the run's
DETERMINISTIC_SUFFIX = ":det"  # the impl of a step's deterministic row: "11_backward:det"
# The decoding shapes (batch, seqlen_k, heads_q, heads_kv): one long sequence, a few medium, many short,
# many short with 64 query heads, and one without GQA (notes/10).
DECODE_SHAPES = ((1, 131072, 32, 8), (8, 32768, 32, 8), (64, 4096, 32, 8), (128, 2048, 64, 8), (16, 16384, 32, 32))
DECODE_DEFAULT_STEPS = "07g,08,09,10"
BACKWARD_TENSORS = ("q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv")  # fs_run_backward's, in order
# --training's first shape: the attention of bench/train_gpt.py's defaults (batch 32, seqlen 512, d_model 512,
# head_dim 64, causal, bf16 autocast).
TRAIN_GPT_SHAPE = {"batch": 32, "seqlen": 512, "heads": 8, "head_dim": 64, "causal": True, "dtype": "bf16"}
RATIOS = (("x_flash", "torch_flash"), ("x_cudnn", "torch_cudnn"), ("x_fa4", "fa4"))


def steps_of(lib) -> list[dict]:  # as the results files have them
    return [dataclasses.asdict(s) for s in lib.steps()]


def refusal(check, *args) -> str:
    """"" when check(*args) accepts, else the library's sentence (a step that cannot run a problem)."""
    try:
        check(*args)
    except flash_steps.InvalidArgument as e:
        return e.message
    return ""


def problem_for_tensors(q, k, v, o, causal: bool, softcap: float = 0.0, window=None):  # (B, N, H, d), own strides
    return flash_steps.forward_problem("compare_torch", q, k, v, o, causal, None, softcap=softcap, window=window)


# ---- shapes ------------------------------------------------------------------------------------------

def with_window(s: dict, window: tuple[int, int] | None) -> dict:
    """The shape with --window's sliding window (window_left, window_right: its rows record it too), or as it is."""
    return s if window is None else dict(s, window_left=window[0], window_right=window[1])


def window_of(s: dict) -> tuple[int, int] | None:
    """The window of a shape or a row (with_window); None: it has none."""
    return (s["window_left"], s["window_right"]) if "window_left" in s else None


def sweep_shape(lib, seqlen: int, head_dim: int, causal: bool, dtype: str, tokens: int) -> dict:
    """Batch and heads from fs_sweep_shape; ValueError with the library's sentence when they do not divide."""
    batch, heads = lib.sweep_shape(tokens, seqlen, head_dim)
    return {"batch": batch, "seqlen": seqlen, "heads": heads, "head_dim": head_dim, "causal": causal, "dtype": dtype}


def sweep_shapes(args, lib, min_seqlen: int = 0) -> list[dict]:
    """The command line's shapes, the library's (quick) sweep where it leaves a list out (seqlens from
    min_seqlen on), by (head_dim, causal, dtype), seqlen ascending: each launch is judged from the last."""
    sweep = lib.sweep(args.quick)
    if args.seqlens is None:
        args.seqlens = [n for n in sweep["seqlens"] if n >= min_seqlen]
    args.head_dims, args.dtypes = args.head_dims or sweep["head_dims"], args.dtypes or sweep["dtypes"]
    args.tokens = args.tokens or lib.sweep_tokens()
    return [sweep_shape(lib, n, d, c, t, args.tokens) for d in args.head_dims for c in fr.CAUSALS[args.causal]
            for t in args.dtypes for n in sorted(args.seqlens)]


def shape_flops(lib, s: dict, backward: bool = False) -> float:
    """fs_problem_flops or fs_backward_flops of the shape, its window too: the library counts the visible pairs."""
    make = lib.backward_problem if backward else lib.problem
    return lib.flops(make(s["batch"], s["seqlen"], s["seqlen"], s["heads"], s["heads"], s["head_dim"], s["dtype"],
                          s["causal"], window=window_of(s)))


def parse_decode_shape(text: str) -> tuple[int, int, int, int]:
    """"8x32768x32x8" -> (batch, seqlen_k, heads_q, heads_kv); ValueError with the rule otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--decode-shapes expects BATCHxSEQLEN_KxHEADS_QxHEADS_KV (positive integers), got '{text}'")
    b, sk, hq, hkv = (int(p) for p in parts)
    if hq % hkv:
        raise ValueError(f"--decode-shapes: heads_q ({hq}) is not a multiple of heads_kv ({hkv}) in '{text}'")
    return b, sk, hq, hkv


def decode_shapes(args) -> list[dict]:  # every (shape, seqlen_q, dtype), DECODE_SHAPES' order
    shapes = [parse_decode_shape(t) for t in args.decode_shapes] if args.decode_shapes else DECODE_SHAPES
    return [{"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hkv,
             "head_dim": args.decode_head_dim, "dtype": dtype, "causal": args.decode_causal and sq > 1}
            for dtype in args.dtypes or ["fp16", "bf16"] for sq in args.decode_seqlens_q for b, sk, hq, hkv in shapes]


def decode_describe(s: dict) -> str:
    return (f"b{s['batch']} sk{s['seqlen_k']} h{s['heads_q']}/{s['heads_kv']} sq{s['seqlen_q']} d{s['head_dim']} "
            f"{s['dtype']}" + " causal" * s["causal"])


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


# ---- what a shape's rows gain once they are in, and their headings -------------------------------------

def add_ratios(rows: list[dict]) -> None:
    """x_flash, x_cudnn, x_fa4 = that backend's time / this row's time, within one shape's rows; for a paged
    decoding row also x_contiguous = the time of the same step on the contiguous cache / its time."""
    base = {r["impl"]: r["ms"] for r in rows if r["kind"] != "step" and r.get("ms")}
    contiguous = {r["impl"]: r["ms"] for r in rows if r["kind"] == "step" and not r.get("page_size") and r.get("ms")}
    for r in (r for r in rows if r.get("ms")):
        r.update({key: base[impl] / r["ms"] for key, impl in RATIOS if base.get(impl)})
        if r.get("page_size") and contiguous.get(r["impl"]):
            r["x_contiguous"] = contiguous[r["impl"]] / r["ms"]


def add_speedups(lib, rows: list[dict]) -> None:
    """x_step01 and x_prev of one shape's step rows, by fs_speedups, where there is something to compare."""
    steps = [r for r in rows if r["kind"] == "step"]
    timed = [r["ms"] if fr.timed(r) else 0.0 for r in steps]
    for r, (x01, xprev) in zip(steps, lib.speedups([r["impl"] for r in steps], timed)):
        r.update({k: x for k, x in (("x_step01", x01), ("x_prev", xprev)) if x > 0})


# ---- the loop every pass shares -----------------------------------------------------------------------

def fields_of(shape: str, timed: str, check: str = "max_abs_err max_lse_err max_abs_diff_flash mismatches "
              "nonfinite pass reason") -> list[str]:  # the run's, the row's shape, its timing and rate, its check
    return f"date commit gpu impl kind {shape} status ms min_ms max_ms iters {timed} {check}".split()


class Sweep:
    """The forward sweep, and the loop every pass shares: on each shape the same tensors for everyone, the
    backends first (our steps are also compared with PyTorch flash's output), then our steps, each launched
    and checked, then all of them timed, interleaved (timed). A pass is a subclass saying what differs: its
    steps, shapes (plan), tensors, our launch (step), a backend's (backend), the row's fields and rate, its
    tables, and whether its implementations may be held at once to be interleaved (`interleaved`)."""
    mode, name, passes, default_steps, speedups = None, "compare_torch", ("forward",), "", True
    interleaved = True  # the forward's implementations hold only an output each between rounds
    work, work_name, rate, unit, digits = "flops", "FLOPs", "tflops", "TFLOP/s", 1
    shape_fields = ("batch", "seqlen", "heads", "head_dim", "causal", "dtype")
    csv_fields = fields_of("batch seqlen heads head_dim causal window_left window_right dtype flops",
                            "tflops x_step01 x_prev x_flash x_cudnn x_fa4")
    short, describe = staticmethod(lambda step_id: step_id[:10]), staticmethod(fr.describe)

    def __init__(self, torch, lib, args, steps: list[dict], backends: list[str], env: dict, head: dict):
        self.torch, self.lib, self.args, self.head = torch, lib, args, head
        self.impls = [(dict(impl=be.impl, kind=be.kind, **self.backend_fields(be)), be)
                      for be in (fr.Backend(torch, b) for b in backends)] + self.step_impls(steps)
        self.timer = fr.Timer(torch, env["l2_bytes"] or (64 << 20), args.sleep_us)
        self.stream = torch.cuda.current_stream().cuda_stream
        self.last: dict = {}  # (impl, page size) -> {(head_dim, causal, dtype) or "any": (work, ms)}
        self.limit_ms = args.max_launch_ms

    # ---- what a pass says; here the forward sweep's ----

    @classmethod
    def plan(cls, args, lib) -> tuple[list[dict], dict]:
        """The shapes (the ladder shape first when the sweep lacks it), and the pass's fields of the file."""
        shapes = sweep_shapes(args, lib)
        ladder = sweep_shape(lib, args.ladder_seqlen, args.ladder_head_dim, args.ladder_causal, args.ladder_dtype,
                             args.tokens)
        if cls.key(ladder) not in {cls.key(s) for s in shapes}:
            shapes.insert(0, ladder)
        return shapes, {"timing": {"ladder_max_launch_ms": args.ladder_max_launch_ms},
                        "flops": "fs_problem_flops: 4*B*H*Sq*Sk*d, halved when causal; with a window, "
                                 "4*B*H*d per visible pair",
                        "speedups": "fs_speedups: x_step01 over 01_naive, x_prev over the fastest row of the "
                                    "previous step number", "ladder": ladder}

    @classmethod
    def key(cls, s: dict) -> tuple:
        return tuple(s[k] for k in cls.shape_fields)

    def step_impls(self, steps: list[dict]) -> list[tuple[dict, str]]:  # (a row's fields, the step id)
        return [({"impl": s["id"], "kind": "step"}, s["id"]) for s in steps]

    def backend_fields(self, be) -> dict:
        return {}

    def features(self, s: dict) -> dict:
        """The features of a shape or a row, as flash_steps, fs_results.Backend and fs_results.reference take them:
        --softcap's, and the shape's window (with_window)."""
        return {"softcap": self.args.softcap, "window": window_of(s)}

    def sizes(self, s: dict) -> tuple:
        """(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) of a shape or a row."""
        return s["batch"], s["seqlen"], s["seqlen"], s["heads"], s["heads"], s["head_dim"]

    def heading(self, shape: dict) -> str:
        return f"{self.describe(shape)}  ({shape_flops(self.lib, shape) / 1e9:.0f} GFLOP"

    def rate_of(self, row: dict, ms: float) -> dict:
        return {"tflops": row["flops"] / (ms * 1e-3) / 1e12}

    def tensors(self, si: int, shape: dict) -> dict:
        # The README's ladder needs every step at the ladder shape, the slow ones included.
        ladder = self.key(shape) == self.key(self.head["ladder"])
        self.limit_ms = self.args.ladder_max_launch_ms if ladder else self.args.max_launch_ms
        return self.forward_tensors(si, shape, {"flops": shape_flops(self.lib, shape)})

    def forward_tensors(self, si: int, shape: dict, fields: dict) -> dict:
        """Q, K, V, O, LSE, the fp64 reference of batch 0, query heads 0-1 and the tolerance; `fields`: the rows'."""
        torch = self.torch
        b, sq, sk, hq, hkv, d = self.sizes(shape)
        draw = fr.drawer(torch, self.args.seed + si, shape["dtype"])  # a fresh draw for every shape
        t = {"q": draw(b, sq, hq, d), "k": draw(b, sk, hkv, d), "v": draw(b, sk, hkv, d), "o_flash": None,
             "scale": 1.0 / math.sqrt(d), "fields": fields, "si": si}
        t["o"] = torch.empty_like(t["q"])
        t["lse"] = torch.empty(b, hq, sq, dtype=torch.float32, device="cuda")
        heads = min(hq, 2)
        kv_of = torch.tensor([h // (hq // hkv) for h in range(heads)], device="cuda")
        k0, v0 = (t[n][0:1].index_select(2, kv_of) for n in ("k", "v"))
        t["ref"] = fr.reference(torch, t["q"], k0, v0, shape["causal"], t["scale"], heads, **self.features(shape))
        t["tol"] = self.lib.tolerance(shape["dtype"], float(t["v"].abs().max()))
        return t

    def step(self, row: dict, step_id: str, t: dict):
        prob = problem_for_tensors(t["q"], t["k"], t["v"], t["o"], row["causal"], **self.features(row))
        if not self.refused(row, step_id, prob):
            return self.checked_output(self.runner(step_id, prob, t["q"], t["k"], t["v"], t["o"], t["lse"]), t)

    def checked_output(self, fn, t: dict):
        """fn and its check: O and LSE poisoned, one launch, compared with the reference and PyTorch flash."""
        def checked():
            self.poisoned(fn, (t["o"], t["lse"]))
            return fr.compare(self.torch, t["o"], t["lse"], t["ref"], t["tol"], t["o_flash"])
        return fn, checked

    def backend(self, row: dict, be, t: dict):
        q, k, v = (be.view(t[n]) for n in ("q", "k", "v"))  # the layout the backend reads, the same memory
        out = {}

        def fn():
            out["o"] = be(q, k, v, row["causal"], t["scale"], **self.features(row))

        def checked():
            fn()
            self.torch.cuda.synchronize()
            o = be.view(out.pop("o"))  # back to (B, N, H, d)
            if be.name == "flash":
                t["o_flash"] = o
            return fr.compare(self.torch, o, None, t["ref"], t["tol"])
        return fn, checked

    def finish(self, rows: list[dict]) -> None:
        add_ratios(rows)
        if self.speedups:
            add_speedups(self.lib, rows)

    def tables(self, result: dict) -> None:
        self.print_table(result, f"{self.unit} (median)", self.rate_cell)

    # ---- the loop ----

    def shape(self, si: int, shape: dict) -> list[dict]:
        """Every implementation checked and probed in turn, then all of them timed together (timed)."""
        t, rows, ready = self.tensors(si, shape), [], []
        for fields, what in self.impls:
            row = dict(shape, **fields, **t["fields"], status="", reason="")
            rows.append(row)
            backend = fields["kind"] != "step"
            context = what.context if backend else contextlib.nullcontext
            try:
                if backend and what.name == "math" and self.math_too_big(row):
                    continue
                with context():
                    launch = self.backend(row, what, t) if backend else self.step(row, what, t)
                    plan = self.prepare(row, *launch) if launch else None
                if plan and self.interleaved:
                    ready.append((row, context, plan))
                elif plan:  # timed now, so that what the launch holds is freed before the next one
                    self.timed([(row, context, plan)])
            except Exception as e:  # one implementation's failure must not end the sweep
                self.failed(row, e)
        self.timed(ready)
        self.finish(rows)
        return rows

    @staticmethod
    def failed(row: dict, e: Exception) -> None:
        msg = fr.first_line(e)
        unsupported = row["kind"] == "torch" and ("No available kernel" in msg or "not supported" in msg.lower())
        row.update(status="unsupported" if unsupported else "error", reason=msg)

    def math_too_big(self, row: dict) -> bool:
        """Marks the row skipped when SDPA's math backend would need more memory than --math-max-gib."""
        b, sq, sk, hq, _, _ = self.sizes(row)
        need = 3 * b * hq * sq * sk * 4  # scores, probabilities, a copy
        cap = min(self.args.math_max_gib * 2 ** 30, 0.5 * self.torch.cuda.mem_get_info()[0])
        if need > cap:
            row.update(status="skipped", reason=f"the math backend needs about {need / 2 ** 30:.0f} GiB for the "
                       f"B*H*N*N scores, over the {cap / 2 ** 30:.0f} GiB allowed (--math-max-gib)")
        return need > cap

    def prepare(self, row: dict, fn, checked):
        """Skip if too slow; one checked launch; one timed probe. Returns (fn, launches to time, warm-up, the
        check's verdict) for timed(), or None when the row is skipped (its status and reason say why)."""
        args, work, limit = self.args, row[self.work], self.limit_ms
        prev, group = self.history(row)
        base = prev.get(group) or prev.get("any")
        if base and base[1] * work / base[0] > limit:
            row.update(status="skipped", reason=f"a launch would take about {base[1] * work / base[0]:.0f} ms "
                       f"(scaled by {self.work_name} from the last shape measured), over the limit of {limit:g} ms "
                       "(--max-launch-ms)")
            return
        chk = checked()
        row.update(chk)
        why = row.pop("why", "")
        probe = self.timer.times(fn, 1)[0]
        self.remember(row, probe)
        if probe > limit:
            row.update(status="skipped", probe_ms=probe,
                       reason=f"one launch took {probe:.0f} ms, over the limit of {limit:g} ms (--max-launch-ms)")
            return
        n = max(args.min_iters, min(args.iters, int(args.budget_ms / max(probe, 1e-3))))
        warmup = min(args.warmup, int(args.budget_ms / max(probe, 1e-3)))  # slow launches: checked + probe suffice
        return fn, n, warmup, (chk["pass"], why)

    def history(self, row: dict) -> tuple[dict, tuple]:
        """This implementation's last (work, ms), by (head_dim, causal, dtype) and under "any", and the row's key."""
        return self.last.setdefault((row["impl"], row.get("page_size")), {}), (row["head_dim"], row["causal"], row["dtype"])

    def remember(self, row: dict, ms: float) -> None:
        """A launch of the row took ms: what prepare() scales the next shape's launch from."""
        prev, group = self.history(row)
        prev[group] = prev["any"] = (row[self.work], ms)

    def timed(self, ready: list) -> None:
        """The timed launches of a shape's implementations (prepare()'s rows), interleaved (fs_results'
        time_interleaved): the median, min and max over all of an implementation's launches."""
        fr.time_interleaved(self.timer, [(row, fn, n, warmup, context, verdict)
                                         for row, context, (fn, n, warmup, verdict) in ready], self.failed, self.rate_of)
        for row, *_ in ready:
            if fr.timed(row):
                self.remember(row, row["ms"])

    # ---- our launch ----

    def refused(self, row: dict, step_id: str, prob) -> bool:
        why = refusal(self.lib.check, step_id, prob)
        if why:
            row.update(status="refused", reason=why)
        return bool(why)

    def runner(self, step_id: str, prob, *tensors):
        """The step's run of prob (fs_run, fs_run_decode or fs_run_backward, by its type) on these tensors
        (None: NULL) with a workspace of the size it asks, on the current stream; it keeps them alive."""
        n = self.lib.workspace_size(step_id, prob)
        ws = self.torch.empty(n, dtype=self.torch.uint8, device="cuda") if n else None
        fn = self.lib.runner(step_id, prob, *(x.data_ptr() if x is not None else 0 for x in tensors),
                             workspace=ws.data_ptr() if ws is not None else 0, workspace_bytes=n, stream=self.stream)
        fn.keep = (ws,) + tensors
        return fn

    def poisoned(self, fn, outputs) -> None:
        """fn() on outputs filled with NaN: an element the step does not write fails the check."""
        for x in outputs:
            x.fill_(float("nan"))
        fn()
        self.torch.cuda.synchronize()

    # ---- the progress lines and the tables ----

    def label(self, r: dict) -> str:
        """A column heading: pt:<backend>, fa4, or short(step id), " pN" for a paged cache, " det" if deterministic."""
        if r["kind"] != "step":
            return r["impl"].replace("torch_", "pt:")
        return (self.short(r["impl"].removesuffix(DETERMINISTIC_SUFFIX)) + (f" p{r['page_size']}" if r.get("page_size")
                else "") + " det" * bool(r.get("deterministic")))

    def cell(self, r: dict) -> str:
        return f"{self.label(r)} {self.rate_cell(r) if r.get(self.rate) else r['status']}"

    def rate_cell(self, r: dict) -> str:
        return f"{r[self.rate]:.{self.digits}f}" + "!" * (r["status"] == "fail")

    def after_shape(self) -> None:
        self.torch.cuda.empty_cache()

    def table(self, result: dict) -> None:
        """The tables of the pass, then the rows that failed or errored (20 at most)."""
        self.tables(result)
        for r in [r for r in result["rows"] if r["status"] in ("fail", "error")][:20]:
            print(f"  {self.label(r)} {self.describe(r)}: {r['status']}: {r['reason']}")

    def print_table(self, result: dict, title: str, cell, only=None, width: int = 11) -> None:
        """One line per shape, one column per implementation (but SDPA efficient and math) whose rows only(r)
        accepts; cell(r) the text of a timed row, '-' not timed (refused, skipped, unsupported)."""
        rows = [r for r in result["rows"] if r["impl"] not in ("torch_efficient", "torch_math")]
        labels = list(dict.fromkeys(self.label(r) for r in rows if only is None or only(r)))
        shapes = list({self.key(r): r for r in rows}.values())
        by = {(self.key(r), self.label(r)): r for r in rows}
        env = result["environment"]
        print(f"\n{title}, {env.get('gpu', '')}, commit {result['commit']}, {result['date']}   - = not run (refused/"
              "skipped),  ! = check failed" + (f"   fa4 = {fr.backend_label('fa4', env)}" if "fa4" in labels else ""))
        first = max([len(self.describe(s)) for s in shapes] + [32]) + 2
        print(f"{'shape':{first}}" + "".join(f"{x:>{width}}" for x in labels))
        for s in shapes:
            cells = [by.get((self.key(s), x)) for x in labels]
            print(f"{self.describe(s):{first}}" + "".join(f"{cell(r) if r and r.get(self.rate) else '-':>{width}}"
                                                          for r in cells))


class DecodeSweep(Sweep):
    """--decode: the steps with a decode pass on the cache and on paged copies, the others through fs_run."""
    mode, name, passes, default_steps = "decode", "compare_torch-decode", ("forward", "decode"), DECODE_DEFAULT_STEPS
    interleaved = False  # a paged copy of the caches per page size would stay allocated
    speedups = False
    work, work_name, rate, unit, digits = "kv_bytes", "bytes", "gbs", "GB/s of K+V read", 0
    shape_fields = ("batch", "seqlen_k", "heads_q", "heads_kv", "seqlen_q", "head_dim", "dtype", "causal")
    csv_fields = fields_of("entry page_size batch seqlen_q seqlen_k heads_q heads_kv head_dim dtype causal kv_bytes",
                            "gbs hbm_pct x_cudnn x_flash x_fa4 x_contiguous")
    short, describe = staticmethod(fr.step_number), staticmethod(decode_describe)

    @classmethod
    def plan(cls, args, lib):
        return decode_shapes(args), {
            "bytes": "fs_decode_kv_bytes: batch*seqlen_k*heads_kv*head_dim*2 bytes of K, as many of V",
            "hbm": fr.hbm_ceiling(args.ceilings), "page_sizes": list(args.page_sizes)}

    def step_impls(self, steps):
        return [({"impl": s["id"], "kind": "step", "entry": entry, "page_size": p}, s["id"]) for s in steps
                for entry, p in ([("decode", p) for p in [0, *self.args.page_sizes]] if "decode" in s["passes"]
                                 else [("forward", 0)])]

    def backend_fields(self, be):
        return {"entry": "sdpa" if be.kind == "torch" else be.name, "page_size": 0}

    def sizes(self, s):
        return tuple(s[k] for k in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"))

    def problem(self, s: dict, page_size: int = 0):
        return self.lib.decode_problem(*self.sizes(s), s["dtype"], s["causal"], page_size)

    def heading(self, shape):
        return f"{self.describe(shape)}  ({self.lib.decode_kv_bytes(self.problem(shape)) / 1e9:.2f} GB of K+V"

    def rate_of(self, row, ms):
        gbs, hbm = row["kv_bytes"] / (ms * 1e-3) / 1e9, self.head.get("hbm")
        return {"gbs": gbs, **({"hbm_pct": 100 * gbs / (hbm["tbs"] * 1e3)} if hbm else {})}

    def tensors(self, si, shape):
        return self.forward_tensors(si, shape, {"kv_bytes": self.lib.decode_kv_bytes(self.problem(shape))})

    def step(self, row, step_id, t):
        if row["entry"] == "forward":
            return super().step(row, step_id, t)
        page_size = row["page_size"]
        prob = self.problem(row, page_size)
        if self.refused(row, step_id, prob):
            return None
        k, v, table = t["k"], t["v"], None
        if page_size:  # a seeded shuffle of all the pages: a sequence's neighbouring pages lie far apart
            gen = self.torch.Generator()
            gen.manual_seed(self.args.seed + 1000 * t["si"] + page_size)
            pages = self.torch.randperm(row["batch"] * prob.max_pages_per_seq, generator=gen)
            table_cpu = pages.to(self.torch.int32).view(row["batch"], prob.max_pages_per_seq)
            k, v = (paged_copy(self.torch, t[n], table_cpu, page_size) for n in ("k", "v"))
            table = table_cpu.to("cuda")
        return self.checked_output(self.runner(step_id, prob, t["q"], k, v, table, None, t["o"], t["lse"]), t)

    def tables(self, result):
        super().tables(result)

        def decoding(r):
            return r["kind"] == "step" and r["entry"] == "decode"

        def cell(r):
            return (f"{r.get('hbm_pct', 0):.0f}%" + (f" {r['x_cudnn']:.2f}x" if r.get("x_cudnn") else "")
                    + (f" {r['x_contiguous']:.2f}" if r.get("x_contiguous") else ""))
        if any(decoding(r) for r in result["rows"]):
            hbm = result.get("hbm") or {}
            self.print_table(result, f"% of the HBM read ceiling ({hbm.get('tbs', 0):.2f} TB/s, "
                             f"{hbm.get('path', 'none')}) / x cuDNN / x contiguous (paged)", cell, decoding, 20)


class BackwardSweep(Sweep):
    """--backward: the backward alone timed, each step at deterministic 0 and 1, checked by fs_backward_bound."""
    mode, name, passes, short = "backward", "compare_torch_backward", ("backward",), staticmethod(fr.step_number)
    interleaved = False  # each backend keeps its autograd graph (retain_graph) for its launches
    speedups = False
    csv_fields = fields_of("deterministic batch seqlen heads head_dim causal window_left window_right dtype flops",
                            "tflops x_flash x_cudnn x_fa4 forward_step", "dq_err dq_bound dk_err dk_bound dv_err "
                            "dv_bound ref_impl nonfinite repeatable pass reason")

    @classmethod
    def plan(cls, args, lib):
        return sweep_shapes(args, lib, min_seqlen=1024), {  # N 1k-16k, as the forward sweep
            "timing": {"timed": "the backward alone: fs_run_backward from our forward's O and LSE; the backends: "
                                "torch.autograd.grad(o, (q, k, v), dO, retain_graph=True) on one forward's graph, "
                                "dO in O's layout"},
            "flops": "fs_backward_flops: 2.5 x fs_problem_flops (5 matrix products instead of 2)",
            "check": "batch 0, heads 0-1 against an fp32 reference; each gradient within fs_backward_bound(dtype, "
                     "ref_err, max|exact|) = 2*ref_err + u*max|exact|, ref_err = the first backend's error "
                     "(SDPA flash by default)"}

    def step_impls(self, steps):
        return [({"impl": s["id"] + DETERMINISTIC_SUFFIX * det, "kind": "step", "deterministic": det}, s["id"])
                for s in steps for det in (False, True)]

    def backend_fields(self, be):
        return {"deterministic": False}

    def heading(self, shape):
        return f"{self.describe(shape)}  ({shape_flops(self.lib, shape, backward=True) / 1e9:.0f} GFLOP backward"

    def tensors(self, si, shape):
        self.ref_err, self.ref_impl = None, ""  # per shape: the first backend's errors, and its name
        b, n, _, h, _, d = self.sizes(shape)
        draw = fr.drawer(self.torch, self.args.seed + si, shape["dtype"])
        t = {x: draw(b, n, h, d) for x in ("q", "k", "v", "d_o")}
        t.update(scale=1.0 / math.sqrt(d), fields={"flops": shape_flops(self.lib, shape, backward=True)})
        t["exact"] = fr.reference(self.torch, t["q"], t["k"], t["v"], shape["causal"], t["scale"], min(h, 2),
                                  d_o=t["d_o"], **self.features(shape))
        return t

    def judged(self, dtype: str, errors: dict, own_reference: bool) -> dict:
        """The check's fields of a row: per gradient its error and fs_backward_bound(dtype, ref_err, max|exact|)
        with ref_err the reference backend's error (the reference backend itself passes by definition)."""
        res, failed = {"nonfinite": errors["nonfinite"], "ref_impl": ""}, []
        max_exact = max(errors[name][1] for name in ("dq", "dk", "dv"))  # the problem's scale (fs_backward_bound)
        for name in ("dq", "dk", "dv"):
            res[name + "_err"] = err = errors[name][0]
            if own_reference:
                continue
            if self.ref_err is None:
                failed.append(f"{name}: no SDPA backend gave the reference error")
                continue
            res["ref_impl"] = self.ref_impl
            res[name + "_bound"] = bound = self.lib.backward_bound(dtype, self.ref_err[name][0], max_exact)
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

    def backend(self, row, be, t):
        torch, out = self.torch, {}
        inputs = [be.view(t[n].detach().requires_grad_()) for n in ("q", "k", "v")]  # views of leaf tensors
        o = be(*inputs, row["causal"], t["scale"], **self.features(row))  # the graph, once
        d_o = torch.empty_like(o)  # dO in O's own layout, so that no backend copies it to match
        d_o.copy_(be.view(t["d_o"]))

        def fn():
            out["g"] = torch.autograd.grad(o, inputs, d_o, retain_graph=True)
        return fn, self.checked_gradients(row, fn, out, be.view, t, backend=True)

    def checked_gradients(self, row, fn, out, view, t, backend: bool):
        """The check of a launch fn that leaves (dQ, dK, dV) in out["g"] (view: back to (B, N, H, d)); the first
        backend that gives gradients (SDPA flash by default) sets ref_err."""
        def checked():
            fn()
            self.torch.cuda.synchronize()
            errors = fr.gradient_errors(self.torch, dict(zip(("dq", "dk", "dv"), map(view, out.pop("g")))),
                                        t["exact"])
            first = backend and self.ref_err is None
            if first:
                self.ref_err, self.ref_impl = errors, row["impl"]
            return self.judged(row["dtype"], errors, own_reference=first)
        return checked

    def backward_problem(self, row, t):
        """The fs_backward_problem of the shape's tensors (our forward's O and LSE, computed once per shape by
        --forward-step or the default step, which the row records)."""
        if "o" not in t:  # our forward, once per shape: O and LSE for every backward step
            fwd = self.args.forward_step or None
            t["o"], t["lse"] = flash_steps.forward(t["q"], t["k"], t["v"], row["causal"], t["scale"], fwd,
                                                   **self.features(row))
            t["forward_step"] = fwd or flash_steps.default_step(
                problem_for_tensors(t["q"], t["k"], t["v"], t["o"], row["causal"], **self.features(row)))
            t["dq"], t["dk"], t["dv"] = (self.torch.empty_like(t[n]) for n in ("q", "k", "v"))
        row["forward_step"] = t["forward_step"]
        return flash_steps.backward_problem("compare_torch", *(t[n] for n in BACKWARD_TENSORS), row["causal"],
                                            t["scale"], row["deterministic"], **self.features(row))

    def step(self, row, step_id, t):
        torch = self.torch
        prob = self.backward_problem(row, t)
        if self.refused(row, step_id, prob):
            return None
        fn, grads = self.runner(step_id, prob, *(t[n] for n in BACKWARD_TENSORS)), {n: t[n] for n in ("dq", "dk", "dv")}

        def checked():
            self.poisoned(fn, grads.values())
            res = self.judged(row["dtype"], fr.gradient_errors(torch, grads, t["exact"]), own_reference=False)
            if row["deterministic"]:  # bitwise the same on a second run
                first = {n: g.clone() for n, g in grads.items()}
                self.poisoned(fn, grads.values())
                res["repeatable"] = all(torch.equal(first[n].view(torch.int16), g.view(torch.int16))
                                        for n, g in grads.items())
                if not res["repeatable"]:
                    res["pass"] = False
                    res["why"] = "; ".join(x for x in (res.get("why"), "deterministic = 1 gave other bits on a "
                                                                        "second run") if x)
            return res
        return fn, checked


class TrainingSweep(BackwardSweep):
    """--training: a training step's attention, forward and backward timed together through autograd, as a
    model runs them: o = attention(q, k, v), then torch.autograd.grad(o, (q, k, v), dO). Ours is
    flash_steps.attention with the default forward step (or --forward-step) and each backward step; the
    gradients are checked as --backward checks them (autograd allocates them, so they are not poisoned)."""
    mode, name = "training", "compare_torch_training"
    interleaved = True  # no graph is kept between launches
    csv_fields = fields_of("batch seqlen heads head_dim causal window_left window_right dtype flops",
                           "tflops x_flash x_cudnn x_fa4 forward_step",
                           "dq_err dq_bound dk_err dk_bound dv_err dv_bound ref_impl nonfinite pass reason")

    @classmethod
    def plan(cls, args, lib):
        args.head_dims = args.head_dims or [128]
        shapes = sweep_shapes(args, lib, min_seqlen=1024)
        if not args.no_train_gpt_shape:
            shapes.insert(0, dict(TRAIN_GPT_SHAPE))
        return shapes, {
            "timing": {"timed": "forward and backward together: o = attention(q, k, v), then "
                                "torch.autograd.grad(o, (q, k, v), dO); ours: flash_steps.attention (forward_step, "
                                "then the row's backward step)"},
            "flops": "fs_problem_flops + fs_backward_flops: 3.5 x the forward's",
            "check": "as --backward: each gradient of batch 0, heads 0-1 within fs_backward_bound of SDPA flash's "
                     "error against an fp32 reference", "train_gpt_shape": TRAIN_GPT_SHAPE}

    def step_impls(self, steps):
        return [({"impl": s["id"], "kind": "step", "deterministic": False}, s["id"]) for s in steps]

    def heading(self, shape):
        flops = shape_flops(self.lib, shape) + shape_flops(self.lib, shape, backward=True)
        return f"{self.describe(shape)}  ({flops / 1e9:.0f} GFLOP forward + backward"

    def tensors(self, si, shape):
        t = super().tensors(si, shape)
        t["fields"]["flops"] += shape_flops(self.lib, shape)
        return t

    def backend(self, row, be, t):
        torch, out = self.torch, {}
        inputs = [be.view(t[n].detach().requires_grad_()) for n in ("q", "k", "v")]
        with torch.no_grad():
            d_o = torch.empty_like(be(*inputs, row["causal"], t["scale"], **self.features(row)))  # in O's layout
        d_o.copy_(be.view(t["d_o"]))

        def fn():
            out["g"] = torch.autograd.grad(be(*inputs, row["causal"], t["scale"], **self.features(row)), inputs, d_o)
        return fn, self.checked_gradients(row, fn, out, be.view, t, backend=True)

    def step(self, row, step_id, t):
        if self.refused(row, step_id, self.backward_problem(row, t)):
            return None
        torch, out = self.torch, {}
        inputs = [t[n].detach().requires_grad_() for n in ("q", "k", "v")]

        def fn():
            o = flash_steps.attention(*inputs, row["causal"], t["scale"], t["forward_step"], step_id,
                                      **self.features(row))
            out["g"] = torch.autograd.grad(o, inputs, t["d_o"])
        return fn, self.checked_gradients(row, fn, out, lambda x: x, t, backend=False)


SWEEPS = {"forward": Sweep, "decode": DecodeSweep, "backward": BackwardSweep, "training": TrainingSweep}


# ---- running a pass ------------------------------------------------------------------------------------

def measure_shapes(result: dict, shapes: list, sweep, base) -> int:
    """Every shape's rows into result["rows"], a progress line each; the files, also when interrupted; the
    table; exit status 1 when a row failed its check or errored (an optional baseline's error is its cell's)."""
    t0 = time.time()
    try:
        for si, shape in enumerate(shapes):
            print(f"[{si + 1}/{len(shapes)}] {sweep.heading(shape)}, {time.time() - t0:.0f} s so far)",
                  file=sys.stderr, flush=True)
            rows = sweep.shape(si, shape)
            result["rows"] += rows
            print("    " + "  ".join(sweep.cell(r) for r in rows), file=sys.stderr, flush=True)
            sweep.after_shape()
        result["complete"] = True
    finally:  # what was measured is written even when the run is interrupted
        result["wall_s"] = round(time.time() - t0, 1)
        fr.write_results(result, base, sweep.csv_fields)
    sweep.table(result)
    return int(any(r["status"] == "fail" or r["status"] == "error" and r["kind"] not in OPTIONAL_KINDS
                   for r in result["rows"]))


def check_backends(backends: list[str]) -> None:
    """Raises ValueError naming the --backends values that are neither SDPA backends nor fa4."""
    unknown = [b for b in backends if b not in fr.BACKEND_LABELS]
    if unknown:
        raise ValueError(f"--backends: unknown {', '.join(unknown)} (known: {', '.join(fr.BACKEND_LABELS)})")


def with_fa4(backends: list[str], default: bool, notes: list[str]) -> list[str]:
    """fa4 added to the default backends where FlashAttention-4 imports; left out, with the note why, if not."""
    if "fa4" not in backends and not default:
        return backends
    found = fr.fa4()
    if not found["func"]:
        notes.append(found["note"])
        print(f"compare_torch: {found['note']}", file=sys.stderr, flush=True)
        return [b for b in backends if b != "fa4"]
    return backends + ["fa4"] * ("fa4" not in backends)


def run(args) -> int:
    cls = SWEEPS["decode" if args.decode else "backward" if args.backward else "training" if args.training
                 else "forward"]
    try:
        lib = flash_steps.library(args.lib)
    except flash_steps.LibraryNotFound as e:
        print(f"compare_torch: {e.message} (or pass --lib)", file=sys.stderr)
        return 1
    wanted = [w.strip() for w in (args.steps or cls.default_steps).split(",") if w.strip()]
    steps = [s for s in steps_of(lib) if any(p in s["passes"] for p in cls.passes)
             and (not wanted or any(s["id"].startswith(w) for w in wanted))]
    backends = [b for b in args.backends.split(",") if b]
    try:
        check_backends(backends)
        shapes, head = cls.plan(args, lib)
        shapes = [with_window(s, args.window) for s in shapes]
    except (ValueError, OSError) as e:
        print(f"compare_torch: {e}", file=sys.stderr)
        return 2
    if not steps:
        print(f"compare_torch: no registered step has a {' or '.join(cls.passes)} pass" + (
            f" among --steps {args.steps}" if args.steps else "") + "; only the backends are measured", file=sys.stderr)

    import torch

    if not torch.cuda.is_available():
        print("compare_torch: PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    notes: list[str] = []
    backends = with_fa4(backends, args.default_backends and cls.mode != "decode", notes)
    env = fr.environment(torch)
    sweep = cls(torch, lib, args, steps, backends, env, head)
    date, commit = datetime.datetime.now(datetime.timezone.utc), args.commit or fr.git_commit()
    timing = {"statistic": "median", "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
              "budget_ms": args.budget_ms, "max_launch_ms": args.max_launch_ms, **head.pop("timing", {}),
              "l2_flush": True, "sleep_us": args.sleep_us, "events": "one pair per launch",
              "order": f"a shape's implementations interleaved, {fr.ROUNDS} rounds, in order then reversed"
                       if cls.interleaved else "each implementation's launches together"}
    result = {**fr.result_head("compare_torch", cls.mode, date, commit, env, lib.path), "timing": timing, **head,
              "softcap": args.softcap, "window": args.window,
              "steps": steps, "backends": backends, "notes": notes, "complete": False, "rows": []}
    hbm = head.get("hbm")
    print(f"compare_torch{' --' + cls.mode if cls.mode else ''} {commit} on {env['gpu']} (driver {env['driver']}, "
          f"CUDA {env['cuda']}, torch {env['torch']}, cuDNN {env['cudnn']}, FA4 {env['fa4']}): {len(shapes)} shapes x "
          f"{len(sweep.impls)} implementations" + (f"; HBM read ceiling {hbm.get('tbs', 0):.2f} TB/s from "
                                                   f"{hbm.get('path', 'no ceilings file')}" if hbm is not None else ""),
          file=sys.stderr, flush=True)
    return measure_shapes(result, shapes, sweep, fr.results_base(args.out_dir, cls.name, date))


def parse_args(argv=None):
    ap = fr.parser(__doc__)
    fr.add_run_arguments(ap, "JSON and CSV")
    add = ap.add_argument
    add("--quick", action="store_true", help="the library's quick sweep (seqlen 1k, 2k, 4k; d 128; fp16); fewer launches")
    add("--seqlens", type=int, nargs="+", help="default: the library's sweep, 512 ... 16384")
    add("--head-dims", type=int, nargs="+", help="default: the library's sweep, 128 and 64")
    add("--dtypes", nargs="+", choices=["fp16", "bf16"], help="default: the library's sweep, fp16 and bf16")
    add("--causal", choices=list(fr.CAUSALS), default="both")
    add("--tokens", type=int, help="B*N of every shape (default: the library's, 16384)")
    add("--steps", default="", help="only the steps whose id starts with one of these (comma-separated)")
    add("--backends", help="beside our steps: SDPA's flash, cudnn, efficient, math, and fa4 (FlashAttention-4) "
        "(default: all, fa4 where it imports; flash,cudnn with --decode; flash,cudnn,efficient,fa4 with --backward)")
    add("--iters", type=int, default=20, help="timed launches per measurement (at most)")
    add("--min-iters", type=int, default=5, help="timed launches per measurement (at least)")
    add("--warmup", type=int, default=2, help="untimed launches before the timed ones")
    add("--budget-ms", type=float, default=500, help="aim for this much GPU time per measurement")
    add("--max-launch-ms", type=float, default=100,
        help="skip a launch that takes (or would take) longer than this, e.g. the naive steps at long N")
    add("--ladder-max-launch-ms", type=float, default=5000,
        help="the same limit at the ladder shape, where every step should be timed")
    add("--math-max-gib", type=float, default=16, help="memory the math backend may use")
    add("--sleep-us", type=float, default=50, help="GPU sleep before each timed launch (0: none)")
    add("--seed", type=int, default=1)
    add("--ladder-seqlen", type=int, default=2048, help="the README ladder's shape (B = tokens / N)")
    add("--ladder-head-dim", type=int, default=128)
    add("--ladder-dtype", choices=["fp16", "bf16"], default="fp16")
    add("--ladder-causal", action="store_true")
    add("--decode", action="store_true", help="the decoding shapes (DECODE_SHAPES) instead of the sweep; --steps "
        f"defaults to {DECODE_DEFAULT_STEPS}, --backends to flash,cudnn, --dtypes to fp16 bf16")
    add("--decode-shapes", nargs="+", metavar="BxSKxHQxHKV", help="e.g. 8x32768x32x8 (default: the five of DECODE_SHAPES)")
    add("--decode-seqlens-q", type=int, nargs="+", default=[1, 4], help="new tokens per sequence")
    add("--decode-head-dim", type=int, default=128)
    add("--decode-causal", action="store_true", help="bottom-right causal for seqlen_q > 1 (SDPA: causal_lower_right)")
    add("--page-sizes", type=int, nargs="*", default=[16, 64, 256],
        help="paged copies of the cache for the steps with a decode pass (none: contiguous only)")
    add("--backward", action="store_true", help="the backward pass instead of the forward (bench/README.md): from "
        "seqlen 1024, every step with a backward at deterministic 0 and 1")
    add("--training", action="store_true", help="a training step's attention (bench/README.md): forward and "
        "backward together through autograd, every step with a backward after the default forward step; the "
        "shape of bench/train_gpt.py, then the sweep's from seqlen 1024 at --head-dims (default 128)")
    add("--no-train-gpt-shape", action="store_true", help="--training: leave out train_gpt.py's shape")
    add("--forward-step", default="", help="--backward, --training: the step whose O and LSE the backward steps "
        "start from (default: the newest step that accepts the shape)")
    add("--softcap", type=float, default=0.0, help="logit softcapping, softcap*tanh(s/softcap), for every shape "
        "(forward and --backward; default 0: off). SDPA has none: the backends are fa4 alone (--backends: fa4 only)")
    add("--window", type=fr.window_arg, metavar="L,R", help="a sliding window for every shape (forward, --backward, "
        "--training; default: none): query i sees key j iff i+d-L <= j <= i+d+R, d = seqlen_k - seqlen_q, -1 "
        "unbounded on that side, R 0 when causal (FlashAttention's window_size). SDPA has none: the backends are "
        "fa4 alone (--backends: fa4 only). A negative L goes after '=': --window=-1,32")
    add("--ceilings", help="the ceilings file whose hbm_read gives the %% of HBM (default: the newest "
        "bench/results/ceilings-*.json)")
    args = ap.parse_args(argv)
    if args.decode + args.backward + args.training > 1:
        ap.error("--decode, --backward and --training are different runs; give one")
    args.default_backends = args.backends is None  # then fa4 joins where it imports (forward and backward)
    if args.softcap and (args.decode or args.training):
        ap.error("--softcap: the forward sweep and --backward only")
    if args.softcap and args.backends not in (None, "fa4"):
        ap.error("--softcap: PyTorch SDPA has no softcapping; --backends may be fa4 only")
    if args.window is not None and args.decode:
        ap.error("--window: the forward sweep, --backward and --training only")
    if args.window is not None and args.backends not in (None, "fa4"):
        ap.error("--window: PyTorch SDPA has no sliding window; --backends may be fa4 only")
    if (args.softcap or args.window is not None) and args.backends is None:
        args.backends = ""  # fa4 joins where it imports
    if args.backends is None:
        args.backends = "flash,cudnn" if args.decode or args.training else "flash,cudnn,efficient" if args.backward else ",".join(
            TORCH_BACKENDS)
    if args.quick:
        args.iters, args.warmup = min(args.iters, 10), min(args.warmup, 1)
        args.budget_ms, args.max_launch_ms = min(args.budget_ms, 200), min(args.max_launch_ms, 50)
    return args


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
