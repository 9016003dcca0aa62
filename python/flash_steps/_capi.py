"""The ctypes layer over common/flash_steps.h: its structs field for field (tested against a C compiler), one
PASSES entry per pass, a Library method per verb, and a non-zero fs_status raised as a FlashStepsError."""
from __future__ import annotations

import ctypes
import operator
import os
import struct
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

FS_FP16, FS_BF16 = 0, 1
DTYPE_CODES = {"fp16": FS_FP16, "bf16": FS_BF16}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
FS_OK, FS_ERR_INVALID, FS_ERR_UNKNOWN_STEP, FS_ERR_CUDA, FS_ERR_OUT_OF_MEMORY, FS_ERR_INTERNAL = range(6)
STATUS_NAMES = dict(enumerate(("FS_OK", "FS_ERR_INVALID", "FS_ERR_UNKNOWN_STEP", "FS_ERR_CUDA", "FS_ERR_OUT_OF_MEMORY",
                               "FS_ERR_INTERNAL")))
CORE = ("fs_last_error", "fs_step_count")  # in every build: a library without them is another one
REPO = Path(__file__).resolve().parent.parent.parent  # python/flash_steps/_capi.py (an editable install keeps it)
LIBRARY_NAME = "libflash_steps.so"

class FlashStepsError(RuntimeError):
    """A call that failed: `status` (an fs_status), `function` (the C function or the Python entry point)
    and `message` (the library's sentence, or the Python check's)."""
    def __init__(self, status: int, function: str, message: str):
        super().__init__(f"{function}: {message}" if function else message)
        self.status, self.function, self.message = status, function, message

    @property
    def status_name(self) -> str:
        return STATUS_NAMES.get(self.status, f"fs_status {self.status}")

class InvalidArgument(FlashStepsError, ValueError): """FS_ERR_INVALID: the problem or a pointer breaks a rule"""
class UnknownStep(FlashStepsError, LookupError): """FS_ERR_UNKNOWN_STEP: no registered step has this id"""
class CudaError(FlashStepsError): """FS_ERR_CUDA: a CUDA call failed (no device, driver too old, launch failure, ...)"""
class OutOfMemory(FlashStepsError, MemoryError): """FS_ERR_OUT_OF_MEMORY: an allocation failed"""
class InternalError(FlashStepsError): """FS_ERR_INTERNAL: a bug in the library"""

class LibraryNotFound(FlashStepsError, OSError):
    """libflash_steps.so could not be found or loaded; the message says where it looked."""
    def __init__(self, message: str):
        FlashStepsError.__init__(self, FS_ERR_INVALID, "", message)

ERRORS = {FS_ERR_INVALID: InvalidArgument, FS_ERR_UNKNOWN_STEP: UnknownStep, FS_ERR_CUDA: CudaError,
          FS_ERR_OUT_OF_MEMORY: OutOfMemory, FS_ERR_INTERNAL: InternalError}  # any other status: FlashStepsError

def refuse(function: str, message: str) -> InvalidArgument:
    """The FS_ERR_INVALID of a check made in Python (function: the entry point that refuses)."""
    return InvalidArgument(FS_ERR_INVALID, function, message)

INT32, INT64 = (-2 ** 31, 2 ** 31 - 1), (-2 ** 63, 2 ** 63 - 1)  # the ranges of int32_t and int64_t

def integer(function: str, name: str, value, low: int, high: int, rule: str = "") -> int:
    """value as an int from low to high (operator.index: no bool, float or str), else InvalidArgument; before
    ctypes, which would wrap 2**64 + 2 to 2."""
    if type(value) is int and low <= value <= high:  # the common case, first: a plain int in range
        return value
    try:
        checked = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        checked = None
    if checked is None or not low <= checked <= high:
        raise refuse(function, f"{name} is {value!r}; it must be {rule or f'an integer from {low} to {high}'}")
    return checked

def flag(function: str, name: str, value) -> int:
    """A flag of the C ABI (causal, deterministic, checked): a value equal to True, False, 0 or 1 (a numpy bool
    too), as 0 or 1; anything else is refused, as the C ABI refuses 2 (bool() would make 2 and 'no' a 1)."""
    try:
        ok = not isinstance(value, (str, bytes)) and value is not None and bool(value == 0 or value == 1)
    except (TypeError, ValueError):  # an array, whose == has no single truth value
        ok = False
    if not ok:
        raise refuse(function, f"{name} is {value!r}; it must be True, False, 0 or 1")
    return int(value == 1)

def int64s(function: str, name: str, values, dims: tuple) -> tuple[int, ...]:
    """values (a tensor's shape or strides) as one int64 per dimension of dims, else InvalidArgument."""
    try:
        entries = tuple(values)
    except TypeError:
        entries = ()
    if len(entries) != len(dims):
        raise refuse(function, f"{name} is {values!r}; it must have one entry per dimension ({', '.join(dims)})")
    if all(type(x) is int and INT64[0] <= x <= INT64[1] for x in entries):  # a torch.Size, a stride(): no names
        return entries
    return tuple(integer(function, f"{dim} in {name} {entries}", x, *INT64) for dim, x in zip(dims, entries))

WINDOW_RULE = ("None (no sliding window) or a pair (left, right) of int32 integers, FlashAttention's window_size "
               "(-1: unbounded on that side)")

def window_fields(function: str, window) -> dict:
    """The fs_problem fields (window, window_left, window_right) of a sliding window given as FlashAttention's
    window_size: None, off, as (0, 0, 0); a pair (left, right) of integers as (1, left, right). Their values are
    the library's to judge (each at least -1, -1 unbounded on its side); what is no pair of int32s is refused
    here, before ctypes, which would wrap 2**32 to 0 (a set or a dict has no order: refused too)."""
    if window is None:
        return dict.fromkeys(WINDOW_FIELDS, 0)
    bounds = None
    if not isinstance(window, (str, bytes, set, frozenset, dict)):
        try:
            bounds = tuple(None if isinstance(x, bool) else operator.index(x) for x in window)
        except TypeError:
            pass
    if bounds is None or len(bounds) != 2 or not all(x is not None and INT32[0] <= x <= INT32[1] for x in bounds):
        raise refuse(function, f"window is {window!r}; it must be {WINDOW_RULE}")
    return {"window": 1, "window_left": bounds[0], "window_right": bounds[1]}

_I64, _I32, _INT, _DBL, _U64, _PTR, _STR = (ctypes.c_int64, ctypes.c_int32, ctypes.c_int, ctypes.c_double,
                                             ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p)
_P = ctypes.POINTER

SIZES = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim")  # of fs_problem and every init function
WINDOW_FIELDS = ("window", "window_left", "window_right")  # the sliding window, after the strides
VARLEN_POINTERS = ("cu_seqlens_q", "cu_seqlens_k")  # a variable-length batch, at the end of fs_problem: device
VARLEN_TOTALS = ("total_q", "total_k")                # offsets (addresses, 0: NULL), then the packed rows
STRIDES = ("batch", "row", "head", "dim")

class FsStrides(ctypes.Structure):
    _fields_ = [(name, _I64) for name in STRIDES]

class FsProblem(ctypes.Structure):
    _fields_ = ([(name, _I64) for name in SIZES]
                + [("dtype", _I32), ("causal", _I32), ("softmax_scale", ctypes.c_float), ("softcap", ctypes.c_float)]
                + [(name, FsStrides) for name in ("q", "k", "v", "o")]
                + [(name, _I32) for name in WINDOW_FIELDS]
                + [(name, _PTR) for name in VARLEN_POINTERS]
                + [(name, _I64) for name in VARLEN_TOTALS])

class FsDecodeProblem(ctypes.Structure):
    _fields_ = ([("attention", FsProblem), ("num_splits", _I32), ("checked", _I32)]
                + [(name, _I64) for name in ("page_size", "num_pages", "max_pages_per_seq", "block_table_stride")])

class FsBackwardProblem(ctypes.Structure):
    _fields_ = ([("attention", FsProblem), ("deterministic", _I32)]
                + [(name, FsStrides) for name in ("d_o", "dq", "dk", "dv")])

# One pass of the C ABI: its fs_pass code, struct, functions and the pointers its run takes (Pointer, in order,
# before the workspace). init_extra: the ctypes of the init function's arguments after (batch, ..., dtype, causal).
Pass = namedtuple("Pass", "name code struct init init_extra check workspace_size run pointers")
# One pointer of a run: its argument, its name in the sentences, its alignment, and when NULL is refused: when every
# size that `needs` names is > 0 (q: seqlen_q, k: seqlen_k, p: page_size, a paged cache), never for "". The rules
# of validate_tensors (common/forward, decode and backward/rules.cpp).
Pointer = namedtuple("Pointer", "arg name align needs")

PASSES = (
    Pass("forward", 0, FsProblem, "fs_problem_init", (), "fs_check", "fs_workspace_size", "fs_run",
         (Pointer("q", "Q", 16, "q"), Pointer("k", "K", 16, "qk"), Pointer("v", "V", 16, "qk"),
          Pointer("o", "O", 16, "q"), Pointer("lse", "LSE", 4, ""))),
    Pass("decode", 1, FsDecodeProblem, "fs_decode_problem_init", (_I64,), "fs_decode_check", "fs_decode_workspace_size",
         "fs_run_decode",
         (Pointer("q", "Q", 16, "q"), Pointer("k_cache", "the K cache", 16, "qk"),
          Pointer("v_cache", "the V cache", 16, "qk"), Pointer("block_table", "the block table", 4, "qkp"),
          Pointer("cache_seqlens", "cache_seqlens", 4, ""), Pointer("o", "O", 16, "q"), Pointer("lse", "LSE", 4, ""))),
    Pass("backward", 2, FsBackwardProblem, "fs_backward_problem_init", (_I32,), "fs_backward_check",
         "fs_backward_workspace_size", "fs_run_backward",
         (Pointer("q", "Q", 16, "qk"), Pointer("k", "K", 16, "qk"), Pointer("v", "V", 16, "qk"),
          Pointer("o", "O", 16, "qk"), Pointer("lse", "LSE", 4, "qk"), Pointer("d_o", "dO", 16, "qk"),
          Pointer("dq", "dQ", 16, "q"), Pointer("dk", "dK", 16, "k"), Pointer("dv", "dV", 16, "k"))),
)

def pass_of(p) -> Pass:
    for ps in PASSES:
        if type(p) is ps.struct:
            return ps
    raise refuse("", f"{type(p).__name__} is no problem of flash_steps (one of "
                 + ", ".join(ps.struct.__name__ for ps in PASSES) + ")")

def check_pointers(function: str, p, addresses: list) -> None:
    """The C rules of a run's pointers (Pointer; fs_check reads none), `addresses` in their order, None: unchecked."""
    attention = getattr(p, "attention", p)
    varlen = bool(attention.cu_seqlens_q)  # a variable-length batch's work: its packed rows
    sizes = {"q": attention.total_q if varlen else attention.seqlen_q,
             "k": attention.total_k if varlen else attention.seqlen_k, "p": getattr(p, "page_size", 0)}
    for x, address in zip(pass_of(p).pointers, addresses):
        if address == 0 and x.needs and all(sizes[size] > 0 for size in x.needs):
            raise refuse(function, f"{x.name} is a null pointer")
        if address and address % x.align:
            raise refuse(function, f"{x.name} pointer {address:#x} is not {x.align}-byte aligned (address mod "
                         f"{x.align} = {address % x.align})")

# name: (argtypes, restype) of every function of flash_steps.h; each pass's four from PASSES.
SIGNATURES = {
    "fs_last_error": ([], _STR), "fs_step_count": ([], _INT), "fs_sweep_tokens": ([], _I64),
    **{f"fs_step_{what}": ([_INT], _STR) for what in ("id", "name", "lesson", "dir")},
    "fs_step_min_compute_capability": ([_INT], _INT), "fs_step_runs": ([_INT, _I32], _INT),
    "fs_problem_flops": ([_P(FsProblem)], _DBL), "fs_backward_flops": ([_P(FsBackwardProblem)], _DBL),
    "fs_varlen_flops": ([_P(FsProblem), _P(_I32), _P(_I32), _P(_DBL)], _INT),
    "fs_check_offsets": ([_P(FsProblem), _PTR], _INT),
    "fs_decode_kv_bytes": ([_P(FsDecodeProblem), _P(_I32), _I64, _P(_DBL)], _INT),
    "fs_tolerance": ([_I32, _DBL] + [_P(_DBL)] * 3, _INT), "fs_backward_bound": ([_I32, _DBL, _DBL, _P(_DBL)], _INT),
    "fs_speedups": ([_INT, _P(_STR)] + [_P(_DBL)] * 3, _INT), "fs_sweep_shape": ([_I64] * 3 + [_P(_I64)] * 2, _INT),
    "fs_sweep_seqlens": ([_I32, _P(_I64), _INT], _INT), "fs_sweep_head_dims": ([_I32, _P(_I64), _INT], _INT),
    "fs_sweep_dtypes": ([_I32, _P(_I32), _INT], _INT),
}
for _ps in PASSES:
    SIGNATURES[_ps.init] = ([_P(_ps.struct)] + [_I64] * 6 + [_I32] * 2 + list(_ps.init_extra), None)
    SIGNATURES[_ps.check] = ([_STR, _P(_ps.struct)], _INT)
    SIGNATURES[_ps.workspace_size] = ([_STR, _P(_ps.struct), _P(_U64)], _INT)
    SIGNATURES[_ps.run] = ([_STR, _P(_ps.struct)] + [_PTR] * (len(_ps.pointers) + 1) + [_U64, _PTR], _INT)

@dataclass(frozen=True)
class Step:
    """One registered step (fs_step_*): `passes` are the names of the passes it runs."""
    id: str
    name: str
    lesson: str
    dir: str
    min_compute_capability: int
    passes: tuple

    def runs(self, pass_name: str) -> bool:
        return pass_name in self.passes

def library_candidates(repo: Path = REPO) -> list[Path]:
    """Where the library is looked for when FLASH_STEPS_LIB is not set: build/ of the repository, then
    every other build*/ directory next to python/, in name order."""
    others = sorted(d / LIBRARY_NAME for d in repo.glob("build*") if d.is_dir() and d.name != "build")
    return [repo / "build" / LIBRARY_NAME] + others

def find_library(explicit: str | os.PathLike | None = None) -> list[Path]:
    """The paths to try, in order: the one given, else $FLASH_STEPS_LIB, else the existing candidates (also when
    FLASH_STEPS_LIB is set but empty, as when it is not set: `FLASH_STEPS_LIB= cmd` clears it). A relative path
    is the current directory's. Raises LibraryNotFound, naming where it looked, when there is none."""
    how = "build it (cmake -B build -G Ninja && cmake --build build, in the repository) or set FLASH_STEPS_LIB"
    env = os.environ.get("FLASH_STEPS_LIB")
    given = explicit or env
    if given:
        path = Path(given).absolute()  # not Path("./x.so"), which is x.so: dlopen would look for that on its own path
        if not path.exists():
            shown = given if Path(given).is_absolute() else f"{given} ({path})"
            what = shown if explicit else f"FLASH_STEPS_LIB is {shown}, which"
            raise LibraryNotFound(f"{what} does not exist; {how} to the library's path")
        return [path]
    candidates = library_candidates()
    found = [p for p in candidates if p.exists()]
    if not found:
        state = "set but empty" if env == "" else "not set"
        raise LibraryNotFound(f"{LIBRARY_NAME} not found: FLASH_STEPS_LIB is {state} and none of "
                              f"{', '.join(str(p) for p in candidates)} exists; {how} to the library's path")
    return found

def elf_problem(path: Path) -> str:
    """Why dlopen must not be given path ("" when it may): no such file, not a regular file, not a 64-bit ELF file, or
    shorter than its headers say: a copy cut short, which dlopen would map past its end (SIGBUS: the process killed)."""
    if not path.is_file():
        return "not a regular file" if path.exists() else "no such file"
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF":
            return "not an ELF file (it does not start with \\x7fELF)"
        if len(header) < 64 or header[4] != 2:  # EI_CLASS 2: ELFCLASS64
            return "not a 64-bit ELF file"
        order = "<" if header[5] == 1 else ">"  # EI_DATA 1: little-endian
        phoff, shoff = struct.unpack_from(order + "QQ", header, 32)  # e_phoff, e_shoff
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "4H", header, 54)
        need = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
        if need <= size and phnum and phentsize >= 40:  # every segment's p_offset + p_filesz, at 8 and 32
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            ends = [sum(struct.unpack_from(order + "8xQ16xQ", table, i * phentsize)) for i in range(phnum)]
            need = max([need] + ends)
    return f"{size} bytes, shorter than the {need} its ELF headers give (a truncated copy?)" if need > size else ""

def load(path: str | os.PathLike | None = None) -> Library:
    """The library at `path`, else by find_library's order: the first candidate that loads (a
    sanitizer build, for one, cannot be loaded into a plain Python)."""
    failures = []
    for candidate in find_library(path):
        try:
            return Library(candidate)
        except LibraryNotFound as e:
            failures.append(e.message)
        except OSError as e:
            failures.append(f"{candidate}: {e}")
    raise LibraryNotFound("cannot load " + "; ".join(failures))

_library = None  # the package's Library: library()'s

def library(path: str | os.PathLike | None = None) -> Library:
    """The loaded libflash_steps.so (loaded once; a path given later loads that one instead)."""
    global _library
    if path is not None or _library is None:
        _library = load(path)
    return _library

class Library:
    """libflash_steps.so: every function of flash_steps.h, a non-zero status raised as FlashStepsError. Pointers
    are integers (a tensor's data_ptr(); 0 for NULL); `stream` is a cudaStream_t (0: the default stream)."""
    def __init__(self, path: str | os.PathLike):
        self.path = str(Path(path).absolute())
        if why := elf_problem(Path(self.path)):  # before dlopen, which a truncated file would kill the process in
            raise LibraryNotFound(f"{self.path}: {why}")
        self.lib = ctypes.CDLL(self.path)
        self.missing = [name for name in SIGNATURES if not hasattr(self.lib, name)]  # what an older build lacks
        if lacking := [name for name in CORE if name in self.missing]:
            raise LibraryNotFound(f"{self.path}: not libflash_steps (it has no {' or '.join(lacking)})")
        for name, (argtypes, restype) in SIGNATURES.items():
            if name not in self.missing:
                fn = getattr(self.lib, name)
                fn.argtypes, fn.restype = argtypes, restype

    def _fn(self, name: str):
        if name in self.missing:
            raise InternalError(FS_ERR_INTERNAL, name, f"{self.path} has no {name}: it was built from an older "
                                "commit; rebuild it")
        return getattr(self.lib, name)

    def last_error(self) -> str:
        return self.lib.fs_last_error().decode(errors="replace")

    def _raise_for(self, status: int, function: str) -> None:
        """A non-zero fs_status raised as its FlashStepsError with fs_last_error's sentence."""
        if status != FS_OK:
            raise ERRORS.get(status, FlashStepsError)(status, function, self.last_error())

    def call(self, name: str, *args) -> None:
        self._raise_for(self._fn(name)(*args), name)

    def _outs(self, name: str, types: list, *args) -> list:
        """call(name, *args, then a pointer to a new value of each ctypes type): those values."""
        out = [t() for t in types]
        self.call(name, *args, *(ctypes.byref(x) for x in out))
        return [x.value for x in out]

    def steps(self) -> list[Step]:
        lib, runs = self.lib, self._fn("fs_step_runs")
        return [Step(id=lib.fs_step_id(i).decode(), name=lib.fs_step_name(i).decode(),
                     lesson=lib.fs_step_lesson(i).decode(), dir=lib.fs_step_dir(i).decode(),
                     min_compute_capability=lib.fs_step_min_compute_capability(i),
                     passes=tuple(ps.name for ps in PASSES if runs(i, ps.code) == 1))
                for i in range(lib.fs_step_count())]

    def _init(self, ps: Pass, sizes: tuple, dtype: str, causal: bool, extra: tuple = (), strides: dict | None = None,
              window=None):
        """The pass's init function, then the strides given ({"q": (batch, row, head, dim), ...}), each a field
        of the problem or of its attention, and the window (window_fields); sizes, causal and the window checked
        first (ctypes would wrap them)."""
        p = ps.struct()
        sizes = [integer(ps.init, name, x, *INT64) for name, x in zip(SIZES, sizes)]
        fields = window_fields(ps.init, window)
        self._fn(ps.init)(ctypes.byref(p), *sizes, DTYPE_CODES[dtype], flag(ps.init, "causal", causal), *extra)
        for name, s in (strides or {}).items():
            s = int64s(ps.init, f"strides[{name!r}]", s, STRIDES)
            setattr(p if hasattr(p, name) else p.attention, name, FsStrides(*s))
        for name, value in fields.items():
            setattr(getattr(p, "attention", p), name, value)
        return p

    def problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                strides: dict | None = None, window=None) -> FsProblem:
        """window: None, or FlashAttention's window_size (left, right) (window_fields)."""
        return self._init(PASSES[0], (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), dtype, causal,
                          strides=strides, window=window)

    def decode_problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                       page_size: int = 0) -> FsDecodeProblem:
        """Contiguous Q and O; a contiguous (page_size 0) or paged cache."""
        return self._init(PASSES[1], (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), dtype, causal,
                          (integer(PASSES[1].init, "page_size", page_size, *INT64),))

    def backward_problem(self, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype: str, causal: bool,
                         deterministic: bool = False, strides: dict | None = None, window=None) -> FsBackwardProblem:
        """strides: of "q", "k", "v", "o", "d_o", "dq", "dk", "dv"; window: as problem's."""
        return self._init(PASSES[2], (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), dtype, causal,
                          (flag(PASSES[2].init, "deterministic", deterministic),), strides, window)

    def check(self, step_id: str, p) -> None:
        """Raises when the step cannot run p (of any pass) on the current device."""
        self.call(pass_of(p).check, step_id.encode(), ctypes.byref(p))

    def workspace_size(self, step_id: str, p) -> int:
        return self._outs(pass_of(p).workspace_size, [_U64], step_id.encode(), ctypes.byref(p))[0]

    def runner(self, step_id: str, p, *pointers: int, workspace: int = 0, workspace_bytes: int = 0, stream: int = 0):
        """A no-argument callable that checks, then enqueues the pass's run with these arguments, the pointers
        in the order of Pass.pointers. For timing: the ctypes conversions are done once, here."""
        ps = pass_of(p)
        if len(pointers) != len(ps.pointers):
            raise refuse(ps.run, f"{len(pointers)} pointers given; {ps.run} takes {len(ps.pointers)}: "
                         + ", ".join(x.arg for x in ps.pointers))
        fn, sid, pp, where = self._fn(ps.run), step_id.encode(), ctypes.byref(p), f"{ps.run}({step_id})"
        args = [ctypes.c_void_p(x or None) for x in pointers + (workspace,)]
        args += [_U64(workspace_bytes), ctypes.c_void_p(stream or None)]
        return lambda: self._raise_for(fn(sid, pp, *args), where)

    def run(self, step_id: str, p, *pointers: int, workspace: int = 0, workspace_bytes: int = 0,
            stream: int = 0) -> None:
        self.runner(step_id, p, *pointers, workspace=workspace, workspace_bytes=workspace_bytes, stream=stream)()

    def flops(self, p) -> float:
        """fs_problem_flops or fs_backward_flops (2.5 x the forward's): the FlashAttention convention."""
        fn = "fs_backward_flops" if isinstance(p, FsBackwardProblem) else "fs_problem_flops"
        return self._fn(fn)(ctypes.byref(p))

    def varlen_flops(self, p: FsProblem, cu_seqlens_q: list[int], cu_seqlens_k: list[int]) -> float:
        """fs_varlen_flops: the FLOPs of a variable-length batch from host copies of its offsets (batch + 1
        int32s each), every sequence counted on its own lengths."""
        arrays = []
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            values = [integer("fs_varlen_flops", f"{name}[{i}]", x, *INT32) for i, x in enumerate(cu)]
            if len(values) != p.batch + 1:
                raise refuse("fs_varlen_flops", f"{name} has {len(values)} offsets; a batch of {p.batch} sequences "
                             f"has batch + 1 = {p.batch + 1}")
            arrays.append((_I32 * len(values))(*values))
        return self._outs("fs_varlen_flops", [_DBL], ctypes.byref(p), *arrays)[0]

    def check_offsets(self, p: FsProblem, stream: int = 0) -> None:
        """fs_check_offsets: raises InvalidArgument naming the first device offset of p that breaks the contract
        (they are copied to the host on `stream`, which is synchronized)."""
        self.call("fs_check_offsets", ctypes.byref(p), ctypes.c_void_p(stream or None))

    def decode_kv_bytes(self, p: FsDecodeProblem, lengths: list[int] | None = None) -> float:
        """The bytes of K and V a launch must read: seqlen_k keys a sequence when lengths is None, else lengths[b]
        (int32s, one per sequence, each in [0, seqlen_k])."""
        values = None if lengths is None else [integer("fs_decode_kv_bytes", f"lengths[{i}]", x, *INT32)
                                               for i, x in enumerate(lengths)]
        c_lengths = None if values is None else (_I32 * len(values))(*values)
        return self._outs("fs_decode_kv_bytes", [_DBL], ctypes.byref(p), c_lengths, len(values or ()))[0]

    def tolerance(self, dtype: str, max_abs_v: float) -> tuple[float, float, float]:
        """(atol, rtol, lse_tol) of common/forward/check.h."""
        return tuple(self._outs("fs_tolerance", [_DBL] * 3, DTYPE_CODES[dtype], max_abs_v))

    def backward_bound(self, dtype: str, ref_err: float, max_abs_exact: float) -> float:
        """2*ref_err + u*max_abs_exact (the largest |exact| over dQ, dK and dV): a gradient's largest error."""
        return self._outs("fs_backward_bound", [_DBL], DTYPE_CODES[dtype], ref_err, max_abs_exact)[0]

    def speedups(self, ids: list[str], ms: list[float]) -> list[tuple[float, float]]:
        """(x_step01, x_prev) per row; ms <= 0 for a row that was not timed."""
        n = len(ids)
        x01, xprev = (_DBL * n)(), (_DBL * n)()
        self.call("fs_speedups", n, (_STR * n)(*(i.encode() for i in ids)), (_DBL * n)(*ms), x01, xprev)
        return list(zip(x01, xprev))

    def sweep_tokens(self) -> int:
        return self.lib.fs_sweep_tokens()

    def sweep(self, quick: bool) -> dict:
        """{"seqlens", "head_dims", "dtypes"} of the full sweep or the quick one."""
        def values(fn, ctype):
            out = (ctype * fn(int(quick), None, 0))()
            fn(int(quick), out, len(out))
            return list(out)
        return {"seqlens": values(self.lib.fs_sweep_seqlens, _I64),
                "head_dims": values(self.lib.fs_sweep_head_dims, _I64),
                "dtypes": [DTYPE_NAMES[d] for d in values(self.lib.fs_sweep_dtypes, _I32)]}

    def sweep_shape(self, tokens: int, seqlen: int, head_dim: int) -> tuple[int, int]:
        """(batch, heads) of the sweep's shape at (seqlen, head_dim)."""
        return tuple(self._outs("fs_sweep_shape", [_I64] * 2, tokens, seqlen, head_dim))
