"""The one ctypes layer over the C ABI of common/flash_steps.h (libflash_steps.so).

The structs below mirror fs_strides, fs_problem, fs_decode_problem and fs_backward_problem field for
field (tests/python/test_flash_steps.py checks their sizes and offsets against a C compiler); every
function gets its argtypes and restype; a non-zero fs_status becomes a FlashStepsError carrying the
library's sentence (fs_last_error). Nothing here imports PyTorch: pointers are plain integers.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

FS_FP16, FS_BF16 = 0, 1
DTYPE_CODES = {"fp16": FS_FP16, "bf16": FS_BF16}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}

FS_OK, FS_ERR_INVALID, FS_ERR_UNKNOWN_STEP, FS_ERR_CUDA, FS_ERR_OUT_OF_MEMORY, FS_ERR_INTERNAL = range(6)
STATUS_NAMES = {FS_OK: "FS_OK", FS_ERR_INVALID: "FS_ERR_INVALID", FS_ERR_UNKNOWN_STEP: "FS_ERR_UNKNOWN_STEP",
                FS_ERR_CUDA: "FS_ERR_CUDA", FS_ERR_OUT_OF_MEMORY: "FS_ERR_OUT_OF_MEMORY",
                FS_ERR_INTERNAL: "FS_ERR_INTERNAL"}

# python/flash_steps/_capi.py -> the repository (an editable install keeps the files where they are).
REPO = Path(__file__).resolve().parent.parent.parent
LIBRARY_NAME = "libflash_steps.so"


# ---- errors ----------------------------------------------------------------------------------------

class FlashStepsError(RuntimeError):
    """A call that failed: `status` (an fs_status), `function` (the C function or the Python entry point)
    and `message` (the library's sentence, or the Python check's)."""

    def __init__(self, status: int, function: str, message: str):
        super().__init__(f"{function}: {message}" if function else message)
        self.status, self.function, self.message = status, function, message

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"fs_status {self.status}")


class InvalidArgument(FlashStepsError, ValueError):
    """FS_ERR_INVALID: the problem or a pointer breaks a rule (also raised by the Python-side checks)."""


class UnknownStep(FlashStepsError, LookupError):
    """FS_ERR_UNKNOWN_STEP: no registered step has this id."""


class CudaError(FlashStepsError):
    """FS_ERR_CUDA: a CUDA call failed (no device, driver too old, launch failure, ...)."""


class OutOfMemory(FlashStepsError, MemoryError):
    """FS_ERR_OUT_OF_MEMORY: an allocation failed."""


class InternalError(FlashStepsError):
    """FS_ERR_INTERNAL: a bug in the library."""


class LibraryNotFound(FlashStepsError, OSError):
    """libflash_steps.so could not be found or loaded; the message says where it looked."""

    def __init__(self, message: str):
        FlashStepsError.__init__(self, FS_ERR_INVALID, "", message)


_ERROR_CLASSES = {FS_ERR_INVALID: InvalidArgument, FS_ERR_UNKNOWN_STEP: UnknownStep, FS_ERR_CUDA: CudaError,
                  FS_ERR_OUT_OF_MEMORY: OutOfMemory, FS_ERR_INTERNAL: InternalError}


def error(status: int, function: str, message: str) -> FlashStepsError:
    """The exception of an fs_status."""
    return _ERROR_CLASSES.get(status, FlashStepsError)(status, function, message)


# ---- the structs of flash_steps.h ------------------------------------------------------------------

class FsStrides(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("row", ctypes.c_int64), ("head", ctypes.c_int64),
                ("dim", ctypes.c_int64)]


class FsProblem(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("q", FsStrides),
        ("k", FsStrides),
        ("v", FsStrides),
        ("o", FsStrides),
    ]


class FsDecodeProblem(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("checked", ctypes.c_int32),
        ("page_size", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("max_pages_per_seq", ctypes.c_int64),
        ("block_table_stride", ctypes.c_int64),
        ("q", FsStrides),
        ("k", FsStrides),
        ("v", FsStrides),
        ("o", FsStrides),
    ]


class FsBackwardProblem(ctypes.Structure):
    _fields_ = [
        ("forward", FsProblem),
        ("deterministic", ctypes.c_int32),
        ("d_o", FsStrides),
        ("dq", FsStrides),
        ("dk", FsStrides),
        ("dv", FsStrides),
    ]


# ---- the registry ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One registered step (fs_step_*). has_forward is False for a backward-only step (step 11); where the
    library predates the backward pass, has_forward is True and has_backward False."""
    id: str
    name: str
    lesson: str
    dir: str
    min_compute_capability: int
    decodes: bool
    has_forward: bool
    has_backward: bool


# ---- finding the library ---------------------------------------------------------------------------

def library_candidates(repo: Path = REPO) -> list[Path]:
    """Where the library is looked for when FLASH_STEPS_LIB is not set: build/ of the repository, then
    every other build*/ directory next to python/, in name order."""
    first = repo / "build" / LIBRARY_NAME
    others = sorted(d / LIBRARY_NAME for d in repo.glob("build*") if d.is_dir() and d.name != "build")
    return [first] + others


def find_library(explicit: str | os.PathLike | None = None) -> list[Path]:
    """The paths to try, in order: the one given, else $FLASH_STEPS_LIB, else the existing candidates.
    Raises LibraryNotFound, naming where it looked, when there is none."""
    how = "build it (cmake -B build -G Ninja && cmake --build build, in the repository) or set FLASH_STEPS_LIB"
    if explicit:
        if not Path(explicit).exists():
            raise LibraryNotFound(f"{explicit} does not exist; {how} to the library's path")
        return [Path(explicit)]
    env = os.environ.get("FLASH_STEPS_LIB")
    if env:
        if not Path(env).exists():
            raise LibraryNotFound(f"FLASH_STEPS_LIB is {env}, which does not exist; {how} to the library's path")
        return [Path(env)]
    found = [p for p in library_candidates() if p.exists()]
    if not found:
        looked = ", ".join(str(p) for p in library_candidates())
        raise LibraryNotFound(f"{LIBRARY_NAME} not found: FLASH_STEPS_LIB is not set and none of {looked} exists; "
                              f"{how} to the library's path")
    return found


def load(path: str | os.PathLike | None = None) -> "Library":
    """The library at `path`, else by find_library's order: the first candidate that loads (a
    sanitizer build, for one, cannot be loaded into a plain Python)."""
    failures = []
    for candidate in find_library(path):
        try:
            return Library(candidate)
        except OSError as e:
            failures.append(f"{candidate}: {e}")
    raise LibraryNotFound("cannot load " + "; ".join(failures))


# ---- the library -----------------------------------------------------------------------------------

_P = ctypes.POINTER
_I64, _I32, _INT, _DBL, _U64, _PTR, _STR = (ctypes.c_int64, ctypes.c_int32, ctypes.c_int, ctypes.c_double,
                                             ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p)

# name: (argtypes, restype) of every function of flash_steps.h.
SIGNATURES = {
    "fs_problem_init": ([_P(FsProblem)] + [_I64] * 6 + [_I32] * 2, None),
    "fs_step_count": ([], _INT),
    "fs_step_id": ([_INT], _STR),
    "fs_step_name": ([_INT], _STR),
    "fs_step_lesson": ([_INT], _STR),
    "fs_step_dir": ([_INT], _STR),
    "fs_step_min_compute_capability": ([_INT], _INT),
    "fs_step_has_forward": ([_INT], _INT),
    "fs_check": ([_STR, _P(FsProblem)], _INT),
    "fs_workspace_size": ([_STR, _P(FsProblem), _P(_U64)], _INT),
    "fs_run": ([_STR, _P(FsProblem)] + [_PTR] * 6 + [_U64, _PTR], _INT),
    "fs_last_error": ([], _STR),
    "fs_decode_problem_init": ([_P(FsDecodeProblem)] + [_I64] * 6 + [_I32] * 2 + [_I64], None),
    "fs_step_decodes": ([_INT], _INT),
    "fs_decode_check": ([_STR, _P(FsDecodeProblem)], _INT),
    "fs_decode_workspace_size": ([_STR, _P(FsDecodeProblem), _P(_U64)], _INT),
    "fs_run_decode": ([_STR, _P(FsDecodeProblem)] + [_PTR] * 8 + [_U64, _PTR], _INT),
    "fs_decode_kv_bytes": ([_P(FsDecodeProblem), _P(_I32)], _DBL),
    "fs_backward_problem_init": ([_P(FsBackwardProblem)] + [_I64] * 6 + [_I32] * 3, None),
    "fs_step_has_backward": ([_INT], _INT),
    "fs_backward_check": ([_STR, _P(FsBackwardProblem)], _INT),
    "fs_backward_workspace_size": ([_STR, _P(FsBackwardProblem), _P(_U64)], _INT),
    "fs_run_backward": ([_STR, _P(FsBackwardProblem)] + [_PTR] * 10 + [_U64, _PTR], _INT),
    "fs_backward_flops": ([_P(FsBackwardProblem)], _DBL),
    "fs_backward_bound": ([_I32, _DBL, _DBL, _P(_DBL)], _INT),
    "fs_problem_flops": ([_P(FsProblem)], _DBL),
    "fs_tolerance": ([_I32, _DBL] + [_P(_DBL)] * 3, _INT),
    "fs_speedups": ([_INT, _P(_STR)] + [_P(_DBL)] * 3, _INT),
    "fs_sweep_tokens": ([], _I64),
    "fs_sweep_seqlens": ([_I32, _P(_I64), _INT], _INT),
    "fs_sweep_head_dims": ([_I32, _P(_I64), _INT], _INT),
    "fs_sweep_dtypes": ([_I32, _P(_I32), _INT], _INT),
    "fs_sweep_shape": ([_I64] * 3 + [_P(_I64)] * 2, _INT),
}


def _ptr(x: int | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(x or None)


class Library:
    """libflash_steps.so: every function of flash_steps.h, a non-zero status raised as FlashStepsError.
    Pointers are integers (a tensor's data_ptr(); 0 for NULL); `stream` is a cudaStream_t as an integer
    (0: the default stream)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.lib = lib = ctypes.CDLL(self.path)
        self.missing = []  # functions of the header this build lacks (an older library)
        for name, (argtypes, restype) in SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                self.missing.append(name)
                continue
            fn.argtypes, fn.restype = argtypes, restype

    def _fn(self, name: str):
        if name in self.missing:
            raise InternalError(FS_ERR_INTERNAL, name, f"{self.path} has no {name}: it was built from an older "
                                "commit; rebuild it")
        return getattr(self.lib, name)

    def last_error(self) -> str:
        return self.lib.fs_last_error().decode(errors="replace")

    def call(self, name: str, *args) -> None:
        """Calls an fs_status function; raises the status's FlashStepsError with fs_last_error's sentence."""
        status = self._fn(name)(*args)
        if status != FS_OK:
            raise error(status, name, self.last_error())

    # ---- the registry ----

    def steps(self) -> list[Step]:
        lib = self.lib
        has_forward = (lambda i: 1) if "fs_step_has_forward" in self.missing else lib.fs_step_has_forward
        has_backward = (lambda i: 0) if "fs_step_has_backward" in self.missing else lib.fs_step_has_backward
        return [Step(id=lib.fs_step_id(i).decode(), name=lib.fs_step_name(i).decode(),
                     lesson=lib.fs_step_lesson(i).decode(), dir=lib.fs_step_dir(i).decode(),
                     min_compute_capability=lib.fs_step_min_compute_capability(i),
                     decodes=lib.fs_step_decodes(i) == 1, has_forward=has_forward(i) == 1,
                     has_backward=has_backward(i) == 1)
                for i in range(lib.fs_step_count())]

    # ---- the forward problem ----

    def problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                strides: dict | None = None) -> FsProblem:
        """fs_problem_init (contiguous, scale 1/sqrt(head_dim)), then the strides given:
        {"q": (batch, row, head, dim), ...}."""
        p = FsProblem()
        self.lib.fs_problem_init(ctypes.byref(p), batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                 DTYPE_CODES[dtype], int(causal))
        for name, s in (strides or {}).items():
            setattr(p, name, FsStrides(*s))
        return p

    def check(self, step_id: str, p: FsProblem) -> None:
        """Raises when the step cannot run p on the current device (fs_check)."""
        self.call("fs_check", step_id.encode(), ctypes.byref(p))

    def workspace_size(self, step_id: str, p: FsProblem) -> int:
        n = _U64(0)
        self.call("fs_workspace_size", step_id.encode(), ctypes.byref(p), ctypes.byref(n))
        return n.value

    def run(self, step_id: str, p: FsProblem, q: int, k: int, v: int, o: int, lse: int, workspace: int = 0,
            workspace_bytes: int = 0, stream: int = 0) -> None:
        """fs_run: checks, then enqueues the step on `stream`."""
        self.runner(step_id, p, q, k, v, o, lse, workspace, workspace_bytes, stream)()

    def runner(self, step_id: str, p: FsProblem, q: int, k: int, v: int, o: int, lse: int, workspace: int = 0,
               workspace_bytes: int = 0, stream: int = 0):
        """A no-argument callable that enqueues fs_run with these arguments (for timing: the ctypes
        conversions are done once, here)."""
        fn, sid, pp = self._fn("fs_run"), step_id.encode(), ctypes.byref(p)
        args = tuple(_ptr(x) for x in (q, k, v, o, lse, workspace)) + (_U64(workspace_bytes), _ptr(stream))

        def run():
            status = fn(sid, pp, *args)
            if status != FS_OK:
                raise error(status, f"fs_run({step_id})", self.last_error())
        return run

    # ---- decoding ----

    def decode_problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                       page_size: int = 0) -> FsDecodeProblem:
        """fs_decode_problem_init: contiguous Q and O, a contiguous (page_size 0) or paged cache."""
        p = FsDecodeProblem()
        self.lib.fs_decode_problem_init(ctypes.byref(p), batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                        DTYPE_CODES[dtype], int(causal), page_size)
        return p

    def decode_check(self, step_id: str, p: FsDecodeProblem) -> None:
        self.call("fs_decode_check", step_id.encode(), ctypes.byref(p))

    def decode_workspace_size(self, step_id: str, p: FsDecodeProblem) -> int:
        n = _U64(0)
        self.call("fs_decode_workspace_size", step_id.encode(), ctypes.byref(p), ctypes.byref(n))
        return n.value

    def decode_runner(self, step_id: str, p: FsDecodeProblem, q: int, k_cache: int, v_cache: int, block_table: int,
                      cache_seqlens: int, o: int, lse: int, workspace: int = 0, workspace_bytes: int = 0,
                      stream: int = 0):
        """A no-argument callable that enqueues fs_run_decode (0 for a NULL pointer)."""
        fn, sid, pp = self._fn("fs_run_decode"), step_id.encode(), ctypes.byref(p)
        args = (tuple(_ptr(x) for x in (q, k_cache, v_cache, block_table, cache_seqlens, o, lse, workspace))
                + (_U64(workspace_bytes), _ptr(stream)))

        def run():
            status = fn(sid, pp, *args)
            if status != FS_OK:
                raise error(status, f"fs_run_decode({step_id})", self.last_error())
        return run

    def decode_kv_bytes(self, p: FsDecodeProblem, lengths: list[int] | None = None) -> float:
        """fs_decode_kv_bytes: the bytes of K and V a launch must read (every sequence at seqlen_k keys
        when lengths is None)."""
        c_lengths = (_I32 * len(lengths))(*lengths) if lengths is not None else None
        return self.lib.fs_decode_kv_bytes(ctypes.byref(p), c_lengths)

    # ---- the backward pass ----

    def backward_problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                         deterministic: bool = False, strides: dict | None = None) -> FsBackwardProblem:
        """fs_backward_problem_init (contiguous), then the strides given: {"q", "k", "v", "o", "d_o", "dq",
        "dk", "dv"} -> (batch, row, head, dim)."""
        p = FsBackwardProblem()
        self._fn("fs_backward_problem_init")(ctypes.byref(p), batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                              DTYPE_CODES[dtype], int(causal), int(deterministic))
        for name, s in (strides or {}).items():
            setattr(p.forward if name in ("q", "k", "v", "o") else p, name, FsStrides(*s))
        return p

    def backward_check(self, step_id: str, p: FsBackwardProblem) -> None:
        self.call("fs_backward_check", step_id.encode(), ctypes.byref(p))

    def backward_workspace_size(self, step_id: str, p: FsBackwardProblem) -> int:
        n = _U64(0)
        self.call("fs_backward_workspace_size", step_id.encode(), ctypes.byref(p), ctypes.byref(n))
        return n.value

    def backward_runner(self, step_id: str, p: FsBackwardProblem, q: int, k: int, v: int, o: int, lse: int,
                        d_o: int, dq: int, dk: int, dv: int, workspace: int = 0, workspace_bytes: int = 0,
                        stream: int = 0):
        """A no-argument callable that enqueues fs_run_backward."""
        fn, sid, pp = self._fn("fs_run_backward"), step_id.encode(), ctypes.byref(p)
        args = (tuple(_ptr(x) for x in (q, k, v, o, lse, d_o, dq, dk, dv, workspace))
                + (_U64(workspace_bytes), _ptr(stream)))

        def run():
            status = fn(sid, pp, *args)
            if status != FS_OK:
                raise error(status, f"fs_run_backward({step_id})", self.last_error())
        return run

    def backward_flops(self, p: FsBackwardProblem) -> float:
        """fs_backward_flops: 2.5 x the forward's."""
        return self._fn("fs_backward_flops")(ctypes.byref(p))

    def backward_bound(self, dtype: str, ref_err: float, max_abs_exact: float) -> float:
        """fs_backward_bound: 2*ref_err + u*max_abs_exact (the largest |exact| over dQ, dK and dV), the largest
        error a gradient may have."""
        out = _DBL()
        self.call("fs_backward_bound", DTYPE_CODES[dtype], ref_err, max_abs_exact, ctypes.byref(out))
        return out.value

    # ---- the rules the tools share ----

    def flops(self, p: FsProblem) -> float:
        """fs_problem_flops: the FlashAttention convention."""
        return self.lib.fs_problem_flops(ctypes.byref(p))

    def tolerance(self, dtype: str, max_abs_v: float) -> tuple[float, float, float]:
        """fs_tolerance: (atol, rtol, lse_tol) of common/compare.h."""
        out = [_DBL() for _ in range(3)]
        self.call("fs_tolerance", DTYPE_CODES[dtype], max_abs_v, *(ctypes.byref(x) for x in out))
        return tuple(x.value for x in out)

    def speedups(self, ids: list[str], ms: list[float]) -> list[tuple[float, float]]:
        """fs_speedups: (x_step01, x_prev) per row; ms <= 0 for a row that was not timed."""
        n = len(ids)
        x01, xprev = (_DBL * n)(), (_DBL * n)()
        self.call("fs_speedups", n, (_STR * n)(*(i.encode() for i in ids)), (_DBL * n)(*ms), x01, xprev)
        return list(zip(x01, xprev))

    def sweep_tokens(self) -> int:
        return self.lib.fs_sweep_tokens()

    def sweep(self, quick: bool) -> dict:
        """{"seqlens", "head_dims", "dtypes"} of the full sweep or the quick one (fs_sweep_*)."""
        def values(fn, ctype):
            n = fn(int(quick), None, 0)
            out = (ctype * n)()
            fn(int(quick), out, n)
            return list(out)
        return {"seqlens": values(self.lib.fs_sweep_seqlens, _I64),
                "head_dims": values(self.lib.fs_sweep_head_dims, _I64),
                "dtypes": [DTYPE_NAMES[d] for d in values(self.lib.fs_sweep_dtypes, _I32)]}

    def sweep_shape(self, tokens: int, seqlen: int, head_dim: int) -> tuple[int, int]:
        """(batch, heads) of the sweep's shape at (seqlen, head_dim) (fs_sweep_shape)."""
        batch, heads = _I64(), _I64()
        self.call("fs_sweep_shape", tokens, seqlen, head_dim, ctypes.byref(batch), ctypes.byref(heads))
        return batch.value, heads.value
