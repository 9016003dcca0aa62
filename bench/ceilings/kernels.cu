// The ceilings that every GPU the project supports can measure: mma.sync, FP32 FMA, ex2 and the HBM
// read. Built for CMAKE_CUDA_ARCHITECTURES like the steps. Each compute kernel keeps several
// independent chains per thread, so the unit never waits for a result, and runs an outer loop of
// `iters` iterations (a launch argument, not unrolled) around a fully unrolled body: the SASS shows
// the body's instructions exactly as counted below, once per iteration.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/harness/gpu.h"
#include "instructions.cuh"
#include "kernels.h"
#include "values.cuh"

namespace fs::ceilings {

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: registers only -------------------------
// Each warp keeps kMmaChains accumulators (16×8 fp32 each) and adds A·B into each of them in turn,
// kMmaUnroll times per iteration: 32 mma per warp per iteration, 8 of them independent at any time.
// A and B are the same registers every time; they are varied per lane and never change.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaChains = 8;
constexpr int kMmaUnroll = 4;
constexpr double kMmaFlops = 2.0 * 16 * 8 * 16;  // one m16n8k16: 16·8·16 multiply-adds

template <typename T>
__global__ void __launch_bounds__(kMmaThreads) mma_sync_peak(int iters, float* sink) {
  const uint32_t seed = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  uint32_t a[4], b[2];
  for (int r = 0; r < 4; ++r) a[r] = pack2<T>(hashed_unit(seed + 2 * r), hashed_unit(seed + 2 * r + 1));
  for (int r = 0; r < 2; ++r) b[r] = pack2<T>(hashed_unit(seed + 2 * r + 100), hashed_unit(seed + 2 * r + 101));
  float acc[kMmaChains][4] = {};
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
#pragma unroll
      for (int c = 0; c < kMmaChains; ++c) mma_m16n8k16<T>(acc[c], a, b);
    }
  }
  float sum = 0;
  for (int c = 0; c < kMmaChains; ++c)
    for (int j = 0; j < 4; ++j) sum += acc[c][j];
  if (isnan(sum)) *sink = sum;
}

template <typename T>
void launch_mma_sync(int blocks, int iters, float* sink, cudaStream_t stream) {
  mma_sync_peak<T><<<blocks, kMmaThreads, 0, stream>>>(iters, sink);
  CHECK_LAUNCH();
}

// ---- fma.rn.f32 on the CUDA cores ---------------------------------------------------------------
// Each thread runs kFmaChains independent chains x = x·a + b, kFmaUnroll steps each per iteration
// (256 FFMA per thread per iteration, so the loop's own few instructions take about 1 % of the
// issue slots). |a| < 1 keeps every x finite.
constexpr int kFmaThreads = 256;
constexpr int kFmaChains = 8;
constexpr int kFmaUnroll = 32;

__global__ void __launch_bounds__(kFmaThreads) fma_peak(int iters, float* sink) {
  const uint32_t seed = (kFmaChains + 2) * (blockIdx.x * blockDim.x + threadIdx.x);
  const float a = 0.5f + 0.25f * hashed_unit(seed);
  const float b = hashed_unit(seed + 1);
  float x[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) x[c] = hashed_unit(seed + 2 + c);
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < kFmaUnroll; ++u) {
#pragma unroll
      for (int c = 0; c < kFmaChains; ++c) x[c] = fmaf(x[c], a, b);
    }
  }
  float sum = 0;
  for (int c = 0; c < kFmaChains; ++c) sum += x[c];
  if (isnan(sum)) *sink = sum;
}

void launch_fma(int blocks, int iters, float* sink, cudaStream_t stream) {
  fma_peak<<<blocks, kFmaThreads, 0, stream>>>(iters, sink);
  CHECK_LAUNCH();
}

// ---- ex2.approx.ftz.f32 on the MUFU unit (the softmax's exponentials) ------------------------
// Each thread runs kEx2Chains independent chains x = 2^(-x), kEx2Unroll steps each per iteration
// (64 ex2 per thread per iteration). From x in [-1, 1) every x stays in [0.25, 2].
constexpr int kEx2Threads = 256;
constexpr int kEx2Chains = 8;
constexpr int kEx2Unroll = 8;

__global__ void __launch_bounds__(kEx2Threads) ex2_peak(int iters, float* sink) {
  const uint32_t seed = kEx2Chains * (blockIdx.x * blockDim.x + threadIdx.x);
  float x[kEx2Chains];
  for (int c = 0; c < kEx2Chains; ++c) x[c] = hashed_unit(seed + c);
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < kEx2Unroll; ++u) {
#pragma unroll
      for (int c = 0; c < kEx2Chains; ++c) x[c] = exp2_approx(-x[c]);
    }
  }
  float sum = 0;
  for (int c = 0; c < kEx2Chains; ++c) sum += x[c];
  if (isnan(sum)) *sink = sum;
}

void launch_ex2(int blocks, int iters, float* sink, cudaStream_t stream) {
  ex2_peak<<<blocks, kEx2Threads, 0, stream>>>(iters, sink);
  CHECK_LAUNCH();
}

// ---- HBM read: 16-byte loads over a buffer many times the L2 ------------------------------------
// Thread t of T reads vectors t, t + T, t + 2T, ... in groups of kHbmReadUnroll independent loads
// (a warp's load is 512 contiguous bytes). `vectors` is a multiple of kHbmReadUnroll·T, so every
// load is in bounds and every vector is read once per pass. The running hash depends on the order
// of the passes, so no pass can be folded into another.
__global__ void __launch_bounds__(kHbmReadThreads) hbm_read(const uint4* __restrict__ data, int64_t vectors,
                                                            int passes, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
#pragma unroll 1
  for (int p = 0; p < passes; ++p) {
#pragma unroll 1
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += kHbmReadUnroll * stride) {
      uint4 v[kHbmReadUnroll];
#pragma unroll
      for (int u = 0; u < kHbmReadUnroll; ++u) v[u] = data[i + u * stride];
#pragma unroll
      for (int u = 0; u < kHbmReadUnroll; ++u) acc = acc * 33u + (v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    }
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // rare and harmless; makes every load count
}

__global__ void fill_words(uint32_t* data, int64_t words) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x)
    data[i] = hash32(uint32_t(i));
}

LoopKernel mma_sync_kernel(bool bf16) {
  LoopKernel k;
  k.function = bf16 ? reinterpret_cast<const void*>(mma_sync_peak<__nv_bfloat16>)
                    : reinterpret_cast<const void*>(mma_sync_peak<__half>);
  k.threads = kMmaThreads;
  k.work_per_block_iteration = kMmaWarps * kMmaUnroll * kMmaChains * kMmaFlops;
  k.shape = "4 warps/block, each 8 independent accumulators × 4 mma per iteration";
  k.launch = bf16 ? launch_mma_sync<__nv_bfloat16> : launch_mma_sync<__half>;
  return k;
}

LoopKernel fma_kernel() {
  LoopKernel k;
  k.function = reinterpret_cast<const void*>(fma_peak);
  k.threads = kFmaThreads;
  k.work_per_block_iteration = 2.0 * kFmaThreads * kFmaUnroll * kFmaChains;  // an FMA is 2 FLOPs
  k.shape = "256 threads/block, each 8 independent chains × 32 FMA per iteration";
  k.launch = launch_fma;
  return k;
}

LoopKernel ex2_kernel() {
  LoopKernel k;
  k.function = reinterpret_cast<const void*>(ex2_peak);
  k.threads = kEx2Threads;
  k.work_per_block_iteration = double(kEx2Threads) * kEx2Unroll * kEx2Chains;
  k.shape = "256 threads/block, each 8 independent chains × 8 ex2 per iteration";
  k.launch = launch_ex2;
  return k;
}

const void* hbm_read_function() { return reinterpret_cast<const void*>(hbm_read); }

void launch_hbm_read(int blocks, const void* data, int64_t vectors, int passes, uint32_t* sink,
                     cudaStream_t stream) {
  hbm_read<<<blocks, kHbmReadThreads, 0, stream>>>(static_cast<const uint4*>(data), vectors, passes, sink);
  CHECK_LAUNCH();
}

void launch_fill(void* data, size_t bytes, cudaStream_t stream) {
  const int64_t words = int64_t(bytes / 4);
  fill_words<<<grid_stride_blocks(words, 256), 256, 0, stream>>>(static_cast<uint32_t*>(data), words);
  CHECK_LAUNCH();
}

}  // namespace fs::ceilings
