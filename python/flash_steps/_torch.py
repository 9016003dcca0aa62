"""flash_steps on tensors. First the checks made in Python before a tensor reaches the C ABI and the fs_*
structs of tensors: they read only `shape`, `stride()`, `dtype` and `device` (by their names: torch.float16,
cuda:0), so that they run, and are tested, without PyTorch; the library checks the rest itself (head_dim and
strides multiples of 8, the sizes' and a step's limits). Then forward, backward, attention and decode: a
launch goes on PyTorch's current stream of the tensors' device, with a torch.uint8 workspace allocated on
that stream (the caching allocator keeps it valid for the work enqueued there)."""
from __future__ import annotations

import functools
import math
import numbers

from ._capi import (DTYPE_CODES, INT64, FsBackwardProblem, FsDecodeProblem, FsProblem, FsStrides, InvalidArgument,
                    Library, flag, integer, library, pass_of, refuse)

TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}  # the name of a torch.dtype (torch.half's is float16)
FLOAT32_MIN, FLOAT32_MAX = 2.0 ** -149, (2 - 2.0 ** -23) * 2.0 ** 127  # the smallest positive and largest float32
MAX_SPLITS = 128  # num_splits: 0 (the step's heuristic) or 1 ... 128 (kMaxSplits, common/decode/problem.h)

def shape_of(t) -> tuple[int, ...]:
    return tuple(int(x) for x in t.shape)
def strides_of(t) -> tuple[int, ...]:
    return tuple(int(x) for x in t.stride())

def check_tensors(function: str, named: list[tuple[str, object]]) -> str:
    """The rules the tensors of one call share: 4 dimensions, one dtype (returned: "fp16" or "bf16"), one CUDA
    device, a last dimension of stride 1."""
    for name, t in named:
        if len(t.shape) != 4:
            raise refuse(function, f"{name} has {len(t.shape)} dimensions (shape {shape_of(t)}); it must have 4, "
                         "(batch, seqlen, heads, head_dim)")
    if len({str(t.dtype) for _, t in named}) > 1:
        raise refuse(function, "dtype mismatch: " + ", ".join(f"{n} is {t.dtype}" for n, t in named)
                     + f"; {', '.join(n for n, _ in named)} must share one dtype")
    name, first = named[0]
    dtype = TORCH_DTYPES.get(str(first.dtype).rsplit(".", 1)[-1])  # torch.float16 -> fp16
    if dtype is None:
        raise refuse(function, f"{name} is {first.dtype}; the dtype must be torch.float16 or torch.bfloat16")
    if getattr(first.device, "type", str(first.device).split(":")[0]) != "cuda":
        raise refuse(function, f"{name} is on {first.device}; flash_steps runs on a CUDA device")
    for n, t in named[1:]:
        if str(t.device) != str(first.device):
            raise refuse(function, f"{n} is on {t.device} but {name} is on {first.device}; they must be on one device")
    for n, t in named:
        if strides_of(t)[-1] != 1:
            raise refuse(function, f"{n}'s last dimension (head_dim) has stride {strides_of(t)[-1]}; it must be 1 "
                         "(contiguous)")
    return dtype

def check_same_shape(function: str, name: str, t, like_name: str, like) -> None:
    if shape_of(t) != shape_of(like):
        raise refuse(function, f"{name} is {shape_of(t)} but {like_name} is {shape_of(like)}; they must match")

def check_dtype_and_device(function: str, name: str, t, dtype: str, q) -> None:
    if str(t.dtype).rsplit(".", 1)[-1] != dtype:
        raise refuse(function, f"{name} is {t.dtype}; it must be torch.{dtype}")
    if str(t.device) != str(q.device):
        raise refuse(function, f"{name} is on {t.device} but Q is on {q.device}; they must be on one device")

def check_lse(function: str, lse, q) -> None:
    b, sq, hq, _ = shape_of(q)
    if shape_of(lse) != (b, hq, sq):
        raise refuse(function, f"LSE is {shape_of(lse)}; it must be (batch, heads_q, seqlen_q) = {(b, hq, sq)}")
    check_dtype_and_device(function, "LSE", lse, "float32", q)
    if strides_of(lse) != (hq * sq, sq, 1):
        raise refuse(function, f"LSE has strides {strides_of(lse)}; it must be contiguous, {(hq * sq, sq, 1)}")

def softmax_scale(function: str, scale, head_dim: int) -> float:
    """scale as softmax_scale, a float32: 1/sqrt(head_dim) when None (1 for a head_dim below 1, which the library
    refuses), else a real number (an int or a float, not a bool or a str), finite, > 0 and within the positive
    float32s, which 1e-50 (0) and 1e39 (inf) are not; the library then applies its own bound of the dtype."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise refuse(function, f"scale is {scale!r}; it must be a real number (an int or a float) or None")
    if not 0 < scale < math.inf:  # not float(scale) first: 10**400 is an int that no float holds
        raise refuse(function, f"scale is {scale}; it must be finite and > 0")
    if scale < FLOAT32_MIN:
        raise refuse(function, f"scale is {scale}; it must be at least {FLOAT32_MIN}, the smallest positive float32 "
                     "(softmax_scale is a float32)")
    if scale > FLOAT32_MAX:
        raise refuse(function, f"scale is {scale}; it must be at most {FLOAT32_MAX}, the largest float32 "
                     "(softmax_scale is a float32)")
    return float(scale)

def attention_problem(function: str, dtype: str, q, k, v, o, seqlen_k: int, causal: bool, scale) -> FsProblem:
    """The fs_problem of checked tensors (scale: see softmax_scale)."""
    b, sq, hq, d = shape_of(q)
    return FsProblem(batch=b, seqlen_q=sq, seqlen_k=seqlen_k, heads_q=hq, heads_kv=shape_of(k)[2], head_dim=d,
                     dtype=DTYPE_CODES[dtype], causal=flag(function, "causal", causal),
                     softmax_scale=softmax_scale(function, scale, d),
                     q=FsStrides(*strides_of(q)), k=FsStrides(*strides_of(k)), v=FsStrides(*strides_of(v)),
                     o=FsStrides(*strides_of(o)))

def forward_problem(function: str, q, k, v, o, causal: bool, scale) -> FsProblem:
    """The fs_problem of Q, K, V and O (batch, seqlen, heads, head_dim) with their own strides."""
    dtype = check_tensors(function, [("Q", q), ("K", k), ("V", v), ("O", o)])
    check_same_shape(function, "V", v, "K", k)
    (b, _, hq, d), (kb, sk, hkv, kd) = shape_of(q), shape_of(k)
    if kb != b or kd != d:
        raise refuse(function, f"K is {shape_of(k)} but Q is {shape_of(q)}; batch (dimension 0) and head_dim "
                     "(dimension 3) must match")
    if hkv <= 0 or hq % hkv:
        raise refuse(function, f"Q has {hq} heads and K, V {hkv}; heads_q must be a multiple of heads_kv (GQA)")
    check_same_shape(function, "O", o, "Q", q)
    return attention_problem(function, dtype, q, k, v, o, sk, causal, scale)

def backward_problem(function: str, q, k, v, o, lse, d_o, dq, dk, dv, causal: bool, scale,
                     deterministic: bool) -> FsBackwardProblem:
    """The fs_backward_problem of the forward's Q, K, V, O, LSE, the gradient dO and the outputs dQ, dK, dV."""
    check_tensors(function, [("Q", q), ("K", k), ("V", v), ("O", o), ("dO", d_o), ("dQ", dq), ("dK", dk), ("dV", dv)])
    forward = forward_problem(function, q, k, v, o, causal, scale)
    for name, t, like_name, like in (("dO", d_o, "Q", q), ("dQ", dq, "Q", q), ("dK", dk, "K", k), ("dV", dv, "V", v)):
        check_same_shape(function, name, t, like_name, like)
    check_lse(function, lse, q)
    return FsBackwardProblem(attention=forward, deterministic=flag(function, "deterministic", deterministic),
                             d_o=FsStrides(*strides_of(d_o)), dq=FsStrides(*strides_of(dq)),
                             dk=FsStrides(*strides_of(dk)), dv=FsStrides(*strides_of(dv)))

def decode_problem(function: str, q, k_cache, v_cache, o, cache_seqlens, block_table, causal: bool, scale,
                   max_seqlen_k, num_splits: int, checked: bool) -> FsDecodeProblem:
    """The fs_decode_problem of Q, O and a contiguous or paged cache (the layouts: flash_steps.decode)."""
    dtype = check_tensors(function, [("Q", q), ("K cache", k_cache), ("V cache", v_cache), ("O", o)])
    check_same_shape(function, "V cache", v_cache, "K cache", k_cache)
    check_same_shape(function, "O", o, "Q", q)
    (b, _, hq, d), (rows, page_rows, hkv, kd) = shape_of(q), shape_of(k_cache)
    if kd != d:
        raise refuse(function, f"the K cache is {shape_of(k_cache)} but Q is {shape_of(q)}; head_dim (dimension 3) "
                     "must match")
    if hkv <= 0 or hq % hkv:
        raise refuse(function, f"Q has {hq} heads and the cache {hkv}; heads_q must be a multiple of heads_kv (GQA)")
    page_size = num_pages = max_pages = table_stride = 0
    if block_table is None:
        if rows != b:
            raise refuse(function, f"the K cache is {shape_of(k_cache)} but Q is {shape_of(q)}; a contiguous cache's "
                         "batch (dimension 0) must match Q's")
        capacity = page_rows
    else:
        check_dtype_and_device(function, "block_table", block_table, "int32", q)
        if len(block_table.shape) != 2 or shape_of(block_table)[0] != b or strides_of(block_table)[1] != 1:
            raise refuse(function, f"block_table is {shape_of(block_table)} with strides {strides_of(block_table)}; "
                         f"it must be ({b}, max_pages_per_seq) with contiguous rows")
        page_size, num_pages, max_pages = page_rows, rows, shape_of(block_table)[1]
        table_stride = strides_of(block_table)[0]
        capacity = max_pages * page_size
    if cache_seqlens is not None:
        check_dtype_and_device(function, "cache_seqlens", cache_seqlens, "int32", q)
        if shape_of(cache_seqlens) != (b,) or strides_of(cache_seqlens) != (1,):
            raise refuse(function, f"cache_seqlens is {shape_of(cache_seqlens)} with strides "
                         f"{strides_of(cache_seqlens)}; it must be a contiguous ({b},)")
    if max_seqlen_k is None:  # the capacity, an int64 when its sizes are (max_pages_per_seq * page_size may not be)
        seqlen_k = integer(function, "the cache's capacity, max_seqlen_k's default,", capacity, *INT64)
    else:
        seqlen_k = integer(function, "max_seqlen_k", max_seqlen_k, 0, capacity,
                           f"an integer between 0 and the cache's capacity, {capacity}")
    attention = attention_problem(function, dtype, q, k_cache, v_cache, o, seqlen_k, causal, scale)
    splits = integer(function, "num_splits", num_splits, 0, MAX_SPLITS,
                     f"0 (the step's heuristic) or an integer from 1 to {MAX_SPLITS}")
    return FsDecodeProblem(attention=attention, num_splits=splits, checked=flag(function, "checked", checked),
                           page_size=page_size, num_pages=num_pages, max_pages_per_seq=max_pages,
                           block_table_stride=table_stride)

_defaults: dict = {}  # (pass, problem's bytes, device) -> the step _default_step found

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

def _launch(p, step: str | None, device, tensors) -> None:
    """Runs p's pass with the step given or the default one; `tensors`: its pointers in order (None: NULL)."""
    torch, lib = _torch(), library()
    with torch.cuda.device(device):
        sid = step or _default_step(lib, p, device.index)
        nbytes = lib.workspace_size(sid, p)
        ws = _empty((nbytes,), torch.uint8, device) if nbytes else None
        lib.run(sid, p, *(t.data_ptr() if t is not None else 0 for t in tensors),
                workspace=ws.data_ptr() if ws is not None else 0, workspace_bytes=nbytes,
                stream=torch.cuda.current_stream(device).cuda_stream)

def _lse_for(function: str, lse, q, p):
    if lse is None:
        return _empty((p.batch, p.heads_q, p.seqlen_q), _torch().float32, q.device)
    check_lse(function, lse, q)
    return lse

def forward(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None, out=None, lse=None):
    """(O, LSE) of softmax attention: q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv,
    head_dim), fp16 or bf16 on one CUDA device, any strides the C ABI accepts. causal: bottom-right aligned.
    scale: default 1/sqrt(head_dim). step: default default_step's. out (like q) and lse (fp32, contiguous
    (batch, heads_q, seqlen_q)): written when given, else allocated."""
    _torch()
    o = out if out is not None else _empty(q.shape, q.dtype, q.device)
    p = forward_problem("flash_steps.forward", q, k, v, o, causal, scale)
    lse = _lse_for("flash_steps.forward", lse, q, p)
    _launch(p, step, q.device, (q, k, v, o, lse))
    return o, lse

def backward(q, k, v, o, lse, d_o, causal: bool = False, scale: float | None = None, step: str | None = None,
             deterministic: bool = False, dq=None, dk=None, dv=None):
    """(dQ, dK, dV) of the forward (q, k, v) -> (o, lse) for the gradient d_o (like o); causal, scale and step
    as forward's. deterministic: bitwise repeatable gradients (no atomics). dq, dk, dv: written when given
    (like q, k, v), else allocated contiguous. With GQA, dK and dV sum over the query heads of a group."""
    _torch()
    dq, dk, dv = (g if g is not None else _empty(x.shape, x.dtype, x.device) for g, x in ((dq, q), (dk, k), (dv, v)))
    p = backward_problem("flash_steps.backward", q, k, v, o, lse, d_o, dq, dk, dv, causal, scale, deterministic)
    _launch(p, step, q.device, (q, k, v, o, lse, d_o, dq, dk, dv))
    return dq, dk, dv

def decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal: bool = False,
           scale: float | None = None, step: str | None = None, max_seqlen_k: int | None = None, num_splits: int = 0,
           checked: bool = False, out=None, lse=None):
    """(O, LSE) of q (batch, seqlen_q new tokens, heads_q, head_dim) against a KV cache, contiguous (batch,
    capacity, heads_kv, head_dim) or, with block_table (int32 (batch, max_pages_per_seq)), paged (num_pages,
    page_size, heads_kv, head_dim). cache_seqlens: int32 (batch,), the keys of each sequence (None:
    max_seqlen_k each). max_seqlen_k: the most keys a sequence has (default the cache's capacity; a tighter
    bound helps the split). num_splits: 0 for the step's heuristic. checked: check cache_seqlens and
    block_table on the device first (synchronizes)."""
    _torch()
    o = out if out is not None else _empty(q.shape, q.dtype, q.device)
    p = decode_problem("flash_steps.decode", q, k_cache, v_cache, o, cache_seqlens, block_table, causal, scale,
                       max_seqlen_k, num_splits, checked)
    lse = _lse_for("flash_steps.decode", lse, q, p.attention)
    _launch(p, step, q.device, (q, k_cache, v_cache, block_table, cache_seqlens, o, lse))
    return o, lse

def usable(t):
    """t when the C ABI can read it as it is (last stride 1, the others >= 0 and multiples of 8, a
    16-byte aligned pointer), else a contiguous copy."""
    strides = t.stride()
    if strides[-1] == 1 and all(s >= 0 and s % 8 == 0 for s in strides[:-1]) and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=_torch().contiguous_format)

@functools.cache
def _attention_function():
    """The torch.autograd.Function of attention (made on the first call: it subclasses a PyTorch class)."""
    class Attention(_torch().autograd.Function):
        """O = softmax(scale·Q·Kᵀ)·V with our forward; the backward from the saved Q, K, V, O and LSE."""
        @staticmethod
        def forward(ctx, q, k, v, causal, scale, step, backward_step, deterministic):
            q, k, v = usable(q), usable(k), usable(v)
            o, lse = forward(q, k, v, causal, scale, step)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.options = (causal, scale, backward_step, deterministic)
            return o

        @staticmethod
        def backward(ctx, d_o):
            causal, scale, backward_step, deterministic = ctx.options
            grads = backward(*ctx.saved_tensors, usable(d_o), causal, scale, backward_step, deterministic)
            return (*grads, None, None, None, None, None)
    return Attention

def attention(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None,
              backward_step: str | None = None, deterministic: bool = False):
    """O of softmax attention, differentiable, on tensors as forward's; a view the C ABI cannot read (see
    usable) is copied first. step / backward_step: the forward's and the backward's step (default
    default_step's); deterministic: the backward's bitwise repeatable mode. The gradients are contiguous."""
    return _attention_function().apply(q, k, v, causal, scale, step, backward_step, deterministic)
