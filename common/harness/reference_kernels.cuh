// Kernels the two cuBLAS references share: the forward's (reference_gpu.cu) and the backward's
// (backward/reference_gpu.cu). Each .cu that includes this file gets its own copy (anonymous namespace).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "forward/check.h"
#include "step/device.h"
#include "step/dtype.cuh"

namespace fs {
namespace {

constexpr int kSoftmaxThreads = 256;

int grid_for(int64_t n) { return grid_stride_blocks(n, 256); }  // the conversion kernels: 256 threads

// out[(hh·rows + r)·head_dim + d] = x(b, row0 + r, h0 + hh, d) as fp32: heads h0 … h0+heads-1 and rows
// row0 … row0+rows-1 of a strided (batch, seqlen, heads, head_dim) view, as a [heads][rows][head_dim] array.
template <typename T>
__global__ void rows_to_float_kernel(const T* x, Strides st, int64_t b, int64_t row0, int64_t rows, int64_t h0,
                                     int64_t heads, int64_t head_dim, float* out) {
  const int64_t n = heads * rows * head_dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % head_dim, r = e / head_dim % rows, hh = e / (head_dim * rows);
    out[e] = to_float(x[offset_of(st, b, row0 + r, h0 + hh) + d]);
  }
}

// The max (is_max) or the sum of x over a block of kSoftmaxThreads threads; every thread gets it.
__device__ inline float block_reduce(float x, bool is_max) {
  __shared__ float red[kSoftmaxThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
  __syncthreads();  // red is free again for the next call
  return x;
}

// One block of kSoftmaxThreads per row of S: masked max, sum of exponentials, P = exp(s - max) / sum,
// and (lse not null) LSE = max + log(sum). S holds `group` heads × `rows` query rows × Sk keys, for
// query rows i0 … i0+rows-1 of heads h0 … h0+group-1 of batch entry b. Row i sees the keys
// reference_keys(p, i) (causal, window), the CPU reference's interval; every other key gets P = 0, and a
// row with no key gets P = 0, LSE = -inf.
// p.softcap > 0: each logit s first becomes softcap·tanh(s / softcap) (tanhf, not the kernels' MUFU.TANH),
// and `slope` (when not null, laid out as S) receives its derivative 1 - tanh² for every key (1 where
// masked, so that ds_kernel's 0 · slope is 0 there, whatever the scratch held before).
__global__ void masked_softmax_kernel(float* s, Problem p, int64_t rows, int64_t i0, int64_t b, int64_t h0,
                                      float* lse, float* slope = nullptr) {
  const int64_t r = blockIdx.x;
  const int64_t g = r / rows, i = i0 + r % rows;
  const int64_t seqlen_k = p.seqlen_k;
  const float softcap = p.softcap;
  float* row = s + r * seqlen_k;
  const KeyRange keys = reference_keys(p, i);
  const auto seen = [&](int64_t j) { return keys.first <= j && j < keys.end; };
  float m = -INFINITY;
  for (int64_t j = keys.first + threadIdx.x; j < keys.end; j += blockDim.x) {
    if (softcap > 0.0f) row[j] = softcap * tanhf(row[j] / softcap);
    m = fmaxf(m, row[j]);
  }
  m = block_reduce(m, true);
  float sum = 0.0f;
  for (int64_t j = keys.first + threadIdx.x; j < keys.end; j += blockDim.x) sum += expf(row[j] - m);
  sum = block_reduce(sum, false);
  for (int64_t j = threadIdx.x; j < seqlen_k; j += blockDim.x) {
    if (slope) {
      const float t = softcap > 0.0f && seen(j) ? row[j] / softcap : 0.0f;  // tanh, from the capped logit
      slope[r * seqlen_k + j] = 1.0f - t * t;
    }
    row[j] = seen(j) ? expf(row[j] - m) / sum : 0.0f;
  }
  if (lse && threadIdx.x == 0)
    lse[(b * p.heads_q + h0 + g) * p.seqlen_q + i] = keys.first < keys.end ? m + logf(sum) : -INFINITY;
}

}  // namespace
}  // namespace fs
