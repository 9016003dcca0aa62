// Step 06 — tensor cores: S = Q·Kᵀ and O = P·V with ldmatrix + mma.sync.m16n8k16.
//
// Extends step 05 (swizzled shared tiles filled by cp.async, double-buffered K/V) by moving both
// matrix products from CUDA-core FMAs to the tensor cores. One idea: data is handed to the tensor
// cores in *fragments*, registers spread over the 32 lanes of a warp in a fixed pattern
// (common/fragment_layout.h has the maps, tested on the CPU), and the whole kernel is arranged so
// that every value is already in the lane that needs it:
//
//   * each warp owns 16 query rows; its Q fragments are loaded once (ldmatrix.x4) and stay in
//     registers for the whole key loop;
//   * K fragments come from shared memory with ldmatrix.x2, V fragments with ldmatrix.x4.trans
//     (V is stored [key][dim] but P·V wants it as the "column-major" B operand);
//   * S lives in fp32 accumulator registers; the row max and row sum of a row are reduced over the
//     4 lanes that share it with two __shfl_xor_sync, and nothing else is communicated;
//   * the accumulators of S are, register for register, the A fragment of P: P is rounded to
//     fp16/bf16 in place and fed to the next mma with no shared-memory round trip;
//   * the swizzled layout (fs::Swizzled128Layout) keeps every ldmatrix phase conflict-free.
//
// Expected speed-up over step 05: an order of magnitude (the tensor cores do a 16×8×16 product per
// warp instruction; the CUDA cores of step 05 do one FMA per lane). With 16 query rows per warp
// every K/V byte read from shared memory serves only 16 rows: shared-memory traffic alone caps this
// step at about two thirds of the 645 TFLOP/s mma.sync ceiling, and 8 warps per SM overlap less
// than that; step 07 gives each warp more rows. notes/06_ldmatrix_mma.md has the counts.
//
// This step teaches ldmatrix and mma, so their inline PTX is written out below; common/ptx.cuh
// holds the same wrappers (with cp.async, taught by step 05 and used here from there) for step 07.
#include <sstream>

#include "common/dtype.cuh"
#include "common/fragment_layout.h"
#include "common/ptx.cuh"
#include "common/registry.h"
#include "common/smem_layout.h"
#include "common/workload.h"

namespace fs {
namespace {

// ---- the instructions this step teaches -------------------------------------------------------

// ldmatrix.m8n8: 8×8 matrices of 16-bit elements from shared memory into registers. Lane 8·m + r
// gives the 16-byte address of row r of matrix m; afterwards register m of lane l holds two
// elements of matrix m: row l/4, columns 2·(l%4) and +1 — or, with .trans, column l/4, rows 2·(l%4)
// and +1 (frag::ldmatrix_element). The .x2 form reads the addresses of lanes 0-15 only.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ptx::smem_u32(smem)));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(ptx::smem_u32(smem)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(ptx::smem_u32(smem)));
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

// ---- compile-time choices ----------------------------------------------------------------------
template <int HEAD_DIM_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int NUM_WARPS = 4;
  static constexpr int ROWS_PER_WARP = 16;                    // one m16 tile of queries per warp
  static constexpr int BLOCK_Q = NUM_WARPS * ROWS_PER_WARP;   // 64 query rows per block
  static constexpr int BLOCK_KV = 64;                         // keys per K/V tile
  static constexpr int THREADS = NUM_WARPS * 32;
  // Two blocks (8 warps) per SM: up to 255 registers per thread, which the fp32 accumulators of
  // O and S plus the Q fragments need at HEAD_DIM = 128 (left alone, ptxas aims for 3 blocks at
  // HEAD_DIM = 64 and spills).
  static constexpr int MIN_BLOCKS_PER_SM = 2;

  static constexpr int QK_K_STEPS = HEAD_DIM / 16;  // k16 steps of S = Q·Kᵀ (over head dims)
  static constexpr int S_N_TILES = BLOCK_KV / 8;    // n8 tiles of S (over keys)
  static constexpr int PV_K_STEPS = BLOCK_KV / 16;  // k16 steps of O = P·V (over keys)
  static constexpr int O_N_TILES = HEAD_DIM / 8;    // n8 tiles of O (over head dims)

  using Layout = Swizzled128Layout<HEAD_DIM>;  // 16-byte chunk c of row r stored at chunk c ^ (r % 8)
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte cp.async copies per row

  // q_smem [BLOCK_Q, HEAD_DIM], then k_smem and v_smem [2][BLOCK_KV, HEAD_DIM] (double buffer).
  static constexpr int Q_ELEMS = BLOCK_Q * HEAD_DIM;
  static constexpr int KV_ELEMS = BLOCK_KV * HEAD_DIM;
  static constexpr size_t SMEM_BYTES = size_t(Q_ELEMS + 4 * KV_ELEMS) * 2;  // fp16 / bf16

  static_assert(HEAD_DIM % 64 == 0, "the 128-byte swizzle and the k16 / n16 loops need HEAD_DIM % 64 == 0");
  static_assert(BLOCK_KV % 16 == 0, "P·V consumes keys 16 at a time");
  static_assert((BLOCK_Q * CHUNKS_PER_ROW) % THREADS == 0 && (BLOCK_KV * CHUNKS_PER_ROW) % THREADS == 0,
                "every thread issues the same number of 16-byte copies per tile");
};

// Issues the cp.async copies of one [ROWS, HEAD_DIM] tile whose first row is `gmem` (rows `row_stride`
// elements apart) into `smem`, swizzled. Rows at and past `valid_rows` are zero-filled through the
// src-size operand (0 bytes read), so ragged tails need no branch around the copy; their source
// address is the tile's first row, which always exists.
template <class Tr, int ROWS, typename T>
__device__ inline void copy_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid_rows) {
#pragma unroll
  for (int i = 0; i < ROWS * Tr::CHUNKS_PER_ROW / Tr::THREADS; ++i) {
    const int c = i * Tr::THREADS + threadIdx.x;  // consecutive threads copy consecutive 16 bytes of a row
    const int row = c / Tr::CHUNKS_PER_ROW;
    const int col = (c % Tr::CHUNKS_PER_ROW) * 8;
    const bool valid = row < valid_rows;
    ptx::cp_async_16(smem + Tr::Layout::offset(row, col), valid ? gmem + row * row_stride + col : gmem,
                     valid ? 16 : 0);
  }
}

// One block = BLOCK_Q query rows of one (batch, head); warp w owns rows 16·w … 16·w + 15.
// 1-D grid: block x = ((b · heads_q + h) · q_tiles + q_tile), so no grid dimension limit of 65535.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(Traits<HEAD_DIM>::THREADS, Traits<HEAD_DIM>::MIN_BLOCKS_PER_SM)
    attention_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                     float* __restrict__ lse, const Problem p, const float scale_log2) {
  using Tr = Traits<HEAD_DIM>;
  using Layout = typename Tr::Layout;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);  // [BLOCK_Q, HEAD_DIM], swizzled
  T* k_smem = q_smem + Tr::Q_ELEMS;            // [2][BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + 2 * Tr::KV_ELEMS;       // [2][BLOCK_KV, HEAD_DIM], swizzled

  // Block and head indices are below 2^31 (supports() checks the grid), so 32-bit divisions do:
  // 64-bit ones would be slow subroutine calls.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k);
  const unsigned q_tiles = (unsigned(seqlen_q) + BLOCK_Q - 1) / BLOCK_Q;
  const int q0 = int(blockIdx.x % q_tiles) * BLOCK_Q;
  const unsigned bh = blockIdx.x / q_tiles;
  const unsigned h = bh % unsigned(p.heads_q), b = bh / unsigned(p.heads_q);
  const unsigned h_kv = h / (unsigned(p.heads_q) / unsigned(p.heads_kv));  // GQA: kv_head_of(p, h)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * Tr::ROWS_PER_WARP;  // first row of this warp inside the block's tile

  // Keys this block needs: all of them, or with causal masking up to the last key its last query
  // row may see (bottom-right alignment); none (kv_end = 0) when no row of this tile sees a key.
  const int q_rows = min(BLOCK_Q, seqlen_q - q0);  // real query rows in this tile
  int kv_end = seqlen_k;
  if (p.causal) {
    const int64_t last_key = int64_t(q0) + q_rows - 1 + seqlen_k - seqlen_q;
    kv_end = last_key < 0 ? 0 : last_key + 1 < seqlen_k ? int(last_key + 1) : seqlen_k;
  }
  const int kv_tiles = int((unsigned(kv_end) + BLOCK_KV - 1) / BLOCK_KV);

  const T* q_tile = q + offset_of(p.q, b, q0, h);
  const T* k_head = k + offset_of(p.k, b, 0, h_kv);
  const T* v_head = v + offset_of(p.v, b, 0, h_kv);

  // ---- load Q
  // Q and the first K/V tile go out as one cp.async group; nothing else is in flight yet.
  copy_tile_async<Tr, BLOCK_Q>(q_smem, q_tile, p.q.row, q_rows);
  if (kv_tiles > 0) {
    copy_tile_async<Tr, BLOCK_KV>(k_smem, k_head, p.k.row, seqlen_k);
    copy_tile_async<Tr, BLOCK_KV>(v_smem, v_head, p.v.row, seqlen_k);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();  // every thread's share of Q (and of tile 0) has landed

  // This warp's 16 rows of Q as A fragments, one per k16 step: [16, HEAD_DIM] in 4·HEAD_DIM/16 registers.
  uint32_t q_frag[Tr::QK_K_STEPS][4];
  {
    const frag::Coord a = frag::ldmatrix_x4_a(lane);
#pragma unroll
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
      ldmatrix_x4(q_frag[ks], q_smem + Layout::offset(warp_row0 + a.row, ks * 16 + a.col));
  }

  // Per lane: rows g and g+8 of the warp's 16 (g = lane / 4), as index r = 0, 1 below.
  float o_acc[Tr::O_N_TILES][4] = {};  // [16, HEAD_DIM] fp32 accumulators, C layout (frag::mma_c)
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of raw scores q·k (scale not applied)
  float row_sum[2] = {0.0f, 0.0f};            // this lane's part of Σ exp(scale·(s - row_max))

  for (int j = 0; j < kv_tiles; ++j) {
    const int kv0 = j * BLOCK_KV;
    // Tile j is the only group in flight: wait for it. The barrier then does two jobs: everyone's
    // copies of tile j are visible, and every warp has finished computing tile j-1, so its buffer
    // ((j+1) % 2) may be refilled.
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < kv_tiles) {  // copy tile j+1 while tile j is computed
      const int next = kv0 + BLOCK_KV, buf = (j + 1) % 2;
      copy_tile_async<Tr, BLOCK_KV>(k_smem + buf * Tr::KV_ELEMS, k_head + next * p.k.row, p.k.row, seqlen_k - next);
      copy_tile_async<Tr, BLOCK_KV>(v_smem + buf * Tr::KV_ELEMS, v_head + next * p.v.row, p.v.row, seqlen_k - next);
    }
    ptx::cp_async_commit();
    const T* k_tile = k_smem + (j % 2) * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled
    const T* v_tile = v_smem + (j % 2) * Tr::KV_ELEMS;  // [BLOCK_KV, HEAD_DIM], swizzled

    // ---- S = Q·Kᵀ
    float s_acc[Tr::S_N_TILES][4] = {};  // [16, BLOCK_KV] fp32, C layout
    {
      const frag::Coord bk = frag::ldmatrix_x2_b(lane);
#pragma unroll
      for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
#pragma unroll
        for (int nt = 0; nt < Tr::S_N_TILES; ++nt) {
          uint32_t k_frag[2];  // Kᵀ [16 dims, 8 keys]
          ldmatrix_x2(k_frag, k_tile + Layout::offset(nt * 8 + bk.row, ks * 16 + bk.col));
          mma_m16n8k16<T>(s_acc[nt], q_frag[ks], k_frag);
        }
    }

    // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get
    // -inf. Only tiles that straddle the end of K or the diagonal need it (block-uniform test).
    const bool ragged = seqlen_k - kv0 < BLOCK_KV;
    const bool diagonal = p.causal && int64_t(kv0) + BLOCK_KV - 1 > int64_t(q0) + seqlen_k - seqlen_q;
    if (ragged || diagonal) {
#pragma unroll
      for (int nt = 0; nt < Tr::S_N_TILES; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const frag::Coord c = frag::mma_c(lane, i);
          const int qi = q0 + warp_row0 + c.row, kj = kv0 + nt * 8 + c.col;
          if (kj >= seqlen_k || (p.causal && !causal_allows(qi, kj, seqlen_q, seqlen_k))) s_acc[nt][i] = -INFINITY;
        }
    }

    // ---- online softmax
    // exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)): one FMA and one MUFU ex2 per score.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = row_max[r];
#pragma unroll
      for (int nt = 0; nt < Tr::S_N_TILES; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * r], s_acc[nt][2 * r + 1]));
      // The 4 lanes of a row (same g, t = 0..3) are lanes 4g … 4g+3: XOR 1 and 2 reach them all.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // A row that has seen no key yet keeps max -inf; subtract 0 then, so -inf - (-inf) never
      // makes a NaN (its p are exp2(-inf) = 0 and its correction 0).
      const float max_scaled = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
      const float correction = ptx::exp2_approx(row_max[r] * scale_log2 - max_scaled);
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
          s_acc[nt][i] = ptx::exp2_approx(fmaf(s_acc[nt][i], scale_log2, -max_scaled));
          row_sum[r] += s_acc[nt][i];
        }
    }

    // ---- O += P·V
    {
      const frag::Coord bv = frag::ldmatrix_x4_trans_b(lane);
#pragma unroll
      for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
        // P for keys 16·kk … 16·kk+15 = the accumulators of S's n8 tiles 2·kk and 2·kk+1, rounded.
        uint32_t p_frag[4];
#pragma unroll
        for (int n_half = 0; n_half < 2; ++n_half)
#pragma unroll
          for (int i = 0; i < 4; i += 2)
            p_frag[frag::mma_a_reg_of_c(n_half, i)] =
                ptx::pack2<T>(s_acc[2 * kk + n_half][i], s_acc[2 * kk + n_half][i + 1]);
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
  }

  // ---- epilogue
  // Each lane summed only its own columns; the row sum is the sum over the row's 4 lanes.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  // A row that saw no key has row_sum 0: O = 0 and LSE = -inf, never NaN. (__fdividef: the MUFU
  // reciprocal, 2 ulp, without the subroutine call of an IEEE division; row_sum <= seqlen_k.)
  const float inv_sum[2] = {row_sum[0] > 0.0f ? __fdividef(1.0f, row_sum[0]) : 0.0f,
                            row_sum[1] > 0.0f ? __fdividef(1.0f, row_sum[1]) : 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const frag::Coord c = frag::mma_c(lane, 2 * r);  // this lane's elements 2r, 2r+1: one row, two columns
    const int qi = q0 + warp_row0 + c.row;
    if (qi >= seqlen_q) continue;
    T* o_row = o + offset_of(p.o, b, qi, h);
#pragma unroll
    for (int nt = 0; nt < Tr::O_N_TILES; ++nt)
      *reinterpret_cast<uint32_t*>(o_row + nt * 8 + c.col) =
          ptx::pack2<T>(o_acc[nt][2 * r] * inv_sum[r], o_acc[nt][2 * r + 1] * inv_sum[r]);
    if (lse && frag::thread_in_group(lane) == 0)
      lse[(int64_t(b) * p.heads_q + h) * p.seqlen_q + qi] =
          row_sum[r] > 0.0f ? row_max[r] * p.softmax_scale + logf(row_sum[r]) : -INFINITY;
  }
}

// Both head dims use the same query tile, so the grid does not depend on head_dim.
constexpr int kBlockQ = Traits<64>::BLOCK_Q;
static_assert(Traits<128>::BLOCK_Q == kBlockQ, "one grid shape for every head_dim");

int64_t grid_blocks(const Problem& p) { return (p.seqlen_q + kBlockQ - 1) / kBlockQ * p.batch * p.heads_q; }

std::string limits(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128) {
    std::ostringstream m;
    m << "head_dim is " << p.head_dim
      << "; this step supports head_dim 64 and 128 only (its tiles and register fragments are sized at compile time)";
    return m.str();
  }
  if (grid_blocks(p) > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << kBlockQ << " query rows per batch and head, " << grid_blocks(p)
      << " blocks here, more than the grid limit of " << INT32_MAX;
    return m.str();
  }
  return "";
}

bool claims(const Problem& p, const DeviceInfo&) { return p.head_dim == 64 || p.head_dim == 128; }

Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  const size_t smem = p.head_dim == 64 ? Traits<64>::SMEM_BYTES : Traits<128>::SMEM_BYTES;
  if (smem > dev.smem_per_block_optin) {
    std::ostringstream m;
    m << "this step needs " << smem << " bytes of shared memory per block at head_dim " << p.head_dim
      << " but the device allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
  }
  return pl;
}

template <typename T, int HEAD_DIM>
void launch_for(const Problem& p, const Tensors& t, cudaStream_t stream) {
  using Tr = Traits<HEAD_DIM>;
  auto* kernel = attention_kernel<T, HEAD_DIM>;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::SMEM_BYTES)));
  const float scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);  // scale · log2(e)
  kernel<<<unsigned(grid_blocks(p)), Tr::THREADS, Tr::SMEM_BYTES, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse,
      p, scale_log2);
  CHECK_LAUNCH();
}

void launch(const Problem& p, const Tensors& t, const Plan&, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.head_dim == 64)
      launch_for<T, 64>(p, t, stream);
    else
      launch_for<T, 128>(p, t, stream);
  });
}

}  // namespace

void register_step_06_ldmatrix_mma(Registry& r) {
  r.add(Step{"06_ldmatrix_mma", "tensor cores: ldmatrix + mma.sync",
             "S = Q·Kᵀ and O = P·V on the tensor cores: ldmatrix fragments, mma.sync.m16n8k16, P kept in registers",
             "", 80, 0, limits, plan, launch, claims});
}

}  // namespace fs
