// Step 05 — cp.async double buffering: step 04's swizzled kernel with the K/V copies overlapped
// with the computation.
//
// Extends step 04 (04_swizzle) by changing one thing: how the tiles reach shared memory. In step 04
// every thread loads 16 bytes from global memory into registers, waits for them (hundreds of cycles
// of L2 or DRAM latency, during which its warp issues nothing), stores them to shared memory, and
// only after a barrier does anyone compute; the next tile is not asked for until this one is
// finished. Here the copies are `cp.async.cg` (global -> shared directly, no registers, the thread
// does not wait) and K/V have two buffers: the copy of tile n+1 is started right before tile n is
// computed, so its latency hides behind the FMAs of tile n. Ragged tails are zero-filled by the copy
// itself (its src-size operand), not by a branch around it. The kernel is step 04's line for line
// otherwise (`diff -ru steps/04_bank_conflicts steps/05_cp_async`).
// Expected: a modest gain over 04_swizzle at the default shape (step 04 is FMA-bound and two
// resident blocks already hide part of the latency), and the long-scoreboard stall share of ncu's
// warp-state samples near zero (notes/05_cp_async.md).
#pragma once

#include <algorithm>
#include <cmath>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/05_cp_async/traits.h"

namespace fs::step05 {

constexpr float kLog2e = 1.4426950408889634f;

// ---- the instruction this step teaches ----------------------------------------------------------
// cp.async.cg.shared.global [dst], [src], 16, src_bytes (sm_80+): copies 16 bytes from global to
// shared memory without passing through registers, caching in L2 only (.cg: the tile is read once
// per block, L1 would not help). The thread goes on at once. Only src_bytes bytes are read and the
// rest of the 16 are zero-filled, so src_bytes = 0 writes 16 zero bytes and reads nothing (the
// address must still be a valid one).
__device__ inline void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
// Closes a group: every cp.async this thread issued since the last commit.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight. It waits for the
// thread's own copies only: a __syncthreads() must follow before other threads read the tile.
// None of the three asm statements has a "memory" clobber, so the compiler may move ordinary loads
// and stores across them. That is safe here because a __syncthreads(), which the compiler never moves
// memory accesses across, stands between every copy and every access it could race with: the reads of
// a tile come after its wait and a barrier, the reads of a buffer's old tile before the barrier that
// precedes the copy overwriting it.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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

// All threads start copying rows row0 .. row0 + 63 of one head into a shared tile, 16 bytes at a
// time, and return without waiting; rows at or past `rows_valid` become zeros (finite, and masked
// out later) through src_bytes = 0, their source address being row row0, which always exists.
// Not unrolled on purpose: unrolled, the global and shared addresses of every chunk (they do not
// change from tile to tile) stay in registers across the whole K/V loop and push the FMA loop past
// its 128 registers into spills; rolled, they are recomputed at each call for a few instructions.
template <class Tr, class Layout, typename T>
__device__ void copy_tile_async(T* tile, const T* head, int64_t row_stride, int row0, int64_t rows_valid) {
#pragma unroll 1
  for (int it = 0; it < Tr::LOADS_PER_THREAD; ++it) {
    const int r = Tr::load_row(threadIdx.x, it), c = Tr::load_col(threadIdx.x, it);
    const bool valid = row0 + r < rows_valid;
    cp_async_16(tile + Layout::offset(r, c), head + (valid ? (row0 + r) * row_stride + c : row0 * row_stride),
                valid ? 16 : 0);
  }
}

// TileLayout<HEAD_DIM> maps (row, col) of a Q, K or V tile to its shared-memory element
// (traits.h). This step passes Swizzled128Layout, as 04_swizzle does.
template <typename T, int HEAD_DIM, template <int> class TileLayout>
__global__ void __launch_bounds__(Traits<HEAD_DIM>::NUM_THREADS, 2)
smem_tiling_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                   float* __restrict__ lse, Problem p) {
  using Tr = Traits<HEAD_DIM>;
  using Layout = TileLayout<HEAD_DIM>;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, CHUNK = Tr::CHUNK;
  constexpr int THREAD_ROWS = Tr::THREAD_ROWS, THREAD_KEYS = Tr::THREAD_KEYS, THREAD_COLS = Tr::THREAD_COLS;

  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async needs
  T* q_smem = reinterpret_cast<T*>(smem);           // [BLOCK_Q, HEAD_DIM] fp16/bf16
  T* k_smem = q_smem + Layout::size(BLOCK_Q);       // [2][BLOCK_KV, HEAD_DIM]: tile n in buffer n % 2
  T* v_smem = k_smem + 2 * Layout::size(BLOCK_KV);  // [2][BLOCK_KV, HEAD_DIM]

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

    // ---- load Q, and start K/V tile 0: one cp.async group, the only one in flight
    __syncthreads();  // every thread is done with the previous (b, h)'s q_smem and K/V buffers
    if (kv_tiles > 0) {  // a query tile that sees no key needs no Q either, and leaves no copy in flight
      copy_tile_async<Tr, Layout>(q_smem, q + offset_of(p.q, b, 0, h), p.q.row, q0, p.seqlen_q);
      copy_tile_async<Tr, Layout>(k_smem, k_head, p.k.row, 0, p.seqlen_k);
      copy_tile_async<Tr, Layout>(v_smem, v_head, p.v.row, 0, p.seqlen_k);
      cp_async_commit();
    }

    float o_acc[THREAD_ROWS][THREAD_COLS] = {};  // [4, HEAD_DIM/16] of unnormalized O, fp32
    float row_max[THREAD_ROWS];                  // max raw score q·k of each row so far
    float row_sum[THREAD_ROWS];                  // this thread's share of the sum of probabilities
#pragma unroll
    for (int i = 0; i < THREAD_ROWS; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.0f;
    }

    for (int tile = 0; tile < kv_tiles; ++tile) {
      const int kv0 = tile * BLOCK_KV, buf = tile % 2;
      // Only this tile's group is in flight (the first time, with Q): wait for all of it.
      cp_async_wait<0>();
      // One barrier, two jobs: every thread's copies of this tile are now visible to all, and every
      // thread is done computing the previous tile, so its buffer (buf ^ 1) may be overwritten.
      __syncthreads();
      if (tile + 1 < kv_tiles) {  // start tile n+1 now; it arrives while tile n is computed
        copy_tile_async<Tr, Layout>(k_smem + (buf ^ 1) * Layout::size(BLOCK_KV), k_head, p.k.row, kv0 + BLOCK_KV,
                                    p.seqlen_k);
        copy_tile_async<Tr, Layout>(v_smem + (buf ^ 1) * Layout::size(BLOCK_KV), v_head, p.v.row, kv0 + BLOCK_KV,
                                    p.seqlen_k);
        cp_async_commit();
      }
      const T* k_tile = k_smem + buf * Layout::size(BLOCK_KV);  // [BLOCK_KV, HEAD_DIM] of this tile
      const T* v_tile = v_smem + buf * Layout::size(BLOCK_KV);

      // ---- S = Q·Kᵀ: s_acc[i][j] = q_row(t, i) · key(t, j), 8 columns of head_dim per step
      float s_acc[THREAD_ROWS][THREAD_KEYS] = {};
      for (int d0 = 0; d0 < HEAD_DIM; d0 += CHUNK) {
        float q_frag[THREAD_ROWS][CHUNK];  // one 16-byte read per row: a broadcast in each quarter-warp
#pragma unroll
        for (int i = 0; i < THREAD_ROWS; ++i) load_floats(q_smem + Layout::offset(Tr::q_row(t, i), d0), q_frag[i]);
#pragma unroll
        for (int j = 0; j < THREAD_KEYS; ++j) {
          float k_frag[CHUNK];  // 8 consecutive K rows per quarter-warp, same column: step 03's conflict
          load_floats(k_tile + Layout::offset(Tr::key(t, j), d0), k_frag);
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
          load_floats(v_tile + Layout::offset(Tr::key(src, j), Tr::o_col(t)), v_frag);
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

}  // namespace fs::step05
