// Step 02 — online softmax: one fused kernel, and the score matrix S never exists in memory.
//
// Extends step 01 (three kernels, S = B·H·Sq·Sk floats in global memory: 512 MiB at the default
// shape, written twice and read four times) with one idea: the softmax can be computed in a single
// pass over the keys. One warp owns one query row and streams over its keys, keeping a running max
// row_max, a running sum row_sum and an fp32 accumulator o_acc; when the max grows, the sum and the
// accumulator are rescaled by exp(old max - new max). At the end O = o_acc / row_sum and
// LSE = max + log(row_sum). Memory is O(N·d) instead of O(N²), and each K/V row is read from L1/L2
// once per query row instead of S going through DRAM six times. notes/02_online_softmax.md derives
// the recurrence and predicts a several-fold speed-up over step 01 at the default shape.
//
// Work split: lane l of the warp owns the 4-element chunks l and l + 32 of head_dim (8-byte
// accesses; head_dim <= 128 needs only the first). For each key the lanes multiply their chunks of
// q and k, a 5-step shuffle reduction gives every lane the full dot product, and each lane updates
// its own chunk of o_acc with its chunk of the V row. The compile-time choices: traits.h.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/02_online_softmax/traits.h"

namespace fs::step02 {

constexpr float kLog2e = 1.4426950408889634f;

// CHUNK consecutive elements moved as one 8-byte access.
template <typename T>
struct alignas(8) Chunk {
  T x[4];
};

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T, int CHUNKS_PER_LANE>
__global__ void __launch_bounds__(Traits<CHUNKS_PER_LANE>::NUM_THREADS)
online_softmax_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                      float* __restrict__ lse, Problem p) {
  using Tr = Traits<CHUNKS_PER_LANE>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.x) * Tr::NUM_WARPS + warp;  // this warp's query row
  if (i >= p.seqlen_q) return;  // no barrier in this kernel: a warp may leave early
  // Keys row i may attend: 0 .. key_end - 1 (bottom-right causal: j <= i + Sk - Sq).
  const int64_t key_end = p.causal ? std::min(p.seqlen_k, i + p.seqlen_k - p.seqlen_q + 1) : p.seqlen_k;
  // scores are kept as raw dot products q·k; exp(scale·(s - m)) = 2^(s·c - m·c) with c = scale·log2(e):
  // per key an FMUL (m·c, as the max may change with every key), one FMA and exp2f, which is MUFU.EX2
  // plus the scaling that keeps it within 2 ulp where the result is subnormal (07f drops it: ex2.approx.ftz).
  const float scale_log2 = p.softmax_scale * kLog2e;

  for (int64_t bh = blockIdx.y; bh < p.batch * p.heads_q; bh += gridDim.y) {  // gridDim.y <= 65535
    const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
    const T* q_row = q + offset_of(p.q, b, i, h);
    const T* k_head = k + offset_of(p.k, b, 0, kv_head_of(p, h));
    const T* v_head = v + offset_of(p.v, b, 0, kv_head_of(p, h));

    // ---- load Q: this lane's chunks of q_i, as floats; chunks past head_dim stay 0
    bool active[CHUNKS_PER_LANE];
    float q_frag[CHUNKS_PER_LANE][Tr::CHUNK] = {};
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
      const int col = (lane + 32 * c) * Tr::CHUNK;
      active[c] = col < p.head_dim;
      if (!active[c]) continue;
      const Chunk<T> x = *reinterpret_cast<const Chunk<T>*>(q_row + col);
#pragma unroll
      for (int e = 0; e < Tr::CHUNK; ++e) q_frag[c][e] = to_float(x.x[e]);
    }

    float o_acc[CHUNKS_PER_LANE][Tr::CHUNK] = {};  // this lane's chunks of the unnormalized O row
    float row_max = -INFINITY;                    // max of the raw scores seen so far
    float row_sum = 0.0f;                         // sum of 2^((s - row_max)·c) over the keys seen so far

    // Unrolled by 4 so that the loads and the shuffle reductions of consecutive keys overlap.
#pragma unroll 4
    for (int64_t j = 0; j < key_end; ++j) {
      const T* k_row = k_head + j * p.k.row;
      const T* v_row = v_head + j * p.v.row;

      // ---- S = Q·Kᵀ: one score, s = q_i · k_j, summed over the warp
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
        if (!active[c]) continue;
        const Chunk<T> x = *reinterpret_cast<const Chunk<T>*>(k_row + (lane + 32 * c) * Tr::CHUNK);
#pragma unroll
        for (int e = 0; e < Tr::CHUNK; ++e) s += q_frag[c][e] * to_float(x.x[e]);
      }
      s = warp_sum(s);  // every lane now holds s

      // ---- online softmax: a new max rescales what was summed so far by 2^((old max - new max)·c)
      const float new_max = fmaxf(row_max, s);
      const float rescale = exp2f((row_max - new_max) * scale_log2);  // first key: 2^(-inf) = 0
      const float prob = exp2f(fmaf(s, scale_log2, -new_max * scale_log2));
      row_sum = row_sum * rescale + prob;
      row_max = new_max;

      // ---- O += P·V
#pragma unroll
      for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
        if (!active[c]) continue;
        const Chunk<T> x = *reinterpret_cast<const Chunk<T>*>(v_row + (lane + 32 * c) * Tr::CHUNK);
#pragma unroll
        for (int e = 0; e < Tr::CHUNK; ++e) o_acc[c][e] = fmaf(prob, to_float(x.x[e]), o_acc[c][e] * rescale);
      }
    }

    // ---- epilogue: O = o_acc / row_sum, LSE = scale·row_max + log(row_sum) (natural log)
    // A row with no key to attend (causal, Sq > Sk) never entered the loop: row_sum = 0 gives O = 0, LSE = -inf.
    const float inv_sum = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
    T* o_row = o + offset_of(p.o, b, i, h);
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_LANE; ++c) {
      if (!active[c]) continue;
      Chunk<T> x;
#pragma unroll
      for (int e = 0; e < Tr::CHUNK; ++e) x.x[e] = from_float<T>(o_acc[c][e] * inv_sum);
      *reinterpret_cast<Chunk<T>*>(o_row + (lane + 32 * c) * Tr::CHUNK) = x;
    }
    if (lse && lane == 0)
      lse[bh * p.seqlen_q + i] = row_sum > 0.0f ? row_max * p.softmax_scale + logf(row_sum) : -INFINITY;
  }
}

}  // namespace fs::step02
