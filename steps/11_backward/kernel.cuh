// Step 11 — the backward pass of FlashAttention-2: dQ, dK, dV without storing P.
//
// Extends step 07 (07g: ldmatrix + mma.sync, swizzled tiles filled by cp.async, the forward's LSE), run
// the other way: blocks own K/V tiles and loop over the queries.
//
// The forward kept only O and one number per row, LSE = log Σ_j exp(scale·q·k_j). That is enough to
// rebuild any tile of P exactly, P_ij = exp(scale·q_i·k_j - LSE_i), so the backward recomputes S and
// P tile by tile instead of reading an N × N matrix (notes/11_backward.md derives the gradients):
//
//   preprocess_kernel   per query row: D = rowsum(dO ∘ O) and LSE in base 2 (+inf for a row that saw
//                       no key, so that its P is exp2(s - inf) = 0 and not NaN)
//   backward_kernel     a block owns BLOCK_KV keys of one K/V head (WARP_KEYS per warp, or per pair of
//                       warps: traits.h) and loops over the query tiles of every query head that
//                       reads them:
//                         Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·scale·log2(e) - LSE₂)   (recomputed)
//                         dV += Pᵀ·dO                                      (registers, whole loop)
//                         dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ - D)
//                         dK += dSᵀ·Q                                      (registers, whole loop)
//                         dQ_tile += dS·K   → atomics into an fp32 accumulator: every K/V block adds
//                                              to the same rows of dQ
//   convert_dq_kernel   dQ = scale · accumulator, rounded to fp16/bf16
// Deterministic mode: backward_kernel without its dQ part, then dq_kernel, where a block owns query
// rows and loops over the K/V tiles (S, P, dP and dS once more), summing dQ in a fixed order.
//
// Everything is transposed with respect to the forward: a warp's accumulator rows are keys, its
// columns queries, so Pᵀ and dSᵀ are already the A operands of dV and dK (no shared-memory round trip,
// as P was in step 06, where a warp has all the queries of its keys; where two warps share keys they
// exchange Pᵀ and dSᵀ through shared memory). dQ needs dS the other way round, and its sum runs over
// the keys of all warps: dSᵀ goes through shared memory once per tile.
//
// The instructions are step 07's (cp.async, ldmatrix, mma.sync m16n8k16); the fragment maps are in
// traits.h. Measured on the H200: 0.87–0.94× PyTorch's flash backward (FlashAttention-2) at head_dim
// 64 and 128 (bench/results/compare_torch_backward-20261201-002631.json, notes/11_backward.md).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/backward/problem.h"
#include "common/step/dtype.cuh"
#include "common/step/softcap.h"
#include "common/step/varlen.h"
#include "common/step/window.h"
#include "steps/11_backward/traits.h"

namespace fs::step11 {

// ---- the instructions of steps 05 and 06 (cp.async, ldmatrix, mma.sync), as step 07 wrote them ----
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

template <typename T>
__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ inline void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
// 8 floats at src (16-byte aligned), times s, rounded: one 16-byte store of dQ.
template <typename T>
__device__ inline uint4 scaled_pack8(const float* src, float s) {
  const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
  return {pack2<T>(lo.x * s, lo.y * s), pack2<T>(lo.z * s, lo.w * s), pack2<T>(hi.x * s, hi.y * s),
          pack2<T>(hi.z * s, hi.w * s)};
}

// 2^x as one MUFU instruction (step 07f): 2^-inf = 0.
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Rows first_row … first_row + ROWS - 1 of a [rows, head_dim] view (rows `row_stride` apart) into a
// swizzled [ROWS, Layout::kCols] tile; rows past last_row and columns past head_dim are zero-filled
// (step 07's copy_tile_async).
template <class Layout, int ROWS, int NUM_THREADS, typename T>
__device__ __forceinline__ void copy_tile_async(T* smem, const T* gmem, int64_t row_stride, int first_row,
                                                int last_row, int head_dim) {
  constexpr int CHUNKS = Layout::kCols / 8, ROWS_PER_PASS = NUM_THREADS / CHUNKS;
  constexpr int PASSES = (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
  const int row0 = threadIdx.x / CHUNKS, col = threadIdx.x % CHUNKS * 8;
  const int src_col = col < head_dim ? col : 0;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    // Only 192-wide rows (24 chunks) leave threads idle, and a last pass partly empty.
    if ((NUM_THREADS % CHUNKS == 0 || row0 < ROWS_PER_PASS) && (ROWS % ROWS_PER_PASS == 0 || row < ROWS)) {
      const bool valid = row <= last_row - first_row && col < head_dim;
      const int src_row = first_row + min(row, max(last_row - first_row, 0));
      cp_async_16(smem + Layout::offset(row, col), gmem + int64_t(src_row) * row_stride + src_col, valid ? 16 : 0);
    }
  }
}

// ---- preprocessing: D and LSE₂, one warp per row ------------------------------------------------
// Rows [seqlen_q, padded_rows) of each (batch, head) get D = 0 and LSE₂ = +inf: the main kernel reads
// whole tiles and their P is then 0.
// VARLEN (step 13c): a packed batch. The workspace keeps the padded batch's rows (seqlen_q is the bound on
// the sequences' lengths); sequence b's row i is row q_start + i of the packed O and dO, and its LSE is
// packed (heads_q, total_q).
inline constexpr int kPreprocessWarps = 4;

template <typename T, bool VARLEN = false>
__global__ void __launch_bounds__(kPreprocessWarps * 32)
    preprocess_kernel(const T* __restrict__ o, const T* __restrict__ d_o, const float* __restrict__ lse,
                      float* __restrict__ lse2, float* __restrict__ d_rows, const BackwardProblem p) {
  const Problem& f = p.attention;
  const int64_t rows_per_head = padded_rows(f.seqlen_q);
  const int64_t row = int64_t(blockIdx.x) * kPreprocessWarps + threadIdx.x / 32;
  if (row >= f.batch * f.heads_q * rows_per_head) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = row / rows_per_head, i = row % rows_per_head;
  const int64_t b = bh / f.heads_q, h = bh % f.heads_q;
  int64_t seqlen_q = f.seqlen_q, tb = b, at = i, lse_at = bh * f.seqlen_q + i;
  if constexpr (VARLEN) {
    const Sequence seq = load_sequence(f, b);
    seqlen_q = seq.q_len, tb = 0, at = seq.q_start + i, lse_at = h * f.total_q + seq.q_start + i;
  }
  if (i >= seqlen_q) {
    if (lane == 0) {
      d_rows[row] = 0.0f;
      lse2[row] = INFINITY;
    }
    return;
  }
  const T* o_row = o + offset_of(f.o, tb, at, h);
  const T* do_row = d_o + offset_of(p.d_o, tb, at, h);
  float sum = 0.0f;
  for (int c = lane * 8; c < f.head_dim; c += 32 * 8) {  // 16 bytes of each per lane
    const uint4 ov = *reinterpret_cast<const uint4*>(o_row + c), dv = *reinterpret_cast<const uint4*>(do_row + c);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  if (lane == 0) {
    d_rows[row] = sum;
    const float l = lse[lse_at];
    lse2[row] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
  }
}

// The A fragment of Pᵀ or dSᵀ for keys kr0 + 16·mi … and queries 16·kk …: from the warp's own fp32
// accumulators `src` when the warp has every query (queries 16·kk … are the C tiles 2·kk, 2·kk + 1,
// rounded to T: step 06's P fragment), else from the [BLOCK_KV, BLOCK_Q] tile `a_smem` that the warps
// of its key group wrote.
template <typename T, class Tr>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const float (&src)[Tr::KEY_TILES][Tr::Q_N_TILES][4],
                                           const T* a_smem, const int (&pq_off)[Tr::Q_K_STEPS], int kr0, int mi,
                                           int kk) {
  if constexpr (Tr::COL_GROUPS == 1) {
#pragma unroll
    for (int n_half = 0; n_half < 2; ++n_half)
#pragma unroll
      for (int i = 0; i < 4; i += 2)
        a[frag::mma_a_reg_of_c(n_half, i)] = pack2<T>(src[mi][2 * kk + n_half][i], src[mi][2 * kk + n_half][i + 1]);
  } else {
    ldmatrix_x4(a, a_smem + Tr::DsLayout::origin(kr0 + 16 * mi, 0) + pq_off[kk]);
  }
}

// ---- the main kernel ---------------------------------------------------------------------------
// A warp's rows kr0 … of Pᵀ or dSᵀ (its accumulators, queries wq0 …) into a [BLOCK_KV, BLOCK_Q]
// tile: 4-byte stores from the C layout, conflict-free in the swizzle.
template <typename T, class Tr>
__device__ __forceinline__ void store_rows(T* dst, const float (&acc)[Tr::KEY_TILES][Tr::Q_N_TILES][4], int kr0,
                                           int wq0, int lane) {
#pragma unroll
  for (int mi = 0; mi < Tr::KEY_TILES; ++mi)
#pragma unroll
    for (int nt = 0; nt < Tr::Q_N_TILES; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const frag::Coord c = frag::mma_c(lane, 2 * r);
        *reinterpret_cast<uint32_t*>(dst + Tr::DsLayout::offset(kr0 + 16 * mi + c.row, wq0 + nt * 8 + c.col)) =
            pack2<T>(acc[mi][nt][2 * r], acc[mi][nt][2 * r + 1]);
      }
}

// Block x: K/V head bh_kv = x / (kv_tiles · D_SLICES), then K/V tile and column slice; K/V tile 0
// first (with causal it sees the most query tiles). ATOMIC_DQ: the dQ part (off in deterministic mode).
// SOFTCAP: logit softcapping (common/step/softcap.h; note 13), two lines where P is made. WINDOW: a sliding
// window (common/step/window.h; note 13): the query tiles that see these keys, and its mask. VARLEN (step
// 13c, with WINDOW): a packed batch; x's "batch" is the sequence, a block whose K/V tile lies past its
// sequence's end exits, and the workspace keeps the padded batch's rows (as dq_kernel).
template <typename T, class Tr, bool ATOMIC_DQ, bool SOFTCAP = false, bool WINDOW = false, bool VARLEN = false>
__global__ void __launch_bounds__(Tr::NUM_THREADS, Tr::MIN_BLOCKS)
    backward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const T* __restrict__ d_o, T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dq_accum,
                    const float* __restrict__ lse2, const float* __restrict__ d_rows, const BackwardProblem p,
                    const float scale_log2, const Softcap cap) {
  using Layout = typename Tr::Layout;
  using DsLayout = typename Tr::DsLayout;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, NT = Tr::NUM_THREADS;
  const Problem& f = p.attention;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* k_smem = reinterpret_cast<T*>(smem_raw);           // [BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + Tr::KV_ELEMS;                    // [BLOCK_KV, HEAD_DIM], swizzled
  T* q_smem = v_smem + Tr::KV_ELEMS;                    // [Q_STAGES][BLOCK_Q, HEAD_DIM], swizzled
  T* do_smem = q_smem + Tr::Q_STAGES * Tr::Q_ELEMS;     // [Q_STAGES][BLOCK_Q, HEAD_DIM], swizzled
  T* ds_smem = do_smem + Tr::Q_STAGES * Tr::Q_ELEMS;    // dSᵀ [BLOCK_KV, BLOCK_Q], swizzled
  T* p_smem = ds_smem + Tr::DS_ELEMS;                   // Pᵀ [BLOCK_KV, BLOCK_Q] (COL_GROUPS > 1)
  float* lse_smem = reinterpret_cast<float*>(p_smem + (Tr::COL_GROUPS > 1 ? Tr::DS_ELEMS : 0));  // [Q_STAGES][BLOCK_Q]
  float* dd_smem = lse_smem + Tr::Q_STAGES * BLOCK_Q;                  // [Q_STAGES][BLOCK_Q]: D

  static_assert(!VARLEN || WINDOW, "13c: a packed batch runs the band's code");
  int seqlen_q = int(f.seqlen_q), seqlen_k = int(f.seqlen_k);
  const int head_dim = int(f.head_dim);
  const bool causal = f.causal != 0;
  const int kv_tiles = int(tiles(seqlen_k, BLOCK_KV));  // the grid's: read before 13c sets seqlen_k to a sequence's
  const uint32_t per_head = uint32_t(kv_tiles) * Tr::D_SLICES;
  const uint32_t bh_kv = blockIdx.x / per_head;
  const int kv_tile = int(blockIdx.x % per_head) / Tr::D_SLICES, slice = int(blockIdx.x % per_head) % Tr::D_SLICES;
  const uint32_t b = bh_kv / uint32_t(f.heads_kv), h_kv = bh_kv % uint32_t(f.heads_kv);
  const int group = int(f.heads_q / f.heads_kv);  // the query heads that read this K/V head
  const int kv0 = kv_tile * BLOCK_KV, col0 = slice * Tr::SLICE;
  const int64_t rows_per_head = padded_rows(f.seqlen_q);
  int64_t tb = b, q_start = 0, k_start = 0;  // 13c: the tensors' batch index, the sequence's first rows
  Sequence seq;
  if constexpr (VARLEN) {
    seq = load_sequence(f, b);
    seqlen_q = int(seq.q_len), seqlen_k = int(seq.k_len), tb = 0, q_start = seq.q_start, k_start = seq.k_start;
    if (kv0 >= seqlen_k) return;  // past the sequence's end
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // ---- load K, V (this block's keys, every head dim: S and dP contract over all of them)
  copy_tile_async<Layout, BLOCK_KV, NT>(k_smem, k + offset_of(f.k, tb, k_start, h_kv), f.k.row, kv0, seqlen_k - 1,
                                        head_dim);
  copy_tile_async<Layout, BLOCK_KV, NT>(v_smem, v + offset_of(f.v, tb, k_start, h_kv), f.v.row, kv0, seqlen_k - 1,
                                        head_dim);
  cp_async_commit();

  // The visits: every query tile from the first that sees these keys, for each query head of the group
  // (a window: the run of query tiles that see them).
  const Band band = band_of(VARLEN ? one_sequence(f, seq) : f);
  const Diagonals diagonals = diagonals_of(band);  // a window's per-score mask, in two registers
  int first_tile = first_query_tile(kv0, BLOCK_Q, seqlen_q, seqlen_k, causal);
  int tiles_per_head = int(tiles(seqlen_q, BLOCK_Q)) - first_tile;
  if constexpr (WINDOW) {
    const QSpan span = q_span(band, kv0, BLOCK_KV, BLOCK_Q, seqlen_q);
    first_tile = span.first, tiles_per_head = span.count;
  }
  const int visits = tiles_per_head > 0 ? group * tiles_per_head : 0;
  auto head_of = [&](int t) { return int(h_kv) * group + t / tiles_per_head; };
  auto q0_of = [&](int t) { return (first_tile + t % tiles_per_head) * BLOCK_Q; };

  // Q, dO rows of visit t into stage `stage`, with the rows' LSE₂ and D (16-byte chunks).
  auto load_visit = [&](int stage, int t) {
    const int h = head_of(t), q0 = q0_of(t);
    copy_tile_async<Layout, BLOCK_Q, NT>(q_smem + stage * Tr::Q_ELEMS, q + offset_of(f.q, tb, q_start, h), f.q.row,
                                         q0, seqlen_q - 1, head_dim);
    copy_tile_async<Layout, BLOCK_Q, NT>(do_smem + stage * Tr::Q_ELEMS, d_o + offset_of(p.d_o, tb, q_start, h),
                                         p.d_o.row, q0, seqlen_q - 1, head_dim);
    const int64_t row0 = (int64_t(b) * f.heads_q + h) * rows_per_head + q0;
    constexpr int CHUNKS = BLOCK_Q / 4;  // 16-byte chunks of one row array
    if (threadIdx.x < CHUNKS)
      cp_async_16(lse_smem + stage * BLOCK_Q + 4 * threadIdx.x, lse2 + row0 + 4 * threadIdx.x, 16);
    else if (threadIdx.x < 2 * CHUNKS)
      cp_async_16(dd_smem + stage * BLOCK_Q + 4 * (threadIdx.x - CHUNKS), d_rows + row0 + 4 * (threadIdx.x - CHUNKS),
                  16);
  };
  if (visits > 0) load_visit(0, 0);
  cp_async_commit();

  // Lane offsets of the two ldmatrix orders (traits.h), for columns 16·u … inside a 64-column group.
  int quad_off[4], pair_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const frag::Coord a = frag::ldmatrix_x4_quadrants(lane), c = ldmatrix_x4_k_pair(lane);
    quad_off[u] = Layout::offset(a.row, 16 * u + a.col);
    pair_off[u] = Layout::offset(c.row, 16 * u + c.col);
  }
  constexpr int M = Tr::KEY_TILES;  // m16 tiles of keys per warp
  // Warp w: keys kr0 … kr0 + WARP_KEYS - 1 of the block, queries wq0 … of Sᵀ and dPᵀ, columns wc0 … of
  // dK and dV.
  const int kr0 = warp / Tr::COL_GROUPS * Tr::WARP_KEYS, wq0 = warp % Tr::COL_GROUPS * Tr::WARP_QUERIES;
  const int wc0 = col0 + warp % Tr::COL_GROUPS * Tr::WARP_COLS;
  const T* k_warp = k_smem + Layout::origin(kr0, 0);
  const T* v_warp = v_smem + Layout::origin(kr0, 0);
  const int key0 = kv0 + kr0;  // the warp's first key
  int pq_off[Tr::Q_K_STEPS];   // Pᵀ, dSᵀ read back as A (COL_GROUPS > 1): quadrants, queries 16·kk …
#pragma unroll
  for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
    pq_off[kk] = DsLayout::offset(frag::ldmatrix_x4_quadrants(lane).row, 16 * kk + frag::ldmatrix_x4_quadrants(lane).col);

  float dk_acc[M][Tr::SLICE_N_TILES][4] = {};  // [WARP_KEYS, WARP_COLS] fp32, C layout
  float dv_acc[M][Tr::SLICE_N_TILES][4] = {};

  // dQ's share of this warp: 32 rows from dq_row0 of the query tile, DQ_COLS columns from dq_col.
  const int dq_row0 = warp % Tr::DQ_ROW_GROUPS * 32, dq_col = col0 + warp / Tr::DQ_ROW_GROUPS * Tr::DQ_COLS;
  const frag::Coord kp = ldmatrix_x4_k_pair(lane), qd = frag::ldmatrix_x4_quadrants(lane);
  int ds_off[Tr::DQ_M_TILES];  // dS read as A through .trans, one m16 tile each
#pragma unroll
  for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi) ds_off[mi] = DsLayout::offset(kp.row, dq_row0 + 16 * mi + kp.col);
  int dq_k_off[Tr::DQ_N_TILES / 2];                                  // K read as B through .trans
#pragma unroll
  for (int np = 0; np < Tr::DQ_N_TILES / 2; ++np) dq_k_off[np] = Layout::offset(qd.row, dq_col + 16 * np + qd.col);

  for (int t = 0; t < visits; ++t) {
    const int stage = Tr::Q_STAGES == 2 ? t % 2 : 0;
    // This thread's copies of visit t are the only group in flight; after the barrier everyone's are
    // visible and every warp has finished visit t - 1, whose buffers may be refilled.
    cp_async_wait<0>();
    __syncthreads();
    if (Tr::Q_STAGES == 2 && t + 1 < visits) load_visit(stage ^ 1, t + 1);
    cp_async_commit();

    const T* q_tile = q_smem + stage * Tr::Q_ELEMS;
    const T* do_tile = do_smem + stage * Tr::Q_ELEMS;
    const float* lse_tile = lse_smem + stage * BLOCK_Q;
    const float* dd_tile = dd_smem + stage * BLOCK_Q;
    const int h = head_of(t), q0 = q0_of(t);

    // ---- Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ   [WARP_KEYS, WARP_QUERIES] each, k16 steps over head dims; each Q and
    // dO fragment feeds the warp's M m16 tiles of keys
    float s_acc[M][Tr::Q_N_TILES][4] = {};
    float dp_acc[M][Tr::Q_N_TILES][4] = {};
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks) {
      const int u = ks % 4, col = ks / 4 * 64;
      uint32_t ka[M][4], va[M][4];
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        ldmatrix_x4(ka[mi], k_warp + quad_off[u] + Layout::origin(16 * mi, col));
        ldmatrix_x4(va[mi], v_warp + quad_off[u] + Layout::origin(16 * mi, col));
      }
#pragma unroll
      for (int np = 0; np < Tr::Q_N_TILES / 2; ++np) {
        uint32_t qb[4], db[4];
        ldmatrix_x4(qb, q_tile + pair_off[u] + Layout::origin(wq0 + 16 * np, col));
        ldmatrix_x4(db, do_tile + pair_off[u] + Layout::origin(wq0 + 16 * np, col));
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
          mma_m16n8k16<T>(s_acc[mi][2 * np], ka[mi], qb[0], qb[1]);
          mma_m16n8k16<T>(s_acc[mi][2 * np + 1], ka[mi], qb[2], qb[3]);
          mma_m16n8k16<T>(dp_acc[mi][2 * np], va[mi], db[0], db[1]);
          mma_m16n8k16<T>(dp_acc[mi][2 * np + 1], va[mi], db[2], db[3]);
        }
      }
    }

    // ---- Pᵀ = exp2(Sᵀ·scale·log2(e) - LSE₂) and dSᵀ = Pᵀ ∘ (dPᵀ - D)
    // P is the forward's, exactly: its row max and sum are in LSE. Masked pairs (a key past seqlen_k
    // or after the row's diagonal, or outside a window) get P = 0; rows past seqlen_q have LSE₂ = +inf,
    // so P = 0 too.
    bool masked = tile_needs_mask(q0, kv0, BLOCK_KV, seqlen_q, seqlen_k, causal);
    if constexpr (WINDOW) masked = fs::tile_needs_mask(diagonals, q0, BLOCK_Q, kv0, BLOCK_KV, seqlen_k);
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int nt = 0; nt < Tr::Q_N_TILES; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const frag::Coord c = frag::mma_c(lane, i);  // (key, query) inside the m16 tile
          const int qi = wq0 + nt * 8 + c.col;           // query inside the tile
          float score = s_acc[mi][nt][i], slope = 1.0f;
          if constexpr (SOFTCAP) {
            const float tc = tanh_approx(score * cap.pre);
            score = tc, slope = 1.0f - tc * tc;  // scale_log2 is softcap·log2(e): the logit is softcap·tc
          }
          float pv = exp2_fast(fmaf(score, scale_log2, -lse_tile[qi]));
          if (masked) {
            const int key = key0 + 16 * mi + c.row, row = q0 + qi;
            if (key >= seqlen_k || (WINDOW ? !sees(diagonals, row, key) : causal && key > row + seqlen_k - seqlen_q))
              pv = 0.0f;
          }
          s_acc[mi][nt][i] = pv;
          dp_acc[mi][nt][i] = pv * (dp_acc[mi][nt][i] - dd_tile[qi]) * slope;
        }

    // A warp's dSᵀ rows go to ds_smem (dQ reads them as dS) and, when warps share keys, its Pᵀ to
    // p_smem: the warps of a key group then read each other's queries back as A fragments.
    if constexpr (Tr::COL_GROUPS > 1) {
      store_rows<T, Tr>(p_smem, s_acc, kr0, wq0, lane);
      store_rows<T, Tr>(ds_smem, dp_acc, kr0, wq0, lane);
      __syncthreads();  // every warp's Pᵀ and dSᵀ are in
    }

    // ---- dV += Pᵀ·dO and dK += dSᵀ·Q   [WARP_KEYS, WARP_COLS] each, k16 steps over all queries; dO
    // and Q stored [query][dim] are read through .trans as B (two n8 tiles of head dims per ldmatrix).
    // Each step makes its A fragments just before its mma, so that few are in registers at a time.
    if constexpr (ATOMIC_DQ && Tr::COL_GROUPS == 1) store_rows<T, Tr>(ds_smem, dp_acc, kr0, wq0, lane);
#pragma unroll
    for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk) {
      uint32_t pa[M][4], dsa[M][4];
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        a_fragment<T, Tr>(pa[mi], s_acc, p_smem, pq_off, kr0, mi, kk);
        a_fragment<T, Tr>(dsa[mi], dp_acc, ds_smem, pq_off, kr0, mi, kk);
      }
#pragma unroll
      for (int np = 0; np < Tr::SLICE_N_TILES / 2; ++np) {
        const int col = wc0 + np / 4 * 64;
        uint32_t db[4], qb[4];
        ldmatrix_x4_trans(db, do_tile + quad_off[np % 4] + Layout::origin(16 * kk, col));
        ldmatrix_x4_trans(qb, q_tile + quad_off[np % 4] + Layout::origin(16 * kk, col));
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
          mma_m16n8k16<T>(dv_acc[mi][2 * np], pa[mi], db[0], db[1]);
          mma_m16n8k16<T>(dv_acc[mi][2 * np + 1], pa[mi], db[2], db[3]);
          mma_m16n8k16<T>(dk_acc[mi][2 * np], dsa[mi], qb[0], qb[1]);
          mma_m16n8k16<T>(dk_acc[mi][2 * np + 1], dsa[mi], qb[2], qb[3]);
        }
      }
    }

    if constexpr (ATOMIC_DQ && Tr::COL_GROUPS == 1) {
      __syncthreads();  // every warp's dSᵀ is in; every warp is done with this visit's Q and dO
    } else if constexpr (Tr::COL_GROUPS == 1 && Tr::Q_STAGES == 1) {
      __syncthreads();  // every warp is done with this visit's Q and dO
    }
    if (Tr::Q_STAGES == 1 && t + 1 < visits) {
      load_visit(0, t + 1);  // one buffer: the next visit is copied during dQ
      cp_async_commit();
    }

    if constexpr (ATOMIC_DQ) {
      // ---- dQ[q0 …, slice] += dS·K   [BLOCK_Q, SLICE]: warp (32-row group, column group), k16 steps over keys.
      // dS [query][key] is read from dSᵀ stored [key][query] through .trans, K stored [key][dim] too.
      float dq_acc[Tr::DQ_M_TILES][Tr::DQ_N_TILES][4] = {};
#pragma unroll
      for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk) {
        uint32_t a[Tr::DQ_M_TILES][4];
#pragma unroll
        for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi)
          ldmatrix_x4_trans(a[mi], ds_smem + DsLayout::origin(16 * kk, 0) + ds_off[mi]);
#pragma unroll
        for (int np = 0; np < Tr::DQ_N_TILES / 2; ++np) {
          uint32_t kb[4];
          ldmatrix_x4_trans(kb, k_smem + Layout::origin(16 * kk, 0) + dq_k_off[np]);
#pragma unroll
          for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi) {
            mma_m16n8k16<T>(dq_acc[mi][2 * np], a[mi], kb[0], kb[1]);
            mma_m16n8k16<T>(dq_acc[mi][2 * np + 1], a[mi], kb[2], kb[3]);
          }
        }
      }
      // Every block of this head adds to the same dQ rows: fp32 atomics (red.global.add, no return),
      // two neighbouring columns at once where the GPU has the vector form (sm_90).
      float* acc_rows = dq_accum + ((int64_t(b) * f.heads_q + h) * rows_per_head + q0 + dq_row0) * Tr::HEAD_DIM;
#pragma unroll
      for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi)
#pragma unroll
        for (int nt = 0; nt < Tr::DQ_N_TILES; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const frag::Coord c = frag::mma_c(lane, 2 * r);
            float* dst = acc_rows + (16 * mi + c.row) * Tr::HEAD_DIM + dq_col + nt * 8 + c.col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst), make_float2(dq_acc[mi][nt][2 * r], dq_acc[mi][nt][2 * r + 1]));
#else
            atomicAdd(dst, dq_acc[mi][nt][2 * r]);
            atomicAdd(dst + 1, dq_acc[mi][nt][2 * r + 1]);
#endif
          }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits

  // ---- epilogue: dK = scale·dK_acc and dV, the warp's keys and the slice's columns
  T* dk_rows = dk + offset_of(p.dk, tb, k_start, h_kv);
  T* dv_rows = dv + offset_of(p.dv, tb, k_start, h_kv);
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const frag::Coord c = frag::mma_c(lane, 2 * r);
      const int key = key0 + 16 * mi + c.row;
      if (key >= seqlen_k) continue;
#pragma unroll
      for (int nt = 0; nt < Tr::SLICE_N_TILES; ++nt) {
        const int col = wc0 + nt * 8 + c.col;
        if (col >= head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk_rows + int64_t(key) * p.dk.row + col) =
            pack2<T>(dk_acc[mi][nt][2 * r] * f.softmax_scale, dk_acc[mi][nt][2 * r + 1] * f.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_rows + int64_t(key) * p.dv.row + col) =
            pack2<T>(dv_acc[mi][nt][2 * r], dv_acc[mi][nt][2 * r + 1]);
      }
    }
}

// ---- dQ = scale · accumulator, one thread per 8 columns of a row --------------------------------
inline constexpr int kConvertThreads = 256;

// VARLEN (step 13c): a packed batch, the accumulator in the padded batch's rows; row i of sequence b is
// row q_start + i of the packed dQ.
template <typename T, int HEAD_DIM, bool VARLEN = false>
__global__ void __launch_bounds__(kConvertThreads)
    convert_dq_kernel(const float* __restrict__ dq_accum, T* __restrict__ dq, const BackwardProblem p) {
  const Problem& f = p.attention;
  const int64_t chunks = f.head_dim / 8;
  const int64_t idx = int64_t(blockIdx.x) * kConvertThreads + threadIdx.x;
  if (idx >= f.batch * f.heads_q * f.seqlen_q * chunks) return;
  const int64_t row = idx / chunks, c = idx % chunks;
  const int64_t bh = row / f.seqlen_q, i = row % f.seqlen_q;
  const float* src = dq_accum + (bh * padded_rows(f.seqlen_q) + i) * HEAD_DIM + 8 * c;
  if constexpr (VARLEN) {
    const Sequence seq = load_sequence(f, bh / f.heads_q);
    if (i >= seq.q_len) return;
    *reinterpret_cast<uint4*>(dq + offset_of(p.dq, 0, seq.q_start + i, bh % f.heads_q) + 8 * c) =
        scaled_pack8<T>(src, f.softmax_scale);
  } else {
    *reinterpret_cast<uint4*>(dq + offset_of(p.dq, bh / f.heads_q, i, bh % f.heads_q) + 8 * c) =
        scaled_pack8<T>(src, f.softmax_scale);
  }
}

// ---- deterministic mode: dQ by query rows, no atomics --------------------------------------------
// Block x: query head bh = x / (q_tiles · D_SLICES), then query tile (the last first) and slice. Each
// warp owns 16 query rows and sums dQ over the K/V tiles in order, so dQ is the same on every run.
// SOFTCAP, WINDOW: logit softcapping and a sliding window, as in backward_kernel; with a window the block
// visits only the run of K/V tiles its rows see (kv_span). VARLEN (step 13c, with WINDOW): a packed batch,
// the workspace in the padded batch's rows; a block whose query tile lies past its sequence's end exits.
template <typename T, class Tr, bool SOFTCAP = false, bool WINDOW = false, bool VARLEN = false>
__global__ void __launch_bounds__(Tr::NUM_THREADS)
    dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ d_o,
              T* __restrict__ dq, const float* __restrict__ lse2, const float* __restrict__ d_rows,
              const BackwardProblem p, const float scale_log2, const Softcap cap) {
  using Layout = typename Tr::Layout;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, BLOCK_KV = Tr::BLOCK_KV, NT = Tr::NUM_THREADS;
  const Problem& f = p.attention;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* q_smem = reinterpret_cast<T*>(smem_raw);  // [BLOCK_Q, HEAD_DIM], swizzled
  T* do_smem = q_smem + Tr::Q_ELEMS;            // [BLOCK_Q, HEAD_DIM], swizzled
  T* k_smem = do_smem + Tr::Q_ELEMS;            // [2][BLOCK_KV, HEAD_DIM], swizzled
  T* v_smem = k_smem + 2 * Tr::KV_ELEMS;        // [2][BLOCK_KV, HEAD_DIM], swizzled

  static_assert(!VARLEN || WINDOW, "13c: a packed batch runs the band's code");
  int seqlen_q = int(f.seqlen_q), seqlen_k = int(f.seqlen_k);
  const int head_dim = int(f.head_dim);
  const bool causal = f.causal != 0;
  const uint32_t per_head = uint32_t(tiles(f.seqlen_q, BLOCK_Q)) * Tr::D_SLICES;
  const uint32_t bh = blockIdx.x / per_head;
  const uint32_t b = bh / uint32_t(f.heads_q), h = bh % uint32_t(f.heads_q);
  const uint32_t h_kv = h / uint32_t(f.heads_q / f.heads_kv);
  int64_t tb = b, q_start = 0, k_start = 0;  // 13c: the tensors' batch index, the sequence's first rows
  Band band = band_of(f);
  if constexpr (VARLEN) {
    const Sequence seq = load_sequence(f, b);
    seqlen_q = int(seq.q_len), seqlen_k = int(seq.k_len), tb = 0, q_start = seq.q_start, k_start = seq.k_start;
    band = band_of(one_sequence(f, seq));
  }
  const int q_tile = int(tiles(seqlen_q, BLOCK_Q)) - 1 - int(blockIdx.x % per_head) / Tr::D_SLICES;
  if (VARLEN && q_tile < 0) return;  // past the sequence's end
  const int slice = int(blockIdx.x % per_head) % Tr::D_SLICES;
  const int q0 = q_tile * BLOCK_Q, col0 = slice * Tr::SLICE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const T* k_head = k + offset_of(f.k, tb, k_start, h_kv);
  const T* v_head = v + offset_of(f.v, tb, k_start, h_kv);
  const Diagonals diagonals = diagonals_of(band);
  int kv_first = 0, kv_count = kv_tiles_seen(q0, BLOCK_Q, BLOCK_KV, seqlen_q, seqlen_k, causal);
  if constexpr (WINDOW) {
    const KvSpan span = kv_span(band, q0, min(BLOCK_Q, seqlen_q - q0), BLOCK_KV);
    kv_first = span.first, kv_count = span.count;
  }
  auto load_kv = [&](int stage, int j) {
    copy_tile_async<Layout, BLOCK_KV, NT>(k_smem + stage * Tr::KV_ELEMS, k_head, f.k.row, j * BLOCK_KV, seqlen_k - 1,
                                          head_dim);
    copy_tile_async<Layout, BLOCK_KV, NT>(v_smem + stage * Tr::KV_ELEMS, v_head, f.v.row, j * BLOCK_KV, seqlen_k - 1,
                                          head_dim);
  };
  copy_tile_async<Layout, BLOCK_Q, NT>(q_smem, q + offset_of(f.q, tb, q_start, h), f.q.row, q0, seqlen_q - 1,
                                       head_dim);
  copy_tile_async<Layout, BLOCK_Q, NT>(do_smem, d_o + offset_of(p.d_o, tb, q_start, h), p.d_o.row, q0, seqlen_q - 1,
                                       head_dim);
  if (kv_count > 0) load_kv(0, kv_first);
  cp_async_commit();

  // This lane's rows (g and g + 8 of the warp's 16): LSE₂ and D.
  const int64_t row_base = int64_t(bh) * padded_rows(f.seqlen_q) + q0 + 16 * warp;
  float lse_r[2], dd_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse_r[r] = lse2[row_base + frag::mma_c(lane, 2 * r).row];
    dd_r[r] = d_rows[row_base + frag::mma_c(lane, 2 * r).row];
  }

  int quad_off[4], pair_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const frag::Coord a = frag::ldmatrix_x4_quadrants(lane), c = ldmatrix_x4_k_pair(lane);
    quad_off[u] = Layout::offset(a.row, 16 * u + a.col);
    pair_off[u] = Layout::offset(c.row, 16 * u + c.col);
  }
  const T* q_warp = q_smem + Layout::origin(16 * warp, 0);
  const T* do_warp = do_smem + Layout::origin(16 * warp, 0);

  float dq_acc[Tr::SLICE_N_TILES][4] = {};  // [16 rows, SLICE] fp32
  for (int t = 0; t < kv_count; ++t) {
    const int stage = t % 2, kv0 = (kv_first + t) * BLOCK_KV;
    cp_async_wait<0>();
    __syncthreads();  // tile t is in; every warp is done with tile t - 1
    if (t + 1 < kv_count) load_kv(stage ^ 1, kv_first + t + 1);
    cp_async_commit();
    const T* k_tile = k_smem + stage * Tr::KV_ELEMS;
    const T* v_tile = v_smem + stage * Tr::KV_ELEMS;

    // ---- S = Q·Kᵀ and dP = dO·Vᵀ   [16 rows, BLOCK_KV]
    float s_acc[Tr::KV_N_TILES][4] = {};
    float dp_acc[Tr::KV_N_TILES][4] = {};
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks) {
      const int u = ks % 4, col = ks / 4 * 64;
      uint32_t qa[4], da[4];
      ldmatrix_x4(qa, q_warp + quad_off[u] + col);
      ldmatrix_x4(da, do_warp + quad_off[u] + col);
#pragma unroll
      for (int np = 0; np < Tr::KV_N_TILES / 2; ++np) {
        uint32_t kb[4], vb[4];
        ldmatrix_x4(kb, k_tile + pair_off[u] + Layout::origin(16 * np, col));
        ldmatrix_x4(vb, v_tile + pair_off[u] + Layout::origin(16 * np, col));
        mma_m16n8k16<T>(s_acc[2 * np], qa, kb[0], kb[1]);
        mma_m16n8k16<T>(s_acc[2 * np + 1], qa, kb[2], kb[3]);
        mma_m16n8k16<T>(dp_acc[2 * np], da, vb[0], vb[1]);
        mma_m16n8k16<T>(dp_acc[2 * np + 1], da, vb[2], vb[3]);
      }
    }

    // ---- P and dS = P ∘ (dP - D), as in the main kernel, rows and columns the other way round
    bool masked = tile_needs_mask(q0, kv0, BLOCK_KV, seqlen_q, seqlen_k, causal);
    if constexpr (WINDOW) masked = fs::tile_needs_mask(diagonals, q0, BLOCK_Q, kv0, BLOCK_KV, seqlen_k);
    uint32_t ds_frag[Tr::KV_K_STEPS][4];
#pragma unroll
    for (int nt = 0; nt < Tr::KV_N_TILES; ++nt) {
      float ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const frag::Coord c = frag::mma_c(lane, i);  // (row, key) inside the warp's tile
        float score = s_acc[nt][i], slope = 1.0f;
        if constexpr (SOFTCAP) {
          const float tc = tanh_approx(score * cap.pre);
          score = tc, slope = 1.0f - tc * tc;  // scale_log2 is softcap·log2(e): the logit is softcap·tc
        }
        float pv = exp2_fast(fmaf(score, scale_log2, -lse_r[i / 2]));
        if (masked) {
          const int key = kv0 + nt * 8 + c.col, row = q0 + 16 * warp + c.row;
          if (key >= seqlen_k || (WINDOW ? !sees(diagonals, row, key) : causal && key > row + seqlen_k - seqlen_q))
            pv = 0.0f;
        }
        ds[i] = pv * (dp_acc[nt][i] - dd_r[i / 2]) * slope;
      }
#pragma unroll
      for (int i = 0; i < 4; i += 2) ds_frag[nt / 2][frag::mma_a_reg_of_c(nt % 2, i)] = pack2<T>(ds[i], ds[i + 1]);
    }

    // ---- dQ += dS·K   [16 rows, SLICE], k16 steps over keys; K stored [key][dim] read through .trans
#pragma unroll
    for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk)
#pragma unroll
      for (int np = 0; np < Tr::SLICE_N_TILES / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, k_tile + quad_off[np % 4] + Layout::origin(16 * kk, col0 + np / 4 * 64));
        mma_m16n8k16<T>(dq_acc[2 * np], ds_frag[kk], kb[0], kb[1]);
        mma_m16n8k16<T>(dq_acc[2 * np + 1], ds_frag[kk], kb[2], kb[3]);
      }
  }
  cp_async_wait<0>();

  // ---- epilogue: dQ = scale·dq_acc, the warp's rows and the slice's columns
  T* dq_rows = dq + offset_of(p.dq, tb, q_start, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const frag::Coord c = frag::mma_c(lane, 2 * r);
    const int row = q0 + 16 * warp + c.row;
    if (row >= seqlen_q) continue;
#pragma unroll
    for (int nt = 0; nt < Tr::SLICE_N_TILES; ++nt) {
      const int col = col0 + nt * 8 + c.col;
      if (col < head_dim)
        *reinterpret_cast<uint32_t*>(dq_rows + int64_t(row) * p.dq.row + col) =
            pack2<T>(dq_acc[nt][2 * r] * f.softmax_scale, dq_acc[nt][2 * r + 1] * f.softmax_scale);
    }
  }
}

}  // namespace fs::step11
