// Step 06 — tensor cores: S = Q·Kᵀ and O = P·V with ldmatrix + mma.sync.m16n8k16.
//
// Extends step 05 (swizzled shared tiles filled by cp.async, double-buffered K/V) by moving both
// matrix products from CUDA-core FMAs to the tensor cores, and changes only what that needs. One
// idea: data is handed to the tensor cores in *fragments*, registers spread over the 32 lanes of a
// warp in a fixed pattern (traits.h has the maps, tested on the CPU), and the kernel is arranged so
// that every value is already in the lane that needs it:
//
//   * each warp owns 16 query rows (the M of one mma), so the block of 64 rows is 4 warps, not 8;
//     its Q fragments are read from shared memory with ldmatrix.x4, one per 16 head dims;
//   * K fragments come from shared memory with ldmatrix.x2, V fragments with ldmatrix.x4.trans
//     (V is stored [key][dim] but P·V wants it as the "column-major" B operand);
//   * S lives in fp32 accumulator registers; the row max and row sum of a row are reduced over the
//     4 lanes that share it with two __shfl_xor_sync, and nothing else is communicated;
//   * the accumulators of S are, register for register, the A fragment of P: P is rounded to
//     fp16/bf16 in place and fed to the next mma with no shared-memory round trip;
//   * step 05's swizzled layout keeps every ldmatrix phase conflict-free.
// The grid, the order of the tiles, the cp.async pipeline, the mask (every element of every tile)
// and the exponential (exp2f) are step 05's (`diff -ru steps/05_cp_async steps/06_ldmatrix_mma`).
//
// Expected speed-up over step 05: an order of magnitude (the tensor cores do a 16×8×16 product per
// warp instruction; the CUDA cores of step 05 do one FMA per lane). With 16 query rows per warp
// every K/V byte read from shared memory serves only 16 rows, and at 252 registers an SM holds two
// blocks, 8 warps, to hide the latencies; step 07 gives each warp more rows.
// notes/06_ldmatrix_mma.md has the counts and what Nsight Compute measured.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/06_ldmatrix_mma/traits.h"

namespace fs::step06 {

constexpr float kLog2e = 1.4426950408889634f;

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

// ---- the instructions this step teaches ----------------------------------------------------------

// The 32-bit shared-memory address that ldmatrix takes.
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ldmatrix.m8n8: 8×8 matrices of 16-bit elements from shared memory into registers. Lane 8·m + r
// gives the 16-byte address of row r of matrix m; afterwards register m of lane l holds two
// elements of matrix m: row l/4, columns 2·(l%4) and +1 — or, with .trans, column l/4, rows 2·(l%4)
// and +1 (frag::ldmatrix_element). The .x2 form reads the addresses of lanes 0-15 only.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
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

// All threads start copying rows row0 .. row0 + 63 of one head into a shared tile, 16 bytes at a
// time, and return without waiting; rows at or past `rows_valid` become zeros (finite, and masked
// out later) through src_bytes = 0, their source address being row row0, which always exists.
// Not unrolled, as in step 05 (where unrolling kept every chunk's addresses in registers across the
// K/V loop and pushed the FMA loop past its 128 registers into spills); step 07's copy is unrolled.
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
// (traits.h). This step passes Swizzled128Layout, as 05 does: its ldmatrix phases are conflict-free.
// Warp w owns query rows 16·w … 16·w + 15 of the block's tile; per lane, row state r = 0, 1 is row
// g + 8r of the warp's 16 (g = lane / 4, frag::mma_c).
template <typename T, int HEAD_DIM, template <int> class TileLayout>
__global__ void __launch_bounds__(Traits<HEAD_DIM>::NUM_THREADS, 2)
ldmatrix_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                    float* __restrict__ lse, Problem p) {
  using Tr = Traits<HEAD_DIM>;
  using Layout = TileLayout<HEAD_DIM>;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV;

  extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async needs
  T* q_smem = reinterpret_cast<T*>(smem);           // [BLOCK_Q, HEAD_DIM] fp16/bf16
  T* k_smem = q_smem + Layout::size(BLOCK_Q);       // [2][BLOCK_KV, HEAD_DIM]: tile n in buffer n % 2
  T* v_smem = k_smem + 2 * Layout::size(BLOCK_KV);  // [2][BLOCK_KV, HEAD_DIM]

  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int warp_row0 = warp * Tr::ROWS_PER_WARP;  // first row of this warp inside the block's tile
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

    float o_acc[Tr::O_N_TILES][4] = {};  // [16, HEAD_DIM] of unnormalized O, fp32, C layout (frag::mma_c)
    float row_max[2];                    // max raw score q·k of rows g and g + 8 so far
    float row_sum[2];                    // this lane's share of their sums of probabilities
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
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

      // ---- S = Q·Kᵀ: s_acc[nt] = the warp's 16 rows × keys 8·nt … 8·nt + 7, 16 head dims per mma.
      // Q's A fragment is read from shared memory at each k16 step (one ldmatrix.x4 for 8 mma):
      // holding all of them in registers for the whole loop would take 4·HEAD_DIM/16 more registers
      // than the 255 a thread may have here (252 used at HEAD_DIM 128: resource_report-20261130-212215.md).
      float s_acc[Tr::S_N_TILES][4] = {};  // [16, BLOCK_KV] fp32, C layout
      {
        const frag::Coord a = frag::ldmatrix_x4_a(lane), bk = frag::ldmatrix_x2_b(lane);
#pragma unroll
        for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
          uint32_t q_frag[4];  // Q [16 rows, 16 dims] as A
          ldmatrix_x4(q_frag, q_smem + Layout::offset(warp_row0 + a.row, ks * 16 + a.col));
#pragma unroll
          for (int nt = 0; nt < Tr::S_N_TILES; ++nt) {
            uint32_t k_frag[2];  // Kᵀ [16 dims, 8 keys]
            ldmatrix_x2(k_frag, k_tile + Layout::offset(nt * 8 + bk.row, ks * 16 + bk.col));
            mma_m16n8k16<T>(s_acc[nt], q_frag, k_frag);
          }
        }
      }

      // ---- online softmax, per row across tiles; the 4 lanes of a row are lanes 4g … 4g + 3
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // The last key row g + 8r may see: the end of K, or with causal the diagonal (j <= i + Sk - Sq).
        // Every key of every tile is compared with it, as in step 05 (one compare per element here:
        // with 32 scores per lane, step 05's per-element causal_allows costs registers this kernel
        // does not have).
        const int64_t row = q0 + warp_row0 + frag::mma_c(lane, 2 * r).row;
        const int64_t last_key = p.causal ? std::min(p.seqlen_k - 1, row + p.seqlen_k - p.seqlen_q) : p.seqlen_k - 1;
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
          for (int i = 2 * r; i < 2 * r + 2; ++i) {
            if (kv0 + nt * 8 + frag::mma_c(lane, i).col > last_key) s_acc[nt][i] = -INFINITY;
            tile_max = fmaxf(tile_max, s_acc[nt][i]);
          }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[r], tile_max);
        // A row that has seen no key yet (new_max = -inf) subtracts 0 instead: 2^(-inf) = 0, not NaN.
        const float max_used = new_max == -INFINITY ? 0.0f : new_max;
        const float max_scaled = max_used * scale_log2;
        const float rescale = exp2f((row_max[r] - max_used) * scale_log2);  // 1 if the max held, 0 the first time
        row_max[r] = new_max;
        row_sum[r] *= rescale;
#pragma unroll
        for (int nt = 0; nt < Tr::O_N_TILES; ++nt) {
          o_acc[nt][2 * r] *= rescale;
          o_acc[nt][2 * r + 1] *= rescale;
        }
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
          for (int i = 2 * r; i < 2 * r + 2; ++i) {
            s_acc[nt][i] = exp2f(fmaf(s_acc[nt][i], scale_log2, -max_scaled));  // P, in place of S
            row_sum[r] += s_acc[nt][i];
          }
      }

      // ---- O += P·V: P for keys 16·kk … 16·kk + 15 = the accumulators of S's n8 tiles 2·kk and
      // 2·kk + 1, rounded to T in place (frag::mma_a_reg_of_c); V [16 keys, 16 dims] through
      // ldmatrix.x4.trans is the B fragment of two n8 tiles of O.
      const frag::Coord bv = frag::ldmatrix_x4_trans_b(lane);
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
          uint32_t v_frag[4];  // V [16 keys, 16 dims] as the B fragments of two n8 tiles
          ldmatrix_x4_trans(v_frag, v_tile + Layout::offset(kk * 16 + bv.row, np * 16 + bv.col));
          const uint32_t v_lo[2] = {v_frag[0], v_frag[1]}, v_hi[2] = {v_frag[2], v_frag[3]};
          mma_m16n8k16<T>(o_acc[2 * np], p_frag, v_lo);
          mma_m16n8k16<T>(o_acc[2 * np + 1], p_frag, v_hi);
        }
      }
    }

    // ---- epilogue: add up the 4 partial row sums, O = o_acc / row_sum, LSE = scale·row_max + log(row_sum)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const frag::Coord c = frag::mma_c(lane, 2 * r);  // this lane's elements 2r, 2r+1: one row, two columns
      const int row = q0 + warp_row0 + c.row;
      if (row >= p.seqlen_q) continue;
      // A row with no key to attend has row_sum = 0: O = 0 and LSE = -inf.
      const float inv_sum = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
      T* o_row = o + offset_of(p.o, b, row, h);
#pragma unroll
      for (int nt = 0; nt < Tr::O_N_TILES; ++nt)
        *reinterpret_cast<uint32_t*>(o_row + nt * 8 + c.col) =
            pack2<T>(o_acc[nt][2 * r] * inv_sum, o_acc[nt][2 * r + 1] * inv_sum);
      if (lse && frag::thread_in_group(lane) == 0)
        lse[bh * p.seqlen_q + row] = row_sum[r] > 0.0f ? row_max[r] * p.softmax_scale + logf(row_sum[r]) : -INFINITY;
    }
  }
}

}  // namespace fs::step06
