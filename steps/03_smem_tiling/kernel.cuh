// Step 03 — shared-memory tiling: the FlashAttention-2 loop as a tiled GEMM on CUDA cores.
//
// Extends step 02 (one warp per query row, so every K/V row is fetched from L1/L2 once per query
// row) with one idea: tiles in shared memory. A block of 256 threads owns BLOCK_Q = 64 query rows
// and keeps their Q tile in shared memory; it walks over the keys in tiles of BLOCK_KV = 64 rows
// that all its threads copy into shared memory together, so each K/V element fetched from global
// memory serves 64 query rows. Each thread computes a 4 × 4 register tile of S = Q·Kᵀ from shared
// memory, as in a tiled SGEMM (fp32 FMAs); the online softmax of step 02 runs per row across the
// tiles; the probabilities stay in registers and P·V accumulates into a 4 × HEAD_DIM/16 register
// tile of O that is written once at the end. Loop order of FlashAttention-2: Q tile outside, K/V
// tiles inside. Expected: 1.5–2× faster than step 02 at the default shape (notes/03_smem_tiling.md).
//
// The shared tiles are plain row-major on purpose: the 8 lanes of a quarter-warp read 8 K rows at
// the same column, and in a row-major tile those 8 chunks sit in the same 4 banks — an 8-way bank
// conflict on a shared load as frequent as the Q and V reads. Step 04 removes it by changing TileLayout
// only (`flash-steps banks` prints the bank maps). Which thread touches which element, and the
// layout, are defined in traits.h, which the bank-conflict model replays.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/03_smem_tiling/traits.h"

namespace fs::step03 {

constexpr float kLog2e = 1.4426950408889634f;

// N consecutive elements moved as one 8-byte (N = 4) or 16-byte (N = 8) access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T x[N];
};

// N consecutive elements of a shared tile -> N floats.
template <int N, typename T>
__device__ void load_floats(const T* smem, float (&out)[N]) {
  const Vec<T, N> x = *reinterpret_cast<const Vec<T, N>*>(smem);
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = to_float(x.x[e]);
}

// All threads copy rows row0 .. row0 + 63 of one head into a shared tile, 16 bytes at a time;
// rows at or past `rows_valid` become zeros (finite, and masked out later).
template <class Tr, class Layout, typename T>
__device__ void load_tile(T* tile, const T* head, int64_t row_stride, int row0, int64_t rows_valid) {
#pragma unroll
  for (int it = 0; it < Tr::LOADS_PER_THREAD; ++it) {
    const int r = Tr::load_row(threadIdx.x, it), c = Tr::load_col(threadIdx.x, it);
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows_valid) chunk = *reinterpret_cast<const uint4*>(head + (row0 + r) * row_stride + c);
    *reinterpret_cast<uint4*>(tile + Layout::offset(r, c)) = chunk;
  }
}

// TileLayout<HEAD_DIM> maps (row, col) of a Q, K or V tile to its shared-memory element
// (traits.h). This step uses RowMajorLayout; step 04 passes the fixed layouts.
template <typename T, int HEAD_DIM, template <int> class TileLayout>
__global__ void __launch_bounds__(Traits<HEAD_DIM>::NUM_THREADS, 2)
smem_tiling_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                   float* __restrict__ lse, Problem p) {
  using Tr = Traits<HEAD_DIM>;
  using Layout = TileLayout<HEAD_DIM>;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, CHUNK = Tr::CHUNK;
  constexpr int THREAD_ROWS = Tr::THREAD_ROWS, THREAD_KEYS = Tr::THREAD_KEYS, THREAD_COLS = Tr::THREAD_COLS;

  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned
  T* q_smem = reinterpret_cast<T*>(smem);       // [BLOCK_Q, HEAD_DIM] fp16/bf16
  T* k_smem = q_smem + Layout::size(BLOCK_Q);   // [BLOCK_KV, HEAD_DIM]
  T* v_smem = k_smem + Layout::size(BLOCK_KV);  // [BLOCK_KV, HEAD_DIM]

  const int t = threadIdx.x;
  // With a causal mask the last query tiles have the most keys: start them first so that they do
  // not finish last.
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * BLOCK_Q;
  const float scale_log2 = p.softmax_scale * kLog2e;  // exp(scale·(s - m)) = 2^(s·c - m·c), c = scale·log2(e)

  for (int64_t bh = blockIdx.y; bh < p.batch * p.heads_q; bh += gridDim.y) {  // gridDim.y <= 65535
    const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
    const T* k_head = k + offset_of(p.k, b, 0, kv_head_of(p, h));
    const T* v_head = v + offset_of(p.v, b, 0, kv_head_of(p, h));
    // Keys the tile may attend: all, or with the causal mask those up to the diagonal of its last
    // row (j <= i + Sk - Sq). K/V tiles past that are skipped, not masked. Row and key indices fit
    // in 32 bits (seqlens <= 2^31 - 1); offsets into memory are 64-bit.
    const int64_t last_row = std::min<int64_t>(q0 + BLOCK_Q, p.seqlen_q) - 1;
    const int64_t kv_end = p.causal ? std::min(p.seqlen_k, last_row + p.seqlen_k - p.seqlen_q + 1) : p.seqlen_k;
    const int kv_tiles = kv_end > 0 ? int((kv_end + BLOCK_KV - 1) / BLOCK_KV) : 0;

    // ---- load Q
    __syncthreads();  // every thread is done with the previous (b, h)'s q_smem
    load_tile<Tr, Layout>(q_smem, q + offset_of(p.q, b, 0, h), p.q.row, q0, p.seqlen_q);

    float o_acc[THREAD_ROWS][THREAD_COLS] = {};  // [4, HEAD_DIM/16] of unnormalized O, fp32
    float row_max[THREAD_ROWS];                  // max raw score q·k of each row so far
    float row_sum[THREAD_ROWS];                  // this thread's share of the sum of probabilities
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.0f;
    }

    for (int tile = 0; tile < kv_tiles; ++tile) {
      const int kv0 = tile * BLOCK_KV;
      __syncthreads();  // every thread is done with the previous K/V tile
      load_tile<Tr, Layout>(k_smem, k_head, p.k.row, kv0, p.seqlen_k);
      load_tile<Tr, Layout>(v_smem, v_head, p.v.row, kv0, p.seqlen_k);
      __syncthreads();  // Q, K and V tiles are in shared memory

      // ---- S = Q·Kᵀ: s_acc[i][j] = q_row(t, i) · key(t, j), 8 columns of head_dim per step
      float s_acc[THREAD_ROWS][THREAD_KEYS] = {};
      for (int d0 = 0; d0 < HEAD_DIM; d0 += CHUNK) {
        float q_frag[THREAD_ROWS][CHUNK];  // one 16-byte read per row: a broadcast in each quarter-warp
#pragma unroll
        for (int i = 0; i < THREAD_ROWS; ++i) load_floats(q_smem + Layout::offset(Tr::q_row(t, i), d0), q_frag[i]);
#pragma unroll
        for (int j = 0; j < THREAD_KEYS; ++j) {
          float k_frag[CHUNK];  // 8 consecutive K rows per quarter-warp, same column: step 03's conflict
          load_floats(k_smem + Layout::offset(Tr::key(t, j), d0), k_frag);
#pragma unroll
          for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) s_acc[i][j] = fmaf(q_frag[i][e], k_frag[e], s_acc[i][j]);
        }
      }

      // ---- online softmax, per row across tiles; the 16 threads of a row are one half-warp
#pragma unroll
      for (int i = 0; i < THREAD_ROWS; ++i) {
        const int row = q0 + Tr::q_row(t, i);
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < THREAD_KEYS; ++j) {
          const int key = kv0 + Tr::key(t, j);
          if (key >= p.seqlen_k || (p.causal && !causal_allows(row, key, p.seqlen_q, p.seqlen_k)))
            s_acc[i][j] = -INFINITY;
          tile_max = fmaxf(tile_max, s_acc[i][j]);
        }
#pragma unroll
        for (int offset = Tr::GROUP / 2; offset > 0; offset /= 2)
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
        const float new_max = fmaxf(row_max[i], tile_max);
        // A row that has seen no key yet (new_max = -inf) subtracts 0 instead: 2^(-inf) = 0, not NaN.
        const float max_used = new_max == -INFINITY ? 0.0f : new_max;
        const float max_scaled = max_used * scale_log2;
        const float rescale = exp2f((row_max[i] - max_used) * scale_log2);  // 1 if the max held, 0 the first time
        row_max[i] = new_max;
        row_sum[i] *= rescale;
#pragma unroll
        for (int c = 0; c < THREAD_COLS; ++c) o_acc[i][c] *= rescale;
#pragma unroll
        for (int j = 0; j < THREAD_KEYS; ++j) {
          s_acc[i][j] = exp2f(fmaf(s_acc[i][j], scale_log2, -max_scaled));  // P, in place of S
          row_sum[i] += s_acc[i][j];
        }
      }

      // ---- O += P·V: the probability of key key(src, j) is s_acc[i][j] of lane src of the
      // half-warp; a width-16 shuffle hands it to the 16 threads of the row, each of which owns
      // THREAD_COLS columns of the V row (128 consecutive bytes per quarter-/half-warp: no conflict).
#pragma unroll
      for (int j = 0; j < THREAD_KEYS; ++j) {
#pragma unroll 4
        for (int src = 0; src < Tr::GROUP; ++src) {
          float v_frag[THREAD_COLS];
          load_floats(v_smem + Layout::offset(Tr::key(src, j), Tr::o_col(t)), v_frag);
#pragma unroll
          for (int i = 0; i < THREAD_ROWS; ++i) {
            const float prob = __shfl_sync(0xffffffffu, s_acc[i][j], src, Tr::GROUP);
#pragma unroll
            for (int c = 0; c < THREAD_COLS; ++c) o_acc[i][c] = fmaf(prob, v_frag[c], o_acc[i][c]);
          }
        }
      }
    }

    // ---- epilogue: add up the 16 partial row sums, O = o_acc / row_sum, LSE = scale·row_max + log(row_sum)
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i)
#pragma unroll
      for (int offset = Tr::GROUP / 2; offset > 0; offset /= 2)
        row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], offset);
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i) {
      const int row = q0 + Tr::q_row(t, i);
      if (row >= p.seqlen_q) continue;
      // A row with no key to attend has row_sum = 0: O = 0 and LSE = -inf.
      const float inv_sum = row_sum[i] > 0.0f ? 1.0f / row_sum[i] : 0.0f;
      Vec<T, THREAD_COLS> out;
#pragma unroll
      for (int c = 0; c < THREAD_COLS; ++c) out.x[c] = from_float<T>(o_acc[i][c] * inv_sum);
      *reinterpret_cast<Vec<T, THREAD_COLS>*>(o + offset_of(p.o, b, row, h) + Tr::o_col(t)) = out;
      if (lse && t % Tr::GROUP == 0)
        lse[bh * p.seqlen_q + row] = row_sum[i] > 0.0f ? row_max[i] * p.softmax_scale + logf(row_sum[i]) : -INFINITY;
    }
  }
}

}  // namespace fs::step03
