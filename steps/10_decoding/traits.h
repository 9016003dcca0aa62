// Step 10 — the compile-time choices of the decoding kernels (kernel.cuh) and the index math of their
// work: GQA packing, the grid, the split of the keys and its heuristic, where each thread copies from
// (contiguous or paged cache), the mask, the workspace, and the LSE rule that merges partial results.
// Plain C++: the CPU tests (tests/test_step10_decoding.cpp) include this header and check every
// function here against brute force or independent formulas, so the index math that runs on the GPU
// is the index math that was tested.
//
// Copied from step 07's traits.h: the swizzled layout and the fragment maps (unchanged); the 64-byte
// swizzle, the ideas and the work split of a prefill tile are gone; added: everything below "the
// table".
#pragma once

#include <cmath>
#include <cstdint>

#include "common/decode/problem.h"
#include "common/forward/problem.h"

namespace fs::step10 {

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

// ---- which lane holds which element (step 06's maps, those this kernel uses) --------------------
// mma.sync.aligned.m16n8k16 and ldmatrix.m8n8, as (lane, register, half) -> (row, col). A "register"
// is 32 bits of two 16-bit elements; half 0 is the low one. g = lane / 4 picks the row, t = lane % 4
// the pair of columns (the PTX ISA's groupID and threadID_in_group). Tested equal to step 07's,
// which tests/test_fragment_layout.cpp checks against the PTX ISA's tables.
namespace frag {

struct Coord {
  int row;
  int col;
};

FS_HD constexpr int group_of(int lane) { return lane / 4; }
FS_HD constexpr int thread_in_group(int lane) { return lane % 4; }

// C/D: 16×8 fp32, d[0], d[1] = row g, columns 2t, 2t+1; d[2], d[3] = row g+8.
FS_HD constexpr Coord mma_c(int lane, int i) {
  return {group_of(lane) + 8 * (i / 2), 2 * thread_in_group(lane) + i % 2};
}
// C elements i, i+1 (i even) of the n8 tile n_half of a k16 step are A register mma_a_reg_of_c: S's
// accumulators are P's A fragment, with no shared-memory round trip.
FS_HD constexpr int mma_a_reg_of_c(int n_half, int i) { return i / 2 + 2 * n_half; }

// ldmatrix: lane 8·m + r gives the address of row r of matrix m.
FS_HD constexpr int ldmatrix_matrix_of(int lane) { return lane / 8; }
FS_HD constexpr int ldmatrix_row_of(int lane) { return lane % 8; }
// A 16×16 tile as four 8×8 quadrants in the order of the A registers (matrix m = a[m]): the A
// operand (Q) without .trans, two B operands (V, stored [k][n]) with .trans.
FS_HD constexpr Coord ldmatrix_x4_quadrants(int lane) {
  const int m = ldmatrix_matrix_of(lane);
  return {8 * (m % 2) + ldmatrix_row_of(lane), 8 * (m / 2)};
}

}  // namespace frag

// Q·Kᵀ's B operand for two neighbouring n8 tiles of keys at once: ldmatrix.x4 (no .trans) over
// 16 keys × 16 dims of K stored [key][dim]. Matrix 0 = keys 0-7, dims 0-7 (b[0] of the first n8
// tile); 1 = keys 0-7, dims 8-15 (its b[1]); 2 and 3 = the same for keys 8-15 (the second tile), so
// each tile's b[0], b[1] land in neighbouring registers, as mma takes them. Returns (key, dim) of
// the 16-byte row this lane supplies. (Q and V use frag::ldmatrix_x4_quadrants.)
FS_HD constexpr frag::Coord ldmatrix_x4_k_pair(int lane) {
  const int m = frag::ldmatrix_matrix_of(lane);
  return {8 * (m / 2) + frag::ldmatrix_row_of(lane), 8 * (m % 2)};
}

// ---- the table ---------------------------------------------------------------------------------
// One block works on BLOCK_Q = 16 packed rows (one m16 tile: the query heads of one KV head × the
// new tokens, see "GQA packing") and BLOCK_KV keys at a time. Its NUM_WARPS warps split each K/V
// tile between them, KEYS_PER_WARP keys each, so every byte of K and V is read from shared memory
// by one warp only; at the end the warps' partial results are merged by the LSE rule below. The
// work is memory-bound (notes/10_decoding.md): what matters is how many bytes are in flight, so each
// configuration keeps KV_STAGES - 1 tiles of 32 KiB (K and V) or more on their way while one is
// computed. The problem's head_dim is padded up to the tile width HEAD_DIM: the padded columns are
// zero-filled in shared memory (cp.async with 0 source bytes), never read from memory.
struct Config {
  int head_dim;   // HEAD_DIM: tile width, 64, 128 or 256
  int block_kv;   // BLOCK_KV: keys per K/V tile
  int num_warps;  // NUM_WARPS: each takes BLOCK_KV / NUM_WARPS keys of every tile
  int kv_stages;  // KV_STAGES: K/V buffers in shared memory (a cp.async pipeline this deep)
};

inline constexpr int BLOCK_Q = 16;  // packed rows per block: one m16 tile

// q_smem [BLOCK_Q, HEAD_DIM] + k_smem and v_smem [KV_STAGES][BLOCK_KV, HEAD_DIM], 2-byte elements.
FS_HD constexpr int smem_bytes(const Config& c) { return (BLOCK_Q + 2 * c.kv_stages * c.block_kv) * c.head_dim * 2; }

// Shared memory per block a GPU family allows (opt-in): sm_90 227 KiB, sm_80 163 KiB, sm_86 and
// sm_89 99 KiB; an SM has 1 KiB more, and each resident block reserves 1 KiB.
//   kD64     K+V tile 32 KiB, 3 stages: 98 KiB, two blocks per SM on sm_90, fits every GPU
//   kD128_S3 K+V tile 32 KiB, 3 stages: 100 KiB, two blocks per SM on sm_90 (sm_80: one)
//   kD128_S2 the same with 2 stages, 68 KiB: sm_86, sm_89
//   kD256_S2 K+V tile 64 KiB, 2 stages: 136 KiB (sm_80, sm_90)
//   kD256_W2 2 warps × 16 keys, K+V tile 32 KiB, 2 stages: 72 KiB (sm_86, sm_89)
enum ConfigId : int { kD64, kD128_S3, kD128_S2, kD256_S2, kD256_W2, kNumConfigs };

inline constexpr int64_t KiB = 1024;
inline constexpr Config kConfigs[kNumConfigs] = {
    //  HEAD_DIM BLOCK_KV WARPS STAGES    smem
    {64, 128, 4, 3},   // kD64      98 KiB
    {128, 64, 4, 3},   // kD128_S3 100 KiB
    {128, 64, 4, 2},   // kD128_S2  68 KiB
    {256, 64, 4, 2},   // kD256_S2 136 KiB
    {256, 32, 2, 2},   // kD256_W2  72 KiB
};

// The tile width a problem's head_dim (a multiple of 8, at most 256) is padded to.
FS_HD constexpr int padded_head_dim(int64_t head_dim) { return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }

// The first row of the table with the problem's tile width that fits `smem_optin` bytes, or -1.
constexpr int choose_config(int64_t head_dim, int64_t smem_optin) {
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].head_dim == padded_head_dim(head_dim) && smem_bytes(kConfigs[i]) <= smem_optin) return i;
  return -1;
}

// The least shared memory any row for this head_dim needs (for refusals).
constexpr int min_smem_bytes(int64_t head_dim) {
  int least = 0;
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].head_dim == padded_head_dim(head_dim) && (least == 0 || smem_bytes(kConfigs[i]) < least))
      least = smem_bytes(kConfigs[i]);
  return least;
}

// Blocks of a configuration one SM holds, by shared memory (the SM has smem_optin + 1 KiB, each block
// takes its bytes + 1 KiB), at most kMaxBlocksPerSm: at head_dim 128 the kernel uses 192 registers
// per thread (ptxas, CUDA 13, sm_90; notes/10_decoding.md), so the 64K registers of an SM hold two
// 128-thread blocks, not three.
inline constexpr int kMaxBlocksPerSm = 2;
constexpr int blocks_per_sm(const Config& c, int64_t smem_optin) {
  const int64_t by_smem = (smem_optin + KiB) / (smem_bytes(c) + KiB);
  return int(by_smem < 1 ? 1 : by_smem > kMaxBlocksPerSm ? kMaxBlocksPerSm : by_smem);
}

// Everything the kernel derives from its named constants.
template <int HEAD_DIM_, int BLOCK_KV_, int NUM_WARPS_, int KV_STAGES_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int NUM_WARPS = NUM_WARPS_;
  static constexpr int KV_STAGES = KV_STAGES_;
  static constexpr int NUM_THREADS = NUM_WARPS * 32;

  static constexpr int KEYS_PER_WARP = BLOCK_KV / NUM_WARPS;  // each warp's keys of every K/V tile
  static constexpr int QK_K_STEPS = HEAD_DIM / 16;            // k16 steps of S = Q·Kᵀ (over head dims)
  static constexpr int S_N_TILES = KEYS_PER_WARP / 8;         // n8 tiles of a warp's S (over its keys)
  static constexpr int PV_K_STEPS = KEYS_PER_WARP / 16;       // k16 steps of O = P·V (over its keys)
  static constexpr int O_N_TILES = HEAD_DIM / 8;              // n8 tiles of O (over head dims)
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;         // 16-byte copies per row of a tile
  // Q's A fragments stay in registers for the whole loop (HEAD_DIM / 4 of them) up to HEAD_DIM 128; at
  // 256, with o_acc's 128, they would spill, so they are read from q_smem at every tile.
  static constexpr bool Q_IN_REGISTERS = HEAD_DIM <= 128;

  // The copies of a K/V tile: thread x takes chunk x % CHUNKS_PER_ROW of ROWS_PER_THREAD consecutive
  // keys, starting at key (x / CHUNKS_PER_ROW)·ROWS_PER_THREAD (copy_row below). ROWS_PER_THREAD
  // divides 16, so a thread's keys lie in one aligned group of 16 keys, hence in one page of a paged
  // cache: one block-table lookup per thread and tile.
  static constexpr int ROW_GROUPS = NUM_THREADS / CHUNKS_PER_ROW;
  static constexpr int ROWS_PER_THREAD = BLOCK_KV / ROW_GROUPS;
  // Q (and O in the epilogue): BLOCK_Q rows × CHUNKS_PER_ROW chunks, chunk c = i·NUM_THREADS + x.
  static constexpr int Q_CHUNKS_PER_THREAD = BLOCK_Q * CHUNKS_PER_ROW / NUM_THREADS;

  // The swizzle repeats every 8 rows and every 64 columns, so an ldmatrix address of a 16×16 operand
  // tile at (row0, col0), row0 % 8 == 0, is one of LANE_OFFSETS per-lane offsets plus origin(row0,
  // col0), a compile-time constant (step 07's identity, tested there and again here).
  using Layout = Swizzled128Layout<HEAD_DIM>;
  static constexpr int SWIZZLE_COLS = 64;
  static constexpr int LANE_OFFSETS = SWIZZLE_COLS / 16;
  FS_HD static constexpr int origin(int row0, int col0) { return row0 * HEAD_DIM + col0 - col0 % SWIZZLE_COLS; }

  static constexpr int Q_ELEMS = BLOCK_Q * HEAD_DIM;    // q_smem
  static constexpr int KV_ELEMS = BLOCK_KV * HEAD_DIM;  // one K or V buffer
  static constexpr int SMEM_BYTES = (Q_ELEMS + 2 * KV_STAGES * KV_ELEMS) * 2;

  // After the last tile the K/V buffers hold the warps' results for the merge: o_part [NUM_WARPS]
  // [BLOCK_Q][O_STRIDE] fp32, rows 8 floats longer than HEAD_DIM so that the float2 stores of an mma
  // C fragment (rows g, columns 2t) fall in distinct banks, then lse_part [NUM_WARPS][BLOCK_Q] fp32.
  static constexpr int O_STRIDE = HEAD_DIM + 8;
  static constexpr int MERGE_BYTES = NUM_WARPS * BLOCK_Q * (O_STRIDE + 1) * 4;

  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "tile widths are 64, 128 and 256");
  static_assert(KEYS_PER_WARP % 16 == 0 && KEYS_PER_WARP * NUM_WARPS == BLOCK_KV,
                "each warp takes whole k16 steps of keys, and the warps take the whole tile");
  static_assert(KV_STAGES >= 2, "the pipeline keeps at least one tile in flight while one is computed");
  static_assert(NUM_THREADS % CHUNKS_PER_ROW == 0 && BLOCK_KV % ROW_GROUPS == 0, "every thread copies whole rows");
  static_assert(16 % ROWS_PER_THREAD == 0, "a thread's keys must lie in one group of 16 (one page)");
  static_assert((BLOCK_Q * CHUNKS_PER_ROW) % NUM_THREADS == 0, "every thread copies as many chunks of Q");
  static_assert(MERGE_BYTES <= 2 * KV_STAGES * KV_ELEMS * 2, "the merge fits in the K/V buffers");
  static_assert(Layout::size(BLOCK_Q) == Q_ELEMS && Layout::size(BLOCK_KV) == KV_ELEMS, "the swizzle adds no padding");
};

// The Traits of row CONFIG of the table.
template <int CONFIG>
using TraitsOf = Traits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].block_kv, kConfigs[CONFIG].num_warps,
                        kConfigs[CONFIG].kv_stages>;

// Key `row` of a K/V tile that thread `thread` copies in its pass `pass` (0 ... ROWS_PER_THREAD - 1),
// and the column where its 16 bytes start.
template <class Tr>
FS_HD constexpr int copy_row(int thread, int pass) {
  return thread / Tr::CHUNKS_PER_ROW * Tr::ROWS_PER_THREAD + pass;
}
template <class Tr>
FS_HD constexpr int copy_col(int thread) {
  return thread % Tr::CHUNKS_PER_ROW * 8;
}

// ---- GQA packing -------------------------------------------------------------------------------
// The group = heads_q / heads_kv query heads that share a KV head, times the seqlen_q new tokens,
// are the rows of one tile: packed row r is token r / group of query head h0 + r % group (h0 = the
// group's first head). The rows of one token are neighbours in Q's (batch, seqlen, heads, head_dim)
// layout, and every K/V byte a block reads serves all of them: read once per KV head, not once per
// query head.
struct PackedRow {
  int token;          // 0 ... seqlen_q - 1
  int head_in_group;  // 0 ... group - 1
};
FS_HD constexpr PackedRow packed_row(int row, int group) { return {row / group, row % group}; }

// Packed rows per (batch, KV head) and the BLOCK_Q-row tiles they take.
FS_HD constexpr int64_t packed_rows(int64_t heads_q, int64_t heads_kv, int64_t seqlen_q) {
  return heads_q / heads_kv * seqlen_q;
}
FS_HD constexpr int64_t row_tiles(int64_t rows) { return (rows + BLOCK_Q - 1) / BLOCK_Q; }

// ---- the grid ------------------------------------------------------------------------------------
// One block per (batch, KV head, split, row tile), in a 1-D grid, the row tile fastest: the row tiles
// of one (batch, KV head, split) read the same keys, and neighbours in launch order find them in L2.
struct BlockWork {
  uint32_t b, kv_head, split, row_tile;
};
FS_HD constexpr BlockWork block_work(uint32_t block, uint32_t heads_kv, uint32_t splits, uint32_t tiles_of_rows) {
  const uint32_t rt = block % tiles_of_rows, rest = block / tiles_of_rows;
  const uint32_t split = rest % splits, bh = rest / splits;
  return {bh / heads_kv, bh % heads_kv, split, rt};
}

// ---- the split of the keys (split-KV, "flash-decoding") --------------------------------------------
// The keys a block's rows may see: all `len` keys of its sequence, or with causal (bottom-right, per
// sequence) those up to the last one its last token sees: token i sees key j iff j <= i + len - seqlen_q.
FS_HD constexpr int keys_seen(int len, int seqlen_q, int last_token, bool causal) {
  if (!causal) return len;
  const int end = last_token + len - seqlen_q + 1;
  return end < 0 ? 0 : end > len ? len : end;
}

FS_HD constexpr int kv_tiles(int64_t keys, int block_kv) { return int((keys + block_kv - 1) / block_kv); }

// The K/V tiles [first, end) of split `split` of `splits`: the n_keys keys in whole tiles, the same
// number of tiles per split (the last may have fewer, a split past the end none). Tiles are aligned
// to BLOCK_KV keys, so a split never cuts a tile, and every tile of a sequence is in one split.
struct TileRange {
  int first, end;
};
FS_HD constexpr TileRange split_tiles(int n_keys, int block_kv, int splits, int split) {
  const int tiles = kv_tiles(n_keys, block_kv);
  const int per_split = (tiles + splits - 1) / splits;
  const int first = split * per_split < tiles ? split * per_split : tiles;
  return {first, first + per_split < tiles ? first + per_split : tiles};
}

// How many splits: the smallest number within 10 % of the best, where the cost of s splits is
//     cost(s) = waves(s) · ceil(kv_tiles / s),   waves(s) = ceil(base_blocks · s / slots),
// the K/V tiles the busiest slot of the GPU copies (slots = SMs × blocks per SM; base_blocks = batch ·
// heads_kv · row tiles, the blocks without a split; kv_tiles of the longest sequence). Memory-bound
// blocks of equal work finish together when they all fit in one wave, so cost(s) is the time up to a
// constant. No split when the grid already fills every slot (base_blocks >= slots), when there is one
// tile, and never more than kMaxSplits (the harness's limit, 128) or kv_tiles (every split at least
// one tile). The 10 % spares the partial outputs and the combine when more splits gain little.
constexpr int num_splits_for(int64_t base_blocks, int64_t tiles, int64_t slots) {
  if (base_blocks <= 0 || base_blocks >= slots || tiles <= 1) return 1;
  const int64_t most = tiles < kMaxSplits ? tiles : kMaxSplits;
  auto cost = [&](int64_t s) { return (base_blocks * s + slots - 1) / slots * ((tiles + s - 1) / s); };
  int64_t best = cost(1);
  for (int64_t s = 2; s <= most; ++s) best = cost(s) < best ? cost(s) : best;
  for (int64_t s = 1; s <= most; ++s)
    if (10 * cost(s) <= 11 * best) return int(s);
  return 1;
}

// ---- the mask ------------------------------------------------------------------------------------
// In a tile starting at key kv0: the last key, counted from kv0, that `token` may see (len keys in its
// sequence, n_keys of them loaded by this block, causal bottom-right per sequence), clamped to
// [-1, block_kv - 1]. Step 07's last_visible_key with seqlen_k = the sequence's length.
FS_HD constexpr int last_visible_key(int token, int kv0, int block_kv, int seqlen_q, int len, int n_keys,
                                     bool causal) {
  int last = n_keys - 1;
  if (causal && token + len - seqlen_q < last) last = token + len - seqlen_q;
  last -= kv0;
  return last < -1 ? -1 : last > block_kv - 1 ? block_kv - 1 : last;
}

// ---- the workspace -------------------------------------------------------------------------------
// With splits > 1 each block writes its rows' partial result, normalized O in fp32 and its LSE, and
// the combine kernel merges them: part_lse [splits][rows_all] fp32, then (16-byte aligned) part_o
// [splits][rows_all][head_dim] fp32, where row R = (b · heads_q + h) · seqlen_q + i is LSE's order.
struct WorkspaceLayout {
  int64_t lse_offset, o_offset, bytes;
};
FS_HD constexpr WorkspaceLayout workspace_layout(int splits, int64_t rows_all, int64_t head_dim) {
  if (splits <= 1) return {0, 0, 0};
  const int64_t lse_bytes = (int64_t(splits) * rows_all * 4 + 15) / 16 * 16;
  return {0, lse_bytes, lse_bytes + int64_t(splits) * rows_all * head_dim * 4};
}
FS_HD constexpr int64_t output_row(int64_t b, int64_t head, int64_t token, int64_t heads_q, int64_t seqlen_q) {
  return (b * heads_q + head) * seqlen_q + token;
}

// ---- the LSE rule (note 02's merge exercise) ------------------------------------------------------
// Parts i over disjoint sets of keys, each with lse_i = log Σ exp(s_j) over its keys and its output
// o_i normalized by its own sum (lse_i = -inf and o_i = 0 for a part with no key), merge into
//     lse = m + log Σ_i w_i,   o = Σ_i w_i · o_i / Σ_i w_i,   w_i = exp(lse_i - m),  m = max_i lse_i,
// the softmax over all the keys. Subtracting m keeps every w_i in [0, 1]; a part with no key weighs 0,
// and when no part has a key the merged row is O = 0, LSE = -inf. The kernels merge their warps with
// it in shared memory, and the combine kernel the splits of a row.
FS_HD inline float lse_weight(float lse_i, float lse_max) { return lse_i == -INFINITY ? 0.0f : expf(lse_i - lse_max); }
FS_HD inline float merged_lse(float lse_max, float weight_sum) {
  return weight_sum > 0.0f ? lse_max + logf(weight_sum) : -INFINITY;
}

}  // namespace fs::step10
