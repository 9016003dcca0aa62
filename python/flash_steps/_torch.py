"""flash_steps on tensors. First the checks made in Python before a tensor reaches the C ABI and the fs_*
structs of tensors: they read only `shape`, `stride()`, `dtype`, `device` (by their names: torch.float16,
cuda:0) and `data_ptr()`, so that they run, and are tested, without PyTorch. Every argument is checked before
anything is allocated or handed to ctypes: its type and range (ctypes would wrap an integer silently), and the
pointers by the C rules (fs_check and fs_workspace_size, asked before the run, read none); the library checks
the rest itself (head_dim and strides multiples of 8, the sizes' and a step's limits). Then forward, backward,
attention and decode: a launch goes on PyTorch's current stream of the tensors' device, with a torch.uint8
workspace allocated on that stream (the caching allocator keeps it valid for the work enqueued there)."""
from __future__ import annotations

import ctypes
import functools
import math
from collections import namedtuple

from ._capi import (DTYPE_CODES, INT32, INT64, FsBackwardProblem, FsDecodeProblem, FsProblem, FsStrides,
                    InvalidArgument, Library, check_pointers, flag, int64s, integer, library, pass_of, refuse,
                    window_fields)

TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}  # the name of a torch.dtype (torch.half's is float16)
MAX_SPLITS = 128  # num_splits: 0 (the step's heuristic) or 1 ... 128 (kMaxSplits, common/decode/problem.h)
PAGE_MULTIPLE = 16  # a page holds whole groups of 16 keys (kPageMultiple, common/decode/problem.h)

BSHD = ("batch", "seqlen", "heads", "head_dim")  # the dimensions of Q, K, V, O, the caches and the gradients
LSE_DIMS = ("batch", "heads_q", "seqlen_q")
THD = ("total", "heads", "head_dim")  # a variable-length batch's packed Q, K, V, O and gradients
VARLEN_LSE_DIMS = ("heads_q", "total_q")
# A tensor argument as the checks read it (read); address None: a tensor flash_steps allocates, contiguous.
Arg = namedtuple("Arg", "name shape strides dtype device address")

def contiguous(shape) -> tuple[int, ...]:
    """The strides torch.empty gives a tensor of this shape (a size of 0 counts as 1)."""
    return tuple(math.prod(max(n, 1) for n in shape[i + 1:]) for i in range(len(shape)))

def read(function: str, name: str, t, dims: tuple, like: Arg | None = None, optional: bool = False) -> Arg | None:
    """What the checks read of tensor t: shape and stride() (an int64 per dimension of dims), dtype, device and
    data_ptr() (an address); anything else is refused. t None: with `like`, the contiguous tensor like it that
    flash_steps allocates; None when optional; else refused. An Arg is returned as it is."""
    if isinstance(t, Arg) or (t is None and optional):
        return t
    if t is None and like is not None:
        shape, strides, dtype, device, address = like.shape, contiguous(like.shape), like.dtype, like.device, None
    else:
        try:
            shape, strides, dtype, device, address = t.shape, t.stride(), t.dtype, t.device, t.data_ptr()
        except (AttributeError, TypeError):
            raise refuse(function, f"{name} is {t!r}; it must be a tensor (with shape, stride(), dtype, device and "
                         "data_ptr())") from None
        address = integer(function, f"{name}'s data_ptr()", address, 0, 2 ** 64 - 1)
    shape = int64s(function, f"{name}'s shape", shape, dims)
    return Arg(name, shape, int64s(function, f"{name}'s stride()", strides, dims), dtype, device, address)

def addresses(*tensors: Arg | None) -> list[int | None]:
    """The tensors' data_ptr()s for check_pointers (None: not given, or allocated by flash_steps)."""
    return [None if t is None else t.address for t in tensors]

def check_tensors(function: str, tensors: list[Arg]) -> str:
    """The rules the (batch, seqlen, heads, head_dim) tensors of one call share: one dtype (returned: "fp16" or
    "bf16"), one CUDA device, a last dimension of stride 1."""
    first = tensors[0]
    if len({str(t.dtype) for t in tensors}) > 1:
        raise refuse(function, "dtype mismatch: " + ", ".join(f"{t.name} is {t.dtype}" for t in tensors)
                     + f"; {', '.join(t.name for t in tensors)} must share one dtype")
    dtype = TORCH_DTYPES.get(str(first.dtype).rsplit(".", 1)[-1])  # torch.float16 -> fp16
    if dtype is None:
        raise refuse(function, f"{first.name} is {first.dtype}; the dtype must be torch.float16 or torch.bfloat16")
    if getattr(first.device, "type", str(first.device).split(":")[0]) != "cuda":
        raise refuse(function, f"{first.name} is on {first.device}; flash_steps runs on a CUDA device")
    for t in tensors[1:]:
        if str(t.device) != str(first.device):
            raise refuse(function, f"{t.name} is on {t.device} but {first.name} is on {first.device}; they must be on "
                         "one device")
    for t in tensors:
        if t.strides[-1] != 1:
            raise refuse(function, f"{t.name}'s last dimension (head_dim) has stride {t.strides[-1]}; it must be 1 "
                         "(contiguous)")
    return dtype

def packed(t: Arg) -> Arg:
    """A packed (total, heads, head_dim) tensor as the C ABI reads it: the (1, total, heads, head_dim) view of
    batch stride 0 (the dense problem of its rows; flash_steps.h, variable-length batch)."""
    return t._replace(shape=(1,) + t.shape, strides=(0,) + t.strides)

def check_same_shape(function: str, t: Arg, like: Arg) -> None:
    if t.shape != like.shape:
        raise refuse(function, f"{t.name} is {t.shape} but {like.name} is {like.shape}; they must match")

def check_dtype_and_device(function: str, t: Arg, dtype: str, q: Arg) -> None:
    if str(t.dtype).rsplit(".", 1)[-1] != dtype:
        raise refuse(function, f"{t.name} is {t.dtype}; it must be torch.{dtype}")
    if str(t.device) != str(q.device):
        raise refuse(function, f"{t.name} is on {t.device} but Q is on {q.device}; they must be on one device")

def check_lse(function: str, lse: Arg, q: Arg) -> None:
    b, sq, hq, _ = q.shape
    if lse.shape != (b, hq, sq):
        raise refuse(function, f"LSE is {lse.shape}; it must be (batch, heads_q, seqlen_q) = {(b, hq, sq)}")
    check_dtype_and_device(function, lse, "float32", q)
    dense = contiguous(lse.shape)  # as torch.empty makes it; the stride of a dimension of 0 or 1 entries is not read
    if any(n > 1 and s != want for n, s, want in zip(lse.shape, lse.strides, dense)):
        raise refuse(function, f"LSE has strides {lse.strides}; it must be contiguous, {dense}")


def real(function: str, name: str, value, rule: str) -> float:
    """value as a float: an int, a float, a numpy or 0-d torch scalar, a Fraction; a value too large for a float
    (10**400) as inf; a bool, a str or what float() refuses is refused with `rule`."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        return float(value)
    except OverflowError:
        return math.inf
    except (TypeError, ValueError):
        raise refuse(function, f"{name} is {value!r}; it must be {rule}") from None

def softmax_scale(function: str, scale, head_dim: int) -> float:
    """scale as softmax_scale, a float32: 1/sqrt(head_dim) when None (1 for a head_dim below 1, which the library
    refuses), else a real number (real: an int or a float, not a bool or a str), finite and > 0, whose nearest
    float32 is too (1e-50 rounds to 0, 1e39 to inf): the rule of the C ABI and of the command line's --scale. The
    library then applies its own bound of the dtype."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    x = real(function, "scale", scale, "a real number (an int or a float) or None")
    if not 0 < scale < math.inf:  # scale itself: 10**400 (x inf) goes on to the float32 rule
        raise refuse(function, f"scale is {scale}; it must be finite and > 0")
    if not 0 < ctypes.c_float(x).value < math.inf:  # to the nearest float32, inf past the largest
        raise refuse(function, f"scale is {scale}; it must be a number from 1e-45 to 3.4028235e+38 (positive and "
                     "finite as a float32, which softmax_scale is)")
    return x

def attention_problem(function: str, dtype: str, q: Arg, k: Arg, v: Arg, o: Arg, seqlen_k: int, causal: bool,
                      scale, softcap=0.0, window=None) -> FsProblem:
    """The fs_problem of checked tensors (scale: see softmax_scale; softcap: any real number, the library judges
    its value; window: window_fields)."""
    b, sq, hq, d = q.shape
    return FsProblem(batch=b, seqlen_q=sq, seqlen_k=seqlen_k, heads_q=hq, heads_kv=k.shape[2], head_dim=d,
                     dtype=DTYPE_CODES[dtype], causal=flag(function, "causal", causal),
                     softmax_scale=softmax_scale(function, scale, d),
                     softcap=real(function, "softcap", softcap, "a real number (0: off)"), q=FsStrides(*q.strides),
                     k=FsStrides(*k.strides), v=FsStrides(*v.strides), o=FsStrides(*o.strides),
                     **window_fields(function, window))

def _forward(function: str, q: Arg, k: Arg, v: Arg, o: Arg, causal: bool, scale, softcap, window) -> FsProblem:
    dtype = check_tensors(function, [q, k, v, o])
    check_same_shape(function, v, k)
    (b, _, hq, d), (kb, sk, hkv, kd) = q.shape, k.shape
    if kb != b or kd != d:
        raise refuse(function, f"K is {k.shape} but Q is {q.shape}; batch (dimension 0) and head_dim (dimension 3) "
                     "must match")
    if hkv <= 0 or hq % hkv:
        raise refuse(function, f"Q has {hq} heads and K, V {hkv}; heads_q must be a multiple of heads_kv (GQA)")
    check_same_shape(function, o, q)
    return attention_problem(function, dtype, q, k, v, o, sk, causal, scale, softcap, window)

def forward_problem(function: str, q, k, v, o, causal: bool, scale, lse=None, softcap=0.0, window=None) -> FsProblem:
    """The fs_problem of Q, K, V and O (batch, seqlen, heads, head_dim) with their own strides, every argument
    and pointer checked (O None: one flash_steps allocates; LSE checked when given)."""
    q, k, v = (read(function, name, t, BSHD) for name, t in (("Q", q), ("K", k), ("V", v)))
    o, lse = read(function, "O", o, BSHD, like=q), read(function, "LSE", lse, LSE_DIMS, optional=True)
    p = _forward(function, q, k, v, o, causal, scale, softcap, window)
    if lse is not None:
        check_lse(function, lse, q)
    check_pointers(function, p, addresses(q, k, v, o, lse))
    return p

def backward_problem(function: str, q, k, v, o, lse, d_o, dq, dk, dv, causal: bool, scale,
                     deterministic: bool, softcap=0.0, window=None) -> FsBackwardProblem:
    """The fs_backward_problem of the forward's Q, K, V, O, LSE, the gradient dO and the outputs dQ, dK, dV
    (None: one flash_steps allocates, like Q, K or V), every argument and pointer checked."""
    q, k, v, o, d_o = (read(function, name, t, BSHD) for name, t in zip(("Q", "K", "V", "O", "dO"), (q, k, v, o, d_o)))
    dq, dk, dv = (read(function, name, t, BSHD, like) for name, t, like in (("dQ", dq, q), ("dK", dk, k),
                                                                            ("dV", dv, v)))
    if lse is None:
        raise refuse(function, "lse is None; backward needs the forward's LSE, fp32 (batch, heads_q, seqlen_q)")
    lse = read(function, "LSE", lse, LSE_DIMS)
    check_tensors(function, [q, k, v, o, d_o, dq, dk, dv])
    forward = _forward(function, q, k, v, o, causal, scale, softcap, window)
    for t, like in ((d_o, q), (dq, q), (dk, k), (dv, v)):
        check_same_shape(function, t, like)
    check_lse(function, lse, q)
    p = backward_struct(forward, flag(function, "deterministic", deterministic), d_o.strides, dq.strides, dk.strides,
                        dv.strides)
    check_pointers(function, p, addresses(q, k, v, o, lse, d_o, dq, dk, dv))
    return p

def backward_struct(forward: FsProblem, deterministic: int, d_o, dq, dk, dv) -> FsBackwardProblem:
    """The fs_backward_problem of a checked forward problem and the strides of dO, dQ, dK, dV."""
    return FsBackwardProblem(attention=forward, deterministic=deterministic, d_o=FsStrides(*d_o),
                             dq=FsStrides(*dq), dk=FsStrides(*dk), dv=FsStrides(*dv))

def decode_problem(function: str, q, k_cache, v_cache, o, cache_seqlens, block_table, causal: bool, scale,
                   max_seqlen_k, num_splits: int, checked: bool, lse=None) -> FsDecodeProblem:
    """The fs_decode_problem of Q, O and a contiguous or paged cache (the layouts: flash_steps.decode), every
    argument and pointer checked (O None: one flash_steps allocates; LSE checked when given)."""
    q, k_cache, v_cache = (read(function, name, t, BSHD) for name, t in (("Q", q), ("K cache", k_cache),
                                                                         ("V cache", v_cache)))
    o, lse = read(function, "O", o, BSHD, like=q), read(function, "LSE", lse, LSE_DIMS, optional=True)
    cache_seqlens = read(function, "cache_seqlens", cache_seqlens, ("batch",), optional=True)
    block_table = read(function, "block_table", block_table, ("batch", "max_pages_per_seq"), optional=True)
    dtype = check_tensors(function, [q, k_cache, v_cache, o])
    check_same_shape(function, v_cache, k_cache)
    check_same_shape(function, o, q)
    (b, _, hq, d), (rows, page_rows, hkv, kd) = q.shape, k_cache.shape
    if kd != d:
        raise refuse(function, f"the K cache is {k_cache.shape} but Q is {q.shape}; head_dim (dimension 3) must match")
    if hkv <= 0 or hq % hkv:
        raise refuse(function, f"Q has {hq} heads and the cache {hkv}; heads_q must be a multiple of heads_kv (GQA)")
    page_size = num_pages = max_pages = table_stride = 0
    if block_table is None:
        if rows != b:
            raise refuse(function, f"the K cache is {k_cache.shape} but Q is {q.shape}; a contiguous cache's batch "
                         "(dimension 0) must match Q's")
        capacity = page_rows
    else:
        check_dtype_and_device(function, block_table, "int32", q)
        if block_table.shape[0] != b or block_table.strides[1] != 1:
            raise refuse(function, f"block_table is {block_table.shape} with strides {block_table.strides}; it must be "
                         f"({b}, max_pages_per_seq) with contiguous rows")
        if page_rows < PAGE_MULTIPLE or page_rows % PAGE_MULTIPLE:
            raise refuse(function, f"the K cache is {k_cache.shape} with a block table: a paged cache (num_pages, "
                         f"page_size, heads_kv, head_dim) of page_size {page_rows}; page_size must be a multiple of "
                         f"{PAGE_MULTIPLE} from {PAGE_MULTIPLE}")
        page_size, num_pages, max_pages, table_stride = page_rows, rows, block_table.shape[1], block_table.strides[0]
        capacity = max_pages * page_size
    if cache_seqlens is not None:
        check_dtype_and_device(function, cache_seqlens, "int32", q)
        if cache_seqlens.shape != (b,) or cache_seqlens.strides != (1,):
            raise refuse(function, f"cache_seqlens is {cache_seqlens.shape} with strides {cache_seqlens.strides}; it "
                         f"must be a contiguous ({b},)")
    if lse is not None:
        check_lse(function, lse, q)
    if max_seqlen_k is None:  # the capacity, an int64 when its sizes are (max_pages_per_seq * page_size may not be)
        seqlen_k = integer(function, "the cache's capacity, max_seqlen_k's default,", capacity, *INT64)
    else:
        seqlen_k = integer(function, "max_seqlen_k", max_seqlen_k, 0, capacity,
                           f"an integer between 0 and the cache's capacity, {capacity}")
    attention = attention_problem(function, dtype, q, k_cache, v_cache, o, seqlen_k, causal, scale)
    splits = integer(function, "num_splits", num_splits, 0, MAX_SPLITS,
                     f"0 (the step's heuristic) or an integer from 1 to {MAX_SPLITS}")
    p = FsDecodeProblem(attention=attention, num_splits=splits, checked=flag(function, "checked", checked),
                        page_size=page_size, num_pages=num_pages, max_pages_per_seq=max_pages,
                        block_table_stride=table_stride)
    check_pointers(function, p, addresses(q, k_cache, v_cache, block_table, cache_seqlens, o, lse))
    return p

_defaults: dict = {}  # (pass, problem's bytes, device) -> the step _default_step found
_workspaces: dict = {}  # (step, pass, problem's bytes, device) -> its fs_workspace_size (fs_run checks it again)

def _torch():
    import torch  # here, not at the top: `import flash_steps` needs no PyTorch
    return torch

def _default_step(lib: Library, p, device: int) -> str:
    kind = pass_of(p).name
    key = (kind, bytes(p), device)
    if key in _defaults:
        return _defaults[key]
    refusals = []
    for s in reversed(lib.steps()):
        if s.runs(kind):
            try:
                lib.check(s.id, p)
                _defaults[key] = s.id
                return s.id
            except InvalidArgument as e:
                refusals.append(f"{s.id}: {e.message}")
    raise refuse(f"flash_steps.{kind}", f"no registered step runs this {kind} problem on this device ("
                 + ("; ".join(refusals[:4]) or f"no step has a {kind} pass") + ")")

def default_step(problem, device: int | None = None) -> str:
    """The step flash_steps uses when none is given: the newest registered step that runs `problem`'s pass
    and accepts it on the current CUDA device (remembered per problem and `device`, its index). Raises
    InvalidArgument with the refusals of the newest steps when none accepts it."""
    return _default_step(library(), problem, -1 if device is None else device)

def _empty(shape, dtype, device):
    return _torch().empty(tuple(shape), dtype=dtype, device=device)

def check_step(function: str, name: str, step) -> None:
    if step is not None and not isinstance(step, str):
        raise refuse(function, f"{name} is {step!r}; it must be a step's id (a str) or None")

def _run_forward(p, step: str | None, inputs: tuple, out=None, lse=None):
    """Runs a forward or decoding pass (_launch) on `inputs`, its pointers before O and LSE (Q first), and returns
    O and LSE: those given, else new ones (like Q; fp32 (batch, heads_q, seqlen_q), or (heads_q, total_q) for a
    variable-length batch)."""
    q, fp = inputs[0], getattr(p, "attention", p)  # fp: the fs_problem (a decoding problem's attention)
    o = out if out is not None else _empty(q.shape, q.dtype, q.device)
    shape = (fp.heads_q, fp.total_q) if fp.cu_seqlens_q else (fp.batch, fp.heads_q, fp.seqlen_q)
    lse = lse if lse is not None else _empty(shape, _torch().float32, q.device)
    _launch(p, step, q.device, (*inputs, o, lse))
    return o, lse

def _launch(p, step: str | None, device, tensors) -> None:
    """Runs p's pass with the step given or the default one; `tensors`: its pointers in order (None: NULL)."""
    torch, lib = _torch(), library()
    with torch.cuda.device(device):
        sid = step or _default_step(lib, p, device.index)
        key = (sid, pass_of(p).name, bytes(p), device.index)
        nbytes = _workspaces.get(key)
        if nbytes is None:
            nbytes = _workspaces[key] = lib.workspace_size(sid, p)
        ws = _empty((nbytes,), torch.uint8, device) if nbytes else None
        lib.run(sid, p, *(t.data_ptr() if t is not None else 0 for t in tensors),
                workspace=ws.data_ptr() if ws is not None else 0, workspace_bytes=nbytes,
                stream=torch.cuda.current_stream(device).cuda_stream)

def forward(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None, out=None, lse=None,
            softcap: float = 0.0, window: tuple[int, int] | None = None):
    """(O, LSE) of softmax attention: q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv,
    head_dim), fp16 or bf16 on one CUDA device, any strides the C ABI accepts. causal: bottom-right aligned.
    scale: default 1/sqrt(head_dim). step: default default_step's. out (like q) and lse (fp32, contiguous
    (batch, heads_q, seqlen_q)): written when given, else allocated. softcap: each logit s becomes
    softcap·tanh(s / softcap) before the softmax (0: off; step 13a and later). window: a sliding window,
    FlashAttention's window_size (left, right): query i sees key j iff i + d - left <= j <= i + d + right,
    d = seqlen_k - seqlen_q (bottom-right, as causal), -1 unbounded on that side, the right bound 0 when causal
    (None: off; step 13b and later). A row that sees no key gets O = 0 and LSE = -inf."""
    check_step("flash_steps.forward", "step", step)
    # every argument checked before any allocation
    p = forward_problem("flash_steps.forward", q, k, v, out, causal, scale, lse, softcap, window)
    return _run_forward(p, step, (q, k, v), out, lse)

def backward(q, k, v, o, lse, d_o, causal: bool = False, scale: float | None = None, step: str | None = None,
             deterministic: bool = False, dq=None, dk=None, dv=None, softcap: float = 0.0,
             window: tuple[int, int] | None = None):
    """(dQ, dK, dV) of the forward (q, k, v) -> (o, lse) for the gradient d_o (like o); causal, scale, softcap,
    window and step as forward's (the forward's own: the backward recomputes P under them). deterministic:
    bitwise repeatable gradients (no atomics). dq, dk, dv: written when given (like q, k, v), else allocated
    contiguous. With GQA, dK and dV sum over the query heads of a group."""
    check_step("flash_steps.backward", "step", step)
    p = backward_problem("flash_steps.backward", q, k, v, o, lse, d_o, dq, dk, dv, causal, scale, deterministic,
                         softcap, window)
    dq, dk, dv = (g if g is not None else _empty(x.shape, x.dtype, x.device) for g, x in ((dq, q), (dk, k), (dv, v)))
    _launch(p, step, q.device, (q, k, v, o, lse, d_o, dq, dk, dv))
    return dq, dk, dv

def decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal: bool = False,
           scale: float | None = None, step: str | None = None, max_seqlen_k: int | None = None, num_splits: int = 0,
           checked: bool = False, out=None, lse=None):
    """(O, LSE) of q (batch, seqlen_q new tokens, heads_q, head_dim) against a KV cache, contiguous (batch, capacity,
    heads_kv, head_dim) or, with block_table (int32 (batch, max_pages_per_seq)), paged (num_pages, page_size, heads_kv,
    head_dim). cache_seqlens: int32 (batch,), the keys of each sequence (None: max_seqlen_k each). max_seqlen_k: the
    most keys a sequence has (default the cache's capacity; a tighter bound helps the split). num_splits: 0 for the
    step's heuristic. checked: check cache_seqlens and block_table on the device first (synchronizes)."""
    check_step("flash_steps.decode", "step", step)
    p = decode_problem("flash_steps.decode", q, k_cache, v_cache, out, cache_seqlens, block_table, causal, scale,
                       max_seqlen_k, num_splits, checked, lse)
    return _run_forward(p, step, (q, k_cache, v_cache, block_table, cache_seqlens), out, lse)

def readable(t: Arg) -> bool:
    """Whether the C ABI reads t, a (batch, seqlen, heads, head_dim) view, as it is: the rules of validate_strides
    (common/harness/views.cpp), a last stride of 1, the others >= 0 and multiples of 8, a row or head stride
    below head_dim only over at most one row or head (only a batch stride of 0 broadcasts: a tensor expanded
    over its heads is refused), and a 16-byte aligned pointer."""
    (_, rows, heads, head_dim), (*outer, last) = t.shape, t.strides
    return (last == 1 and all(s >= 0 and s % 8 == 0 for s in outer) and t.address % 16 == 0
            and all(n <= 1 or s >= head_dim for n, s in ((rows, outer[1]), (heads, outer[2]))))

def _copy(t):
    return t.clone(memory_format=_torch().contiguous_format)

def usable(t, name: str = "the tensor"):
    """t when the C ABI can read it as it is (readable), else a contiguous copy; t (batch, seqlen, heads,
    head_dim), or (total, heads, head_dim) of a variable-length batch."""
    if len(t.shape) == 3:
        return t if readable(packed(read("flash_steps.varlen_attention", name, t, THD))) else _copy(t)
    return t if readable(read("flash_steps.attention", name, t, BSHD)) else _copy(t)

def _strides(t) -> tuple:
    """t's strides as the C ABI's (batch, row, head, dim): a packed (total, heads, head_dim) tensor's with batch 0."""
    return tuple(t.stride()) if len(t.shape) == 4 else (0,) + tuple(t.stride())

@functools.cache
def _attention_function():
    """The torch.autograd.Function of attention (made on the first call: it subclasses a PyTorch class). It is
    given the forward's checked problem and builds the backward's from it, so that the backward runs under the
    forward's causal, scale, softcap and window (and a variable-length batch's offsets, `offsets`, the tensors
    kept alive while p holds their addresses): only dO is new to the backward."""
    class Attention(_torch().autograd.Function):
        """O = softmax(scale·Q·Kᵀ)·V with our forward; the backward from the saved Q, K, V, O and LSE."""
        @staticmethod
        def forward(ctx, q, k, v, p, step, backward_step, deterministic, offsets=()):
            o, lse = _run_forward(p, step, (q, k, v))
            ctx.save_for_backward(q, k, v, o, lse, *offsets)
            ctx.options = (p, backward_step, deterministic)
            return o

        @staticmethod
        def backward(ctx, d_o):
            q, k, v, o, lse = ctx.saved_tensors[:5]
            p, backward_step, deterministic = ctx.options
            d_o = usable(d_o, "dO")  # autograd gives dO O's shape, dtype and device
            dq, dk, dv = (_empty(x.shape, x.dtype, x.device) for x in (q, k, v))
            problem = backward_struct(p, deterministic, *(_strides(x) for x in (d_o, dq, dk, dv)))
            _launch(problem, backward_step, q.device, (q, k, v, o, lse, d_o, dq, dk, dv))
            return dq, dk, dv, None, None, None, None, None
    return Attention

def attention(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None,
              backward_step: str | None = None, deterministic: bool = False, softcap: float = 0.0,
              window: tuple[int, int] | None = None):
    """O of softmax attention, differentiable, on tensors as forward's (softcap and window too, which the backward
    keeps); a view the C ABI cannot read (see usable) is copied first. step / backward_step: the forward's and the
    backward's step (default default_step's); deterministic: the backward's bitwise repeatable mode. The gradients are
    contiguous. The arguments are checked once, here; the backward checks only the dO it is given."""
    function = "flash_steps.attention"
    for name, s in (("step", step), ("backward_step", backward_step)):
        check_step(function, name, s)
    deterministic = flag(function, "deterministic", deterministic)
    given = [read(function, name, t, BSHD) for name, t in (("Q", q), ("K", k), ("V", v))]
    # forward's checks, before usable() copies a tensor, on what it gives: a view as it is or a contiguous copy
    kept = [readable(t) for t in given]
    p = forward_problem(function, *(t if keep else read(function, t.name, None, BSHD, t) for t, keep in
                                    zip(given, kept)), None, causal, scale, softcap=softcap, window=window)
    q, k, v = (t if keep else _copy(t) for t, keep in zip((q, k, v), kept))
    return _attention_function().apply(q, k, v, p, step, backward_step, deterministic)

# ---- variable-length batches: FlashAttention's flash_attn_varlen_func layout ------------------------------

def _offsets(function: str, cu_seqlens_q, cu_seqlens_k, q: Arg) -> tuple[Arg, Arg]:
    """cu_seqlens_q and cu_seqlens_k read and checked: int32, contiguous, (batch + 1,) alike, on Q's device."""
    cu = [read(function, name, t, ("batch + 1",)) for name, t in (("cu_seqlens_q", cu_seqlens_q),
                                                                 ("cu_seqlens_k", cu_seqlens_k))]
    for t in cu:
        check_dtype_and_device(function, t, "int32", q)
        if t.shape[0] < 1 or (t.shape[0] > 1 and t.strides[0] != 1):
            raise refuse(function, f"{t.name} is {t.shape} with strides {t.strides}; it must be a contiguous "
                         "(batch + 1,) of offsets, cu[0] = 0 ... cu[batch] = total")
    if cu[0].shape != cu[1].shape:
        raise refuse(function, f"cu_seqlens_k is {cu[1].shape} but cu_seqlens_q is {cu[0].shape}; both hold batch + 1 "
                     "offsets")
    return cu[0], cu[1]

def _varlen(function: str, q: Arg, k: Arg, v: Arg, o: Arg, cu_q: Arg, cu_k: Arg, max_seqlen_q, max_seqlen_k,
            causal: bool, scale, softcap, window) -> FsProblem:
    """The fs_problem of a variable-length batch from its checked packed tensors (Args of THD) and offsets: the
    dense problem of the packed rows (_forward's checks on the (1, total, heads, head_dim) views), then the
    sequences: batch, the bounds, the totals and the offsets' addresses."""
    p = _forward(function, packed(q), packed(k), packed(v), packed(o), causal, scale, softcap, window)
    p.batch = cu_q.shape[0] - 1
    p.seqlen_q = integer(function, "max_seqlen_q", max_seqlen_q, 0, INT32[1])
    p.seqlen_k = integer(function, "max_seqlen_k", max_seqlen_k, 0, INT32[1])
    p.total_q, p.total_k = q.shape[0], k.shape[0]
    p.cu_seqlens_q, p.cu_seqlens_k = cu_q.address or None, cu_k.address or None
    return p

def check_varlen_lse(function: str, lse: Arg, q: Arg) -> None:
    total, hq, _ = q.shape
    if lse.shape != (hq, total):
        raise refuse(function, f"LSE is {lse.shape}; a variable-length batch's is (heads_q, total_q) = {(hq, total)}")
    check_dtype_and_device(function, lse, "float32", q)
    if total > 1 and lse.strides[1] != 1 or hq > 1 and lse.strides[0] != total:
        raise refuse(function, f"LSE has strides {lse.strides}; it must be contiguous, {(total, 1)}")

def varlen_problem(function: str, q, k, v, o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal: bool,
                   scale, lse=None, softcap=0.0, window=None) -> FsProblem:
    """The fs_problem of a variable-length batch: Q, O (total_q, heads_q, head_dim), K, V (total_k, heads_kv,
    head_dim) with their own strides, int32 offsets (batch + 1,) on their device; every argument and pointer
    checked (O None: one flash_steps allocates; LSE (heads_q, total_q) checked when given). The offsets' values
    are on the device: Library.check_offsets checks them."""
    q, k, v = (read(function, name, t, THD) for name, t in (("Q", q), ("K", k), ("V", v)))
    o, lse = read(function, "O", o, THD, like=q), read(function, "LSE", lse, VARLEN_LSE_DIMS, optional=True)
    cu_q, cu_k = _offsets(function, cu_seqlens_q, cu_seqlens_k, q)
    p = _varlen(function, q, k, v, o, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale, softcap, window)
    if lse is not None:
        check_varlen_lse(function, lse, q)
    check_pointers(function, p, addresses(q, k, v, o, lse))
    return p

def varlen_backward_problem(function: str, q, k, v, o, lse, d_o, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q, max_seqlen_k, causal: bool, scale, deterministic: bool, softcap=0.0,
                            window=None) -> FsBackwardProblem:
    """The fs_backward_problem of a variable-length batch: backward_problem's with varlen_problem's layout (dO,
    dQ like Q; dK, dV like K and V; LSE (heads_q, total_q))."""
    q, k, v, o, d_o = (read(function, name, t, THD) for name, t in zip(("Q", "K", "V", "O", "dO"), (q, k, v, o, d_o)))
    dq, dk, dv = (read(function, name, t, THD, like) for name, t, like in (("dQ", dq, q), ("dK", dk, k), ("dV", dv, v)))
    if lse is None:
        raise refuse(function, "lse is None; backward needs the forward's LSE, fp32 (heads_q, total_q)")
    lse = read(function, "LSE", lse, VARLEN_LSE_DIMS)
    check_tensors(function, [packed(t) for t in (q, k, v, o, d_o, dq, dk, dv)])
    cu_q, cu_k = _offsets(function, cu_seqlens_q, cu_seqlens_k, q)
    forward = _varlen(function, q, k, v, o, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale, softcap, window)
    for t, like in ((d_o, q), (dq, q), (dk, k), (dv, v)):
        check_same_shape(function, t, like)
    check_varlen_lse(function, lse, q)
    p = backward_struct(forward, flag(function, "deterministic", deterministic),
                        *(packed(t).strides for t in (d_o, dq, dk, dv)))
    check_pointers(function, p, addresses(q, k, v, o, lse, d_o, dq, dk, dv))
    return p

def _check_offsets(p: FsProblem, device) -> None:
    """Library.check_offsets on the current stream of `device` (it synchronizes)."""
    torch = _torch()
    with torch.cuda.device(device):
        library().check_offsets(p, torch.cuda.current_stream(device).cuda_stream)

def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                   scale: float | None = None, step: str | None = None, out=None, lse=None, softcap: float = 0.0,
                   window: tuple[int, int] | None = None, check_offsets: bool = False):
    """(O, LSE) of a variable-length batch, FlashAttention's varlen layout: q (total_q, heads_q, head_dim), k and
    v (total_k, heads_kv, head_dim), sequence b rows cu_seqlens_q[b] ... cu_seqlens_q[b + 1] - 1 of q (and of k,
    v by cu_seqlens_k): int32 CUDA tensors of batch + 1 offsets; max_seqlen_q, max_seqlen_k bound the lengths.
    causal and window are per sequence, bottom-right on its own lengths; LSE is (heads_q, total_q). The other
    arguments as forward's. check_offsets: check the offsets on the device first (synchronizes); unchecked
    offsets that break the contract give a wrong output, never a read outside the tensors."""
    function = "flash_steps.varlen_forward"
    check_step(function, "step", step)
    p = varlen_problem(function, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                       lse, softcap, window)
    if flag(function, "check_offsets", check_offsets):
        _check_offsets(p, q.device)
    return _run_forward(p, step, (q, k, v), out, lse)

def varlen_backward(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    causal: bool = False, scale: float | None = None, step: str | None = None,
                    deterministic: bool = False, dq=None, dk=None, dv=None, softcap: float = 0.0,
                    window: tuple[int, int] | None = None):
    """(dQ, dK, dV) of varlen_forward's (q, k, v) -> (o, lse) for d_o (like o), as backward's, in the packed
    layout; a step without variable-length batches in its backward refuses the problem with its sentence."""
    function = "flash_steps.varlen_backward"
    check_step(function, "step", step)
    p = varlen_backward_problem(function, q, k, v, o, lse, d_o, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal, scale, deterministic, softcap, window)
    dq, dk, dv = (g if g is not None else _empty(x.shape, x.dtype, x.device) for g, x in ((dq, q), (dk, k), (dv, v)))
    _launch(p, step, q.device, (q, k, v, o, lse, d_o, dq, dk, dv))
    return dq, dk, dv

def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     softmax_scale: float | None = None, window: tuple[int, int] | None = None, softcap: float = 0.0,
                     step: str | None = None, backward_step: str | None = None, deterministic: bool = False,
                     check_offsets: bool = False):
    """O of a variable-length batch, differentiable: FlashAttention's flash_attn_varlen_func(q, k, v,
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=..., causal=..., window_size=...,
    softcap=...) on tensors as varlen_forward's (window: None or (left, right)); the rest as attention's."""
    function = "flash_steps.varlen_attention"
    for name, s in (("step", step), ("backward_step", backward_step)):
        check_step(function, name, s)
    deterministic = flag(function, "deterministic", deterministic)
    given = [read(function, name, t, THD) for name, t in (("Q", q), ("K", k), ("V", v))]
    kept = [readable(packed(t)) for t in given]  # as attention: a view the C ABI cannot read is copied
    p = varlen_problem(function, *(t if keep else read(function, t.name, None, THD, t) for t, keep in
                                   zip(given, kept)), None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       causal, softmax_scale, softcap=softcap, window=window)
    if flag(function, "check_offsets", check_offsets):
        _check_offsets(p, q.device)
    q, k, v = (t if keep else _copy(t) for t, keep in zip((q, k, v), kept))
    return _attention_function().apply(q, k, v, p, step, backward_step, deterministic, (cu_seqlens_q, cu_seqlens_k))
