"""What the tools of bench/ share, so that no script imports another: paths, argument parsing, the results
files, a GPU's ceilings, text between markers, the environment, the timing, the implementations beside
ours (PyTorch SDPA, FlashAttention-4), the check against an exact reference, and matplotlib's setup.
Importing it needs no GPU, PyTorch or matplotlib: what times or checks is given `torch` by its caller."""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def library_path(explicit: str | os.PathLike | None = None) -> Path:
    """The libflash_steps.so given, else $FLASH_STEPS_LIB, else build/libflash_steps.so."""
    return Path(explicit or os.environ.get("FLASH_STEPS_LIB") or REPO / "build" / "libflash_steps.so")


def first_line(e: BaseException) -> str:
    """An exception as one line (its first non-empty one, at most 300 characters): a row's reason."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:300]


# ---- the command line and the figures ------------------------------------------------------------

def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first paragraph as the description, the rest as the epilog."""
    first, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_run_arguments(ap: argparse.ArgumentParser, outputs: str) -> None:
    """--lib, --out-dir and --commit of the scripts that measure on a GPU."""
    ap.add_argument("--lib", help="path of libflash_steps.so (default: $FLASH_STEPS_LIB, else build/libflash_steps.so, "
                    "else the first build*/libflash_steps.so that loads)")
    ap.add_argument("--out-dir", default=str(RESULTS), help=f"where the {outputs} go")
    ap.add_argument("--commit", default="", help="the commit measured (default: git describe, when .git exists)")


CAUSALS = {"off": [False], "on": [True], "both": [False, True]}  # --causal's choices: the causal flags each runs


def window_arg(text: str) -> tuple[int, int]:
    """--window's "L,R" as (L, R): FlashAttention's window_size, each bound an int32 of at least -1 (-1: unbounded
    on that side); the runner's --window rule and sentence."""
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:  # not two parts, or one not an integer
        left = right = -2
    if not all(-1 <= x <= 2 ** 31 - 1 for x in (left, right)):
        raise argparse.ArgumentTypeError(f"--window expects L,R: two integers from -1 to 2147483647 (-1: unbounded on "
                                         f"that side), got '{text}'")
    return left, right


def pyplot():
    """matplotlib.pyplot on the Agg backend; imported only where something is drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, **kw) -> None:
    """At 110 dpi and without the Software tag, so that the same input writes the same bytes."""
    fig.savefig(path, dpi=110, metadata={"Software": None}, **kw)
    pyplot().close(fig)


# ---- results files: bench/results/<tool>-<UTC date>.json and .csv -----------------------------------

def load_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def step_number(step_id: str) -> str:
    """A step's number, its id up to the first '_' (fs_speedups' rule): "04" for 04_pad and 04_swizzle, "07b"."""
    return step_id.split("_")[0]


def newest(directory: str | os.PathLike, pattern: str) -> Path | None:
    """The newest file by name: the names carry a UTC date-time, so the name order is the time order."""
    files = sorted(Path(directory).glob(pattern))
    return files[-1] if files else None


def results_base(out_dir: str | os.PathLike, name: str, date) -> Path:
    """<out_dir>/<name>-<YYYYmmdd-HHMMSS>: the files of one run, .json and .csv (or .png) added."""
    return Path(out_dir) / f"{name}-{date.strftime('%Y%m%d-%H%M%S')}"


def result_head(tool: str, mode: str | None, date, commit: str, env: dict, library: str) -> dict:
    """The fields every results file starts with (mode: none for a tool's main run)."""
    return {"tool": tool, **({"mode": mode} if mode else {}), "schema": 1,
            "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit, "environment": env, "library": library}


def write_results(result: dict, base: Path, fields: list[str]) -> None:
    """base.json (the whole result) and base.csv (these fields of each row, the run's date, commit, GPU)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = base.with_suffix(".json"), base.with_suffix(".csv")
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    common = {"date": result["date"], "commit": result["commit"], "gpu": result["environment"].get("gpu", "")}
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in result["rows"]:
            w.writerow({**common, **r})
    print(f"{result['tool']}: wrote {json_path} and {csv_path}", file=sys.stderr, flush=True)


# ---- the ceilings a GPU reaches (flash_steps_ceilings: bench/results/ceilings-*.json) ------------------
#   {"tool", "commit", "date", "device",
#    "ceilings": [{"id", "value", "unit", "best", "median", "available", "reason"}, ...]}
CEILING_LABELS = {
    "mma_sync_f16": "mma.sync fp16", "mma_sync_bf16": "mma.sync bf16",
    "wgmma_f16": "wgmma fp16", "wgmma_bf16": "wgmma bf16",
    "fma_f32": "fp32 FMA", "ex2_approx": "ex2.approx", "hbm_read": "HBM read", "d2d_copy": "device copy",
}


class CeilingsError(ValueError):
    pass


def load_ceilings(path: str | os.PathLike) -> dict:
    """{"path", "device", "commit", "date", "values": {id: {"value", "unit"}}, "left_out": {id: reason}}:
    the available ceilings of one file, and why the others are not there."""
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("ceilings"), list):
        raise CeilingsError(f"{path}: not a ceilings file (no \"ceilings\" list)")
    values, left_out = {}, {}
    for c in data["ceilings"]:
        cid, value = c.get("id"), c.get("value")
        if not cid:
            continue
        if c.get("available", True) and isinstance(value, (int, float)) and value > 0:
            values[cid] = {"value": float(value), "unit": c.get("unit", "")}
        else:
            left_out[cid] = c.get("reason") or "not available"
    return {"path": str(path), "device": data.get("device", ""), "commit": data.get("commit", ""),
            "date": data.get("date", ""), "values": values, "left_out": left_out}


def same_gpu(device: str, gpu: str) -> bool:
    """Whether a ceilings file's device ("NVIDIA H200 (sm_90, 132 SMs)") is the GPU of a results
    file ("NVIDIA H200"); True when either is unknown."""
    if not device or not gpu:
        return True
    return gpu.lower() in device.lower() or device.lower() in gpu.lower()


def hbm_ceiling(path: str | os.PathLike | None = None) -> dict:
    """{"tbs", "path", "device"} of the HBM read ceiling (hbm_read) in `path`, else in the newest
    bench/results/ceilings-*.json; {} when there is none."""
    path = path or newest(RESULTS, "ceilings-*.json")
    if not path:
        return {}
    c = load_ceilings(path)
    v = c["values"].get("hbm_read")
    return {"tbs": v["value"], "path": str(path), "device": c["device"]} if v else {}


# ---- generated text between markers ------------------------------------------------------------

class MarkerError(Exception):
    pass


def _marker_span(text: str, begin: str, end: str) -> tuple[int, int]:
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise MarkerError(f"the markers '{begin}' and '{end}' (in that order) were not found")
    return i + len(begin), j


def between_markers(text: str, begin: str, end: str) -> str:
    """What stands between the two marker lines (without the newline after the first)."""
    i, j = _marker_span(text, begin, end)
    return text[i + 1:j] if text.startswith("\n", i) else text[i:j]


def replace_between_markers(text: str, content: str, begin: str, end: str) -> str:
    """text with everything between the two marker lines replaced by content."""
    i, j = _marker_span(text, begin, end)
    return text[:i] + "\n" + content + text[j:]


def update_between_markers(path: str | os.PathLike, content: str, begin: str, end: str) -> bool:
    """Rewrites the file between the markers; True when it changed. Raises MarkerError without them."""
    path = Path(path)
    old = path.read_text()
    new = replace_between_markers(old, content, begin, end)
    if new != old:
        path.write_text(new)
    return new != old


# ---- the environment of a measurement ----------------------------------------------------------

def _output(cmd: list[str], **kw) -> str:
    """The first line cmd prints, or "unknown" when it cannot run or fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, **kw)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def git_commit() -> str:
    return _output(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=REPO)


def cudnn_version(v) -> str:
    """cuDNN 9 reports major*10000 + minor*100 + patch (91900 is 9.19.0)."""
    if not v:
        return "none"
    v = int(v)
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else str(v)


def environment(torch) -> dict:
    """The GPU, its driver and the versions of CUDA, PyTorch, cuDNN, Python, Triton and FlashAttention-4
    (those two where they import; "fa4": "none" otherwise)."""
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": torch.cuda.get_device_name(0), "compute_capability": f"{props.major}.{props.minor}",
           "sm_count": props.multi_processor_count, "memory_gib": round(props.total_memory / 2 ** 30, 1),
           "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
           "driver": _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
           "cuda": torch.version.cuda, "torch": torch.__version__,
           "cudnn": cudnn_version(torch.backends.cudnn.version()), "python": platform.python_version()}
    with contextlib.suppress(ImportError):
        import triton  # only its version is recorded
        env["triton"] = triton.__version__
    env["fa4"] = fa4()["version"] or "none"
    return env


# ---- the inputs and the timing -------------------------------------------------------------------

INPUT_OFFSET, INPUT_SIGMA = 0.25, 1.0  # Q, K, V, dO drawn as 0.25 + N(0, 1), as common/workload.h


def drawer(torch, seed: int, dtype: str):
    """draw(*size): INPUT_OFFSET + INPUT_SIGMA·N(0, 1) on the GPU, rounded to the dtype (fp16 or bf16), from a
    CUDA generator seeded with seed (each call draws on from where the last one stopped)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)

    def draw(*size):
        x = torch.randn(*size, device="cuda", dtype=torch.float32, generator=gen)
        return (x * INPUT_SIGMA + INPUT_OFFSET).to(torch.float16 if dtype == "fp16" else torch.bfloat16)
    return draw


class Timer:
    """CUDA events around each launch; the L2 flushed (a buffer twice its size written) and a short GPU
    sleep before each, so that the host's cost of the call (ctypes or PyTorch dispatch) hides behind
    queued work and only GPU time is measured."""

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


median = statistics.median
ROUNDS = 4  # a shape's implementations are timed in this many interleaved rounds (time_interleaved)


def time_interleaved(timer, launches: list, failed, rate, rounds: int = ROUNDS) -> None:
    """The timed launches of a shape's implementations, interleaved: launches holds (row, fn, n, warmup, context,
    (passed, why)) of each; each round times a share of every row's n launches (round 0 its warm-up first), in
    the list's order, then reversed, and so on. A GPU timed the same kernel slower at the end of a shape's list
    than alone (it slows as it heats, the likely cause), so alternating gives each the same mean position. An
    exception is its row's, failed(row, e), not the run's; a row with a status is passed over. A row timed gets
    status "ok", or "fail" with why as its reason, ms (the median), min_ms, max_ms, iters and rate(row, ms)'s."""
    samples: dict[int, list[float]] = {id(row): [] for row, *_ in launches}
    for r in range(rounds):
        for row, fn, n, warmup, context, _ in launches if r % 2 == 0 else reversed(launches):
            if row.get("status"):
                continue
            share = n // rounds + (r < n % rounds)
            try:
                with context():
                    if r == 0 and warmup:
                        timer.times(fn, warmup)
                    samples[id(row)] += timer.times(fn, share) if share else []
            except Exception as e:  # this implementation's error, not the run's
                failed(row, e)
    for row, *_, (passed, why) in launches:
        ts = samples[id(row)]
        if row.get("status") or not ts:
            continue
        ms = median(ts)
        row.update(status="ok" if passed else "fail", ms=ms, min_ms=min(ts), max_ms=max(ts), iters=len(ts),
                   **rate(row, ms), **({} if passed else {"reason": why}))


def timed(row: dict | None) -> bool:
    """Whether a results row has a time: run, checked (passed or not) and measured."""
    return bool(row) and row.get("status") in ("ok", "fail") and bool(row.get("ms"))


# ---- the implementations beside ours -----------------------------------------------------------

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
BACKEND_LABELS = {"flash": "PyTorch SDPA flash", "cudnn": "PyTorch SDPA cuDNN",
                  "efficient": "PyTorch SDPA memory-efficient", "math": "PyTorch SDPA math", "fa4": "FA4"}
FA4_MISSING = "FlashAttention-4 not installed (pip install flash-attn-4): no fa4 column"


@functools.cache
def fa4() -> dict:
    """FlashAttention-4 (PyPI flash-attn-4, the package flash_attn.cute; on sm_90 its kernels follow the
    FlashAttention-3 design): {"func": flash_attn_func, "version", "note": ""} when it imports, else
    {"func": None, "version": None, "note": why not}. Looked for once."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # not installed, or one of its own imports fails (the CUTLASS DSL, CUDA)
        missing = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "flash_attn"
        note = FA4_MISSING if missing else f"FlashAttention-4 does not import ({first_line(e)}): no fa4 column"
        return {"func": None, "version": None, "note": note}
    from importlib import metadata
    version = None
    for dist in ("flash-attn-4", "fa4"):  # its own __version__ asks for "fa4", which pip does not name
        with contextlib.suppress(metadata.PackageNotFoundError):
            version = version or metadata.version(dist)
    module = sys.modules["flash_attn.cute"]
    return {"func": flash_attn_func, "note": "", "version": version or getattr(module, "__version__", None) or "unknown"}


def describe(s: dict) -> str:
    """A sweep shape in a few characters: "b8 h16 n2048 d128 fp16 causal", " window 512,0" after it when the
    shape has one (window_left, window_right)."""
    return (f"b{s['batch']} h{s['heads']} n{s['seqlen']} d{s['head_dim']} {s['dtype']}" + " causal" * bool(s["causal"])
            + (f" window {s['window_left']},{s['window_right']}" if "window_left" in s else ""))


def backend_label(name: str, env: dict | None = None) -> str:
    """"PyTorch SDPA cuDNN", ...; FA4 with its version where the environment has it ("FA4 4.0.0b36")."""
    version = (env or {}).get("fa4")
    return BACKEND_LABELS[name] + (f" {version}" if name == "fa4" and version not in (None, "none") else "")


class Backend:
    """One implementation beside ours, on (B, N, H, d) tensors: PyTorch SDPA with one of its backends
    forced, on (B, H, N, d) views of the same memory (x.transpose(1, 2): the layout FlashAttention reads
    natively), or FlashAttention-4's flash_attn_func, which takes (B, N, H, d) as ours do. view() turns a
    tensor of ours into the one the backend reads, and back; call() runs the forward on viewed tensors.
    Causal is bottom-right aligned for all (SDPA: is_causal when seqlen_q = seqlen_k, where both
    alignments agree, else causal_lower_right; FA4 aligns the ends of Q and K itself). Softcapping and the
    sliding window are FA4's alone (SDPA has neither, but for an explicit mask, which turns off its flash and
    cuDNN kernels): SDPA raises ValueError for them."""

    def __init__(self, torch, name: str):
        if name not in BACKEND_LABELS:
            raise ValueError(f"unknown backend {name} (known: {', '.join(BACKEND_LABELS)})")
        self.torch, self.name = torch, name
        self.impl, self.kind = (name, "fa4") if name == "fa4" else ("torch_" + name, "torch")
        self.func = fa4()["func"] if name == "fa4" else torch.nn.functional.scaled_dot_product_attention

    def context(self):
        """Where this backend is called: SDPA's sdpa_kernel with it alone."""
        if self.name == "fa4":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[self.name])])

    def view(self, x):
        return x if self.name == "fa4" else x.transpose(1, 2)

    def __call__(self, q, k, v, causal: bool, scale: float | None, softcap: float = 0.0,
                 window: tuple[int, int] | None = None):
        """window: FlashAttention's window_size (left, right), -1 unbounded (FA4 says None), or None: off."""
        if self.name == "fa4":
            extra = {"softcap": softcap} if softcap else {}  # off: the call as before softcapping existed
            if window is not None:
                extra["window_size"] = tuple(None if bound < 0 else bound for bound in window)
            out = self.func(q, k, v, softmax_scale=scale, causal=causal, **extra)
            return out[0] if isinstance(out, tuple) else out  # (out, lse)
        if softcap:
            raise ValueError("PyTorch SDPA has no logit softcapping")
        if window is not None:
            raise ValueError("PyTorch SDPA has no sliding window (only an explicit mask, which turns its flash and "
                             "cuDNN kernels off)")
        sq, sk = q.shape[2], k.shape[2]
        kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        if causal and sq != sk:
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(sq, sk)
        else:
            kw["is_causal"] = causal
        return self.func(q, k, v, scale=scale, **kw)


# ---- the check ---------------------------------------------------------------------------------

def key_band(seqlen_q: int, seqlen_k: int, causal: bool,
             window: tuple[int, int] | None = None) -> tuple[float, float]:
    """(lo, hi): query row i sees key j (0 <= j < seqlen_k) iff lo <= j - i <= hi, common/flash_steps.h's rule.
    Bottom-right aligned, d = seqlen_k - seqlen_q: causal is j - i <= d; a window (left, right), FlashAttention's
    window_size, is d - left <= j - i <= d + right, a bound of -1 unbounded on its side, the right one 0 when
    causal. The one statement of the rule in Python: visible() and the tile maps of bench/figures.py use it."""
    d = seqlen_k - seqlen_q
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    return (d - left if left >= 0 else float("-inf")), (d + right if right >= 0 else float("inf"))


def visible(i, j, seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int] | None = None):
    """Whether query row i sees key j, by key_band: ints give a bool, torch tensors that broadcast (rows as a
    column, keys as a row) the boolean mask."""
    lo, hi = key_band(seqlen_q, seqlen_k, causal, window)
    return (j >= 0) & (j < seqlen_k) & (j - i >= lo) & (j - i <= hi)


def reference(torch, q, k, v, causal: bool, scale: float, heads: int, d_o=None, chunk: int = 1024,
              softcap: float = 0.0, window: tuple[int, int] | None = None) -> dict:
    """The exact attention of batch 0, heads [0, heads) ((B, N, H, d) tensors; query head h reads K/V head
    h), bottom-right causal, in chunks of query rows, TF32 off: {"o": fp64 O (heads, Sq, d), "lse": fp64
    (heads, Sq)} when d_o is None, else fp32 {"dq", "dk", "dv"} (heads, S, d) for the gradient d_o, from the
    inputs alone (P recomputed, D = rowsum(P∘dP)). A row with no key: O = 0, LSE = -inf, P = 0. softcap > 0:
    every logit c becomes softcap·tanh(c / softcap), and dS takes the slope 1 - tanh². window: a sliding
    window (left, right) (key_band), the keys outside it masked as causal masks them."""
    dt = torch.float64 if d_o is None else torch.float32
    qs, ks, vs = (x[0, :, :heads].transpose(0, 1).to(dt) for x in (q, k, v))
    sq, sk = qs.shape[1], ks.shape[1]
    if d_o is None:
        out = {"o": torch.empty_like(qs), "lse": torch.empty(heads, sq, dtype=dt, device=q.device)}
    else:
        dos = d_o[0, :, :heads].transpose(0, 1).to(dt)
        out = {"dq": torch.zeros_like(qs), "dk": torch.zeros_like(ks), "dv": torch.zeros_like(vs)}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for r0 in range(0, sq, chunk):
            r1 = min(sq, r0 + chunk)
            s = torch.matmul(qs[:, r0:r1], ks.transpose(1, 2)) * scale
            if softcap:
                th = torch.tanh(s / softcap)
                s = softcap * th
            if causal or window is not None:
                i = torch.arange(r0, r1, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                s.masked_fill_(~visible(i, j, sq, sk, causal, window), float("-inf"))
            m = s.amax(dim=-1, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m)
            l = p.sum(dim=-1, keepdim=True)
            p = torch.where(l > 0, p / l.clamp_min(torch.finfo(dt).tiny), torch.zeros_like(p))
            if d_o is None:
                out["o"][:, r0:r1] = torch.matmul(p, vs)
                out["lse"][:, r0:r1] = (m + torch.log(l)).squeeze(-1)
                continue
            dp = torch.matmul(dos[:, r0:r1], vs.transpose(1, 2))
            ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
            if softcap:
                ds = ds * (1 - th * th)
            out["dq"][:, r0:r1] = torch.matmul(ds, ks) * scale
            out["dk"] += torch.matmul(ds.transpose(1, 2), qs[:, r0:r1]) * scale
            out["dv"] += torch.matmul(p.transpose(1, 2), dos[:, r0:r1])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def compare(torch, o_bnhd, lse_bhn, ref: dict, tol: tuple[float, float, float], o_flash_bnhd=None) -> dict:
    """The forward's check: O (B, N, H, d) on reference()'s slice within atol + rtol*|ref| (tol = (atol,
    rtol, lse_tol) of fs_tolerance: 2u*max|V| + 2u*|ref|), LSE (B, H, N) fp32, where given, within
    lse_tol*(1 + |ref|) (-inf where the reference has it), no NaN or infinity anywhere in O, and, where
    o_flash_bnhd is given, every element of O within twice the tolerance of PyTorch flash's output."""
    ref_o, ref_lse = ref["o"], ref["lse"]
    heads = ref_o.shape[0]
    atol, rtol, lse_tol = tol
    got = o_bnhd[0, :, :heads].transpose(0, 1).double()
    finite = torch.isfinite(got)
    err = (got - ref_o).abs()
    bad = (~finite) | (err > atol + rtol * ref_o.abs())
    res = {"max_abs_err": float(torch.where(finite, err, torch.zeros_like(err)).max()),
           "mismatches": int(bad.sum()), "nonfinite": int((~torch.isfinite(o_bnhd)).sum())}
    if lse_bhn is not None:
        g = lse_bhn[0, :heads].double()
        want_inf = torch.isinf(ref_lse)
        lerr = (g - ref_lse).abs()
        ok = torch.where(want_inf, g == ref_lse, torch.isfinite(g) & (lerr <= lse_tol * (1 + ref_lse.abs())))
        res["max_lse_err"] = float(torch.where(want_inf | ~torch.isfinite(g), torch.zeros_like(lerr), lerr).max())
        res["mismatches"] += int((~ok).sum())
    if o_flash_bnhd is not None:
        a, b = o_bnhd.float(), o_flash_bnhd.float()
        diff = (a - b).abs()
        res["max_abs_diff_flash"] = float(torch.nan_to_num(diff, nan=float("inf")).max())
        res["mismatches_vs_flash"] = int((~(diff <= 2 * (atol + rtol * b.abs()))).sum())
    res["pass"] = res["mismatches"] == 0 and res["nonfinite"] == 0 and res.get("mismatches_vs_flash", 0) == 0
    if not res["pass"]:
        res["why"] = (f"check failed: {res['mismatches']} elements outside tolerance of the fp64 reference, "
                      f"{res['nonfinite']} non-finite, {res.get('mismatches_vs_flash', 0)} outside twice the "
                      "tolerance of PyTorch flash")
    return res


def gradient_errors(torch, grads: dict, exact: dict) -> dict:
    """{name: (max |grad - exact| over reference()'s slice, max |exact|)} for dq, dk, dv given as whole
    (B, N, H, d) tensors, and "nonfinite": the count of NaN/inf in the whole tensors. A non-finite element
    counts as an infinite error."""
    out = {"nonfinite": 0}
    for name, g in grads.items():
        ex = exact[name]
        got = g[0, :, :ex.shape[0]].transpose(0, 1).float()
        err = torch.nan_to_num((got - ex).abs(), nan=float("inf"))
        out[name] = (float(err.max()), float(ex.abs().max()))
        out["nonfinite"] += int((~torch.isfinite(g)).sum())
    return out
