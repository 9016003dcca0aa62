// Step 07 — the compile-time choices of the FlashAttention-2 kernel (flash_attention2.cuh), the one
// table that picks them per problem and GPU, and the index math of the work split. Plain C++: the
// CPU tests (tests/test_step07_flash_attention2.cpp) include this header and check every function
// here against brute force, so the index math that runs on the GPU is the index math that was tested.
#pragma once

#include <cuda_runtime.h>  // cudaStream_t (launcher declaration only)

#include <cstdint>
#include <type_traits>

#include "common/fragment_layout.h"
#include "common/problem.h"
#include "common/smem_layout.h"

namespace fs::fa2 {

// ---- the traits table --------------------------------------------------------------------------
// One tile configuration. The problem's head_dim is padded up to `head_dim` (the tile width): Q, K
// and V columns at and past the real head_dim are zero-filled in shared memory, which changes no
// score and no output column that is stored.
struct Config {
  int head_dim;             // HEAD_DIM: tile width, a multiple of 32
  int block_q;              // BLOCK_Q: query rows per block
  int block_kv;             // BLOCK_KV: keys per K/V tile
  int num_warps;            // NUM_WARPS: each owns BLOCK_Q / NUM_WARPS query rows
  int kv_stages;            // KV_STAGES: K/V buffers in shared memory (1 or 2)
  int64_t min_smem_optin;   // used only where a block may opt in to at least this many bytes
};

// q_smem [BLOCK_Q, HEAD_DIM] + k_smem and v_smem [KV_STAGES][BLOCK_KV, HEAD_DIM], 2-byte elements.
FS_HD constexpr int smem_bytes(const Config& c) { return (c.block_q + 2 * c.kv_stages * c.block_kv) * c.head_dim * 2; }

// Register budget, per thread (the reason for every row below). A warp that owns R query rows holds
//   o_acc  R·HEAD_DIM/32 fp32   (the output accumulator, live for the whole K/V loop)
//   s_acc  R·BLOCK_KV/32 fp32   (the scores of one tile; rounded in place to P, half as many registers)
// plus the ldmatrix fragments in flight, the softmax state and addresses, within the 255 registers
// a thread may have. R = 32 (two m16 tiles per warp) is what the tensor cores need (ANCHORS.md).
// FlashAttention-2 uses 128 × 64 tiles at HEAD_DIM 128 (o_acc 128 + s_acc 64) and 128 × 128 at 64
// (64 + 128); compiled here (CUDA 13, sm_90) both spill (128 × 64 at HEAD_DIM 128: 60 bytes of
// stores per thread in the current kernel): ptxas keeps many
// ldmatrix results in flight across the softmax → P·V boundary and spills the loop's addresses and
// row sums instead. What compiles without a spill, ptxas -v (fp16 and bf16 alike):
//   HEAD_DIM 128: 128 × 48 (128 + 48)            HEAD_DIM 64: 128 × 64 (64 + 64)
//   HEAD_DIM  96: 128 × 32 (96 + 32)              HEAD_DIM 32: 128 × 64 (32 + 64)
// At HEAD_DIM 192 and 256 o_acc alone would be 192 or 256 registers with R = 32, so those tiles use
// R = 16 (8 warps for 128 rows): 96 + 32 and 128 + 32 registers.
// 4-warp blocks above 128 registers per thread run 2 per SM (65536 registers / (128 threads · 256)),
// 8-warp blocks 1 per SM: 8 warps per SM either way.
//
// Shared memory decides the rest, per GPU family (bytes a block may opt in to / an SM has):
//   sm_90 227 KiB / 228 KiB, sm_80 163 KiB / 164 KiB: room for two K/V buffers (one barrier per tile,
//   the next tile copied during all of the current one) in two blocks per SM; at HEAD_DIM 256 (one
//   block per SM) two buffers where they fit. HEAD_DIM 192 keeps one buffer everywhere, which also
//   puts the one-buffer pipeline of the smaller GPUs under the H200's tests (head_dim 136-192);
//   sm_86, sm_89 99 KiB / 100 KiB: two blocks need <= 49 KiB each, so one K/V buffer at HEAD_DIM
//   128 and 64 × 32 tiles at HEAD_DIM 256 (FlashAttention-2 shrinks its tiles there too).
// choose_config takes the first row of the problem's tile width that the GPU allows.
// dtype and causal are part of the key but no row depends on them: FlashAttention-2 also uses the
// same tiles for fp16 and bf16, and for causal on sm_80 and sm_90.
enum ConfigId : int {
  kD32,        // HEAD_DIM  32                                   every GPU
  kD64,        // HEAD_DIM  64                                   every GPU
  kD96,        // HEAD_DIM  96                                   every GPU
  kD128_S2,    // HEAD_DIM 128, two K/V buffers                  >= 128 KiB per block (sm_80, sm_90)
  kD128_S1,    // HEAD_DIM 128, one K/V buffer                   others (sm_86, sm_89)
  kD192,       // HEAD_DIM 192, 8 warps × 16 rows, one buffer    every GPU
  kD256_S2,    // HEAD_DIM 256, 8 warps × 16 rows, two buffers   where 192 KiB fit (sm_90)
  kD256_S1,    // HEAD_DIM 256, one buffer                       where 128 KiB fit (sm_80)
  kD256_Q64,   // HEAD_DIM 256, 64 query rows, 32-key tiles      others (sm_86, sm_89)
  kNumConfigs
};

inline constexpr int64_t KiB = 1024;
inline constexpr Config kConfigs[kNumConfigs] = {
    //  HEAD_DIM BLOCK_Q BLOCK_KV WARPS STAGES min opt-in     smem
    {32, 128, 64, 4, 2, 0},            // kD32        24 KiB
    {64, 128, 64, 4, 2, 0},            // kD64        48 KiB
    {96, 128, 32, 4, 2, 0},            // kD96        48 KiB
    {128, 128, 48, 4, 2, 128 * KiB},   // kD128_S2    80 KiB
    {128, 128, 32, 4, 1, 0},           // kD128_S1    48 KiB
    {192, 128, 64, 8, 1, 0},           // kD192       96 KiB
    {256, 128, 64, 8, 2, 0},           // kD256_S2   192 KiB
    {256, 128, 64, 8, 1, 0},           // kD256_S1   128 KiB
    {256, 64, 32, 4, 1, 0},            // kD256_Q64   64 KiB
};

// The tile width a problem's head_dim (a multiple of 8, at most 256) is padded to.
FS_HD constexpr int padded_head_dim(int64_t head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 96 ? 96 : head_dim <= 128 ? 128 : head_dim <= 192 ? 192 : 256;
}

// The configuration for a problem on a GPU whose blocks may opt in to `smem_optin` bytes of shared
// memory: the first row of its tile width that the GPU is big enough for, or -1 if none fits.
constexpr int choose_config(int64_t head_dim, int32_t /*dtype*/, bool /*causal*/, int64_t smem_optin) {
  const int width = padded_head_dim(head_dim);
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].head_dim == width && smem_optin >= kConfigs[i].min_smem_optin && smem_optin >= smem_bytes(kConfigs[i]))
      return i;
  return -1;
}

// The least shared memory any configuration of this head_dim's tile width needs (for refusals).
constexpr int min_smem_bytes(int64_t head_dim) {
  int least = 0;
  for (const Config& c : kConfigs)
    if (c.head_dim == padded_head_dim(head_dim) && (least == 0 || smem_bytes(c) < least)) least = smem_bytes(c);
  return least;
}

// Everything the kernel derives from one row of the table.
template <int CONFIG>
struct Traits {
  static constexpr Config kConfig = kConfigs[CONFIG];
  static constexpr int HEAD_DIM = kConfig.head_dim;
  static constexpr int BLOCK_Q = kConfig.block_q;
  static constexpr int BLOCK_KV = kConfig.block_kv;
  static constexpr int NUM_WARPS = kConfig.num_warps;
  static constexpr int KV_STAGES = kConfig.kv_stages;
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
  static constexpr int SMEM_BYTES = smem_bytes(kConfig);

  static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 256, "tile widths are multiples of 32 up to 256");
  static_assert(NUM_WARPS * ROWS_PER_WARP == BLOCK_Q && ROWS_PER_WARP % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(BLOCK_KV % 16 == 0 && O_N_TILES % 2 == 0,
                "ldmatrix.x4 loads K and V for two n8 tiles at a time, P·V consumes keys 16 at a time");
  static_assert(KV_STAGES == 1 || KV_STAGES == 2, "one K/V buffer (two barriers per tile) or two (one barrier)");
  static_assert((BLOCK_Q * CHUNKS_PER_ROW) % NUM_THREADS == 0 && (BLOCK_KV * CHUNKS_PER_ROW) % NUM_THREADS == 0,
                "every thread issues the same number of 16-byte copies per tile");
  static_assert((ROWS_PER_WARP * CHUNKS_PER_ROW) % 32 == 0, "every lane stores the same number of 16-byte chunks of O");
  static_assert(Layout::size(BLOCK_Q) == Q_ELEMS && Layout::size(BLOCK_KV) == KV_ELEMS, "the swizzle adds no padding");
  static_assert(SMEM_BYTES == (Q_ELEMS + 2 * KV_STAGES * KV_ELEMS) * 2, "q_smem + k_smem + v_smem");
};

// ---- the work split ----------------------------------------------------------------------------
// One block per (batch·head, query tile) in a 1-D grid (no 65535 limit; supports() checks 2^31 - 1).
FS_HD constexpr int64_t grid_blocks(const Problem& p, int block_q) {
  return (p.seqlen_q + block_q - 1) / block_q * p.batch * p.heads_q;
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
// keys every row sees. The kernel visits them from count - 1 down to 0, so the tiles that need the
// mask (the end of K, the causal diagonal) come first and tiles above the diagonal not at all.
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

// ---- the launcher of one configuration ---------------------------------------------------------
// Defined in flash_attention2.cuh and instantiated in flash_attention2_d<width>.cu (one file per
// tile width, so they compile in parallel).
template <int CONFIG, typename T>
void launch_config(const Problem& p, const Tensors& t, cudaStream_t stream);

}  // namespace fs::fa2
