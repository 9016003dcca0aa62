// Step 12 — the compile-time choices of the Hopper backward (kernel.cuh): the tile table, the shared
// memory map, which warpgroup owns which tile of each of the five products, and the wgmma operand
// views of each product (which tile is K-major, which MN-major, which operand comes from registers).
// Plain C++: tests/test_step12_hopper_backward.cpp checks every function here against brute force and
// against the PTX ISA's canonical layouts (tests/ptx_isa.h).
//
// Reused, not copied: step 08's 128-byte swizzle, tile_offset, matrix descriptors, the register
// fragments of wgmma (steps/08_tma_wgmma/traits.h); step 11's work split over query tiles, its causal
// bounds and its padded rows (steps/11_backward/traits.h).
#pragma once

#include <cstdint>

#include "steps/08_tma_wgmma/traits.h"
#include "steps/11_backward/traits.h"

namespace fs::step12 {

using step08::box_offset;
using step08::k_major_step_offset;
using step08::mn_major_lbo;
using step08::mn_major_step_offset;
using step08::ROW_BYTES;
using step08::SWIZZLE_ATOM;
using step08::tile_offset;

// ---- the tile table ----------------------------------------------------------------------------
// A block owns BLOCK_KV = 128 keys of one K/V head and loops over the query tiles (BLOCK_Q rows) of
// every query head that reads them, as step 11's does. Two warpgroups, each the owner of 64 keys
// (wgmma's M), compute everything transposed, keys as rows:
//
//   Sᵀ  = K·Qᵀ     [64 keys, BLOCK_Q]     A = K (smem, K-major)   B = Q  (smem, K-major)
//   dPᵀ = V·dOᵀ    [64 keys, BLOCK_Q]     A = V (smem, K-major)   B = dO (smem, K-major)
//   dV += Pᵀ·dO    [64 keys, HEAD_DIM]    A = Pᵀ (registers)      B = dO (smem, MN-major)
//   dK += dSᵀ·Q    [64 keys, HEAD_DIM]    A = dSᵀ (registers)     B = Q  (smem, MN-major)
//   dQ  = dS·K     [64 queries, 64 cols]  A = dS (smem, MN-major) B = K  (smem, MN-major)
//
// Pᵀ and dSᵀ come out of their accumulators exactly as wgmma's register A operand wants them (step 08's
// p_source: the keys are the accumulator rows, the queries its columns, the k dimension of dV and dK),
// so no fragment crosses threads. dQ sums over all 128 keys, both warpgroups' halves of dSᵀ: it goes
// through shared memory once, stored [key][query] as the accumulators hold it (4-byte stores), which is
// dS [query][key] with the query (M) dimension contiguous: an MN-major A (imm-trans-a = 1).
// The dQ tile [BLOCK_Q, HEAD_DIM] is two 64 × 64 tiles, one per warpgroup: at HEAD_DIM 128 (BLOCK_Q
// 64) the two column halves, at HEAD_DIM 64 (BLOCK_Q 128) the two row halves.
//
// Registers per thread (fp32 accumulators, and the fp16/bf16 A fragments of Pᵀ and dSᵀ):
//     dv_acc, dk_acc   HEAD_DIM / 2 each      live through the whole loop
//     s_acc, dp_acc    BLOCK_Q / 2 each       one query tile
//     p_frag, ds_frag  BLOCK_Q / 4 each       (p_frag beside s_acc: dSᵀ reads P; ds_frag replaces dp_acc)
//     dq_acc           32                     (after s_acc, dp_acc are dead)
//   HEAD_DIM  64, BLOCK_Q 128:  32 + 32 + 64 + 64 + 32 = 224 at the peak (dv, dk, s, dp, p_frag)
//   HEAD_DIM 128, BLOCK_Q  64:  64 + 64 + 32 + 32 + 16 = 208 at the peak
// within the 255 a thread of a 256-thread block may have. A wider head_dim would need more: this step
// runs head_dim up to 128 and refuses wider ones with a sentence naming step 11, which runs them.
//
// ---- the sub-steps -----------------------------------------------------------------------------
// One kernel (kernel.cuh) builds every sub-step: `Tr::has(kIdea)` marks where an idea changes it, and
// bench/substeps.py writes each sub-step's view (notes/substeps/12?_*.cuh) for diffing.
enum Idea : int {
  kDataPath = 1,    // 12a  the Hopper data path: the TMA ring, the five products on wgmma, each group of
                    //      products waited for in full before the threads touch a result
  kAsyncWgmma = 2,  // 12b  each wait covers only what the next instructions read: Pᵀ under dPᵀ's
                    //      products, dSᵀ under dV's, the dQ atomics under dK's
  kBulkDq = 3,      // 12c  dQ leaves through shared memory: both warpgroups store their tiles, and one
                    //      thread adds the query tile to the fp32 accumulator with one bulk reduce-add
                    //      (the TMA's cp.reduce.async.bulk) instead of 16 atomics per thread
};

struct Config {
  int head_dim;  // HEAD_DIM: tile width (64 or 128)
  int block_q;   // BLOCK_Q: query rows per visit, the N of Sᵀ and dPᵀ
};

inline constexpr int kNumConfigs = 2;
inline constexpr Config kConfigs[kNumConfigs] = {{64, 128}, {128, 64}};

inline constexpr int BLOCK_KV = 128;  // keys per block
inline constexpr int KEYS_PER_WARPGROUP = 64;  // wgmma's M
inline constexpr int NUM_WARPGROUPS = BLOCK_KV / KEYS_PER_WARPGROUP;
inline constexpr int NUM_THREADS = NUM_WARPGROUPS * 128;
inline constexpr int Q_STAGES = 2;  // Q/dO buffers: the next query tile lands during this one
inline constexpr int DQ_TILE = 64;  // a warpgroup's dQ tile is DQ_TILE × DQ_TILE
// 12c stages the block's dQ tile in shared memory in the order the accumulators hold it, which is
// also its order in the fp32 accumulator: warpgroup wg's 64 × 64 tile is the wg-th DQ_TILE² floats
// of the query tile's [BLOCK_Q, HEAD_DIM] region, and in it thread t's registers i, i + 1 are the
// floats dq_slot(t, i), dq_slot(t, i) + 1. Consecutive threads store consecutive 8 bytes (no bank
// conflict), and the whole query tile is one contiguous block for a single bulk reduce-add.
FS_HD constexpr int dq_slot(int t, int i) { return (i / 2) * 256 + 2 * t + i % 2; }
// Read back 8 at a time (slot a multiple of 8), the floats are threads t … t + 3's pair i, i + 1: one
// row's 8 consecutive columns, starting at this cell of the 64 × 64 tile (the conversion's one store).
FS_HD constexpr step08::frag::Coord dq_run_start(int slot) {
  return step08::wgmma_acc(slot % 256 / 2, 2 * (slot / 256));
}
inline constexpr int DQ_STAGE_BYTES = NUM_WARPGROUPS * DQ_TILE * DQ_TILE * 4;

// The row for a head_dim (a multiple of 8), or -1 above 128.
FS_HD constexpr int config_for(int64_t head_dim) { return head_dim <= 64 ? 0 : head_dim <= 128 ? 1 : -1; }

// Shared memory, bytes from the 1024-byte-aligned base: K, V (resident), Q_STAGES × (Q, dO), dSᵀ,
// Q_STAGES × (LSE₂, D) rows (fp32), from 12c the dQ staging rows, the mbarriers (K/V, one per Q/dO
// stage), and 1 KiB of slack to align the base (as step 08).
FS_HD constexpr int tile_bytes(int rows, int cols) { return rows * cols * 2; }
FS_HD constexpr int smem_bytes(const Config& c, int ideas = kDataPath) {
  return 2 * tile_bytes(BLOCK_KV, c.head_dim) + 2 * Q_STAGES * tile_bytes(c.block_q, c.head_dim) +
         tile_bytes(BLOCK_KV, c.block_q) + 2 * Q_STAGES * c.block_q * 4 + (ideas >= kBulkDq ? DQ_STAGE_BYTES : 0) +
         8 * (1 + Q_STAGES) + int(SWIZZLE_ATOM);
}

// IDEAS: the sub-step (an Idea's value); the tiles and the map are the same for every sub-step.
template <int HEAD_DIM_, int BLOCK_Q_, int IDEAS_ = kDataPath>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_Q = BLOCK_Q_;
  static constexpr int IDEAS = IDEAS_;
  FS_HD static constexpr bool has(Idea idea) { return IDEAS >= idea; }
  static constexpr Config kConfig = {HEAD_DIM, BLOCK_Q};
  static constexpr int COL_BLOCKS = HEAD_DIM / 64;   // TMA boxes per K, V, Q, dO tile
  static constexpr int D_K_STEPS = HEAD_DIM / 16;    // k16 steps of Sᵀ and dPᵀ (over head dims)
  static constexpr int Q_K_STEPS = BLOCK_Q / 16;     // k16 steps of dV and dK (over queries)
  static constexpr int KV_K_STEPS = BLOCK_KV / 16;   // k16 steps of dQ (over keys)
  static constexpr int S_REGS = BLOCK_Q / 2;         // s_acc, dp_acc: m64nBLOCK_Q fp32
  static constexpr int KV_REGS = HEAD_DIM / 2;       // dv_acc, dk_acc: m64nHEAD_DIM fp32
  static constexpr int DQ_REGS = DQ_TILE / 2;        // dq_acc: m64n64 fp32
  static constexpr int DQ_ROW_TILES = BLOCK_Q / DQ_TILE;  // dQ tiles down the query rows (1 or 2)
  static constexpr int DQ_TILE_BYTES = BLOCK_Q * HEAD_DIM * 4;  // 12c: one bulk reduce-add per query tile

  static constexpr int KV_BYTES = tile_bytes(BLOCK_KV, HEAD_DIM);  // K or V
  static constexpr int Q_BYTES = tile_bytes(BLOCK_Q, HEAD_DIM);    // one Q or dO buffer
  static constexpr int DS_BYTES = tile_bytes(BLOCK_KV, BLOCK_Q);   // dSᵀ [BLOCK_KV, BLOCK_Q]
  static constexpr int ROWS_BYTES = BLOCK_Q * 4;                   // one LSE₂ or D buffer
  static constexpr int K_OFFSET = 0;
  static constexpr int V_OFFSET = K_OFFSET + KV_BYTES;
  static constexpr int Q_OFFSET = V_OFFSET + KV_BYTES;             // [Q_STAGES] Q tiles
  static constexpr int DO_OFFSET = Q_OFFSET + Q_STAGES * Q_BYTES;  // [Q_STAGES] dO tiles
  static constexpr int DS_OFFSET = DO_OFFSET + Q_STAGES * Q_BYTES;
  static constexpr int LSE_OFFSET = DS_OFFSET + DS_BYTES;          // [Q_STAGES] LSE₂ rows
  static constexpr int D_OFFSET = LSE_OFFSET + Q_STAGES * ROWS_BYTES;  // [Q_STAGES] D rows
  static constexpr int DQ_OFFSET = D_OFFSET + Q_STAGES * ROWS_BYTES;     // 12c: [BLOCK_Q · HEAD_DIM] fp32
  static constexpr int BARRIER_OFFSET = DQ_OFFSET + (IDEAS >= kBulkDq ? DQ_STAGE_BYTES : 0);  // kv_full, q_full[]
  static constexpr int SMEM_BYTES = smem_bytes(kConfig, IDEAS);
  // What one Q/dO stage's barrier expects per phase: Q, dO, and the rows' LSE₂ and D.
  static constexpr uint32_t VISIT_BYTES = 2 * Q_BYTES + 2 * ROWS_BYTES;

  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "dK and dV of 64 keys × HEAD_DIM fit the registers up to 128");
  static_assert(BLOCK_Q % 64 == 0 && BLOCK_Q <= 128, "dSᵀ's rows are whole 64-query column blocks");
  static_assert(DQ_ROW_TILES * COL_BLOCKS == NUM_WARPGROUPS, "dQ is one 64 × 64 tile per warpgroup");
  static_assert(KV_BYTES % SWIZZLE_ATOM == 0 && Q_BYTES % SWIZZLE_ATOM == 0 && DS_BYTES % SWIZZLE_ATOM == 0,
                "every tile starts on the swizzle's 1024-byte repeat");
  static_assert(ROWS_BYTES % 16 == 0 && DQ_OFFSET % 16 == 0 && BARRIER_OFFSET % 8 == 0,
                "bulk copies move 16-byte units; barriers are 8 bytes");
  static_assert(BARRIER_OFFSET + 8 * (1 + Q_STAGES) + int(SWIZZLE_ATOM) == SMEM_BYTES, "the map is smem_bytes");
  static_assert(SMEM_BYTES <= 227 * 1024, "an sm_90 block may opt in to 227 KiB of shared memory");
};

template <int CONFIG>
using TraitsOf = Traits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].block_q>;

// ---- who owns what -----------------------------------------------------------------------------
// Warpgroup wg owns keys 64·wg … 64·wg + 63 of the block (rows of Sᵀ, dPᵀ, dK, dV) and the dQ tile
// dq_tile_of(wg): query rows 64·row_tile …, columns 64·col_block … of the block's [BLOCK_Q, HEAD_DIM].
struct DqTile {
  int row_tile;   // 64-row tile of the query rows
  int col_block;  // 64-column block of the head dims
};
FS_HD constexpr DqTile dq_tile_of(int wg, int block_q) {
  return block_q / DQ_TILE > 1 ? DqTile{wg, 0} : DqTile{0, wg};
}

// ---- operand views (byte offsets from the start of each tile; step 08's descriptors read them) ---
// K-major A of Sᵀ and dPᵀ: warpgroup wg's 64 rows of K or V, k16 step ks of the head dims. Inside a
// column block [BLOCK_KV, 64] its rows start 64·wg rows of 128 bytes in (step 08's Q, one warpgroup each).
FS_HD constexpr uint32_t kv_rows_step(int wg, int ks) {
  return uint32_t(wg * KEYS_PER_WARPGROUP) * ROW_BYTES + k_major_step_offset(BLOCK_KV, ks);
}
// K-major B of Sᵀ and dPᵀ: Q or dO [BLOCK_Q, HEAD_DIM], k16 step ks (step 08's K).
FS_HD constexpr uint32_t q_k_major_step(int block_q, int ks) { return k_major_step_offset(block_q, ks); }
// MN-major B of dV and dK: Q or dO [BLOCK_Q (k), HEAD_DIM (n)], queries 16·kk … (step 08's V);
// LBO mn_major_lbo(BLOCK_Q): the next 64 head dims.
FS_HD constexpr uint32_t q_mn_major_step(int kk) { return mn_major_step_offset(kk); }
// MN-major A of dQ: dSᵀ stored [BLOCK_KV (k), BLOCK_Q (m)], the row tile's 64 queries, keys 16·kk ….
FS_HD constexpr uint32_t ds_step(int row_tile, int kk) {
  return box_offset(BLOCK_KV, row_tile) + mn_major_step_offset(kk);
}
// MN-major B of dQ: K stored [BLOCK_KV (k), HEAD_DIM (n)], the column block's 64 dims, keys 16·kk ….
FS_HD constexpr uint32_t k_mn_major_step(int col_block, int kk) {
  return box_offset(BLOCK_KV, col_block) + mn_major_step_offset(kk);
}
// Where element (key, query) of dSᵀ is stored: the TMA's layout of a [BLOCK_KV, BLOCK_Q] tile.
FS_HD constexpr uint32_t ds_offset(int key, int query) { return tile_offset(BLOCK_KV, key, query); }

// The query tiles a block visits: step 11's first_query_tile, for each query head of the GQA group.
// Block x: K/V head x / kv_tiles, K/V tile x % kv_tiles (tile 0 first: with causal it sees the most).
FS_HD constexpr int64_t grid_blocks(const Problem& p) {
  return step11::tiles(p.seqlen_k, BLOCK_KV) * p.batch * p.heads_kv;
}

}  // namespace fs::step12
