// Step 10 — decoding: one new token (or a few) per sequence against a long KV cache. Step 07's
// tensor-core tile, turned for a problem that is memory-bound (notes/10_decoding.md).
//
// Extends step 07 (07g: ldmatrix + mma.sync, online softmax in registers, cp.async into swizzled
// shared memory). The one idea: keep every SM reading K and V at full speed when the queries are few.
//   GQA packing   the query heads that share a KV head, times the new tokens, are the 16 rows of one
//                 m16 tile (traits.h, packed_row): each K/V byte is read once per KV head, not once
//                 per query head, and a 1-token query does not waste a 128-row tile.
//   keys across warps   the NUM_WARPS warps of a block (4; 2 in kD256_W2) take different keys of every
//                 K/V tile (step 07's warps took different query rows); at the end their partial results
//                 are merged by the LSE rule (traits.h) in shared memory.
//   split-KV      when batch × KV heads blocks cannot fill the GPU, the keys of each sequence are cut
//                 into splits, one block each (num_splits_for, a heuristic on the SM count); each split
//                 writes its normalized O (fp32) and LSE to the workspace, and combine_kernel merges
//                 them with the same rule.
//   a deeper pipeline   KV_STAGES K/V tiles of 32 KiB or more in shared memory, KV_STAGES - 1 of them
//                 in flight while one is computed: bandwidth is bytes in flight over latency.
//   per-sequence lengths and a paged cache   each block reads its sequence's length from
//                 cache_seqlens and finds every key through the block table (one lookup per thread
//                 and tile: a thread's keys lie in one page, traits.h, copy_row).
//
// Expected speed: K and V read near the HBM read bandwidth, 4.64 TB/s measured by
// bench/results/ceilings-20261130-212215.json (measured here: 3.25-4.48 TB/s over the 20 decoding
// problems of bench/results/compare_torch-decode-20261130-224031.json). Step 07 on the same problem
// computes a whole 128-row query tile per query head for 1 to 16 real rows: at batch 1 its few
// blocks leave most SMs idle; at larger batches its grid fills the GPU and the padding rows' tensor
// work bounds it (notes/10_decoding.md, "What is measured").
#pragma once

#include <cuda_runtime.h>

#include "common/decode/problem.h"
#include "common/step/dtype.cuh"
#include "steps/10_decoding/traits.h"

namespace fs::step10 {

// ---- the instructions of steps 05 and 06 (cp.async, ldmatrix, mma.sync), as they wrote them ----
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// cp.async.cg: 16 bytes global -> shared without registers; src_bytes < 16 zero-fills the rest.
__device__ inline void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix.x4: four 8×8 matrices; lane 8·m + r gives row r of matrix m (frag::ldmatrix_matrix_of, _row_of).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// d += a·b for one 16×8×16 tile, fp32 accumulators (frag::mma_c; the A and B maps: step 07's traits.h).
template <typename T>
__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ inline void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> one register of two fp16/bf16 (lo in the low half), rounded to nearest.
template <typename T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x as one MUFU instruction (step 07f's ex2.approx.ftz; 2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// What plan() derived from the problem, passed by value with it.
struct Args {
  int group;          // heads_q / heads_kv: query heads per KV head
  int rows;           // group · seqlen_q: packed rows per (batch, KV head)
  int row_tiles;      // BLOCK_Q-row tiles of them
  int splits;         // parts the keys of a sequence are cut into (1: no split, no workspace)
  int64_t rows_all;   // batch · heads_q · seqlen_q: rows of O
  float scale_log2;   // softmax_scale · log2(e)
};

// One block: BLOCK_Q packed rows (row tile w.row_tile) of one (batch, KV head), over the keys of one
// split. splits == 1: writes O and LSE; else its normalized O in fp32 and its LSE, to part_o and
// part_lse (traits.h, workspace_layout), for combine_kernel.
template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::NUM_THREADS)
    split_kv_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                    const int32_t* __restrict__ block_table, const int32_t* __restrict__ cache_seqlens,
                    T* __restrict__ o, float* __restrict__ lse, float* __restrict__ part_o,
                    float* __restrict__ part_lse, const DecodeProblem dp, const Args a) {
  const Problem& p = dp.attention;  // sizes and strides; k and v are the cache's
  using Layout = typename Tr::Layout;
  constexpr int BLOCK_KV = Tr::BLOCK_KV, KV_STAGES = Tr::KV_STAGES, KEYS_PER_WARP = Tr::KEYS_PER_WARP;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);         // [BLOCK_Q, HEAD_DIM], swizzled
  T* k_smem = q_smem + Tr::Q_ELEMS;                   // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + KV_STAGES * Tr::KV_ELEMS;      // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled

  const BlockWork w = block_work(blockIdx.x, uint32_t(p.heads_kv), uint32_t(a.splits), uint32_t(a.row_tiles));
  const int seqlen_q = int(p.seqlen_q), head_dim = int(p.head_dim);
  const bool causal = p.causal != 0;
  // This sequence's keys. Clamped to [0, seqlen_k]: a length that breaks the contract (flash_steps.h)
  // gives a wrong answer, never a read past the cache.
  const int len = cache_seqlens ? min(max(cache_seqlens[w.b], 0), int(p.seqlen_k)) : int(p.seqlen_k);

  const int row0 = int(w.row_tile) * BLOCK_Q;          // the tile's first packed row
  const int tile_rows = min(BLOCK_Q, a.rows - row0);   // real rows in it
  const int first_token = packed_row(row0, a.group).token;
  const int n_keys = keys_seen(len, seqlen_q, packed_row(row0 + tile_rows - 1, a.group).token, causal);
  const TileRange tiles = split_tiles(n_keys, BLOCK_KV, a.splits, int(w.split));
  const int n_tiles = tiles.end - tiles.first;

  // ---- load Q
  // Packed row r is token r / group of query head kv_head · group + r % group; rows past the tile's
  // real rows and columns past head_dim are zero-filled (0 source bytes, from a clamped address).
#pragma unroll
  for (int i = 0; i < Tr::Q_CHUNKS_PER_THREAD; ++i) {
    const int c = i * Tr::NUM_THREADS + int(threadIdx.x);
    const int row = c / Tr::CHUNKS_PER_ROW, col = c % Tr::CHUNKS_PER_ROW * 8;
    const PackedRow pr = packed_row(row0 + min(row, tile_rows - 1), a.group);
    const T* src = q + offset_of(p.q, w.b, pr.token, int64_t(w.kv_head) * a.group + pr.head_in_group) +
                   (col < head_dim ? col : 0);
    cp_async_16(q_smem + Layout::offset(row, col), src, row < tile_rows && col < head_dim ? 16 : 0);
  }
  cp_async_commit();

  // K/V tile j (keys j·BLOCK_KV ...) into buffer `stage`. This thread copies one 16-byte column chunk
  // of ROWS_PER_THREAD consecutive keys, all in one aligned group of 16 keys: one page of a paged
  // cache, found with one block-table lookup. Keys at and past n_keys are zero-filled; so is a page
  // outside [0, num_pages) (the contract broken: zeros, never a read outside the cache).
  const int my_row0 = copy_row<Tr>(int(threadIdx.x), 0), my_col = copy_col<Tr>(int(threadIdx.x));
  const bool col_real = my_col < head_dim;
  const T* k_head = k_cache + int64_t(w.kv_head) * p.k.head + my_col;
  const T* v_head = v_cache + int64_t(w.kv_head) * p.v.head + my_col;
  auto copy_kv_tile = [&](const int j, const int stage) {
    const int key0 = j * BLOCK_KV + my_row0;
    bool found = col_real && key0 < n_keys;
    int64_t k_row0 = 0, v_row0 = 0;  // element offsets of key0 in the caches
    if (found) {
      int64_t slot = w.b, row = key0;  // contiguous: batch entry b, row key0
      if (block_table) {
        const int page = __ldg(block_table + int64_t(w.b) * dp.block_table_stride + key0 / int(dp.page_size));
        found = page >= 0 && page < dp.num_pages;
        slot = page;
        row = key0 % int(dp.page_size);
      }
      k_row0 = slot * p.k.batch + row * p.k.row;
      v_row0 = slot * p.v.batch + row * p.v.row;
    }
    T* k_dst = k_smem + stage * Tr::KV_ELEMS;
    T* v_dst = v_smem + stage * Tr::KV_ELEMS;
#pragma unroll
    for (int pass = 0; pass < Tr::ROWS_PER_THREAD; ++pass) {
      const bool valid = found && key0 + pass < n_keys;
      const int smem_at = Layout::offset(my_row0 + pass, my_col);
      cp_async_16(k_dst + smem_at, valid ? k_head + k_row0 + pass * p.k.row : k_cache, valid ? 16 : 0);
      cp_async_16(v_dst + smem_at, valid ? v_head + v_row0 + pass * p.v.row : v_cache, valid ? 16 : 0);
    }
  };

  // The pipeline: tile t's copies are cp.async group t + 1 (group 0 is Q). Every thread commits one
  // group per step, empty past the last tile, so that "group t + 1 has landed" is always
  // cp.async.wait_group KV_STAGES - 2 at step t.
#pragma unroll
  for (int s = 0; s < KV_STAGES - 1; ++s) {
    if (s < n_tiles) copy_kv_tile(tiles.first + s, s);
    cp_async_commit();
  }

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int warp_key0 = warp * KEYS_PER_WARP;  // this warp's keys inside every K/V tile

  // Where this lane points ldmatrix, as the LANE_OFFSETS offsets of Traits::origin (step 07's).
  int qv_lane_off[Tr::LANE_OFFSETS], k_lane_off[Tr::LANE_OFFSETS];
#pragma unroll
  for (int u = 0; u < Tr::LANE_OFFSETS; ++u) {
    const frag::Coord qv = frag::ldmatrix_x4_quadrants(lane), kp = ldmatrix_x4_k_pair(lane);
    qv_lane_off[u] = Layout::offset(qv.row, 16 * u + qv.col);
    k_lane_off[u] = Layout::offset(kp.row, 16 * u + kp.col);
  }

  // Q has landed (its group is the oldest). Up to HEAD_DIM 128 its A fragments stay in registers for
  // every tile; at 256 they are read from q_smem at every k16 step (Traits::Q_IN_REGISTERS).
  cp_async_wait<KV_STAGES - 1>();
  __syncthreads();
  auto load_q = [&](uint32_t(&a_frag)[4], const int ks) {  // Q [16 rows, 16 dims] of k16 step ks, as A
    ldmatrix_x4(a_frag, q_smem + qv_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(0, ks * 16));
  };
  uint32_t q_frag[Tr::Q_IN_REGISTERS ? Tr::QK_K_STEPS : 1][4];
  if constexpr (Tr::Q_IN_REGISTERS) {
#pragma unroll
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) load_q(q_frag[ks], ks);
  }

  float o_acc[Tr::O_N_TILES][4] = {};  // [BLOCK_Q, HEAD_DIM] fp32 over this warp's keys, C layout
  float row_max[2] = {-INFINITY, -INFINITY};  // raw-score max of rows g and g + 8 (frag::mma_c)
  float row_sum[2] = {0.0f, 0.0f};           // this lane's part of their sums
  int token[2];                               // the tokens of rows g and g + 8
#pragma unroll
  for (int r = 0; r < 2; ++r) token[r] = packed_row(row0 + frag::mma_c(lane, 2 * r).row, a.group).token;
  // Keys [0, visible_end) are seen by every real row of the tile: a warp's keys past it need the mask.
  const int visible_end = causal ? min(n_keys, first_token + len - seqlen_q + 1) : n_keys;

  for (int t = 0; t < n_tiles; ++t) {
    // Tile t has landed for this thread; the barrier makes it everyone's and tells that every warp has
    // finished tile t - 1, whose buffer the copy of tile t + KV_STAGES - 1 reuses.
    cp_async_wait<KV_STAGES - 2>();
    __syncthreads();
    if (t + KV_STAGES - 1 < n_tiles) copy_kv_tile(tiles.first + t + KV_STAGES - 1, (t + KV_STAGES - 1) % KV_STAGES);
    cp_async_commit();

    const T* k_tile = k_smem + (t % KV_STAGES) * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled
    const T* v_tile = v_smem + (t % KV_STAGES) * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled
    const int kv0 = (tiles.first + t) * BLOCK_KV + warp_key0;   // this warp's first key

    // ---- S = Q·Kᵀ
    // [16 rows, KEYS_PER_WARP keys]: k16 steps over head dims, K's B fragments two n8 tiles (one
    // ldmatrix.x4) at a time.
    float s_acc[Tr::S_N_TILES][4] = {};
#pragma unroll
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
      uint32_t(&a_frag)[4] = q_frag[Tr::Q_IN_REGISTERS ? ks : 0];
      if constexpr (!Tr::Q_IN_REGISTERS) load_q(a_frag, ks);
#pragma unroll
      for (int np = 0; np < Tr::S_N_TILES / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_tile + k_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(warp_key0 + np * 16, ks * 16));
        const uint32_t b_lo[2] = {kf[0], kf[1]}, b_hi[2] = {kf[2], kf[3]};
        mma_m16n8k16<T>(s_acc[2 * np], a_frag, b_lo);
        mma_m16n8k16<T>(s_acc[2 * np + 1], a_frag, b_hi);
      }
    }

    // Keys this block did not load (past n_keys) and, with causal, keys after a row's diagonal get
    // -inf. Only a warp whose keys reach past visible_end builds the mask.
    if (kv0 + KEYS_PER_WARP > visible_end) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int last = last_visible_key(token[r], kv0, KEYS_PER_WARP, seqlen_q, len, n_keys, causal);
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
          for (int i = 2 * r; i < 2 * r + 2; ++i)
            if (nt * 8 + frag::mma_c(lane, i).col > last) s_acc[nt][i] = -INFINITY;
      }
    }

    // ---- online softmax
    // Step 07's, for one m16 tile: exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)).
    float max_scaled[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = row_max[r];
#pragma unroll
      for (int nt = 0; nt < Tr::S_N_TILES; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * r], s_acc[nt][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // A row that has seen no key yet keeps max -inf; subtract 0 then, never -inf - (-inf).
      max_scaled[r] = tile_max == -INFINITY ? 0.0f : tile_max * a.scale_log2;
      const float correction = exp2_approx(row_max[r] * a.scale_log2 - max_scaled[r]);
      row_max[r] = tile_max;
      row_sum[r] *= correction;
#pragma unroll
      for (int nt = 0; nt < Tr::O_N_TILES; ++nt) {
        o_acc[nt][2 * r] *= correction;
        o_acc[nt][2 * r + 1] *= correction;
      }
#pragma unroll
      for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
        for (int i = 2 * r; i < 2 * r + 2; ++i) {
          s_acc[nt][i] = exp2_approx(fmaf(s_acc[nt][i], a.scale_log2, -max_scaled[r]));
          row_sum[r] += s_acc[nt][i];
        }
    }

    // ---- O += P·V
    // P for keys 16·kk ... 16·kk + 15 = S's n8 tiles 2·kk and 2·kk + 1 rounded to T in place
    // (frag::mma_a_reg_of_c); V's B fragments two n8 tiles of head dims (ldmatrix.x4.trans) at a time.
#pragma unroll
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
      uint32_t p_frag[4];
#pragma unroll
      for (int n_half = 0; n_half < 2; ++n_half)
#pragma unroll
        for (int i = 0; i < 4; i += 2)
          p_frag[frag::mma_a_reg_of_c(n_half, i)] = pack2<T>(s_acc[2 * kk + n_half][i], s_acc[2 * kk + n_half][i + 1]);
#pragma unroll
      for (int np = 0; np < Tr::O_N_TILES / 2; ++np) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_tile + qv_lane_off[np * 16 % Tr::SWIZZLE_COLS / 16] +
                                  Tr::origin(warp_key0 + kk * 16, np * 16));
        const uint32_t b_lo[2] = {vf[0], vf[1]}, b_hi[2] = {vf[2], vf[3]};
        mma_m16n8k16<T>(o_acc[2 * np], p_frag, b_lo);
        mma_m16n8k16<T>(o_acc[2 * np + 1], p_frag, b_hi);
      }
    }
  }

  // ---- epilogue: merge the warps (the LSE rule, in shared memory), then store
  // The groups still committed are empty; after the barrier no warp reads a K/V buffer again, and
  // they hold each warp's normalized O and LSE.
  cp_async_wait<0>();
  __syncthreads();
  float* o_part = reinterpret_cast<float*>(k_smem);                        // [NUM_WARPS][BLOCK_Q][O_STRIDE]
  float* lse_part = o_part + Tr::NUM_WARPS * BLOCK_Q * Tr::O_STRIDE;        // [NUM_WARPS][BLOCK_Q]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv_sum = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
    const frag::Coord c = frag::mma_c(lane, 2 * r);  // elements 2r, 2r+1: one row, two columns
    float* o_row = o_part + (warp * BLOCK_Q + c.row) * Tr::O_STRIDE;
#pragma unroll
    for (int nt = 0; nt < Tr::O_N_TILES; ++nt)
      *reinterpret_cast<float2*>(o_row + nt * 8 + c.col) =
          make_float2(o_acc[nt][2 * r] * inv_sum, o_acc[nt][2 * r + 1] * inv_sum);
    if (frag::thread_in_group(lane) == 0)
      lse_part[warp * BLOCK_Q + c.row] = sum > 0.0f ? row_max[r] * p.softmax_scale + logf(sum) : -INFINITY;
  }
  __syncthreads();

  // Each thread merges 8 columns of a row over the warps and stores them: O in the problem's dtype
  // (16 bytes) and LSE without a split, the split's normalized O in fp32 and its LSE with one.
#pragma unroll
  for (int i = 0; i < Tr::Q_CHUNKS_PER_THREAD; ++i) {
    const int c = i * Tr::NUM_THREADS + int(threadIdx.x);
    const int row = c / Tr::CHUNKS_PER_ROW, col = c % Tr::CHUNKS_PER_ROW * 8;
    if (row >= tile_rows || col >= head_dim) continue;
    float lse_max = -INFINITY;
#pragma unroll
    for (int wp = 0; wp < Tr::NUM_WARPS; ++wp) lse_max = fmaxf(lse_max, lse_part[wp * BLOCK_Q + row]);
    float weight_sum = 0.0f, acc[8] = {};
#pragma unroll
    for (int wp = 0; wp < Tr::NUM_WARPS; ++wp) {
      const float weight = lse_weight(lse_part[wp * BLOCK_Q + row], lse_max);
      const float4* src = reinterpret_cast<const float4*>(o_part + (wp * BLOCK_Q + row) * Tr::O_STRIDE + col);
      const float4 lo = src[0], hi = src[1];
      weight_sum += weight;
      acc[0] += weight * lo.x, acc[1] += weight * lo.y, acc[2] += weight * lo.z, acc[3] += weight * lo.w;
      acc[4] += weight * hi.x, acc[5] += weight * hi.y, acc[6] += weight * hi.z, acc[7] += weight * hi.w;
    }
    const float inv = weight_sum > 0.0f ? __fdividef(1.0f, weight_sum) : 0.0f;
    const PackedRow pr = packed_row(row0 + row, a.group);
    const int64_t head = int64_t(w.kv_head) * a.group + pr.head_in_group;
    const int64_t out_row = output_row(w.b, head, pr.token, p.heads_q, seqlen_q);
    if (a.splits == 1) {
      uint4 packed;
      packed.x = pack2<T>(acc[0] * inv, acc[1] * inv);
      packed.y = pack2<T>(acc[2] * inv, acc[3] * inv);
      packed.z = pack2<T>(acc[4] * inv, acc[5] * inv);
      packed.w = pack2<T>(acc[6] * inv, acc[7] * inv);
      *reinterpret_cast<uint4*>(o + offset_of(p.o, w.b, pr.token, head) + col) = packed;
      if (lse && col == 0) lse[out_row] = merged_lse(lse_max, weight_sum);
    } else {
      float4* dst = reinterpret_cast<float4*>(part_o + (int64_t(w.split) * a.rows_all + out_row) * head_dim + col);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
      if (col == 0) part_lse[int64_t(w.split) * a.rows_all + out_row] = merged_lse(lse_max, weight_sum);
    }
  }
}

// ---- the combine: one warp per row of O, merging its splits by the LSE rule ---------------------
inline constexpr int kCombineWarps = 4;
template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32)
    combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, T* __restrict__ o,
                   float* __restrict__ lse, const Problem p, const int splits, const int64_t rows_all) {
  __shared__ float weight[kCombineWarps][kMaxSplits];  // each warp's w_i of its row
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, head_dim = int(p.head_dim);
  for (int64_t row = int64_t(blockIdx.x) * kCombineWarps + warp; row < rows_all;
       row += int64_t(gridDim.x) * kCombineWarps) {
    float lse_max = -INFINITY;
    for (int s = lane; s < splits; s += 32) lse_max = fmaxf(lse_max, part_lse[s * rows_all + row]);
#pragma unroll
    for (int x = 16; x > 0; x /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, x));
    float weight_sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      weight[warp][s] = lse_weight(part_lse[s * rows_all + row], lse_max);
      weight_sum += weight[warp][s];
    }
#pragma unroll
    for (int x = 16; x > 0; x /= 2) weight_sum += __shfl_xor_sync(0xffffffffu, weight_sum, x);
    __syncwarp();  // every lane's weights are in shared memory
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
    const int64_t token = row % p.seqlen_q, head = row / p.seqlen_q % p.heads_q, b = row / (p.seqlen_q * p.heads_q);
    T* o_row = o + offset_of(p.o, b, token, head);
    for (int col = lane * 4; col < head_dim; col += 32 * 4) {  // head_dim is a multiple of 8
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s = 0; s < splits; ++s) {
        const float ws = weight[warp][s];
        const float4 x = *reinterpret_cast<const float4*>(part_o + (s * rows_all + row) * head_dim + col);
        acc.x += ws * x.x, acc.y += ws * x.y, acc.z += ws * x.z, acc.w += ws * x.w;
      }
      *reinterpret_cast<uint2*>(o_row + col) = make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
    }
    if (lse && lane == 0) lse[row] = merged_lse(lse_max, weight_sum);
    __syncwarp();  // the weights are read before the next row overwrites them
  }
}

}  // namespace fs::step10
