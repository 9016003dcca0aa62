"""flash_steps: every step of the flash-steps repository from Python, through its C ABI
(common/flash_steps.h, libflash_steps.so, loaded with ctypes).

    o = flash_steps.attention(q, k, v, causal=True)  # q, k, v: (batch, seqlen, heads, head_dim) fp16/bf16 on CUDA
    o.sum().backward()                               # dQ, dK, dV from the backward pass
    o = flash_steps.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k)  # packed (total, heads, head_dim)
    [s.id for s in flash_steps.steps()]              # the registered steps

flash_steps.library() loads $FLASH_STEPS_LIB, else build/libflash_steps.so of the repository, else the
first build*/libflash_steps.so that loads (LibraryNotFound says where it looked). `import flash_steps`
needs neither PyTorch nor a GPU; forward, backward, attention and decode import PyTorch when called."""
from ._capi import (DTYPE_CODES, FS_BF16, FS_FP16, PASSES, CudaError, FlashStepsError, FsBackwardProblem,
                    FsDecodeProblem, FsProblem, FsStrides, InternalError, InvalidArgument, Library, LibraryNotFound,
                    OutOfMemory, Pass, Step, UnknownStep, find_library, library, library_candidates, pass_of)
from ._capi import load as load_library
from ._torch import (attention, backward, backward_problem, decode, decode_problem, default_step, forward,
                     forward_problem, varlen_attention, varlen_backward, varlen_backward_problem, varlen_forward,
                     varlen_problem)

def steps() -> list[Step]:
    """The registered steps, in order (Step: id, name, lesson, dir, min_compute_capability, passes)."""
    return library().steps()

__all__ = ["library", "load_library", "find_library", "library_candidates", "steps", "forward", "backward",
           "attention", "decode", "default_step", "varlen_attention", "varlen_forward", "varlen_backward",
           "varlen_problem", "varlen_backward_problem", "forward_problem", "backward_problem", "decode_problem",
           "Library", "Step", "FlashStepsError", "InvalidArgument", "UnknownStep", "CudaError", "OutOfMemory",
           "InternalError", "LibraryNotFound", "FsProblem", "FsDecodeProblem", "FsBackwardProblem", "FsStrides",
           "Pass", "PASSES", "pass_of", "DTYPE_CODES", "FS_FP16", "FS_BF16"]
