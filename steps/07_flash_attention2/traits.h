// Step 07 — the compile-time choices of the FlashAttention-2 kernel (kernel.cuh): its ideas, one
// per lettered sub-step, the table of tile configurations, and the index math of the work split.
// Plain C++: the CPU tests (tests/test_step07_flash_attention2.cpp) include this header and check
// every function here against brute force and against step 06's maps, so the index math that runs on
// the GPU is the index math that was tested.
//
// Copied from step 06's traits.h: the swizzled layout and the fragment maps (unchanged); added: the
// 64-byte swizzle for 32- and 96-wide tiles, the ideas, the table, the work split.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/forward/problem.h"

namespace fs::step07 {

// ---- shared-memory layouts (step 04's swizzle) -------------------------------------------------
// XOR swizzle on 16-byte chunks (8 elements): within each group of 8 chunks (128 bytes) of a row,
// chunk c is stored at chunk c ^ (row % 8). Eight consecutive rows then put the same logical chunk
// in eight different 16-byte bank groups, so an ldmatrix (8 rows × 16 bytes) or a 16-byte store
// per thread is conflict-free, with no extra memory. Needs COLS to be a multiple of 64.
template <int COLS>
struct Swizzled128Layout {
  static_assert(COLS % 64 == 0, "the 128-byte XOR swizzle needs rows of a multiple of 64 elements");
  static constexpr int kCols = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ (row % 8)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
};

// The same XOR idea for rows of an odd multiple of 32 elements (64, 192, ... bytes: tile widths 32
// and 96), where chunk ^ (row % 8) would leave the row. Such rows start alternately at bank group 0
// and 4 (a row is an odd number of 64-byte halves), so XOR-ing the chunk inside its aligned group of
// 4 chunks (64 bytes) with (row / 2) % 4 is enough: eight consecutive rows, starting at a multiple
// of 8, then put the same logical chunk in eight different 16-byte bank groups.
template <int COLS>
struct Swizzled64Layout {
  static_assert(COLS % 32 == 0 && (COLS / 32) % 2 == 1,
                "the 64-byte XOR swizzle is for rows of an odd multiple of 32 elements");
  static constexpr int kCols = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ ((row / 2) % 4)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
};

// ---- which lane holds which element (step 06's maps) -------------------------------------------
// mma.sync.aligned.m16n8k16 and ldmatrix.m8n8, as (lane, register, half) -> (row, col). A "register"
// is 32 bits of two 16-bit elements; half 0 is the low one. g = lane / 4 picks the row, t = lane % 4
// the pair of columns (the PTX ISA's groupID and threadID_in_group).
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
// C elements i, i+1 (i even) of the n8 tile n_half of a k16 step are A register mma_a_reg_of_c: S's
// accumulators are P's A fragment, with no shared-memory round trip.
FS_HD constexpr int mma_a_reg_of_c(int n_half, int i) { return i / 2 + 2 * n_half; }

// ldmatrix: lane 8·m + r gives the address of row r of matrix m; register m of a lane receives row g,
// columns 2t, 2t+1 of matrix m (with .trans: column g, rows 2t, 2t+1).
FS_HD constexpr int ldmatrix_address_lane(int matrix, int row) { return 8 * matrix + row; }
FS_HD constexpr int ldmatrix_matrix_of(int lane) { return lane / 8; }
FS_HD constexpr int ldmatrix_row_of(int lane) { return lane % 8; }
FS_HD constexpr Coord ldmatrix_element(int lane, int half, bool trans) {
  return trans ? Coord{2 * thread_in_group(lane) + half, group_of(lane)}
               : Coord{group_of(lane), 2 * thread_in_group(lane) + half};
}
// A 16×16 tile as four 8×8 quadrants in the order of the A registers (matrix m = a[m]): the A
// operand (Q) without .trans, two B operands (V, stored [k][n]) with .trans.
FS_HD constexpr Coord ldmatrix_x4_quadrants(int lane) {
  const int m = ldmatrix_matrix_of(lane);
  return {8 * (m % 2) + ldmatrix_row_of(lane), 8 * (m / 2)};
}

}  // namespace frag

// ---- the ideas of step 07 ----------------------------------------------------------------------
// Step 07 adds seven ideas to step 06, one per lettered sub-step (07a … 07g); sub-step 07x has every
// idea up to its own (the kernel's IDEAS parameter), so the runner's "x prev" column is what each buys.
enum Idea : int {
  kRows32 = 1,            // 07a  32 query rows per warp: every K/V fragment read feeds two mma, not one
  kWorkOrder = 2,         // 07b  K/V tiles visited from the diagonal down, so only the first (masked) ones
                          //      build a mask; a 1-D grid (no loop over batch·heads past 65535)
  kLdmatrixPipeline = 3,  // 07c  the next ldmatrix is issued before the mma of the current fragment
  kSmemEpilogue = 4,      // 07d  O staged through shared memory, stored in 16-byte coalesced chunks
  kRescaleSkip = 5,       // 07e  no O rescale in a warp whose row maxima did not grow
  kFastExp2 = 6,          // 07f  ex2.approx.ftz, one MUFU instruction, instead of exp2f (2 ulp, full range)
  kHeadDimTable = 7,      // 07g  every head_dim and every GPU: tile widths 32-256, the table below
};

// ---- the table of tile configurations ----------------------------------------------------------
// One tile configuration. The problem's head_dim is padded up to `head_dim` (the tile width): Q, K
// and V columns at and past the real head_dim are zero-filled in shared memory, which changes no
// score and no output column that is stored.
struct Config {
  int head_dim;            // HEAD_DIM: tile width, a multiple of 32
  int block_q;             // BLOCK_Q: query rows per block
  int block_kv;            // BLOCK_KV: keys per K/V tile
  int num_warps;           // NUM_WARPS: each owns BLOCK_Q / NUM_WARPS query rows
  int kv_stages;           // KV_STAGES: K/V buffers in shared memory (1 or 2)
  int64_t min_smem_optin;  // used only where a block may opt in to at least this many bytes
};

// q_smem [BLOCK_Q, HEAD_DIM] + k_smem and v_smem [KV_STAGES][BLOCK_KV, HEAD_DIM], 2-byte elements.
FS_HD constexpr int smem_bytes(const Config& c) { return (c.block_q + 2 * c.kv_stages * c.block_kv) * c.head_dim * 2; }

// Register budget, per thread (the reason for every row below). A warp that owns R query rows holds
//   o_acc  R·HEAD_DIM/32 fp32   (the output accumulator, live for the whole K/V loop)
//   s_acc  R·BLOCK_KV/32 fp32   (the scores of one tile; rounded in place to P, half as many registers)
// plus the ldmatrix fragments in flight, the softmax state and addresses, within the 255 registers a
// thread may have. R = 32 (two m16 tiles per warp) is idea kRows32. FlashAttention-2 uses 128 × 64
// tiles at HEAD_DIM 128 and 128 × 128 at 64; compiled here (CUDA 13, sm_90) 128 × 64 at HEAD_DIM 128
// spills (ptxas -v, recorded in notes/07_flash_attention2.md), so what fits without a spill is:
//   HEAD_DIM 128: 128 × 48 (128 + 48)            HEAD_DIM 64: 128 × 64 (64 + 64)
//   HEAD_DIM  96: 128 × 32 (96 + 32)              HEAD_DIM 32: 128 × 64 (32 + 64)
// At HEAD_DIM 192 and 256 o_acc alone would be 192 or 256 registers with R = 32, so those tiles use
// R = 16 (8 warps for 128 rows): 96 + 32 and 128 + 32 registers.
//
// Shared memory decides the rest, per GPU family (bytes a block may opt in to / an SM has):
//   sm_90 227 KiB / 228 KiB, sm_80 163 KiB / 164 KiB: room for two K/V buffers (one barrier per tile,
//   the next tile copied during all of the current one) in two blocks per SM; at HEAD_DIM 256 (one
//   block per SM) two buffers where they fit. HEAD_DIM 192 keeps one buffer everywhere, which also
//   puts the one-buffer pipeline of the smaller GPUs under the H200's tests (head_dim 136-192);
//   sm_86, sm_89 99 KiB / 100 KiB: two blocks need <= 49 KiB each, so one K/V buffer at HEAD_DIM
//   128 and 64 × 32 tiles at HEAD_DIM 256 (FlashAttention-2 shrinks its tiles there too).
// The sub-steps before 07g have two rows of their own, kD64 and kD128_K32: at HEAD_DIM 128 the 48-key
// tile of 07g spills with some subsets of the ideas (ptxas is at its 255-register edge, and which
// subsets spill follows no pattern), 32-key tiles with none, so every sub-step runs spill-free and the
// ablation measures the ideas, not the spills. Choosing the widest spill-free tile per head_dim is 07g's.
enum ConfigId : int {
  kD32,       // HEAD_DIM  32                                   every GPU
  kD64,       // HEAD_DIM  64                                   every GPU
  kD96,       // HEAD_DIM  96                                   every GPU
  kD128_S2,   // HEAD_DIM 128, two K/V buffers                  >= 128 KiB per block (sm_80, sm_90)
  kD128_S1,   // HEAD_DIM 128, one K/V buffer                   others (sm_86, sm_89)
  kD192,      // HEAD_DIM 192, 8 warps × 16 rows, one buffer    every GPU
  kD256_S2,   // HEAD_DIM 256, 8 warps × 16 rows, two buffers   where 192 KiB fit (sm_90)
  kD256_S1,   // HEAD_DIM 256, one buffer                       where 128 KiB fit (sm_80)
  kD256_Q64,  // HEAD_DIM 256, 64 query rows, 32-key tiles      others (sm_86, sm_89)
  kD128_K32,  // HEAD_DIM 128, 32-key tiles, two K/V buffers    the sub-steps before 07g only
  kNumConfigs
};

inline constexpr int64_t KiB = 1024;
inline constexpr Config kConfigs[kNumConfigs] = {
    //  HEAD_DIM BLOCK_Q BLOCK_KV WARPS STAGES min opt-in     smem
    {32, 128, 64, 4, 2, 0},           // kD32        24 KiB
    {64, 128, 64, 4, 2, 0},           // kD64        48 KiB
    {96, 128, 32, 4, 2, 0},           // kD96        48 KiB
    {128, 128, 48, 4, 2, 128 * KiB},  // kD128_S2    80 KiB
    {128, 128, 32, 4, 1, 0},          // kD128_S1    48 KiB
    {192, 128, 64, 8, 1, 0},          // kD192       96 KiB
    {256, 128, 64, 8, 2, 0},          // kD256_S2   192 KiB
    {256, 128, 64, 8, 1, 0},          // kD256_S1   128 KiB
    {256, 64, 32, 4, 1, 0},           // kD256_Q64   64 KiB
    {128, 128, 32, 4, 2, 0},          // kD128_K32   64 KiB
};

// Whether sub-step IDEAS has configuration `config`: 07g every row but kD128_K32, the earlier sub-steps
// kD64 and kD128_K32.
FS_HD constexpr bool has_config(int ideas, int config) {
  return ideas >= kHeadDimTable ? config != kD128_K32 : config == kD64 || config == kD128_K32;
}

// The tile width a problem's head_dim (a multiple of 8, at most 256) is padded to.
FS_HD constexpr int padded_head_dim(int64_t head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 96 ? 96 : head_dim <= 128 ? 128 : head_dim <= 192 ? 192 : 256;
}

// The configuration of sub-step IDEAS for a problem on a GPU whose blocks may opt in to `smem_optin`
// bytes of shared memory: the first row it has of the problem's tile width that the GPU is big enough
// for, or -1 if none fits. Before 07g only head_dim 64 and 128 have a row (limits() says so).
constexpr int choose_config(int ideas, int64_t head_dim, int64_t smem_optin) {
  if (ideas < kHeadDimTable && head_dim != 64 && head_dim != 128) return -1;
  const int width = padded_head_dim(head_dim);
  for (int i = 0; i < kNumConfigs; ++i)
    if (has_config(ideas, i) && kConfigs[i].head_dim == width && smem_optin >= kConfigs[i].min_smem_optin &&
        smem_optin >= smem_bytes(kConfigs[i]))
      return i;
  return -1;
}

// The least shared memory any configuration of sub-step IDEAS for this head_dim needs (for refusals).
constexpr int min_smem_bytes(int ideas, int64_t head_dim) {
  int least = 0;
  for (int i = 0; i < kNumConfigs; ++i)
    if (has_config(ideas, i) && kConfigs[i].head_dim == padded_head_dim(head_dim) &&
        (least == 0 || smem_bytes(kConfigs[i]) < least))
      least = smem_bytes(kConfigs[i]);
  return least;
}

// Everything the kernel derives from its named constants. IDEAS: the ideas it has (1 … kHeadDimTable).
template <int HEAD_DIM_, int BLOCK_Q_, int BLOCK_KV_, int NUM_WARPS_, int KV_STAGES_, int IDEAS_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_Q = BLOCK_Q_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr int KV_STAGES = KV_STAGES_;
  static constexpr int IDEAS = IDEAS_;
  FS_HD static constexpr bool has(Idea idea) { return IDEAS >= idea; }
  static constexpr int NUM_THREADS = NUM_WARPS * 32;

  static constexpr int ROWS_PER_WARP = BLOCK_Q / NUM_WARPS;  // 32 (or 16 at HEAD_DIM >= 192)
  static constexpr int M_TILES = ROWS_PER_WARP / 16;         // m16 tiles of query rows per warp
  static constexpr int QK_K_STEPS = HEAD_DIM / 16;           // k16 steps of S = Q·Kᵀ (over head dims)
  static constexpr int S_N_TILES = BLOCK_KV / 8;             // n8 tiles of S (over keys)
  static constexpr int PV_K_STEPS = BLOCK_KV / 16;           // k16 steps of O = P·V (over keys)
  static constexpr int O_N_TILES = HEAD_DIM / 8;             // n8 tiles of O (over head dims)
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;        // 16-byte copies per row of a tile

  // 16-byte chunk c of row r stored at c ^ (r % 8), or inside its 64-byte group for 32 and 96.
  using Layout = std::conditional_t<HEAD_DIM % 64 == 0, Swizzled128Layout<HEAD_DIM>, Swizzled64Layout<HEAD_DIM>>;

  // The swizzle repeats every 8 rows and every SWIZZLE_COLS columns. So for a 16×16 operand tile at
  // (row0, col0), row0 % 8 == 0, col0 % 16 == 0, and a lane's (r, c) inside it (r < 16, c = 0 or 8):
  //   Layout::offset(row0 + r, col0 + c) = Layout::offset(r, col0 % SWIZZLE_COLS + c) + origin(row0, col0)
  // (tested on the CPU): an ldmatrix address is one of LANE_OFFSETS per-lane offsets plus a
  // compile-time constant, which the instruction takes as an immediate. Without this the compiler
  // computes one address per (k-step, n-tile) pair and keeps them all in registers.
  static constexpr int SWIZZLE_COLS = HEAD_DIM % 64 == 0 ? 64 : 32;
  static constexpr int LANE_OFFSETS = SWIZZLE_COLS / 16;
  FS_HD static constexpr int origin(int row0, int col0) { return row0 * HEAD_DIM + col0 - col0 % SWIZZLE_COLS; }

  static constexpr int Q_ELEMS = BLOCK_Q * HEAD_DIM;    // q_smem, and O in the epilogue
  static constexpr int KV_ELEMS = BLOCK_KV * HEAD_DIM;  // one K or V buffer
  static constexpr int SMEM_BYTES = (Q_ELEMS + 2 * KV_STAGES * KV_ELEMS) * 2;

  static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 256, "tile widths are multiples of 32 up to 256");
  static_assert(NUM_WARPS * ROWS_PER_WARP == BLOCK_Q && ROWS_PER_WARP % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(BLOCK_KV % 16 == 0 && O_N_TILES % 2 == 0,
                "ldmatrix.x4 loads K and V for two n8 tiles at a time, P·V consumes keys 16 at a time");
  static_assert(KV_STAGES == 1 || KV_STAGES == 2, "one K/V buffer (two barriers per tile) or two (one barrier)");
  static_assert(KV_STAGES == 2 || IDEAS >= kHeadDimTable, "the one-buffer pipeline belongs to the head_dim table");
  static_assert((BLOCK_Q * CHUNKS_PER_ROW) % NUM_THREADS == 0 || IDEAS >= kHeadDimTable,
                "before the table every thread issues the same number of 16-byte copies per tile");
  static_assert((ROWS_PER_WARP * CHUNKS_PER_ROW) % 32 == 0, "every lane stores the same number of 16-byte chunks of O");
  static_assert(Layout::size(BLOCK_Q) == Q_ELEMS && Layout::size(BLOCK_KV) == KV_ELEMS, "the swizzle adds no padding");
};

// The Traits of row CONFIG of the table for sub-step IDEAS.
template <int CONFIG, int IDEAS>
using TraitsOf = Traits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].block_q, kConfigs[CONFIG].block_kv,
                        kConfigs[CONFIG].num_warps, kConfigs[CONFIG].kv_stages, IDEAS>;

// ---- the work split ----------------------------------------------------------------------------
FS_HD constexpr int64_t query_tiles(int64_t seqlen_q, int block_q) { return (seqlen_q + block_q - 1) / block_q; }

// Before kWorkOrder: step 06's grid. x = query tile, the last tile first (causal: the longest block
// starts first); y = batch·head, in a grid-stride loop over batch·heads_q when there are more than
// the 65535 that gridDim.y allows.
inline constexpr int64_t kMaxGridY = 65535;
FS_HD constexpr int64_t grid_y(const Problem& p) {
  return p.batch * p.heads_q < kMaxGridY ? p.batch * p.heads_q : kMaxGridY;
}

// With kWorkOrder: one block per (batch·head, query tile) in a 1-D grid (no 65535 limit; plan()
// checks 2^31 - 1).
FS_HD constexpr int64_t grid_blocks(const Problem& p, int block_q) {
  return query_tiles(p.seqlen_q, block_q) * p.batch * p.heads_q;
}

// Block x works on head bh = x / q_tiles: the query tiles of one head (and the query heads of one
// GQA group, which are consecutive) are neighbours in launch order, so the blocks that run at the
// same time read the same K/V and find it in L2. Inside a head the last query tile comes first:
// with causal masking it has the most keys, and starting the longest blocks first leaves short
// ones to fill the end of the grid.
struct BlockTile {
  uint32_t bh;  // batch · heads_q + head
  int q_tile;   // query rows [q_tile · BLOCK_Q, (q_tile + 1) · BLOCK_Q)
};
FS_HD constexpr BlockTile block_tile(uint32_t block, uint32_t q_tiles) {
  return {block / q_tiles, int(q_tiles - 1 - block % q_tiles)};
}

// The K/V tiles a query tile visits: [0, count) hold every key some row may see, [0, unmasked) only
// keys every row sees. With kWorkOrder the kernel visits them from count - 1 down to 0, so the tiles
// that need the mask (the end of K, the causal diagonal) come first and tiles above the diagonal not
// at all; before it, from 0 up, every tile masked.
// q_rows: real query rows in the tile (the last tile may be partial).
struct KvTiles {
  int count;
  int unmasked;
};
FS_HD constexpr KvTiles kv_tiles_for(int64_t q0, int64_t q_rows, int block_kv, int64_t seqlen_q, int64_t seqlen_k,
                                     bool causal) {
  int64_t end = seqlen_k;   // keys [0, end): seen by at least one real row
  int64_t full = seqlen_k;  // keys [0, full): seen by every row of the tile
  if (causal) {             // row i sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned)
    const int64_t diagonal = seqlen_k - seqlen_q;
    const int64_t last_row_end = q0 + q_rows + diagonal, first_row_end = q0 + 1 + diagonal;
    end = last_row_end < 0 ? 0 : last_row_end < seqlen_k ? last_row_end : seqlen_k;
    full = first_row_end < 0 ? 0 : first_row_end < seqlen_k ? first_row_end : seqlen_k;
  }
  return {int((end + block_kv - 1) / block_kv), int(full / block_kv)};
}

// In a masked tile starting at key kv0: the last key, counted from kv0, that query row `row` may see
// (past the end of K or past the diagonal it may not), clamped to [-1, block_kv - 1].
FS_HD constexpr int last_visible_key(int64_t row, int64_t kv0, int block_kv, int64_t seqlen_q, int64_t seqlen_k,
                                     bool causal) {
  int64_t last = seqlen_k - 1;
  if (causal && row + seqlen_k - seqlen_q < last) last = row + seqlen_k - seqlen_q;
  last -= kv0;
  return int(last < -1 ? -1 : last > block_kv - 1 ? block_kv - 1 : last);
}

// ---- where each lane points ldmatrix ------------------------------------------------------------
// Q·Kᵀ's B operand for two neighbouring n8 tiles of keys at once: ldmatrix.x4 (no .trans) over
// 16 keys × 16 dims of K stored [key][dim]. Matrix 0 = keys 0-7, dims 0-7 (b[0] of the first n8
// tile); 1 = keys 0-7, dims 8-15 (its b[1]); 2 and 3 = the same for keys 8-15 (the second tile), so
// each tile's b[0], b[1] land in neighbouring registers, as mma takes them. Returns (key, dim) of
// the 16-byte row this lane supplies. (Q and V use frag::ldmatrix_x4_quadrants.)
FS_HD constexpr frag::Coord ldmatrix_x4_k_pair(int lane) {
  const int m = frag::ldmatrix_matrix_of(lane);
  return {8 * (m / 2) + frag::ldmatrix_row_of(lane), 8 * (m % 2)};
}

}  // namespace fs::step07
