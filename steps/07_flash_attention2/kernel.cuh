// Step 07 — FlashAttention-2: step 06's tensor-core kernel with the seven ideas that make it as fast as
// FlashAttention-2, each one a lettered sub-step (07a … 07g) so that the ladder measures what each buys.
//
// Extends step 06 (ldmatrix + mma.sync, P kept in registers, 16 query rows per warp, 64-row blocks).
// The kernel is templated on Traits<HEAD_DIM, BLOCK_Q, BLOCK_KV, NUM_WARPS, KV_STAGES, IDEAS> (traits.h);
// `if constexpr (Tr::has(idea))` marks where each idea changes step 06's code:
//
//   07a kRows32            each warp owns 32 query rows (two m16 tiles), so every K and V fragment it
//                          reads from shared memory feeds two mma instead of one: with 16 rows per
//                          warp, shared memory cannot feed the tensor cores faster than about 60 % of
//                          their rate. The accumulators of O and S for 32 rows then fill most of the
//                          255 registers a thread may have (traits.h counts them), so the K/V tile is
//                          as wide as the registers allow; K is read two n8 tiles at a time
//                          (ldmatrix.x4), as V is, and each lane's ldmatrix addresses are one lane
//                          offset plus a compile-time constant (Traits::origin).
//   07b kWorkOrder         K/V tiles are visited from the last to the first, so the tiles that
//                          straddle the causal diagonal or the end of K come first and are the only
//                          ones that build a mask (a separate instantiation of the loop body); before
//                          it, every tile is masked. And a 1-D grid instead of step 06's 2-D one: the
//                          same block order (a head's query tiles together, the longest first), with
//                          no 65535 limit on batch·heads and no loop over them.
//   07c kLdmatrixPipeline  ldmatrix is double-buffered in registers: the next fragment is requested
//                          before the mma instructions of the current one are issued.
//   07d kSmemEpilogue      O goes through shared memory (Q's space, which each warp no longer needs)
//                          and leaves in 16-byte, fully coalesced stores instead of 4-byte ones.
//   07e kRescaleSkip       once the row maxima settle, every correction factor is exactly 1: a warp
//                          whose maxima did not grow skips the rescale of O.
//   07f kFastExp2          exp2 as one MUFU instruction (ex2.approx.ftz) instead of exp2f's range checks.
//   07g kHeadDimTable      every head_dim and GPU by traits.h's table (tiles 32 … 256 wide, one K/V
//                          buffer where shared memory is short, 8 warps at 192, 256); 128 × 48 at d 128:
//                          1.05–1.09× 07f at N 1k–16k (bench/results/compare_torch-20261130-212252.json).
//
// Expected speed: FlashAttention-2's work split and pipeline, so about PyTorch's flash backend
// (FlashAttention-2) on the H200 at head_dim 64 and 128; notes/07_flash_attention2.md has the
// ablation, each sub-step against the one before, measured in one run.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/07_flash_attention2/traits.h"

namespace fs::step07 {

// ---- step 05's instruction ------------------------------------------------------------------------
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

// ---- step 06's instructions ---------------------------------------------------------------------

// The 32-bit shared-memory address that ldmatrix takes.
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ldmatrix.m8n8: 8×8 matrices of 16-bit elements from shared memory into registers. Lane 8·m + r
// gives the 16-byte address of row r of matrix m; afterwards register m of lane l holds two
// elements of matrix m: row l/4, columns 2·(l%4) and +1 — or, with .trans, column l/4, rows 2·(l%4)
// and +1 (frag::ldmatrix_element).
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

// d += a·b for one 16×8×16 tile, fp32 accumulators: a = A 16×16 (4 registers of 2 elements,
// frag::mma_a), b = B 16×8 (2 registers, frag::mma_b), d = C/D 16×8 (4 floats, frag::mma_c).
// "row.col": A is read row by row and B column by column, which is how both fragments are laid out.
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

// Two floats -> one 32-bit register of two fp16/bf16 (lo in the low half), round to nearest: an A
// register of P, or two neighbouring elements of O.
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

// One x4 of B (from ldmatrix_x4_k_pair's K order, or V's quadrants through .trans) holds the B fragments
// of two neighbouring n8 tiles: b[0], b[1] for tile 2·np and b[2], b[3] for tile 2·np + 1. Both
// products with the same A: acc[2·np] += a·B_lo, acc[2·np + 1] += a·B_hi.
template <typename T, int N_TILES>
__device__ __forceinline__ void mma_n8_pair(float (&acc)[N_TILES][4], const int np, const uint32_t (&a)[4],
                                            const uint32_t* b) {
  const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
  mma_m16n8k16<T>(acc[2 * np], a, b_lo);
  mma_m16n8k16<T>(acc[2 * np + 1], a, b_hi);
}

// 2^x. Step 06 calls exp2f, accurate to 2 ulp over the full range: MUFU.EX2 plus instructions that
// scale arguments whose result would be subnormal. With kFastExp2, ex2.approx.ftz: MUFU.EX2 alone
// (relative error about 2^-22, subnormal results flushed to 0, 2^-inf = 0), all a softmax needs.
template <class Tr>
__device__ __forceinline__ float exp2_(float x) {
  if constexpr (Tr::has(kFastExp2)) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  } else {
    return exp2f(x);
  }
}

// Issues the cp.async copies of one [ROWS, HEAD_DIM] tile, rows first_row … first_row + ROWS - 1 of
// a tensor whose rows start `row_stride` elements apart at `gmem`, into `smem`, swizzled. Each pass
// of the block's threads copies ROWS_PER_PASS whole rows, consecutive threads taking consecutive 16
// bytes of a row. Rows at and past last_row + 1 and columns at and past head_dim are zero-filled
// through the src-size operand (0 bytes read): ragged tails and padded head dims need no branch.
// Their source address is clamped to a real element (the row to last_row, a column past head_dim to 0).
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
      cp_async_16(smem + Tr::Layout::offset(row, col), gmem + int64_t(src_row) * row_stride + src_col,
                  valid ? 16 : 0);
    }
  }
}

// One block's work: BLOCK_Q query rows (query tile q_tile) of one (batch, head) bh. Warp w owns rows
// w·ROWS_PER_WARP … + ROWS_PER_WARP - 1, as M_TILES m16 tiles. Per lane, element (mi, r) of the row
// state is row g + 8r of m16 tile mi (g = lane / 4, frag::mma_c).
template <typename T, class Tr>
__device__ __forceinline__ void attend(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                       T* __restrict__ o, float* __restrict__ lse, const Problem& p,
                                       const float scale_log2, T* smem, const uint32_t bh, const int q_tile) {
  using Layout = typename Tr::Layout;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, M_TILES = Tr::M_TILES;

  T* q_smem = smem;                                   // [BLOCK_Q, HEAD_DIM], swizzled  // From 07d: O in the epilogue
  T* k_smem = q_smem + Tr::Q_ELEMS;                   // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + Tr::KV_STAGES * Tr::KV_ELEMS;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], swizzled

  // Head indices are below 2^31 (the harness checks batch·heads_q), so 32-bit divisions do: 64-bit
  // ones would be slow subroutine calls.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k), head_dim = int(p.head_dim);
  const unsigned h = bh % unsigned(p.heads_q), b = bh / unsigned(p.heads_q);
  const unsigned h_kv = h / (unsigned(p.heads_q) / unsigned(p.heads_kv));  // GQA: kv_head_of(p, h)
  const int q0 = q_tile * BLOCK_Q;
  const int q_rows = min(BLOCK_Q, seqlen_q - q0);  // real query rows in this tile

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * Tr::ROWS_PER_WARP;  // first row of this warp inside the block's tile

  const KvTiles kv = kv_tiles_for(q0, q_rows, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0);
  const int kv_tiles = kv.count;
  // Before 07b: visit t is K/V tile t, from the first up.
  // From 07b: visit t is K/V tile kv_tiles - 1 - t, from the last down.
  auto tile_of = [&](const int t) { return Tr::has(kWorkOrder) ? kv_tiles - 1 - t : t; };

  const T* q_tile_ptr = q + offset_of(p.q, b, q0, h);
  const T* k_head = k + offset_of(p.k, b, 0, h_kv);
  const T* v_head = v + offset_of(p.v, b, 0, h_kv);

  // K/V tile j (keys j·BLOCK_KV …) into one buffer; keys past seqlen_k are zero-filled.
  auto copy_kv_tile = [&](T* buffer, const T* head, int64_t row_stride, int j) {
    copy_tile_async<Tr, BLOCK_KV>(buffer, head, row_stride, j * BLOCK_KV, seqlen_k - 1, head_dim);
  };

  // ---- load Q
  // Before 07g: Q and the first K and V tiles go out as one cp.async group.
  // From 07g: Q and the first K tile (and its V, with two buffers) go out as one cp.async group.
  // A tile whose rows see no key at all (causal, seqlen_q > seqlen_k) loads nothing and writes O = 0,
  // LSE = -inf.
  if (kv_tiles > 0) {
    copy_tile_async<Tr, BLOCK_Q>(q_smem, q_tile_ptr, p.q.row, 0, q_rows - 1, head_dim);
    copy_kv_tile(k_smem, k_head, p.k.row, tile_of(0));
    if constexpr (Tr::KV_STAGES == 2) copy_kv_tile(v_smem, v_head, p.v.row, tile_of(0));
    cp_async_commit();
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

  // One K/V tile: the t-th visited. MASKED (a compile-time constant) builds the mask of the end of K
  // and of the causal diagonal.
  auto process_tile = [&](const int t, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    const int j = tile_of(t);
    const int stage = Tr::KV_STAGES == 2 ? t % 2 : 0;
    const T* k_tile = k_smem + stage * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled
    const T* v_tile = v_smem + stage * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled

    // Before 07g: this thread's copies of K(j) and V(j) are the only group in flight.
    // From 07g: this thread's copies of K(j) (and V(j) with two buffers) are the only group in flight.
    // The barrier then does two jobs: everyone's copies are visible, and every warp has finished visit
    // t-1, so the buffers it used may be refilled.
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (Tr::KV_STAGES == 2) {
      if (t + 1 < kv_tiles) {  // the next tile is copied during all of this one
        copy_kv_tile(k_smem + (stage ^ 1) * Tr::KV_ELEMS, k_head, p.k.row, tile_of(t + 1));
        copy_kv_tile(v_smem + (stage ^ 1) * Tr::KV_ELEMS, v_head, p.v.row, tile_of(t + 1));
      }
    } else {
      copy_kv_tile(v_smem, v_head, p.v.row, j);  // V(j) is copied during S = Q·Kᵀ
    }
    cp_async_commit();

    // ---- S = Q·Kᵀ
    // k16 steps over head dims; in each, Q's A fragments for the warp's M_TILES m16 tiles, then K's
    // B fragments two n8 tiles (one ldmatrix.x4) at a time, each followed by its 2·M_TILES mma.
    // From 07c: the next x4 (and at the end of a step the next step's Q) is requested before the mma
    // instructions of the current one are issued.
    float s_acc[M_TILES][Tr::S_N_TILES][4] = {};  // [ROWS_PER_WARP, BLOCK_KV] fp32, C layout
    if constexpr (Tr::has(kLdmatrixPipeline)) {
      constexpr int K_PAIRS = Tr::S_N_TILES / 2;
      uint32_t q_frag[2][M_TILES][4];  // [2 steps][m16 tile]: Q [16 rows, 16 dims] as A (quadrants = a[0..3])
      uint32_t k_frag[2][4];           // [2 loads]: K [16 keys, 16 dims] as the B of two n8 tiles
      auto load_q = [&](const int ks) {
#pragma unroll
        for (int mi = 0; mi < M_TILES; ++mi)
          ldmatrix_x4(q_frag[ks % 2][mi], q_warp + qv_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(mi * 16, ks * 16));
      };
      auto load_k = [&](const int ks, const int np) {
        ldmatrix_x4(k_frag[(ks * K_PAIRS + np) % 2],
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
#pragma unroll
          for (int mi = 0; mi < M_TILES; ++mi)
            mma_n8_pair<T>(s_acc[mi], np, q_frag[ks % 2][mi], k_frag[(ks * K_PAIRS + np) % 2]);
        }
    } else {
#pragma unroll
      for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
        uint32_t q_frag[M_TILES][4];  // [m16 tile]: Q [16 rows, 16 dims] as A (quadrants = a[0..3])
#pragma unroll
        for (int mi = 0; mi < M_TILES; ++mi)
          ldmatrix_x4(q_frag[mi], q_warp + qv_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(mi * 16, ks * 16));
#pragma unroll
        for (int np = 0; np < Tr::S_N_TILES / 2; ++np) {
          uint32_t k_frag[4];  // K [16 keys, 16 dims] as the B of two n8 tiles
          ldmatrix_x4(k_frag, k_tile + k_lane_off[ks * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(np * 16, ks * 16));
#pragma unroll
          for (int mi = 0; mi < M_TILES; ++mi) mma_n8_pair<T>(s_acc[mi], np, q_frag[mi], k_frag);
        }
      }
    }

    // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get -inf.
    // Before 07b: in every tile, inside the softmax's loop over rows below (step 06's code).
    // From 07b: only in the masked tiles, in a pass of its own.
    const int kv0 = j * BLOCK_KV;  // the tile's first key
    if constexpr (MASKED && Tr::has(kWorkOrder)) {
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
      // V(j) has landed; every warp is done reading K(j), so the next K may overwrite it and is copied
      // during the softmax and P·V.
      cp_async_wait<0>();
      __syncthreads();
      if (t + 1 < kv_tiles) copy_kv_tile(k_smem, k_head, p.k.row, tile_of(t + 1));
      cp_async_commit();
    }

    // ---- online softmax
    // exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)): one FMA and one exp2 per score.
    // Before 07e: step 06's loop, each row's max, rescale and exponentials in turn; the 4 lanes of a
    // row are lanes 4g … 4g + 3.
    // From 07e: the maxima of all rows first, so that the warp can vote on them before any rescale.
    if constexpr (!Tr::has(kRescaleSkip)) {
#pragma unroll
      for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = q0 + warp_row0 + mi * 16 + frag::mma_c(lane, 2 * r).row;
          // Before 07b: the last key row g + 8r may see: the end of K, or with causal the diagonal
          // (j <= i + Sk - Sq). Every key of every tile is compared with it, as in step 06, in 32 bits
          // (64-bit compares cost registers that the 32 rows need).
          const int last_key = p.causal ? min(seqlen_k - 1, row + (seqlen_k - seqlen_q)) : seqlen_k - 1;
          float tile_max = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
            for (int i = 2 * r; i < 2 * r + 2; ++i) {
              if constexpr (!Tr::has(kWorkOrder))
                if (kv0 + nt * 8 + frag::mma_c(lane, i).col > last_key) s_acc[mi][nt][i] = -INFINITY;
              tile_max = fmaxf(tile_max, s_acc[mi][nt][i]);
            }
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          const float new_max = fmaxf(row_max[mi][r], tile_max);
          // A row that has seen no key yet (new_max = -inf) subtracts 0 instead: 2^(-inf) = 0, not NaN.
          const float max_used = new_max == -INFINITY ? 0.0f : new_max;
          const float max_scaled = max_used * scale_log2;
          const float rescale = exp2f((row_max[mi][r] - max_used) * scale_log2);  // 1 if the max held, 0 the first time
          row_max[mi][r] = new_max;
          row_sum[mi][r] *= rescale;
#pragma unroll
          for (int nt = 0; nt < Tr::O_N_TILES; ++nt) {
            o_acc[mi][nt][2 * r] *= rescale;
            o_acc[mi][nt][2 * r + 1] *= rescale;
          }
#pragma unroll
          for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
            for (int i = 2 * r; i < 2 * r + 2; ++i) {
              s_acc[mi][nt][i] = exp2f(fmaf(s_acc[mi][nt][i], scale_log2, -max_scaled));  // P, in place of S
              row_sum[mi][r] += s_acc[mi][nt][i];
            }
        }
    } else {
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
          correction[mi][r] = exp2_<Tr>(row_max[mi][r] * scale_log2 - max_scaled[mi][r]);
          max_grew |= tile_max > row_max[mi][r];
          row_max[mi][r] = tile_max;
        }
      // Rescaling O costs each thread HEAD_DIM/4 multiplies per row it holds and tile.
      // From 07e: a warp whose rows' maxima did not grow skips it (every correction is exactly 1); the
      // vote keeps the branch uniform.
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
              s_acc[mi][nt][i] = exp2_<Tr>(fmaf(s_acc[mi][nt][i], scale_log2, -max_scaled[mi][r]));
              row_sum[mi][r] += s_acc[mi][nt][i];
            }
    }

    // ---- O += P·V
    // P for keys 16·kk … 16·kk + 15 = the accumulators of S's n8 tiles 2·kk and 2·kk + 1, rounded to
    // T in place of the fp32 scores (frag::mma_a_reg_of_c). Then k16 steps over keys; in each, V's B
    // fragments two n8 tiles of head dims (one ldmatrix.x4.trans) at a time.
    // From 07c: all of P first, then V double-buffered as above.
    {
      if constexpr (Tr::has(kLdmatrixPipeline)) {
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
                    pack2<T>(s_acc[mi][2 * kk + n_half][i], s_acc[mi][2 * kk + n_half][i + 1]);

        constexpr int V_PAIRS = Tr::O_N_TILES / 2;
        uint32_t v_frag[2][4];  // [2 loads]: V [16 keys, 16 dims] through .trans as the B of two n8 tiles
        auto load_v = [&](const int kk, const int np) {
          ldmatrix_x4_trans(v_frag[(kk * V_PAIRS + np) % 2],
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
#pragma unroll
            for (int mi = 0; mi < M_TILES; ++mi)
              mma_n8_pair<T>(o_acc[mi], np, p_frag[mi][kk], v_frag[(kk * V_PAIRS + np) % 2]);
          }
      } else {
#pragma unroll
        for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
          uint32_t p_frag[M_TILES][4];  // [m16 tile]: P [16 rows, keys 16·kk …] as A, fp16/bf16
#pragma unroll
          for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
            for (int n_half = 0; n_half < 2; ++n_half)
#pragma unroll
              for (int i = 0; i < 4; i += 2)
                p_frag[mi][frag::mma_a_reg_of_c(n_half, i)] =
                    pack2<T>(s_acc[mi][2 * kk + n_half][i], s_acc[mi][2 * kk + n_half][i + 1]);
#pragma unroll
          for (int np = 0; np < Tr::O_N_TILES / 2; ++np) {
            uint32_t v_frag[4];  // V [16 keys, 16 dims] through .trans as the B of two n8 tiles
            ldmatrix_x4_trans(v_frag, v_tile + qv_lane_off[np * 16 % Tr::SWIZZLE_COLS / 16] + Tr::origin(kk * 16, np * 16));
            // Quadrants of V [key, dim] through .trans: 0 = keys 0-7 × dims 0-7 (b[0] of n8 tile 2·np),
            // 1 = keys 8-15 × dims 0-7 (its b[1]), 2 and 3 = the same keys × dims 8-15 (tile 2·np + 1).
#pragma unroll
            for (int mi = 0; mi < M_TILES; ++mi) mma_n8_pair<T>(o_acc[mi], np, p_frag[mi], v_frag);
          }
        }
      }
    }
  };

  if constexpr (Tr::has(kWorkOrder)) {
    const int masked_tiles = kv.count - kv.unmasked;
    for (int t = 0; t < masked_tiles; ++t) process_tile(t, std::true_type{});
    for (int t = masked_tiles; t < kv_tiles; ++t) process_tile(t, std::false_type{});
  } else {
    for (int t = 0; t < kv_tiles; ++t) process_tile(t, std::true_type{});
  }

  // ---- epilogue
  // Before 07d: step 06's epilogue: the 4 partial row sums added up, then per row O = o_acc / row_sum,
  // each lane storing two neighbouring columns (4 bytes) at a time, and LSE = scale·row_max + log(row_sum).
  // From 07d: O normalized for every row first, then staged through shared memory.
  if constexpr (!Tr::has(kSmemEpilogue)) {
#pragma unroll
    for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_sum[mi][r] += __shfl_xor_sync(0xffffffffu, row_sum[mi][r], 1);
        row_sum[mi][r] += __shfl_xor_sync(0xffffffffu, row_sum[mi][r], 2);
      }
#pragma unroll
    for (int mi = 0; mi < M_TILES; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const frag::Coord c = frag::mma_c(lane, 2 * r);  // this lane's elements 2r, 2r+1: one row, two columns
        const int row = q0 + warp_row0 + mi * 16 + c.row;
        if (row >= p.seqlen_q) continue;
        // A row with no key to attend has row_sum = 0: O = 0 and LSE = -inf.
        const float inv_sum = row_sum[mi][r] > 0.0f ? 1.0f / row_sum[mi][r] : 0.0f;
        T* o_row = o + offset_of(p.o, b, row, h);
#pragma unroll
        for (int nt = 0; nt < Tr::O_N_TILES; ++nt)
          *reinterpret_cast<uint32_t*>(o_row + nt * 8 + c.col) =
              pack2<T>(o_acc[mi][nt][2 * r] * inv_sum, o_acc[mi][nt][2 * r + 1] * inv_sum);
        if (lse && frag::thread_in_group(lane) == 0)
          lse[bh * p.seqlen_q + row] =
              row_sum[mi][r] > 0.0f ? row_max[mi][r] * p.softmax_scale + logf(row_sum[mi][r]) : -INFINITY;
      }
  } else {
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
          lse[int64_t(bh) * seqlen_q + q0 + row] = sum > 0.0f ? row_max[mi][r] * p.softmax_scale + logf(sum) : -INFINITY;
      }

    T* o_tile = o + offset_of(p.o, b, q0, h);
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
              pack2<T>(o_acc[mi][nt][2 * r] * inv_sum[mi][r], o_acc[mi][nt][2 * r + 1] * inv_sum[mi][r]);
      }
    __syncwarp();  // every lane's part of the warp's rows is in shared memory
#pragma unroll
    for (int i = 0; i < Tr::ROWS_PER_WARP * Tr::CHUNKS_PER_ROW / 32; ++i) {
      const int c = i * 32 + lane;
      const int row = warp_row0 + c / Tr::CHUNKS_PER_ROW, col = (c % Tr::CHUNKS_PER_ROW) * 8;
      if (row < q_rows && col < head_dim)
        *reinterpret_cast<uint4*>(o_tile + row * p.o.row + col) =
            *reinterpret_cast<const uint4*>(o_smem + Layout::offset(row, col));
    }
  }
}

// Before 07b: the grid is step 06's 2-D grid, x = query tile (the last first), y = batch·head in a
// grid-stride loop.
// From 07b: the grid is 1-D, one block per (batch·head, query tile) (block_tile).
template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::NUM_THREADS)
    flash_attention2_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                            T* __restrict__ o, float* __restrict__ lse, const Problem p, const float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  if constexpr (Tr::has(kWorkOrder)) {
    const BlockTile tile = block_tile(blockIdx.x, uint32_t(query_tiles(p.seqlen_q, Tr::BLOCK_Q)));
    attend<T, Tr>(q, k, v, o, lse, p, scale_log2, smem, tile.bh, tile.q_tile);
  } else {
    const int q_tile = int(gridDim.x - 1 - blockIdx.x);
    for (uint32_t bh = blockIdx.y; bh < uint32_t(p.batch * p.heads_q); bh += gridDim.y) {
      __syncthreads();  // every warp is done with the previous (batch, head)'s shared memory
      attend<T, Tr>(q, k, v, o, lse, p, scale_log2, smem, bh, q_tile);
    }
  }
}

}  // namespace fs::step07
