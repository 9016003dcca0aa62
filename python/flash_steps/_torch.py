"""flash_steps on PyTorch tensors: forward, backward, attention (a torch.autograd.Function) and decode.

Every launch goes on PyTorch's current stream of the tensors' device; workspace is a torch.uint8
tensor allocated on that stream (the caching allocator keeps it valid for the work enqueued there).
PyTorch is imported on the first call, so that `import flash_steps` works without it.
"""
from __future__ import annotations

from . import _args
from ._capi import FS_ERR_INVALID, InvalidArgument, Library, pass_of

_torch_module = None  # PyTorch, once imported
_attention_function = None


def _torch():
    global _torch_module
    if _torch_module is None:
        import torch
        _torch_module = torch
    return _torch_module


def _library() -> Library:
    from . import library
    return library()


# ---- the default steps -----------------------------------------------------------------------------

_defaults: dict = {}


def _default_step(lib: Library, p, device: int) -> str:
    """The newest registered step that runs p's pass and accepts p on this device (the pass's check).
    Remembered per problem and device."""
    kind = pass_of(p).name
    key = (kind, bytes(p), device)
    if key in _defaults:
        return _defaults[key]
    refusals = []
    for s in reversed(lib.steps()):
        if not s.runs(kind):
            continue
        try:
            lib.check(s.id, p)
        except InvalidArgument as e:
            refusals.append(f"{s.id}: {e.message}")
            continue
        _defaults[key] = s.id
        return s.id
    raise InvalidArgument(FS_ERR_INVALID, f"flash_steps.{kind}",
                          f"no registered step runs this {kind} problem on this device ("
                          + ("; ".join(refusals[:4]) or f"no step has a {kind} pass") + ")")


def default_step(problem, device: int | None = None) -> str:
    """The step flash_steps uses when none is given: the newest registered step that accepts `problem`
    (an FsProblem, FsDecodeProblem or FsBackwardProblem: its pass) on the current CUDA device; `device`
    (its index) only keys the memo. Raises InvalidArgument with the refusals of the newest steps when none
    accepts it."""
    return _default_step(_library(), problem, -1 if device is None else device)


def _empty(shape, dtype, device):
    return _torch().empty(tuple(shape), dtype=dtype, device=device)


def _launch(p, step: str | None, device, tensors) -> None:
    """Runs p's pass on PyTorch's current stream of `device`: the step given or the default one, a fresh
    workspace of the size it asks (a torch.uint8 tensor, kept alive until the launch is enqueued),
    `tensors` the run's pointer arguments in order (None for NULL)."""
    torch, lib = _torch(), _library()
    with torch.cuda.device(device):
        sid = step or _default_step(lib, p, device.index)
        nbytes = lib.workspace_size(sid, p)
        ws = _empty((nbytes,), torch.uint8, device) if nbytes else None
        lib.run(sid, p, *(t.data_ptr() if t is not None else 0 for t in tensors),
                workspace=ws.data_ptr() if ws is not None else 0, workspace_bytes=nbytes,
                stream=torch.cuda.current_stream(device).cuda_stream)


def usable(t):
    """t when the C ABI can read it as it is (last stride 1, the others >= 0 and multiples of 8, a
    16-byte aligned pointer), else a contiguous copy."""
    strides = t.stride()
    if strides[-1] == 1 and all(s >= 0 and s % 8 == 0 for s in strides[:-1]) and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=_torch().contiguous_format)


def _lse_for(fn: str, lse, q, p):
    if lse is None:
        return _empty((p.batch, p.heads_q, p.seqlen_q), _torch().float32, q.device)
    _args.check_lse(fn, lse, q)
    return lse


# ---- forward, backward, decode ---------------------------------------------------------------------

def forward(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None, out=None, lse=None):
    """O and LSE of softmax attention: q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k,
    heads_kv, head_dim), fp16 or bf16 on one CUDA device, any strides the C ABI accepts (head_dim
    contiguous). causal: bottom-right aligned. scale: default 1/sqrt(head_dim). step: a step id, default
    the newest step that accepts the problem. out (like q) and lse (fp32 (batch, heads_q, seqlen_q),
    contiguous): written when given, else allocated. Returns (o, lse)."""
    _torch()
    o = out if out is not None else _empty(q.shape, q.dtype, q.device)
    p = _args.forward_problem("flash_steps.forward", q, k, v, o, causal, scale)
    lse = _lse_for("flash_steps.forward", lse, q, p)
    _launch(p, step, q.device, (q, k, v, o, lse))
    return o, lse


def backward(q, k, v, o, lse, d_o, causal: bool = False, scale: float | None = None, step: str | None = None,
             deterministic: bool = False, dq=None, dk=None, dv=None):
    """dQ, dK, dV of the forward (q, k, v) -> (o, lse) for the gradient d_o (like o). causal and scale as
    the forward's. step: default the newest step with a backward that accepts the problem.
    deterministic: bitwise repeatable gradients (no atomics). dq, dk, dv: written when given (like q, k,
    v), else allocated contiguous. With GQA, dK and dV are summed over the query heads of a group.
    Returns (dq, dk, dv)."""
    _torch()
    dq = dq if dq is not None else _empty(q.shape, q.dtype, q.device)
    dk = dk if dk is not None else _empty(k.shape, k.dtype, k.device)
    dv = dv if dv is not None else _empty(v.shape, v.dtype, v.device)
    p = _args.backward_problem("flash_steps.backward", q, k, v, o, lse, d_o, dq, dk, dv, causal, scale, deterministic)
    _launch(p, step, q.device, (q, k, v, o, lse, d_o, dq, dk, dv))
    return dq, dk, dv


def decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal: bool = False,
           scale: float | None = None, step: str | None = None, max_seqlen_k: int | None = None, num_splits: int = 0,
           checked: bool = False, out=None, lse=None):
    """Decoding: q (batch, seqlen_q new tokens, heads_q, head_dim) against a KV cache, contiguous
    (batch, capacity, heads_kv, head_dim) or, with block_table (int32 (batch, max_pages_per_seq)),
    paged (num_pages, page_size, heads_kv, head_dim). cache_seqlens: int32 (batch,), the keys of each
    sequence (None: max_seqlen_k each). max_seqlen_k: the most keys a sequence has (default the cache's
    capacity; a tighter bound helps the split). num_splits: 0 for the step's heuristic. checked: check
    cache_seqlens and block_table on the device first (synchronizes). Returns (o, lse)."""
    _torch()
    fn = "flash_steps.decode"
    o = out if out is not None else _empty(q.shape, q.dtype, q.device)
    p = _args.decode_problem(fn, q, k_cache, v_cache, o, cache_seqlens, block_table, causal, scale, max_seqlen_k,
                             num_splits, checked)
    lse = _lse_for(fn, lse, q, p.attention)
    _launch(p, step, q.device, (q, k_cache, v_cache, block_table, cache_seqlens, o, lse))
    return o, lse


# ---- attention as a torch.autograd.Function --------------------------------------------------------

def _make_attention_function():
    torch = _torch()

    class Attention(torch.autograd.Function):
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
            q, k, v, o, lse = ctx.saved_tensors
            causal, scale, backward_step, deterministic = ctx.options
            dq, dk, dv = backward(q, k, v, o, lse, usable(d_o), causal, scale, backward_step, deterministic)
            return dq, dk, dv, None, None, None, None, None

    return Attention


def attention(q, k, v, causal: bool = False, scale: float | None = None, step: str | None = None,
              backward_step: str | None = None, deterministic: bool = False):
    """Softmax attention, differentiable: (batch, seqlen, heads, head_dim) fp16/bf16 tensors as in
    forward(); returns O. A view the C ABI cannot read (head_dim not contiguous, a stride that is not a
    multiple of 8, a misaligned pointer) is copied first. step / backward_step: the forward's and the
    backward's step ids (default: the newest that accept the problem); deterministic: the backward's
    bitwise repeatable mode. The gradients are contiguous."""
    global _attention_function
    if _attention_function is None:
        _attention_function = _make_attention_function()
    return _attention_function.apply(q, k, v, causal, scale, step, backward_step, deterministic)


__all__ = ["forward", "backward", "decode", "attention", "default_step", "usable"]
