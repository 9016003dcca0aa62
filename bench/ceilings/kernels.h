// The kernels of flash_steps_ceilings, as the host code (ceilings.cpp) sees them. Each compute kernel
// repeats one instruction in a loop whose trip count is a launch argument, on values the compiler
// cannot know, in several independent chains per thread; it writes to `sink` only when its final
// sum is NaN (never, for the finite values it starts from), so no instruction can be removed.
//
//   kernels.cu   mma.sync, FP32 FMA, ex2, the HBM read and the buffer fill (CMAKE_CUDA_ARCHITECTURES)
//   wgmma.cu     wgmma.mma_async, built for sm_90a only (flash_steps_cuda_arch ... ARCH 90a)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fs::ceilings {

// A compute kernel: one block does `work_per_block_iteration` units (FLOPs, or exponentials) per
// iteration of its loop, so a launch of B blocks and I iterations does B·I times that.
struct LoopKernel {
  const void* function = nullptr;       // the __global__ function (attributes, occupancy)
  int threads = 0;                      // per block
  double work_per_block_iteration = 0;
  const char* shape = "";               // how a block's work is laid out, for the report
  void (*launch)(int blocks, int iters, float* sink, cudaStream_t stream) = nullptr;
};

LoopKernel mma_sync_kernel(bool bf16);  // kernels.cu
LoopKernel fma_kernel();                // kernels.cu
LoopKernel ex2_kernel();                // kernels.cu
LoopKernel wgmma_kernel(bool bf16);     // wgmma.cu

// The HBM read: every thread reads 16-byte vectors, kHbmReadUnroll loads in flight, `passes` times
// over `vectors` vectors. `vectors` must be a multiple of kHbmReadUnroll × (blocks × threads).
inline constexpr int kHbmReadThreads = 256;
inline constexpr int kHbmReadUnroll = 4;
const void* hbm_read_function();
void launch_hbm_read(int blocks, const void* data, int64_t vectors, int passes, uint32_t* sink,
                     cudaStream_t stream);

// Fills `bytes` (a multiple of 4) with pseudo-random words, so no read is of untouched memory.
void launch_fill(void* data, size_t bytes, cudaStream_t stream);

}  // namespace fs::ceilings
