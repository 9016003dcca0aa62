// Step 08 — the compile-time choices of the Hopper kernel (kernel.cuh) and all of its index math:
// where the TMA puts each element of a tile (the 128-byte swizzle), the wgmma matrix descriptors
// that read those tiles back, the wgmma register fragments (why S's accumulators are P's A
// operand), the TMA boxes and tensor-map shapes, the mbarrier phase each pipeline stage waits for,
// and the work split. Plain C++: tests/test_step08_tma_wgmma.cpp checks every function here against
// tables written from the PTX ISA and the CUDA driver API, so the index math that runs on the GPU
// is the index math that was tested.
#pragma once

#include <cstdint>

#include "common/forward/problem.h"

namespace fs::step08 {

// (row, col) of an element in a fragment map, as in step 07's traits.h.
namespace frag {
struct Coord {
  int row;
  int col;
};
FS_HD constexpr bool operator==(Coord a, Coord b) { return a.row == b.row && a.col == b.col; }
FS_HD constexpr bool operator!=(Coord a, Coord b) { return !(a == b); }
}  // namespace frag

// ---- the tile table ----------------------------------------------------------------------------
// Every tile is made of 64-column blocks: a row of 64 fp16/bf16 elements is 128 bytes, the span of
// the 128-byte swizzle, and the widest box the TMA may swizzle that way. So the problem's head_dim
// is padded up to a multiple of 64, the tile width HEAD_DIM: the TMA fills the columns at and past
// the real head_dim with zeros (the tensor map's inner dimension is head_dim), which changes no
// score, and the epilogue's TMA store writes only the columns < head_dim. Every column block holds
// at least one real column, so no box ever lies entirely outside the tensor.
//
// A block has two warpgroups of 64 query rows each (wgmma's M is 64): BLOCK_Q = 128. Per thread,
// for its warpgroup's 64 rows,
//     o_acc  HEAD_DIM / 2 fp32     the O accumulator, live through the whole K/V loop
//     s_acc  BLOCK_KV / 2 fp32     the scores of one tile
//     p_frag BLOCK_KV / 4 × 32 bit P as fp16/bf16 pairs, wgmma's A operand
// within the 255 registers a thread of a 256-thread block may have (one block per SM). Shared memory,
// with two K/V stages: Q + 2 · 2 · BLOCK_KV · HEAD_DIM · 2 bytes, within the 227 KiB an sm_90 block
// may opt in to:
//     HEAD_DIM  64: BLOCK_KV 128   registers 32 + 64 + 32    smem  16 + 64 KiB =  80 KiB
//     HEAD_DIM 128: BLOCK_KV 128   registers 64 + 64 + 32    smem  32 + 128    = 160 KiB
//     HEAD_DIM 192: BLOCK_KV  96   registers 96 + 48 + 24    smem  48 + 144    = 192 KiB (128 keys: 240)
//     HEAD_DIM 256: BLOCK_KV  64   registers 128 + 32 + 16   smem  64 + 128    = 192 KiB (128 keys: 320)
// (plus 1 KiB of alignment slack and the barriers; see smem_bytes).
struct Config {
  int head_dim;   // HEAD_DIM: tile width, a multiple of 64
  int block_kv;   // BLOCK_KV: keys per K/V tile, the N of S = Q·Kᵀ
  int kv_stages;  // KV_STAGES: K/V tiles in flight in the TMA ring
};

inline constexpr int kNumConfigs = 4;
inline constexpr Config kConfigs[kNumConfigs] = {
    {64, 128, 2},
    {128, 128, 2},
    {192, 96, 2},
    {256, 64, 2},
};

// The tile width a head_dim (a multiple of 8, at most 256) is padded to, and its row of the table.
FS_HD constexpr int padded_head_dim(int64_t head_dim) { return int((head_dim + 63) / 64 * 64); }
FS_HD constexpr int config_for(int64_t head_dim) { return padded_head_dim(head_dim) / 64 - 1; }

inline constexpr int BLOCK_Q = 128;          // query rows per block: two warpgroups
inline constexpr int ROWS_PER_WARPGROUP = 64;  // wgmma's M
inline constexpr int NUM_WARPGROUPS = BLOCK_Q / ROWS_PER_WARPGROUP;
inline constexpr int NUM_THREADS = NUM_WARPGROUPS * 128;

inline constexpr int COLS_PER_BLOCK = 64;        // elements of a row of one column block (one TMA box)
inline constexpr uint32_t ROW_BYTES = 128;       // ... in bytes: the span of the 128-byte swizzle
inline constexpr uint32_t SWIZZLE_ATOM = 1024;   // 8 rows of 128 bytes: the swizzle's repeat

// Bytes of one tile of `rows` rows, and the shared memory of a block: q_smem, KV_STAGES K and V
// tiles, one mbarrier for Q and one per K and per V stage, and 1 KiB of slack to align the tiles
// to the swizzle's 1024-byte repeat (the dynamic shared memory base has no such alignment promise).
FS_HD constexpr int tile_bytes(int rows, int head_dim) { return rows * head_dim * 2; }
FS_HD constexpr int num_barriers(const Config& c) { return 1 + 2 * c.kv_stages; }
FS_HD constexpr int smem_bytes(const Config& c) {
  return tile_bytes(BLOCK_Q, c.head_dim) + 2 * c.kv_stages * tile_bytes(c.block_kv, c.head_dim) +
         8 * num_barriers(c) + int(SWIZZLE_ATOM);
}

// Everything the kernel derives from one row of the table, as named constants.
template <int HEAD_DIM_, int BLOCK_KV_, int KV_STAGES_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int KV_STAGES = KV_STAGES_;
  static constexpr int BLOCK_Q = step08::BLOCK_Q;
  static constexpr int NUM_THREADS = step08::NUM_THREADS;
  static constexpr int NUM_WARPS = NUM_THREADS / 32;
  static constexpr Config kConfig = {HEAD_DIM, BLOCK_KV, KV_STAGES};

  static constexpr int COL_BLOCKS = HEAD_DIM / COLS_PER_BLOCK;  // TMA boxes per tile
  static constexpr int QK_K_STEPS = HEAD_DIM / 16;              // wgmma k16 steps of S = Q·Kᵀ
  static constexpr int PV_K_STEPS = BLOCK_KV / 16;              // wgmma k16 steps of O += P·V
  static constexpr int S_REGS = BLOCK_KV / 2;                   // s_acc: m64nBLOCK_KV fp32 accumulators
  static constexpr int O_REGS = HEAD_DIM / 2;                   // o_acc: m64nHEAD_DIM fp32 accumulators

  // Shared memory, bytes from the 1024-byte-aligned base.
  static constexpr int Q_BYTES = tile_bytes(BLOCK_Q, HEAD_DIM);    // q_smem [BLOCK_Q, HEAD_DIM]
  static constexpr int KV_BYTES = tile_bytes(BLOCK_KV, HEAD_DIM);  // one K or V stage [BLOCK_KV, HEAD_DIM]
  static constexpr int Q_OFFSET = 0;
  static constexpr int K_OFFSET = Q_OFFSET + Q_BYTES;
  static constexpr int V_OFFSET = K_OFFSET + KV_STAGES * KV_BYTES;
  static constexpr int BARRIER_OFFSET = V_OFFSET + KV_STAGES * KV_BYTES;  // q_full, k_full[], v_full[]
  static constexpr int SMEM_BYTES = smem_bytes(kConfig);

  static_assert(HEAD_DIM % COLS_PER_BLOCK == 0 && HEAD_DIM <= 256,
                "tiles are 64-column blocks, and wgmma's N (P·V) is at most 256");
  static_assert(BLOCK_KV % 16 == 0 && BLOCK_KV <= 256,
                "P·V consumes keys 16 at a time; wgmma's N (S = Q·Kᵀ) and a TMA box's rows are at most 256");
  static_assert(KV_STAGES >= 2, "one K/V tile in flight while another is read");
  static_assert(Q_BYTES % SWIZZLE_ATOM == 0 && KV_BYTES % SWIZZLE_ATOM == 0 &&
                    (BLOCK_KV * ROW_BYTES) % SWIZZLE_ATOM == 0 && (BLOCK_Q * ROW_BYTES) % SWIZZLE_ATOM == 0,
                "every tile and every column block starts on the swizzle's 1024-byte repeat");
  static_assert(SMEM_BYTES <= 227 * 1024, "an sm_90 block may opt in to 227 KiB of shared memory");
};

// ---- the 128-byte swizzle ----------------------------------------------------------------------
// What CU_TENSOR_MAP_SWIZZLE_128B makes the TMA write and what swizzle mode 1 makes wgmma read:
// inside each 1024-byte block (8 rows of 128 bytes, starting 1024-byte aligned), the 16-byte chunk c
// of row r is stored at chunk c ^ r. On a byte offset from a 1024-byte-aligned base: bits 4-6 (the
// chunk) XOR bits 7-9 (the row within the block). Eight rows of one logical chunk land in eight
// different chunks, so no two of them share a bank.
FS_HD constexpr uint32_t swizzle_128b(uint32_t byte_offset) { return byte_offset ^ ((byte_offset >> 3) & 0x70u); }

// Byte offset of element (row, col) of a tile of `rows` rows as the TMA stores it: the tile is
// HEAD_DIM / 64 boxes [rows, 64] one after the other (box cb holds columns 64·cb …), each row-major
// with 128-byte rows, swizzled. `rows` is a multiple of 8, so every box starts on a 1024-byte repeat.
FS_HD constexpr uint32_t tile_offset(int rows, int row, int col) {
  return swizzle_128b(uint32_t(col / COLS_PER_BLOCK) * uint32_t(rows) * ROW_BYTES + uint32_t(row) * ROW_BYTES +
                      uint32_t(col % COLS_PER_BLOCK) * 2u);
}

// ---- wgmma matrix descriptors (PTX ISA, "Matrix Descriptor Format") ----------------------------
// A 64-bit value: bits 0-13 start address, 16-29 leading dimension byte offset (LBO), 32-45 stride
// dimension byte offset (SBO), each as (x & 0x3FFFF) >> 4; bits 49-51 base offset (0: the swizzle
// pattern starts on a 1024-byte boundary, as every tile here does); bits 62-63 the swizzle mode,
// 1 = 128-byte swizzle.
inline constexpr uint64_t kDescSwizzle128B = 1;
FS_HD constexpr uint64_t descriptor_field(uint32_t bytes) { return uint64_t((bytes & 0x3FFFFu) >> 4); }
FS_HD constexpr uint64_t matrix_descriptor(uint32_t start_address, uint32_t leading_byte_offset,
                                           uint32_t stride_byte_offset) {
  return descriptor_field(start_address) | descriptor_field(leading_byte_offset) << 16 |
         descriptor_field(stride_byte_offset) << 32 | kDescSwizzle128B << 62;
}
// Shared addresses are below 2^18 and the start field holds address / 16 in 14 bits, so moving a
// descriptor by `bytes` (a multiple of 16, staying below 2^18) is adding bytes / 16 to it: the
// kernel builds one descriptor per tile and steps it with additions (tested on the CPU).
FS_HD constexpr uint64_t advance(uint64_t descriptor, uint32_t bytes) { return descriptor + (bytes >> 4); }

// K-major operands: Q (A of S = Q·Kᵀ, M = query rows) and K (B, N = keys), both stored with the
// reduction dimension (head dims) contiguous. The ISA's canonical K-major layout with 128-byte
// swizzle, in 16-byte units, is Swizzle<3,4,3> ∘ ((8,m),(T,2k)):((8T,SBO),(1,T)): 8 rows of 128
// bytes, then the next 8 rows SBO bytes further; LBO is unused with swizzling ("assumed 1").
inline constexpr uint32_t K_MAJOR_LBO = 16;        // encodes as 1
inline constexpr uint32_t SBO_8_ROWS = 8 * ROW_BYTES;  // 1024: 8-row groups are contiguous
// Where k16 step ks starts inside a tile of `rows` rows: column block ks / 4, then 16 columns = 32
// bytes per step inside the 128-byte row. The hardware swizzles the address it forms from this
// start, which lands on the chunks the TMA filled because the tile is 1024-byte aligned and 32·(ks % 4)
// + 2·k < 128 never carries into the row bits 7-9.
FS_HD constexpr uint32_t k_major_step_offset(int rows, int ks) {
  return uint32_t(ks / 4) * uint32_t(rows) * ROW_BYTES + uint32_t(ks % 4) * 32u;
}

// MN-major operand: V, the B of O += P·V (K = keys, N = head dims) stored [key][dim], N contiguous;
// the instruction's imm-trans-b = 1 says so. The ISA's canonical MN-major layout with 128-byte
// swizzle is Swizzle<3,4,3> ∘ ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): 64 N-elements (one 128-byte
// row) × 8 keys form an atom; LBO is the distance to the next 64 head dims (the next column block,
// BLOCK_KV rows of 128 bytes further), SBO the distance to the next 8 keys (1024 bytes).
FS_HD constexpr uint32_t mn_major_lbo(int rows) { return uint32_t(rows) * ROW_BYTES; }
// k16 step kk covers keys 16·kk … 16·kk + 15: 16 rows of 128 bytes further, a multiple of 1024.
FS_HD constexpr uint32_t mn_major_step_offset(int kk) { return uint32_t(kk) * 16u * ROW_BYTES; }

// ---- wgmma register fragments (PTX ISA, "Register Fragments", m64nNk16) ------------------------
// Thread t (0-127) of a warpgroup: warp t / 32 owns rows 16·(t / 32) …, lane t % 32 holds, like
// mma.sync's m16n8 fragments, rows g = lane / 4 and g + 8 and the column pair 2·(lane % 4).
//
// The fp32 accumulator D of m64nNk16: register i (0 … N/2 - 1). Registers 4j … 4j + 3 cover
// columns 8j … 8j + 7: i % 2 picks the column of the pair, (i / 2) % 2 the row (g or g + 8).
FS_HD constexpr frag::Coord wgmma_acc(int t, int i) {
  return {16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (t % 4) + i % 2};
}
// The A operand from registers, fp16/bf16, 16 columns (one k16 step): register r (0-3) holds two
// elements, half 0 in the low 16 bits: r % 2 picks the row (g or g + 8), r / 2 the 8-column half.
FS_HD constexpr frag::Coord wgmma_a(int t, int r, int half) {
  return {16 * (t / 32) + (t % 32) / 4 + 8 * (r % 2), 8 * (r / 2) + 2 * (t % 4) + half};
}
// So the accumulators of S for columns 16·kk … 16·kk + 15 are registers 8kk … 8kk + 7, and the pair
// 8kk + 2r, 8kk + 2r + 1 sits exactly where A register r of k16 step kk wants it (same thread, same
// row, neighbouring columns, low half first): P's A fragment is S's accumulators rounded pairwise,
// with no data crossing threads. p_source(kk, r) is the accumulator that becomes the low half.
FS_HD constexpr int p_source(int kk, int r) { return 8 * kk + 2 * r; }

// ---- TMA: boxes and tensor maps ----------------------------------------------------------------
// A tensor map describes Q, K, V or O as a 4-D tensor, innermost first: (head_dim, seqlen, heads,
// batch), with the problem's strides in bytes. A box is [rows, 64] (64 head dims × rows), so a tile
// of HEAD_DIM columns is HEAD_DIM / 64 boxes. Box cb of the tile starting at row row0 has the
// coordinates (64·cb, row0, head, batch) and lands box_offset(rows, cb) bytes into the tile.
struct BoxCoord {
  int col, row, head, batch;
};
FS_HD constexpr BoxCoord tma_box(int cb, int row0, int head, int batch) { return {COLS_PER_BLOCK * cb, row0, head, batch}; }
FS_HD constexpr uint32_t box_offset(int rows, int cb) { return uint32_t(cb) * uint32_t(rows) * ROW_BYTES; }
FS_HD constexpr uint32_t box_bytes(int rows) { return uint32_t(rows) * ROW_BYTES; }

// What cuTensorMapEncodeTiled gets for one tensor (cuuint64_t and cuuint32_t are these types).
struct TensorMapShape {
  uint64_t dims[4];     // elements: head_dim, seqlen, heads, batch
  uint64_t strides[3];  // bytes between consecutive rows, heads, batches
  uint32_t box[4];      // elements: 64, rows, 1, 1
};
// The driver requires strides that are multiples of 16 bytes (the harness's rule, strides that are
// multiples of 8 elements, guarantees it) and below 2^40 bytes.
inline constexpr int64_t kMaxTmaStrideBytes = int64_t(1) << 40;
// A dimension of extent 1 is never stepped, so its stride cannot matter; it gets the packed value
// (the bytes of the dimensions inside it), which always meets the driver's rules, whatever the
// caller passed (0, or a stride past 2^40).
constexpr TensorMapShape tensor_map_shape(const Strides& s, int64_t seqlen, int64_t heads, int64_t batch,
                                          int64_t head_dim, int box_rows) {
  const int64_t row_bytes = head_dim * 2;
  const int64_t extent[3] = {seqlen, heads, batch};
  const int64_t stride[3] = {s.row * 2, s.head * 2, s.batch * 2};
  const int64_t packed[3] = {row_bytes, seqlen * row_bytes, heads * seqlen * row_bytes};
  TensorMapShape m{{uint64_t(head_dim), uint64_t(seqlen), uint64_t(heads), uint64_t(batch)},
                   {},
                   {uint32_t(COLS_PER_BLOCK), uint32_t(box_rows), 1u, 1u}};
  for (int i = 0; i < 3; ++i) m.strides[i] = uint64_t(extent[i] > 1 ? stride[i] : packed[i]);
  return m;
}

// ---- mbarrier phases of the K/V ring -----------------------------------------------------------
// The t-th K/V tile the block visits goes to stage t % KV_STAGES; it is that stage's fill number
// t / KV_STAGES, and fill n completes phase n of the stage's barrier (a barrier starts in phase 0;
// a phase completes when its one expected arrival, the producer's arrive.expect_tx, and all the
// bytes it announced have arrived). A wait for phase n tests its parity: try_wait.parity(P) is true
// once the phase of parity P just before the current one has completed, which is unambiguous
// because a stage is refilled only after every thread has waited for its previous fill.
FS_HD constexpr int kv_stage(int t, int kv_stages) { return t % kv_stages; }
FS_HD constexpr uint32_t kv_parity(int t, int kv_stages) { return uint32_t(t / kv_stages) & 1u; }
// The prologue fills the first min(KV_STAGES, count) stages; after visit t every thread is done with
// its stage, which then takes visit t + KV_STAGES, if there is one.
FS_HD constexpr int prologue_fills(int count, int kv_stages) { return count < kv_stages ? count : kv_stages; }
FS_HD constexpr bool refills_after(int t, int count, int kv_stages) { return t + kv_stages < count; }

// ---- the work split (as step 07) ---------------------------------------------------------------
// One block per (batch·head, query tile) in a 1-D grid; plan() refuses more than 2^31 - 1 blocks.
FS_HD constexpr int64_t grid_blocks(const Problem& p) { return (p.seqlen_q + BLOCK_Q - 1) / BLOCK_Q * p.batch * p.heads_q; }

// Block x works on head bh = x / q_tiles, the last query tile of a head first (with causal masking
// it has the most keys); neighbouring blocks share a head, and a GQA group's K/V, in L2.
struct BlockTile {
  uint32_t bh;  // batch · heads_q + head
  int q_tile;   // query rows [q_tile · BLOCK_Q, (q_tile + 1) · BLOCK_Q)
};
FS_HD constexpr BlockTile block_tile(uint32_t block, uint32_t q_tiles) {
  return {block / q_tiles, int(q_tiles - 1 - block % q_tiles)};
}

// The K/V tiles a query tile visits: [0, count) hold a key some row may see, [0, unmasked) only keys
// every row sees. Visited from count - 1 down to 0: the masked tiles first, tiles above the causal
// diagonal never. q_rows: real query rows in the tile.
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

// In a masked tile starting at key kv0: the last key, counted from kv0, that query row `row` may see,
// clamped to [-1, block_kv - 1].
FS_HD constexpr int last_visible_key(int64_t row, int64_t kv0, int block_kv, int64_t seqlen_q, int64_t seqlen_k,
                                     bool causal) {
  int64_t last = seqlen_k - 1;
  if (causal && row + seqlen_k - seqlen_q < last) last = row + seqlen_k - seqlen_q;
  last -= kv0;
  return int(last < -1 ? -1 : last > block_kv - 1 ? block_kv - 1 : last);
}

}  // namespace fs::step08
