"""The checks made in Python before a tensor reaches the C ABI, and the fs_* structs of tensors.

Everything here reads only what a tensor shows: `shape`, `stride()`, `dtype` (by its name, e.g.
torch.float16) and `device` (by its name, e.g. cuda:0), so that the checks run, and are tested, without
PyTorch. What the library checks itself (head_dim a multiple of 8, strides multiples of 8, the sizes'
limits, a step's own limits) is left to it: it answers with its own sentence.
"""
from __future__ import annotations

import math

from ._capi import (DTYPE_CODES, FS_ERR_INVALID, FsBackwardProblem, FsDecodeProblem, FsProblem, FsStrides,
                    InvalidArgument)

TORCH_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def refuse(function: str, message: str) -> InvalidArgument:
    return InvalidArgument(FS_ERR_INVALID, function, message)


def dtype_of(t) -> str | None:
    """"fp16", "bf16", or None for any other dtype (read from its name: torch.float16 -> fp16)."""
    return TORCH_DTYPES.get(str(t.dtype).rsplit(".", 1)[-1])


def device_of(t) -> str:
    return str(t.device)


def is_cuda(t) -> bool:
    return getattr(t.device, "type", device_of(t).split(":")[0]) == "cuda"


def shape_of(t) -> tuple[int, ...]:
    return tuple(int(x) for x in t.shape)


def strides_of(t) -> tuple[int, ...]:
    return tuple(int(x) for x in t.stride())


def check_tensors(function: str, named: list[tuple[str, object]], dims: int = 4) -> str:
    """The rules every fp16/bf16 tensor of one call shares: `dims` dimensions, one dtype (fp16 or bf16),
    one CUDA device, a last dimension of stride 1. Returns the dtype ("fp16" or "bf16")."""
    layout = "(batch, seqlen, heads, head_dim)"
    for name, t in named:
        if len(t.shape) != dims:
            raise refuse(function, f"{name} has {len(t.shape)} dimensions (shape {shape_of(t)}); it must have "
                         f"{dims}, {layout}")
    dtypes = {str(t.dtype) for _, t in named}
    if len(dtypes) > 1:
        raise refuse(function, "dtype mismatch: " + ", ".join(f"{n} is {t.dtype}" for n, t in named)
                     + f"; {', '.join(n for n, _ in named)} must share one dtype")
    name, first = named[0]
    dtype = dtype_of(first)
    if dtype is None:
        raise refuse(function, f"{name} is {first.dtype}; the dtype must be torch.float16 or torch.bfloat16")
    if not is_cuda(first):
        raise refuse(function, f"{name} is on {device_of(first)}; flash_steps runs on a CUDA device")
    for n, t in named[1:]:
        if device_of(t) != device_of(first):
            raise refuse(function, f"{n} is on {device_of(t)} but {name} is on {device_of(first)}; they must be on "
                         "one device")
    for n, t in named:
        if strides_of(t)[-1] != 1:
            raise refuse(function, f"{n}'s last dimension (head_dim) has stride {strides_of(t)[-1]}; it must be 1 "
                         "(contiguous)")
    return dtype


def check_same_shape(function: str, name: str, t, like_name: str, like) -> None:
    if shape_of(t) != shape_of(like):
        raise refuse(function, f"{name} is {shape_of(t)} but {like_name} is {shape_of(like)}; they must match")


def check_qkv(function: str, q, k, v) -> None:
    """K and V of one shape, with Q's batch and head_dim; heads_q a multiple of heads_kv."""
    check_same_shape(function, "V", v, "K", k)
    b, _, hq, d = shape_of(q)
    kb, _, hkv, kd = shape_of(k)
    if kb != b or kd != d:
        raise refuse(function, f"K is {shape_of(k)} but Q is {shape_of(q)}; batch (dimension 0) and head_dim "
                     "(dimension 3) must match")
    if hkv <= 0 or hq % hkv:
        raise refuse(function, f"Q has {hq} heads and K, V {hkv}; heads_q must be a multiple of heads_kv (GQA)")


def check_lse(function: str, lse, q) -> None:
    """LSE: fp32, contiguous (batch, heads_q, seqlen_q), on Q's device."""
    b, sq, hq, _ = shape_of(q)
    if shape_of(lse) != (b, hq, sq):
        raise refuse(function, f"LSE is {shape_of(lse)}; it must be (batch, heads_q, seqlen_q) = {(b, hq, sq)}")
    if str(lse.dtype).rsplit(".", 1)[-1] != "float32":
        raise refuse(function, f"LSE is {lse.dtype}; it must be torch.float32")
    if device_of(lse) != device_of(q):
        raise refuse(function, f"LSE is on {device_of(lse)} but Q is on {device_of(q)}; they must be on one device")
    if strides_of(lse) != (hq * sq, sq, 1):
        raise refuse(function, f"LSE has strides {strides_of(lse)}; it must be contiguous, {(hq * sq, sq, 1)}")


def softmax_scale(function: str, scale, head_dim: int) -> float:
    """1/sqrt(head_dim) when scale is None; else the scale, which must be finite and > 0."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise refuse(function, f"scale is {scale}; it must be finite and > 0")
    return scale


def forward_problem(function: str, q, k, v, o, causal: bool, scale) -> FsProblem:
    """The fs_problem of (batch, seqlen, heads, head_dim) tensors Q, K, V and O with their own strides."""
    dtype = check_tensors(function, [("Q", q), ("K", k), ("V", v), ("O", o)])
    check_qkv(function, q, k, v)
    check_same_shape(function, "O", o, "Q", q)
    b, sq, hq, d = shape_of(q)
    sk, hkv = shape_of(k)[1], shape_of(k)[2]
    return FsProblem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=d,
                     dtype=DTYPE_CODES[dtype], causal=int(bool(causal)),
                     softmax_scale=softmax_scale(function, scale, d),
                     q=FsStrides(*strides_of(q)), k=FsStrides(*strides_of(k)), v=FsStrides(*strides_of(v)),
                     o=FsStrides(*strides_of(o)))


def backward_problem(function: str, q, k, v, o, lse, d_o, dq, dk, dv, causal: bool, scale,
                     deterministic: bool) -> FsBackwardProblem:
    """The fs_backward_problem of the forward's Q, K, V, O, LSE, the gradient dO and the outputs dQ, dK, dV."""
    check_tensors(function, [("Q", q), ("K", k), ("V", v), ("O", o), ("dO", d_o), ("dQ", dq), ("dK", dk),
                             ("dV", dv)])
    forward = forward_problem(function, q, k, v, o, causal, scale)
    check_same_shape(function, "dO", d_o, "Q", q)
    check_same_shape(function, "dQ", dq, "Q", q)
    check_same_shape(function, "dK", dk, "K", k)
    check_same_shape(function, "dV", dv, "V", v)
    check_lse(function, lse, q)
    return FsBackwardProblem(attention=forward, deterministic=int(bool(deterministic)),
                             d_o=FsStrides(*strides_of(d_o)), dq=FsStrides(*strides_of(dq)),
                             dk=FsStrides(*strides_of(dk)), dv=FsStrides(*strides_of(dv)))


def check_int32_vector(function: str, name: str, t, length: int, device: str) -> None:
    if str(t.dtype).rsplit(".", 1)[-1] != "int32":
        raise refuse(function, f"{name} is {t.dtype}; it must be torch.int32")
    if device_of(t) != device:
        raise refuse(function, f"{name} is on {device_of(t)} but Q is on {device}; they must be on one device")
    if shape_of(t) != (length,) or strides_of(t) != (1,):
        raise refuse(function, f"{name} is {shape_of(t)} with strides {strides_of(t)}; it must be a contiguous "
                     f"({length},)")


def decode_problem(function: str, q, k_cache, v_cache, o, cache_seqlens, block_table, causal: bool, scale,
                   max_seqlen_k, num_splits: int, checked: bool) -> FsDecodeProblem:
    """The fs_decode_problem of Q, O (batch, seqlen_q, heads_q, head_dim) and a cache: contiguous
    (batch, rows, heads_kv, head_dim) when block_table is None, else paged (num_pages, page_size,
    heads_kv, head_dim) with an int32 block table (batch, max_pages_per_seq). max_seqlen_k (the most
    keys a sequence has; None: the cache's capacity) sizes the split of the keys."""
    dtype = check_tensors(function, [("Q", q), ("K cache", k_cache), ("V cache", v_cache), ("O", o)])
    check_same_shape(function, "V cache", v_cache, "K cache", k_cache)
    check_same_shape(function, "O", o, "Q", q)
    b, sq, hq, d = shape_of(q)
    rows, page_rows, hkv, kd = shape_of(k_cache)
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
        if str(block_table.dtype).rsplit(".", 1)[-1] != "int32":
            raise refuse(function, f"block_table is {block_table.dtype}; it must be torch.int32")
        if device_of(block_table) != device_of(q):
            raise refuse(function, f"block_table is on {device_of(block_table)} but Q is on {device_of(q)}; they "
                         "must be on one device")
        if len(block_table.shape) != 2 or shape_of(block_table)[0] != b or strides_of(block_table)[1] != 1:
            raise refuse(function, f"block_table is {shape_of(block_table)} with strides {strides_of(block_table)}; "
                         f"it must be ({b}, max_pages_per_seq) with contiguous rows")
        page_size, num_pages, max_pages = page_rows, rows, shape_of(block_table)[1]
        table_stride = strides_of(block_table)[0]
        capacity = max_pages * page_size
    if cache_seqlens is not None:
        check_int32_vector(function, "cache_seqlens", cache_seqlens, b, device_of(q))
    seqlen_k = capacity if max_seqlen_k is None else int(max_seqlen_k)
    if not 0 <= seqlen_k <= capacity:
        raise refuse(function, f"max_seqlen_k is {seqlen_k}; it must be between 0 and the cache's capacity, {capacity}")
    attention = FsProblem(batch=b, seqlen_q=sq, seqlen_k=seqlen_k, heads_q=hq, heads_kv=hkv, head_dim=d,
                          dtype=DTYPE_CODES[dtype], causal=int(bool(causal)),
                          softmax_scale=softmax_scale(function, scale, d), q=FsStrides(*strides_of(q)),
                          k=FsStrides(*strides_of(k_cache)), v=FsStrides(*strides_of(v_cache)),
                          o=FsStrides(*strides_of(o)))
    return FsDecodeProblem(attention=attention, num_splits=int(num_splits), checked=int(bool(checked)),
                           page_size=page_size, num_pages=num_pages, max_pages_per_seq=max_pages,
                           block_table_stride=table_stride)
