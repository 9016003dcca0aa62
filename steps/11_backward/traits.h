// Step 11 — the compile-time choices of the backward pass (kernel.cuh): the table of tile
// configurations, the work split and the index math. Plain C++: tests/test_step11_backward.cpp
// includes this header and checks every function here against brute force and the PTX ISA's tables.
//
// Copied from step 07's traits.h: the 128-byte swizzled layout, the fragment maps of mma.sync and
// ldmatrix, the K-pair ldmatrix order (unchanged). Added: the backward's tiles, and the map of an A
// operand read transposed from shared memory (dSᵀ stored [key][query], read as dS [query][key]).
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>

#include "common/forward/problem.h"
#include "common/step/overflow.h"

namespace fs::step11 {

// ---- shared-memory layout (step 04's swizzle, as step 07 uses it) ------------------------------
// XOR swizzle on 16-byte chunks (8 elements): within each group of 8 chunks (128 bytes) of a row,
// chunk c is stored at chunk c ^ (row % 8). Eight consecutive rows then put the same logical chunk
// in eight different 16-byte bank groups: an ldmatrix (8 rows × 16 bytes) is conflict-free.
template <int COLS>
struct Swizzled128Layout {
  static_assert(COLS % 64 == 0, "the 128-byte XOR swizzle needs rows of a multiple of 64 elements");
  static constexpr int kCols = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ (row % 8)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
  // The swizzle repeats every 8 rows and every 64 columns: for row0 % 8 == 0, col0 % 64 == 0 and
  // (r, c) with c < 64, offset(row0 + r, col0 + c) = offset(r, c) + origin(row0, col0). An ldmatrix
  // address is then one of four per-lane offsets plus a compile-time constant.
  FS_HD static constexpr int origin(int row0, int col0) { return row0 * COLS + col0; }
};

// Rows of 32 elements (64 bytes: dSᵀ of 32-query tiles), step 07's 64-byte swizzle: within its
// aligned group of 4 chunks, chunk c of row r is stored at c ^ ((r / 2) % 4). Rows start alternately
// at bank group 0 and 4, so eight consecutive rows from a multiple of 8 still hit eight different
// 16-byte bank groups.
template <int COLS>
struct Swizzled64Layout {
  static_assert(COLS == 32, "the 64-byte XOR swizzle is used for 32-element rows only here");
  static constexpr int kCols = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ ((row / 2) % 4)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
  FS_HD static constexpr int origin(int row0, int col0) { return row0 * COLS + col0; }
};

// ---- which lane holds which element (step 06's maps, as step 07 copied them) --------------------
namespace frag {

struct Coord {
  int row;
  int col;
};
FS_HD constexpr bool operator==(Coord a, Coord b) { return a.row == b.row && a.col == b.col; }
FS_HD constexpr bool operator!=(Coord a, Coord b) { return !(a == b); }

FS_HD constexpr int group_of(int lane) { return lane / 4; }
FS_HD constexpr int thread_in_group(int lane) { return lane % 4; }

// A: 16×16, a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 8+2t..), a[3] = (g+8, 8+2t..).
FS_HD constexpr Coord mma_a(int lane, int reg, int half) {
  return {group_of(lane) + 8 * (reg % 2), 8 * (reg / 2) + 2 * thread_in_group(lane) + half};
}
// B: 16×8 (k × n), lane l holds column g; b[reg] = rows 8·reg + 2t, 8·reg + 2t + 1.
FS_HD constexpr Coord mma_b(int lane, int reg, int half) {
  return {8 * reg + 2 * thread_in_group(lane) + half, group_of(lane)};
}
// C/D: 16×8 fp32, d[0], d[1] = row g, columns 2t, 2t+1; d[2], d[3] = row g+8.
FS_HD constexpr Coord mma_c(int lane, int i) {
  return {group_of(lane) + 8 * (i / 2), 2 * thread_in_group(lane) + i % 2};
}
// C elements i, i+1 (i even) of the n8 tile n_half of a k16 step are A register mma_a_reg_of_c.
FS_HD constexpr int mma_a_reg_of_c(int n_half, int i) { return i / 2 + 2 * n_half; }

// ldmatrix: lane 8·m + r gives the address of row r of matrix m; register m of a lane receives row g,
// columns 2t, 2t+1 of matrix m (with .trans: column g, rows 2t, 2t+1).
FS_HD constexpr int ldmatrix_matrix_of(int lane) { return lane / 8; }
FS_HD constexpr int ldmatrix_row_of(int lane) { return lane % 8; }
FS_HD constexpr Coord ldmatrix_element(int lane, int half, bool trans) {
  return trans ? Coord{2 * thread_in_group(lane) + half, group_of(lane)}
               : Coord{group_of(lane), 2 * thread_in_group(lane) + half};
}
// A 16×16 stored tile as four 8×8 quadrants, matrix m at (8·(m % 2), 8·(m / 2)): without .trans the
// A operand of a tile stored [m][k] (K, V rows); with .trans the B operands of two n8 tiles of a
// tile stored [k][n] (dO for dV, Q for dK, K for dQ). Returns (row, col) of the 16-byte row this
// lane supplies.
FS_HD constexpr Coord ldmatrix_x4_quadrants(int lane) {
  const int m = ldmatrix_matrix_of(lane);
  return {8 * (m % 2) + ldmatrix_row_of(lane), 8 * (m / 2)};
}

}  // namespace frag

// The other order, matrix m at (8·(m / 2), 8·(m % 2)): without .trans the B operands of two n8 tiles
// of a tile stored [n][k] (step 07's K: here Q and dO in S = Q·Kᵀ and dP = dO·Vᵀ, and K and V in the
// deterministic dQ kernel); with .trans the A operand of a tile stored [k][m] (dSᵀ stored [key][query]
// read as dS [query][key]: its a[m] = stored rows 8·(m / 2) …, columns 8·(m % 2) …, transposed).
FS_HD constexpr frag::Coord ldmatrix_x4_k_pair(int lane) {
  const int m = frag::ldmatrix_matrix_of(lane);
  return {8 * (m / 2) + frag::ldmatrix_row_of(lane), 8 * (m % 2)};
}

// ---- the table of tile configurations ----------------------------------------------------------
// The main kernel: a block owns BLOCK_KV keys of one K/V head (each warp WARP_KEYS = 16·KEY_TILES of
// them) and SLICE = HEAD_DIM / D_SLICES columns of dK, dV and dQ; it loops over the query tiles
// (BLOCK_Q rows) of every query head of the group. head_dim is padded to a multiple of 64 (zero-filled
// columns change no score and no stored gradient).
//
// Register budget, per thread, of a warp that owns WARP_KEYS keys (shared by COL_GROUPS warps, each
// with WARP_QUERIES = BLOCK_Q / COL_GROUPS queries of Sᵀ and WARP_COLS = SLICE / COL_GROUPS columns of
// dK and dV):
//   dk_acc, dv_acc  2 · WARP_KEYS·WARP_COLS/32 fp32     (live for the whole loop)
//   s_acc, dp_acc   2 · WARP_KEYS·WARP_QUERIES/32 fp32  (one query tile)
// within the 255 registers a thread may have. A warp reads its queries of Q and dO per tile as B of
// Sᵀ and dPᵀ, and all of them through .trans as B of dK and dV, so the shared-memory traffic per mma
// falls as WARP_KEYS grows: shared memory is what limits this kernel (notes/11_backward.md has the
// ncu counters).
//   HEAD_DIM 64:  32 keys per warp, 32-query tiles: 128 + 64 registers, 4 warps, 2 blocks per SM
//   HEAD_DIM 128: 32 keys shared by 2 warps, 64-query tiles: each warp 32 queries of Sᵀ, dPᵀ and 64
//                 columns of dK, dV, 128 + 64 registers (one warp with all 128 columns would need
//                 256 for dK and dV alone); Pᵀ and dSᵀ go through shared memory so that each warp
//                 reads its partner's queries back as A fragments. 8 warps, 1 block per SM.
// At HEAD_DIM 192 and 256 a block computes a 64-column slice of the gradients (D_SLICES blocks per K/V
// tile, each recomputing S and dP): those widths are supported, not fast. dQ of one query tile
// (BLOCK_Q × SLICE) is split over the warps after S and dP are dead.
//
// Shared memory decides the rest, per GPU family (bytes a block may opt in to): sm_90 227 KiB, sm_80
// 163 KiB hold the rows above; sm_86 and sm_89 allow 99 KiB, so head_dim 128, 192 and 256 have a second,
// smaller row (_S: fewer keys per block; at 128 also one Q/dO buffer, at 192 and 256 fewer keys or
// queries per tile of the deterministic mode's dQ kernel), chosen where the first does not fit (choose_config).
struct Config {
  int head_dim;   // HEAD_DIM: tile width, a multiple of 64
  int block_q;    // BLOCK_Q: query rows per iteration
  int block_kv;   // BLOCK_KV: keys per block, WARP_KEYS per key group of warps
  int q_stages;   // Q_STAGES: Q/dO buffers (2: the next tile is copied during this one)
  int d_slices;   // D_SLICES: column slices of the gradients, one block each
  int min_blocks; // MIN_BLOCKS: blocks per SM the registers are capped for (__launch_bounds__)
  int key_tiles;  // KEY_TILES: m16 tiles of keys per warp (each Q and dO fragment feeds that many mma)
  int col_groups; // COL_GROUPS: warps sharing a group of keys (each: 1/COL_GROUPS of the queries of Sᵀ
                  // and dPᵀ, of the columns of dK and dV; Pᵀ and dSᵀ then go through shared memory)
  int dq_block_q;  // the deterministic mode's dq_kernel: query rows per block (16 per warp)
  int dq_block_kv; // ... and keys per K/V tile (two buffers)
};

enum ConfigId : int { kD64, kD128, kD128_S, kD192, kD192_S, kD256, kD256_S, kNumConfigs };

inline constexpr int64_t KiB = 1024;
inline constexpr Config kConfigs[kNumConfigs] = {
    // HEAD_DIM BLOCK_Q BLOCK_KV STAGES SLICES MIN_BLOCKS KEY_TILES COL_GROUPS  dq: BLOCK_Q BLOCK_KV
    {64, 32, 128, 2, 1, 1, 2, 1, 64, 64},   // kD64      smem  57 KiB, dq_kernel  48 KiB
    {128, 64, 128, 2, 1, 1, 2, 2, 64, 64},  // kD128     smem 161 KiB, dq_kernel  96 KiB
    {128, 64, 64, 1, 1, 1, 1, 1, 64, 64},   // kD128_S   smem  73 KiB, dq_kernel  96 KiB
    {192, 64, 64, 1, 3, 1, 1, 1, 64, 64},   // kD192     smem 105 KiB, dq_kernel 144 KiB
    {192, 64, 32, 1, 3, 1, 1, 1, 64, 32},   // kD192_S   smem  77 KiB, dq_kernel  96 KiB
    {256, 64, 64, 1, 4, 1, 1, 1, 64, 64},   // kD256     smem 137 KiB, dq_kernel 192 KiB
    {256, 32, 32, 1, 4, 1, 1, 1, 32, 32},   // kD256_S   smem  66 KiB, dq_kernel  96 KiB
};

// The tile width a head_dim (a multiple of 8, at most 256) is padded to.
FS_HD constexpr int padded_width(int64_t head_dim) {
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 192 ? 192 : 256;
}

// Shared memory per block of a row's main kernel and of its dq_kernel (2-byte elements; the main
// kernel's rows of LSE₂ and D are fp32). Traits and DqTraits check theirs against these.
FS_HD constexpr int64_t main_smem_bytes(const Config& c) {
  const int64_t kv = int64_t(c.block_kv) * c.head_dim, q = int64_t(c.block_q) * c.head_dim;
  return (2 * kv + 2 * c.q_stages * q + (c.col_groups > 1 ? 2 : 1) * int64_t(c.block_kv) * c.block_q) * 2 +
         2 * c.q_stages * c.block_q * 4;
}
FS_HD constexpr int64_t dq_smem_bytes(const Config& c) {
  return (2 * int64_t(c.dq_block_q) + 4 * int64_t(c.dq_block_kv)) * c.head_dim * 2;
}
// What a launch needs: the main kernel's, and the dq_kernel's too in the deterministic mode.
FS_HD constexpr int64_t smem_needed(const Config& c, bool deterministic) {
  return deterministic && dq_smem_bytes(c) > main_smem_bytes(c) ? dq_smem_bytes(c) : main_smem_bytes(c);
}

// The row for a head_dim on a GPU whose blocks may opt in to smem_optin bytes: the first of its width
// whose kernels fit, or -1.
constexpr int choose_config(int64_t head_dim, bool deterministic, int64_t smem_optin) {
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].head_dim == padded_width(head_dim) && smem_needed(kConfigs[i], deterministic) <= smem_optin)
      return i;
  return -1;
}

// The least shared memory any row of the head_dim's width needs (for refusals).
constexpr int64_t min_smem_needed(int64_t head_dim, bool deterministic) {
  int64_t least = 0;
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].head_dim == padded_width(head_dim) &&
        (least == 0 || smem_needed(kConfigs[i], deterministic) < least))
      least = smem_needed(kConfigs[i], deterministic);
  return least;
}

// Everything the main kernel derives from its named constants.
template <int HEAD_DIM_, int BLOCK_Q_, int BLOCK_KV_, int Q_STAGES_, int D_SLICES_, int MIN_BLOCKS_, int KEY_TILES_,
          int COL_GROUPS_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_Q = BLOCK_Q_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int Q_STAGES = Q_STAGES_;
  static constexpr int D_SLICES = D_SLICES_;
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int KEY_TILES = KEY_TILES_;
  static constexpr int COL_GROUPS = COL_GROUPS_;
  static constexpr int WARP_KEYS = 16 * KEY_TILES;  // keys per warp
  static constexpr int KEY_GROUPS = BLOCK_KV / WARP_KEYS;
  static constexpr int NUM_WARPS = KEY_GROUPS * COL_GROUPS;  // warp w: key group w / COL_GROUPS
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int SLICE = HEAD_DIM / D_SLICES;  // columns of dK, dV, dQ per block

  static constexpr int D_K_STEPS = HEAD_DIM / 16;    // k16 steps of S and dP (over head dims)
  static constexpr int WARP_QUERIES = BLOCK_Q / COL_GROUPS;  // columns of a warp's Sᵀ and dPᵀ
  static constexpr int WARP_COLS = SLICE / COL_GROUPS;       // columns of a warp's dK and dV
  static constexpr int Q_N_TILES = WARP_QUERIES / 8;  // n8 tiles of a warp's Sᵀ and dPᵀ (over queries)
  static constexpr int Q_K_STEPS = BLOCK_Q / 16;      // k16 steps of dV and dK (over queries)
  static constexpr int SLICE_N_TILES = WARP_COLS / 8; // n8 tiles of a warp's dK, dV (over head dims)
  static constexpr int KV_K_STEPS = BLOCK_KV / 16;   // k16 steps of dQ (over keys)
  // dQ of a query tile, [BLOCK_Q, SLICE]: warp w computes 32 rows (two m16 tiles, so that each K
  // fragment it reads feeds two mma), row group w % DQ_ROW_GROUPS, and DQ_COLS columns, column group
  // w / DQ_ROW_GROUPS.
  static constexpr int DQ_M_TILES = 2;
  static constexpr int DQ_ROW_GROUPS = BLOCK_Q / 32;
  static constexpr int DQ_COL_GROUPS = NUM_WARPS / DQ_ROW_GROUPS;
  static constexpr int DQ_COLS = SLICE / DQ_COL_GROUPS;
  static constexpr int DQ_N_TILES = DQ_COLS / 8;
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte copies per row of a tile

  using Layout = Swizzled128Layout<HEAD_DIM>;   // K, V, Q, dO tiles
  // dSᵀ [BLOCK_KV, BLOCK_Q]
  using DsLayout = std::conditional_t<BLOCK_Q % 64 == 0, Swizzled128Layout<BLOCK_Q>, Swizzled64Layout<BLOCK_Q>>;

  static constexpr int KV_ELEMS = BLOCK_KV * HEAD_DIM;  // k_smem, v_smem
  static constexpr int Q_ELEMS = BLOCK_Q * HEAD_DIM;    // one q_smem or do_smem buffer
  static constexpr int DS_ELEMS = BLOCK_KV * BLOCK_Q;   // ds_smem, and p_smem with COL_GROUPS > 1
  static constexpr int SMEM_BYTES = (2 * KV_ELEMS + 2 * Q_STAGES * Q_ELEMS + (COL_GROUPS > 1 ? 2 : 1) * DS_ELEMS) * 2 +
                                    2 * Q_STAGES * BLOCK_Q * 4;  // + the rows' LSE and D, fp32

  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "tile widths are multiples of 64 up to 256");
  static_assert(SLICE % 64 == 0 && SLICE <= 128, "a slice is whole swizzle groups, at most 128 columns (registers)");
  static_assert(BLOCK_Q % 64 == 0 || BLOCK_Q == 32, "dSᵀ rows are whole swizzle groups");
  static_assert(NUM_WARPS % DQ_ROW_GROUPS == 0 && SLICE % (16 * DQ_COL_GROUPS) == 0,
                "dQ's m16 tiles and column groups divide the warps; B fragments come two n8 tiles at a time");
  static_assert(Q_STAGES == 1 || Q_STAGES == 2, "one Q/dO buffer or two");
  static_assert(COL_GROUPS == 1 || (Q_STAGES == 2 && WARP_COLS % 64 == 0 && WARP_QUERIES % 16 == 0),
                "shared keys: the next Q/dO is copied during this one, a warp's columns are whole swizzle groups");
  static_assert(NUM_THREADS >= 2 * (BLOCK_Q / 4), "one thread per 16-byte chunk of the rows' LSE and D");
};

template <int CONFIG>
using TraitsOf = Traits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].block_q, kConfigs[CONFIG].block_kv,
                        kConfigs[CONFIG].q_stages, kConfigs[CONFIG].d_slices, kConfigs[CONFIG].min_blocks,
                        kConfigs[CONFIG].key_tiles, kConfigs[CONFIG].col_groups>;

// The deterministic mode's dQ kernel: a block owns BLOCK_Q query rows (16 per warp) of one query head
// and SLICE columns of dQ, and loops over the K/V tiles that row block sees. dQ is its own sum, in a
// fixed order: no atomics.
template <int HEAD_DIM_, int D_SLICES_, int BLOCK_Q_, int BLOCK_KV_>
struct DqTraits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int D_SLICES = D_SLICES_;
  static constexpr int BLOCK_Q = BLOCK_Q_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int NUM_WARPS = BLOCK_Q / 16;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int SLICE = HEAD_DIM / D_SLICES;
  static constexpr int D_K_STEPS = HEAD_DIM / 16;   // S and dP (over head dims)
  static constexpr int KV_N_TILES = BLOCK_KV / 8;   // n8 tiles of S and dP (over keys)
  static constexpr int KV_K_STEPS = BLOCK_KV / 16;  // k16 steps of dQ (over keys)
  static constexpr int SLICE_N_TILES = SLICE / 8;   // n8 tiles of dQ
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
  using Layout = Swizzled128Layout<HEAD_DIM>;
  static constexpr int Q_ELEMS = BLOCK_Q * HEAD_DIM;    // q_smem, do_smem
  static constexpr int KV_ELEMS = BLOCK_KV * HEAD_DIM;  // one K or V buffer (two stages)
  static constexpr int SMEM_BYTES = (2 * Q_ELEMS + 4 * KV_ELEMS) * 2;
  static_assert(SLICE % 64 == 0 && SLICE <= 128, "a slice is whole swizzle groups, at most 128 columns");
  static_assert(BLOCK_Q % 16 == 0 && BLOCK_KV % 16 == 0, "16 query rows per warp; keys 16 at a time");
};

template <int CONFIG>
using DqTraitsOf = DqTraits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].d_slices, kConfigs[CONFIG].dq_block_q,
                            kConfigs[CONFIG].dq_block_kv>;

// ---- the work split ----------------------------------------------------------------------------
FS_HD constexpr int64_t tiles(int64_t n, int block) { return (n + block - 1) / block; }

// Rows of the workspace's per-row arrays (LSE in base 2, D) and of the fp32 dQ accumulator per
// (batch, query head): seqlen_q rounded up to 128, so a tile never reads past them. The padding rows
// hold LSE = +inf and D = 0: their P is 0, so they add nothing.
FS_HD constexpr int64_t padded_rows(int64_t seqlen_q) { return tiles(seqlen_q, 128) * 128; }

// The workspace (steps 11, 12 and 13): LSE₂ and D (fp32, one per padded query row) and, without the
// deterministic mode, the fp32 dQ accumulator (padded rows × the tile width). Byte offsets of each
// part, each 256-byte aligned (whole 16-byte chunks); nothing when a size does not fit in 64 bits.
struct Workspace {
  int64_t rows = 0;  // batch · heads_q · padded_rows(seqlen_q)
  int64_t lse2 = 0, d_rows = 0, dq_accum = 0, bytes = 0;
};
inline std::optional<Workspace> workspace_of(const Problem& f, bool deterministic, int tile_width) {
  constexpr int64_t kAlign = 256;
  const auto rows = checked_product({f.batch, f.heads_q, padded_rows(f.seqlen_q)});
  if (!rows) return std::nullopt;
  const auto row_bytes = checked_mul(*rows, 4);
  const auto dq_bytes = deterministic ? std::optional<int64_t>(0) : checked_product({*rows, tile_width, 4});
  if (!row_bytes || !dq_bytes || *row_bytes > INT64_MAX / 4 - kAlign) return std::nullopt;
  Workspace w;
  w.rows = *rows;
  const int64_t aligned = (*row_bytes + kAlign - 1) / kAlign * kAlign;
  w.lse2 = 0;
  w.d_rows = aligned;
  w.dq_accum = 2 * aligned;
  const auto total = checked_add(w.dq_accum, *dq_bytes);
  if (!total) return std::nullopt;
  w.bytes = *total;
  return w;
}

// Causal (bottom-right): query row i sees key j iff j <= i + seqlen_k - seqlen_q. The first query
// row that sees any key of a K/V tile starting at key kv0 is kv0 - (seqlen_k - seqlen_q) (clamped to
// 0): the main kernel starts at the query tile holding it; tiles above it see none of the block's keys.
FS_HD constexpr int first_query_tile(int64_t kv0, int block_q, int64_t seqlen_q, int64_t seqlen_k, bool causal) {
  if (!causal) return 0;
  const int64_t first_row = kv0 - (seqlen_k - seqlen_q);
  return first_row <= 0 ? 0 : int(first_row / block_q);
}

// Does the pair (query tile from q0, K/V tile from kv0) need the mask? When some key is past seqlen_k,
// or (causal) some key is after some row's diagonal: kv0 + block_kv - 1 > q0 + seqlen_k - seqlen_q.
FS_HD constexpr bool tile_needs_mask(int64_t q0, int64_t kv0, int block_kv, int64_t seqlen_q, int64_t seqlen_k,
                                     bool causal) {
  return kv0 + block_kv > seqlen_k || (causal && kv0 + block_kv - 1 > q0 + seqlen_k - seqlen_q);
}

// The number of K/V tiles a query tile from q0 (rows q0 … q0 + block_q - 1, the last ones maybe past
// seqlen_q) sees: every key with causal off, else up to the last row's diagonal.
FS_HD constexpr int kv_tiles_seen(int64_t q0, int block_q, int block_kv, int64_t seqlen_q, int64_t seqlen_k,
                                  bool causal) {
  int64_t end = seqlen_k;
  if (causal) {
    const int64_t last_row = (q0 + block_q < seqlen_q ? q0 + block_q : seqlen_q) - 1;
    const int64_t e = last_row + 1 + seqlen_k - seqlen_q;
    end = e < 0 ? 0 : e < seqlen_k ? e : seqlen_k;
  }
  return int(tiles(end, block_kv));
}

}  // namespace fs::step11
