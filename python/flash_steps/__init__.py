"""flash_steps: every step of the flash-steps repository from Python, through its C ABI
(common/flash_steps.h, libflash_steps.so, loaded with ctypes).

    import torch, flash_steps
    q, k, v = (torch.randn(2, 4096, 16, 128, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    o = flash_steps.attention(q, k, v, causal=True)     # (batch, seqlen, heads, head_dim)
    o.sum().backward()                                  # dQ, dK, dV from the backward pass
    [s.id for s in flash_steps.steps()]                 # the registered steps

The library: flash_steps.library() loads $FLASH_STEPS_LIB, else build/libflash_steps.so of the
repository, else the first build*/libflash_steps.so that loads; it raises LibraryNotFound naming
where it looked. `import flash_steps` needs neither PyTorch nor a GPU; forward, backward, attention
and decode import PyTorch when called.
"""
from __future__ import annotations

import os

from ._capi import (DTYPE_CODES, FS_BF16, FS_FP16, PASSES, CudaError, FlashStepsError, FsBackwardProblem,
                    FsDecodeProblem, FsProblem, FsStrides, InternalError, InvalidArgument, Library, LibraryNotFound,
                    OutOfMemory, Pass, Step, UnknownStep, find_library, library_candidates, pass_of)
from ._capi import load as load_library
from ._args import backward_problem, decode_problem, forward_problem
from ._torch import attention, backward, decode, default_step, forward  # PyTorch is imported when they are called

_library = None


def library(path: str | os.PathLike | None = None) -> Library:
    """The loaded libflash_steps.so (loaded once; a path given later loads that one instead)."""
    global _library
    if path is not None:
        _library = load_library(path)
    elif _library is None:
        _library = load_library()
    return _library


def steps() -> list[Step]:
    """The registered steps, in order: id, name, lesson, dir, min_compute_capability and passes (the
    names of the passes each runs: "forward", "decode", "backward")."""
    return library().steps()


__all__ = ["library", "load_library", "find_library", "library_candidates", "steps", "forward", "backward",
           "attention", "decode", "default_step", "forward_problem", "backward_problem", "decode_problem",
           "Library", "Step", "FlashStepsError", "InvalidArgument", "UnknownStep", "CudaError", "OutOfMemory",
           "InternalError", "LibraryNotFound", "FsProblem", "FsDecodeProblem", "FsBackwardProblem", "FsStrides",
           "Pass", "PASSES", "pass_of", "DTYPE_CODES", "FS_FP16", "FS_BF16"]
