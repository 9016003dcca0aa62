// Step 07 — the FlashAttention-2 forward pass: every feature, at production speed.
//
// Extends step 06 (ldmatrix + mma.sync, P kept in registers, 16 query rows per warp). The one idea:
// give each warp 32 query rows, two m16 tiles, so that every K/V fragment it reads from shared
// memory feeds two mma instead of one. With 16 rows per warp, shared memory cannot feed the tensor
// cores faster than about half their rate (ANCHORS.md); with 32 it can. The accumulators of O and
// S for 32 rows then fill most of the 255 registers a thread may have (traits.h counts them), so Q
// no longer stays in registers: its fragments are re-read from shared memory at every k-step, like
// K's, and the K/V tile is as wide as the registers allow. Around that idea, what FlashAttention-2
// does and the earlier steps did not:
//
//   * K/V tiles are visited from the last to the first. The tiles that straddle the causal
//     diagonal or the end of K come first and are the only ones that build a mask (a separate
//     instantiation of the loop body); tiles entirely above the diagonal are never loaded, so
//     causal attention does about half the work.
//   * cp.async keeps the next tile in flight. With two K/V buffers tile t+1 is copied during all of
//     tile t, with one barrier per tile; with one buffer (where shared memory is short) the V copy
//     overlaps S = Q·Kᵀ and the next K copy overlaps the softmax and P·V, two barriers per tile.
//   * ldmatrix is double-buffered in registers: the next fragment is requested before the mma
//     instructions of the current one are issued.
//   * O goes through shared memory (Q's space, which each warp no longer needs) and leaves in
//     16-byte, fully coalesced stores instead of 4-byte ones.
//   * One traits table (traits.h) picks tiles per head_dim and GPU; any head_dim that is a multiple
//     of 8 runs, padded up to the next tile width (32, 64, 96, 128, 192, 256) with zero-filled loads.
//   * The 1-D grid keeps the query tiles of a head together (K/V stays in L2) and starts the
//     longest (causal) tiles first.
//
// Expected speed: FlashAttention-2's work split and pipeline, so about PyTorch's flash backend
// (FlashAttention-2) on the H200, 320-345 TFLOP/s at head_dim 128 without masking; the 48-key tiles
// that keep head_dim 128 free of register spills and the skipped O rescales took it past that
// (notes/07_flash_attention2.md walks through the kernel and has the measurements).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/dtype.cuh"
#include "common/fragment_layout.h"
#include "common/ptx.cuh"
#include "traits.h"

namespace fs::fa2 {

// Issues the cp.async copies of one [ROWS, HEAD_DIM] tile, rows first_row … first_row + ROWS - 1 of
// a tensor whose rows start `row_stride` elements apart at `gmem`, into `smem`, swizzled. Each pass
// of the block's threads copies ROWS_PER_PASS whole rows, consecutive threads taking consecutive 16
// bytes of a row. Rows at and past last_row + 1 and columns at and past head_dim are zero-filled
// through the src-size operand (0 bytes read): ragged tails and padded head dims need no branch.
// Their source address is clamped to a real element (row last_row, column 0).
template <class Tr, int ROWS, typename T>
__device__ __forceinline__ void copy_tile_async(T* smem, const T* gmem, int64_t row_stride, int first_row,
                                                int last_row, int head_dim) {
  constexpr int ROWS_PER_PASS = Tr::NUM_THREADS / Tr::CHUNKS_PER_ROW;
  constexpr int PASSES = (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
  const int row0 = threadIdx.x / Tr::CHUNKS_PER_ROW, col = threadIdx.x % Tr::CHUNKS_PER_ROW * 8;
  const int src_col = col < head_dim ? col : 0;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    // Only widths whose rows do not divide the block's threads evenly (96, 192) have idle threads.
    if ((Tr::NUM_THREADS % Tr::CHUNKS_PER_ROW == 0 || row0 < ROWS_PER_PASS) && (ROWS % ROWS_PER_PASS == 0 || row < ROWS)) {
      // The row index is multiplied inside the loop over K/V tiles (first_row changes), so the
      // compiler cannot hoist one 64-bit offset per copy out of it and keep them all in registers.
      const bool valid = row <= last_row - first_row && col < head_dim;
      const int src_row = first_row + min(row, last_row - first_row);
      ptx::cp_async_16(smem + Tr::Layout::offset(row, col), gmem + int64_t(src_row) * row_stride + src_col,
                       valid ? 16 : 0);
    }
  }
}

// One block = BLOCK_Q query rows of one (batch, head); warp w owns rows w·ROWS_PER_WARP … + ROWS_PER_WARP - 1,
// as M_TILES m16 tiles. Per lane, element (mi, r) of the row state is row g + 8r of m16 tile mi
// (g = lane / 4, frag::mma_c).
template <typename T, int CONFIG>
__global__ void __launch_bounds__(Traits<CONFIG>::NUM_THREADS)
    flash_attention2_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                            T* __restrict__ o, float* __restrict__ lse, const Problem p, const float scale_log2) {
  using Tr = Traits<CONFIG>;
  using Layout = typename Tr::Layout;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, M_TILES = Tr::M_TILES;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);         // [BLOCK_Q, HEAD_DIM], swizzled; O in the epilogue
  T* k_smem = q_smem + Tr::Q_ELEMS;                   // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + Tr::KV_STAGES * Tr::KV_ELEMS;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled

  // Block and head indices are below 2^31 (supports() checks the grid), so 32-bit divisions do:
  // 64-bit ones would be slow subroutine calls.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k), head_dim = int(p.head_dim);
  const unsigned q_tiles = (unsigned(seqlen_q) + BLOCK_Q - 1) / BLOCK_Q;
  const BlockTile tile = block_tile(blockIdx.x, q_tiles);
  const unsigned h = tile.bh % unsigned(p.heads_q), b = tile.bh / unsigned(p.heads_q);
  const unsigned h_kv = h / (unsigned(p.heads_q) / unsigned(p.heads_kv));  // GQA: kv_head_of(p, h)
  const int q0 = tile.q_tile * BLOCK_Q;
  const int q_rows = min(BLOCK_Q, seqlen_q - q0);  // real query rows in this tile

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * Tr::ROWS_PER_WARP;  // first row of this warp inside the block's tile

  const KvTiles kv = kv_tiles_for(q0, q_rows, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0);
  const int kv_tiles = kv.count, masked_tiles = kv.count - kv.unmasked;

  const T* q_tile = q + offset_of(p.q, b, q0, h);
  const T* k_head = k + offset_of(p.k, b, 0, h_kv);
  const T* v_head = v + offset_of(p.v, b, 0, h_kv);

  // K/V tile j (keys j·BLOCK_KV …) into one buffer; keys past seqlen_k are zero-filled.
  auto copy_kv_tile = [&](T* smem, const T* head, int64_t row_stride, int j) {
    copy_tile_async<Tr, BLOCK_KV>(smem, head, row_stride, j * BLOCK_KV, seqlen_k - 1, head_dim);
  };

  // ---- load Q
  // Q and the first K tile (and its V, with two buffers) go out as one cp.async group. A tile whose
  // rows see no key at all (causal, seqlen_q > seqlen_k) loads nothing and writes O = 0, LSE = -inf.
  if (kv_tiles > 0) {
    copy_tile_async<Tr, BLOCK_Q>(q_smem, q_tile, p.q.row, 0, q_rows - 1, head_dim);
    copy_kv_tile(k_smem, k_head, p.k.row, kv_tiles - 1);
    if constexpr (Tr::KV_STAGES == 2) copy_kv_tile(v_smem, v_head, p.v.row, kv_tiles - 1);
    ptx::cp_async_commit();
  }

  float o_acc[M_TILES][Tr::O_N_TILES][4] = {};  // [ROWS_PER_WARP, HEAD_DIM] fp32, C layout (frag::mma_c)
  float row_max[M_TILES][2], row_sum[M_TILES][2];  // raw-score max (scale not applied); this lane's part of the sum
#pragma unroll
  for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mi][r] = -INFINITY;
      row_sum[mi][r] = 0.0f;
    }

  // Where this lane points ldmatrix, as the LANE_OFFSETS offsets of Traits::origin. Q and V are read
  // as 16×16 tiles in the quadrant order of frag::ldmatrix_x4_quadrants, K in the order that puts
  // each n8 tile's b[0], b[1] in neighbouring registers (ldmatrix_x4_k_pair), as mma wants them.
  int qv_lane_off[Tr::LANE_OFFSETS], k_lane_off[Tr::LANE_OFFSETS];
#pragma unroll
  for (int u = 0; u < Tr::LANE_OFFSETS; ++u) {
    const frag::Coord qv = frag::ldmatrix_x4_quadrants(lane), kp = ldmatrix_x4_k_pair(lane);
    qv_lane_off[u] = Layout::offset(qv.row, 16 * u + qv.col);
    k_lane_off[u] = Layout::offset(kp.row, 16 * u + kp.col);
  }
  const T* q_warp = q_smem + Tr::origin(warp_row0, 0);  // this warp's rows of Q

  // One K/V tile: the t-th visited, tile j = kv_tiles - 1 - t. MASKED (a compile-time constant) is
  // true for the first masked_tiles visits only.
  auto process_tile = [&](const int t, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    const int j = kv_tiles - 1 - t;
    const int stage = Tr::KV_STAGES == 2 ? t % 2 : 0;
    const T* k_tile = k_smem + stage * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled
    const T* v_tile = v_smem + stage * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled

    // This thread's copies of K(j) (and V(j) with two buffers) are the only group in flight. The
    // barrier then does two jobs: everyone's copies are visible, and every warp has finished tile
    // t-1, so the buffers it used may be refilled.
    ptx::cp_async_wait<0>();
    __syncthreads();
    if constexpr (Tr::KV_STAGES == 2) {
      if (t + 1 < kv_tiles) {  // tile t+1 is copied during all of tile t
        copy_kv_tile(k_smem + (stage ^ 1) * Tr::KV_ELEMS, k_head, p.k.row, j - 1);
        copy_kv_tile(v_smem + (stage ^ 1) * Tr::KV_ELEMS, v_head, p.v.row, j - 1);
      }
    } else {
      copy_kv_tile(v_smem, v_head, p.v.row, j);  // V(j) is copied during S = Q·Kᵀ
    }
    ptx::cp_async_commit();

    // ---- S = Q·Kᵀ
    // k16 steps over head dims; in each, Q's A fragments for the warp's M_TILES m16 tiles, then K's
    // B fragments two n8 tiles (one ldmatrix.x4) at a time, each followed by its 2·M_TILES mma.
    // ldmatrix is double-buffered: the next x4 (and at the end of a step the next step's Q) is
    // requested before the mma instructions of the current one are issued.
    float s_acc[M_TILES][Tr::S_N_TILES][4] = {};  // [ROWS_PER_WARP, BLOCK_KV] fp32, C layout
    {
      constexpr int K_PAIRS = Tr::S_N_TILES / 2;
      uint32_t q_frag[2][M_TILES][4];  // [2 steps][m16 tile]: Q [16 rows, 16 dims] as A (quadrants = a[0..3])
      uint32_t k_frag[2][4];           // [2 loads]: K [16 keys, 16 dims] as the B of two n8 tiles
      auto load_q = [&](const int ks) {
#pragma unroll
        for (int mi = 0; mi < M_TILES; ++mi)
          ptx::ldmatrix_x4(q_frag[ks % 2][mi],
                           q_warp + qv_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(mi * 16, ks * 16));
      };
      auto load_k = [&](const int ks, const int np) {
        ptx::ldmatrix_x4(k_frag[(ks * K_PAIRS + np) % 2],
                         k_tile + k_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(np * 16, ks * 16));
      };
      load_q(0);
      load_k(0, 0);
#pragma unroll
      for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
#pragma unroll
        for (int np = 0; np < K_PAIRS; ++np) {
          if (np + 1 < K_PAIRS) {
            load_k(ks, np + 1);
          } else if (ks + 1 < Tr::QK_K_STEPS) {
            load_q(ks + 1);
            load_k(ks + 1, 0);
          }
          const uint32_t* kf = k_frag[(ks * K_PAIRS + np) % 2];
          const uint32_t b_lo[2] = {kf[0], kf[1]}, b_hi[2] = {kf[2], kf[3]};
#pragma unroll
          for (int mi = 0; mi < M_TILES; ++mi) {
            ptx::mma_m16n8k16<T>(s_acc[mi][2 * np], q_frag[ks % 2][mi], b_lo);
            ptx::mma_m16n8k16<T>(s_acc[mi][2 * np + 1], q_frag[ks % 2][mi], b_hi);
          }
        }
    }

    // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get -inf.
    // Only the first masked_tiles visits get here; every other tile is seen whole by every row.
    if constexpr (MASKED) {
      const int kv0 = j * BLOCK_KV;
#pragma unroll
      for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t row = int64_t(q0) + warp_row0 + mi * 16 + frag::mma_c(lane, 2 * r).row;
          const int last = last_visible_key(row, kv0, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0);
#pragma unroll
          for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
            for (int i = 2 * r; i < 2 * r + 2; ++i)
              if (nt * 8 + frag::mma_c(lane, i).col > last) s_acc[mi][nt][i] = -INFINITY;
        }
    }

    if constexpr (Tr::KV_STAGES == 1) {
      // V(j) has landed; every warp is done reading K(j), so K(j-1) may overwrite it and is copied
      // during the softmax and P·V.
      ptx::cp_async_wait<0>();
      __syncthreads();
      if (t + 1 < kv_tiles) copy_kv_tile(k_smem, k_head, p.k.row, j - 1);
      ptx::cp_async_commit();
    }

    // ---- online softmax
    // exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)): one FMA and one MUFU ex2 per score.
    float max_scaled[M_TILES][2];  // the new row max, times scale·log2(e)
    float correction[M_TILES][2];  // exp2 of (old max - new max)·scale·log2(e): 1 where it did not grow
    bool max_grew = false;
#pragma unroll
    for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = row_max[mi][r];
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
          tile_max = fmaxf(tile_max, fmaxf(s_acc[mi][nt][2 * r], s_acc[mi][nt][2 * r + 1]));
        // The 4 lanes of a row (same g, t = 0..3) are lanes 4g … 4g+3: XOR 1 and 2 reach them all.
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        // A row that has seen no key yet keeps max -inf; subtract 0 then, so -inf - (-inf) never
        // makes a NaN (its p are exp2(-inf) = 0 and its correction 0).
        max_scaled[mi][r] = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
        correction[mi][r] = ptx::exp2_approx(row_max[mi][r] * scale_log2 - max_scaled[mi][r]);
        max_grew |= tile_max > row_max[mi][r];
        row_max[mi][r] = tile_max;
      }
    // Rescaling O costs HEAD_DIM/4 multiplies per row and tile; once the maxima settle (after the
    // first few tiles) every correction is exactly 1, so a warp whose rows' maxima did not grow skips
    // it. The vote keeps the branch uniform across the warp.
    if (__any_sync(0xffffffffu, max_grew)) {
#pragma unroll
      for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // Each lane keeps the sum of its own columns; the 4 lanes of a row share `correction`, so
          // their partial sums are added once, in the epilogue.
          row_sum[mi][r] *= correction[mi][r];
#pragma unroll
          for (int nt = 0; nt < Tr::O_N_TILES; ++nt) {
            o_acc[mi][nt][2 * r] *= correction[mi][r];
            o_acc[mi][nt][2 * r + 1] *= correction[mi][r];
          }
        }
    }
#pragma unroll
    for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
          for (int i = 2 * r; i < 2 * r + 2; ++i) {
            s_acc[mi][nt][i] = ptx::exp2_approx(fmaf(s_acc[mi][nt][i], scale_log2, -max_scaled[mi][r]));
            row_sum[mi][r] += s_acc[mi][nt][i];
          }

    // ---- O += P·V
    // P for keys 16·kk … 16·kk + 15 = the accumulators of S's n8 tiles 2·kk and 2·kk + 1, rounded to
    // T in place of the fp32 scores (frag::mma_a_reg_of_c). Then k16 steps over keys; in each, V's B
    // fragments two n8 tiles of head dims (one ldmatrix.x4.trans) at a time, double-buffered as above.
    {
      uint32_t p_frag[M_TILES][Tr::PV_K_STEPS][4];  // [ROWS_PER_WARP, BLOCK_KV] as A, fp16/bf16
#pragma unroll
      for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
        for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
#pragma unroll
          for (int n_half = 0; n_half < 2; ++n_half)
#pragma unroll
            for (int i = 0; i < 4; i += 2)
              p_frag[mi][kk][frag::mma_a_reg_of_c(n_half, i)] =
                  ptx::pack2<T>(s_acc[mi][2 * kk + n_half][i], s_acc[mi][2 * kk + n_half][i + 1]);

      constexpr int V_PAIRS = Tr::O_N_TILES / 2;
      uint32_t v_frag[2][4];  // [2 loads]: V [16 keys, 16 dims] through .trans as the B of two n8 tiles
      auto load_v = [&](const int kk, const int np) {
        ptx::ldmatrix_x4_trans(v_frag[(kk * V_PAIRS + np) % 2],
                               v_tile + qv_lane_off[np * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(kk * 16, np * 16));
      };
      load_v(0, 0);
#pragma unroll
      for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
#pragma unroll
        for (int np = 0; np < V_PAIRS; ++np) {
          if (np + 1 < V_PAIRS)
            load_v(kk, np + 1);
          else if (kk + 1 < Tr::PV_K_STEPS)
            load_v(kk + 1, 0);
          // Quadrants of V [key, dim] through .trans: 0 = keys 0-7 × dims 0-7 (b[0] of n8 tile 2·np),
          // 1 = keys 8-15 × dims 0-7 (its b[1]), 2 and 3 = the same keys × dims 8-15 (tile 2·np + 1).
          const uint32_t* vf = v_frag[(kk * V_PAIRS + np) % 2];
          const uint32_t b_lo[2] = {vf[0], vf[1]}, b_hi[2] = {vf[2], vf[3]};
#pragma unroll
          for (int mi = 0; mi < M_TILES; ++mi) {
            ptx::mma_m16n8k16<T>(o_acc[mi][2 * np], p_frag[mi][kk], b_lo);
            ptx::mma_m16n8k16<T>(o_acc[mi][2 * np + 1], p_frag[mi][kk], b_hi);
          }
        }
    }
  };

  for (int t = 0; t < masked_tiles; ++t) process_tile(t, std::true_type{});
  for (int t = masked_tiles; t < kv_tiles; ++t) process_tile(t, std::false_type{});

  // ---- epilogue
  // Each lane summed only its own columns; the row sum is the sum over the row's 4 lanes. A row that
  // saw no key has row_sum 0: O = 0 and LSE = -inf, never NaN. (__fdividef: the MUFU reciprocal,
  // 2 ulp, without the subroutine call of an IEEE division; row_sum <= seqlen_k.)
  float inv_sum[M_TILES][2];
#pragma unroll
  for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mi][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv_sum[mi][r] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
      const int row = warp_row0 + mi * 16 + frag::mma_c(lane, 2 * r).row;  // inside the tile
      if (lse && frag::thread_in_group(lane) == 0 && row < q_rows)
        lse[int64_t(tile.bh) * seqlen_q + q0 + row] =
            sum > 0.0f ? row_max[mi][r] * p.softmax_scale + logf(sum) : -INFINITY;
    }

  // O, normalized and rounded, into this warp's own rows of q_smem (no other warp reads them: each
  // warp reads only its own rows of Q), then out in 16-byte chunks, consecutive lanes writing
  // consecutive chunks of a row. Both passes are conflict-free with the swizzle.
  T* o_smem = q_smem;  // [BLOCK_Q, HEAD_DIM], swizzled
  __syncwarp();        // this warp's last ldmatrix of Q is behind every lane
#pragma unroll
  for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const frag::Coord c = frag::mma_c(lane, 2 * r);  // elements 2r, 2r+1: one row, two columns
#pragma unroll
      for (int nt = 0; nt < Tr::O_N_TILES; ++nt)
        *reinterpret_cast<uint32_t*>(o_smem + Layout::offset(warp_row0 + mi * 16 + c.row, nt * 8 + c.col)) =
            ptx::pack2<T>(o_acc[mi][nt][2 * r] * inv_sum[mi][r], o_acc[mi][nt][2 * r + 1] * inv_sum[mi][r]);
    }
  __syncwarp();  // every lane's part of the warp's rows is in shared memory
  T* o_tile = o + offset_of(p.o, b, q0, h);
#pragma unroll
  for (int i = 0; i < Tr::ROWS_PER_WARP * Tr::CHUNKS_PER_ROW / 32; ++i) {
    const int c = i * 32 + lane;
    const int row = warp_row0 + c / Tr::CHUNKS_PER_ROW, col = (c % Tr::CHUNKS_PER_ROW) * 8;
    if (row < q_rows && col < head_dim)
      *reinterpret_cast<uint4*>(o_tile + row * p.o.row + col) =
          *reinterpret_cast<const uint4*>(o_smem + Layout::offset(row, col));
  }
}

template <int CONFIG, typename T>
void launch_config(const Problem& p, const Tensors& t, cudaStream_t stream) {
  using Tr = Traits<CONFIG>;
  auto* kernel = flash_attention2_kernel<T, CONFIG>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::SMEM_BYTES));
  // All of the SM's unified L1/shared memory as shared memory, so that two blocks fit (cp.async.cg
  // bypasses L1, so the kernel loses nothing).
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  const float scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);  // scale · log2(e)
  kernel<<<unsigned(grid_blocks(p, Tr::BLOCK_Q)), Tr::NUM_THREADS, Tr::SMEM_BYTES, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o),
      t.lse, p, scale_log2);
  CHECK_LAUNCH();
}

}  // namespace fs::fa2
