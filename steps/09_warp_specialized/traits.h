// Step 09 — the compile-time choices of the warp-specialized kernel (kernel.cuh) and all of its
// index math and synchronization protocols: the ideas of the sub-steps 09a … 09e, the tile table,
// the warpgroup roles and their register budgets, where the TMA puts each element of a tile (the
// 128-byte swizzle), the wgmma matrix descriptors and register fragments, the TMA boxes, the order
// in which the producer issues the copies, the mbarrier phase every wait tests (full and empty
// rings), the consumers' turns and the named barriers that order them. Plain C++:
// tests/test_step09_warp_specialized.cpp checks every function here against tables written from
// the PTX ISA and the CUDA driver API, and runs the whole block's protocol (producer, copy engine,
// eight or twelve consumer warps, tensor cores, named barriers) in a simulation under random timings, so the
// protocol that runs on the GPU is the protocol that was tested.
//
// Copied from step 08's traits.h: the swizzle, the descriptors, the fragments, the boxes, the
// tensor-map shapes and the work split (unchanged); changed: the warpgroups (a producer and two or
// three consumers) and the table (by sub-step); added: the register budgets, the producer's load order,
// the empty barriers, the turns, the named barriers.
#pragma once

#include <cstdint>

#include "common/forward/problem.h"

namespace fs::step09 {

// (row, col) of an element in a fragment map, as in step 07's traits.h.
namespace frag {
struct Coord {
  int row;
  int col;
};
FS_HD constexpr bool operator==(Coord a, Coord b) { return a.row == b.row && a.col == b.col; }
FS_HD constexpr bool operator!=(Coord a, Coord b) { return !(a == b); }
}  // namespace frag

// ---- the ideas of step 09 ----------------------------------------------------------------------
// Step 09 adds five ideas to step 08, one per lettered sub-step; sub-step 09x has every idea up to
// its own (the kernel's IDEAS parameter), so the runner's "x prev" column is what each idea buys.
enum Idea : int {
  kWarpSpecialization = 1,  // 09a  a producer warpgroup issues the TMA copies, two consumer warpgroups
                            //      compute; registers move from the one to the others (setmaxnreg);
                            //      full and empty mbarrier rings replace the block barrier
  kPingPong = 2,            // 09b  named barriers make the consumers take turns issuing their products,
                            //      so one's softmax runs while the other's products do
  kIntraOverlap = 3,        // 09c  in a turn, S of tile k is issued before P·V of tile k - 1 and waited
                            //      for alone: the softmax of tile k runs under that P·V
  kTileSizes = 4,           // 09d  tiles for the larger register budget: 176 keys at head_dim 128,
                            //      192 at 64, 112 at 192, 80 at 256 (128 with causal at 64 and 128)
  kThreeConsumers = 5,      // 09e  at head_dim 64, three consumer warpgroups: 192 query rows a block,
                            //      tiles of 128 keys, 160 registers a consumer thread
  kPersistent = 6,          // 09f  a persistent kernel: one block per SM works through the query tiles,
                            //      the next tile's K and Q loading during the previous one's end
};

// ---- the warpgroups ----------------------------------------------------------------------------
// Warpgroup 0 is the producer: one of its threads issues every TMA copy, the other 127 have nothing
// to do. Warpgroups 1 … n are the n consumers (a row of the table says how many: two, or three from
// 09e at head_dim 64): consumer c = warpgroup - 1 owns query rows 64·c … 64·c + 63 of the block
// (wgmma's M is 64), so BLOCK_Q = 64·n and a block has 128·(1 + n) threads: BLOCK_Q 128 and 384
// threads with two consumers, 192 and 512 with three.
inline constexpr int ROWS_PER_WARPGROUP = 64;  // wgmma's M
inline constexpr int PRODUCER_WARPGROUP = 0;
FS_HD constexpr int block_q(int consumers) { return consumers * ROWS_PER_WARPGROUP; }
FS_HD constexpr int num_threads(int consumers) { return (1 + consumers) * 128; }
FS_HD constexpr int consumer_warps(int consumers) { return 4 * consumers; }  // the arrivals that release a stage
FS_HD constexpr int consumer_of(int warpgroup) { return warpgroup - 1; }

// ---- register reallocation (setmaxnreg) --------------------------------------------------------
// An SM has 65536 32-bit registers and runs one block of this kernel. Under
// __launch_bounds__(threads, 1) a thread may have at most the register file split evenly over the
// block, rounded down to the allocation granule of 8: 65536 / 384 = 170.7 -> 168 with two consumers.
// The block starts with 384 × 168 = 64512 registers in its pool. The producer warpgroup gives most
// of its share back (setmaxnreg.dec to 24: 128 × 144 registers into the pool) and each consumer
// warpgroup takes what it needs for the accumulators (setmaxnreg.inc to 240: 128 × 72 each out of
// the pool):
//     128 × 24 + 2 × 128 × 240 = 3072 + 61440 = 64512,
// the whole pool, no more (setmaxnreg.inc would wait for ever for registers nobody gives back).
// With three consumers: 65536 / 512 = 128 at launch, a pool of 65536; the producer gives back 104
// a thread and each consumer takes (65536 - 3072) / 384 = 162.7 -> 160:
//     128 × 24 + 3 × 128 × 160 = 3072 + 61440 = 64512 of the 65536.
inline constexpr int REGISTER_FILE = 65536;
inline constexpr int REGISTER_GRANULE = 8;
FS_HD constexpr int launch_registers(int threads) {
  return REGISTER_FILE / threads / REGISTER_GRANULE * REGISTER_GRANULE;
}
inline constexpr int PRODUCER_REGISTERS = 24;
// setmaxnreg's operand: a multiple of 8 from 24 to 256 (PTX ISA, setmaxnreg).
FS_HD constexpr bool valid_setmaxnreg(int registers) {
  return registers >= 24 && registers <= 256 && registers % 8 == 0;
}
// What each consumer thread gets: the pool less the producer's share, split over the consumers,
// rounded down to the granule (at most 256, setmaxnreg's largest operand).
FS_HD constexpr int consumer_registers(int consumers) {
  const int pool = num_threads(consumers) * launch_registers(num_threads(consumers));
  const int each = (pool - 128 * PRODUCER_REGISTERS) / (consumers * 128) / REGISTER_GRANULE * REGISTER_GRANULE;
  return each < 256 ? each : 256;
}
FS_HD constexpr int registers_after_reallocation(int consumers) {
  return 128 * PRODUCER_REGISTERS + consumers * 128 * consumer_registers(consumers);
}
FS_HD constexpr bool valid_reallocation(int consumers) {
  const int threads = num_threads(consumers), consumer = consumer_registers(consumers);
  return valid_setmaxnreg(PRODUCER_REGISTERS) && valid_setmaxnreg(consumer) &&
         PRODUCER_REGISTERS <= launch_registers(threads) && consumer >= launch_registers(threads) &&
         registers_after_reallocation(consumers) <= threads * launch_registers(threads);
}
static_assert(valid_reallocation(2) && valid_reallocation(3),
              "setmaxnreg operands are multiples of 8 from 24 to 256, the producer decreases its registers, "
              "the consumers increase theirs, and they take no more than the block's pool holds");

// ---- the tile table ----------------------------------------------------------------------------
// Every tile is made of 64-column blocks (one 128-byte swizzle span per row), as in step 08: the
// problem's head_dim is padded up to a multiple of 64, the tile width HEAD_DIM, by the TMA's zero
// fill. Per consumer thread, for its warpgroup's 64 rows:
//     o_acc  HEAD_DIM / 2 fp32     the O accumulator, live through the whole K/V loop
//     s_acc  BLOCK_KV / 2 fp32     the scores of tile k
//     p_frag BLOCK_KV / 4 × 32 bit P of tile k - 1 as fp16/bf16 pairs, wgmma's A operand, live until
//                                  P·V of tile k - 1 completes (the turn structure needs it beside s_acc)
// within the 240 registers a consumer thread has after setmaxnreg (160 with three consumers), with
// at least 32 left for addresses and the softmax (ptxas -v: no row of the table spills,
// bench/results/ptxas-09_warp_specialized-6450ec6.txt). Shared
// memory, two K/V stages: Q + 2 · 2 · BLOCK_KV · HEAD_DIM · 2 bytes, within the 227 KiB an sm_90
// block may opt in to.
//
// The sub-steps before 09d keep step 08's tiles (sized for 08's 255-register, 256-thread budget
// with s_acc and P as one set), so that the ablation measures the schedule and not the tiles:
//     HEAD_DIM  64: BLOCK_KV 128   registers 32 + 64 + 32    smem  16 + 64 KiB  =  80 KiB
//     HEAD_DIM 128: BLOCK_KV 128   registers 64 + 64 + 32    smem  32 + 128     = 160 KiB
//     HEAD_DIM 192: BLOCK_KV  96   registers 96 + 48 + 24    smem  48 + 144     = 192 KiB
//     HEAD_DIM 256: BLOCK_KV  64   registers 128 + 32 + 16   smem  64 + 128     = 192 KiB
// 09d takes FlashAttention-3's BLOCK_KV, within both budgets: at HEAD_DIM 192 and 256 the widest shared memory
// allows; at 64 and 128 both budgets would also admit wider tiles (up to 224 and 192 keys), not measured:
//     HEAD_DIM  64: BLOCK_KV 192   registers 32 + 96 + 48    smem  16 + 96 KiB  = 112 KiB
//     HEAD_DIM 128: BLOCK_KV 176   registers 64 + 88 + 44    smem  32 + 176     = 208 KiB
//     HEAD_DIM 192: BLOCK_KV 112   registers 96 + 56 + 28    smem  48 + 168     = 216 KiB
//     HEAD_DIM 256: BLOCK_KV  80   registers 128 + 40 + 20   smem  64 + 160     = 224 KiB
// except with causal masking at HEAD_DIM 64 and 128, where it keeps 128 keys: a query tile of 128
// rows then crosses the diagonal in one K/V tile, not two (less masking work, fewer wasted keys).
// 09e gives head_dim 64 a third consumer (FlashAttention-3's 192 query rows there), with or without
// causal masking; 160 registers a thread hold 32 + 64 + 32 = 128 of arrays, so 128 keys:
//     HEAD_DIM  64: BLOCK_Q 192, BLOCK_KV 128   registers 32 + 64 + 32    smem  24 + 64 KiB  =  88 KiB
// (Each plus 1 KiB of alignment slack and the barriers; see smem_bytes.)
struct Config {
  int head_dim;   // HEAD_DIM: tile width, a multiple of 64
  int block_kv;   // BLOCK_KV: keys per K/V tile, the N of S = Q·Kᵀ
  int kv_stages;  // KV_STAGES: K/V tiles in flight in the TMA ring
  int consumers;  // consumer warpgroups: BLOCK_Q = 64 · consumers
};

enum ConfigId : int {
  kD64,        // step 08's tiles: every sub-step before 09d; 09d with causal masking at 64;
               // from 09e at 64 with causal masking where 192-row tiles pad too much (config_for)
  kD128,       // step 08's tiles at 128: every sub-step before 09d; from 09d with causal masking
  kD192,
  kD256,
  kD64_N192,   // 09d
  kD128_N176,
  kD192_N112,
  kD256_N80,
  kD64_Q192,   // 09e: three consumers
  kNumConfigs
};

inline constexpr Config kConfigs[kNumConfigs] = {
    {64, 128, 2, 2}, {128, 128, 2, 2}, {192, 96, 2, 2}, {256, 64, 2, 2},
    {64, 192, 2, 2}, {128, 176, 2, 2}, {192, 112, 2, 2}, {256, 80, 2, 2},
    {64, 128, 2, 3},
};

// Whether sub-step IDEAS has configuration `config`.
FS_HD constexpr bool has_config(int ideas, int config) {
  if (ideas >= kThreeConsumers) return config == kD64 || config == kD128 || (config >= kD128_N176 && config <= kD64_Q192);
  if (ideas >= kTileSizes) return config != kD192 && config != kD256 && config != kD64_Q192;
  return config < kD64_N192;
}

// The tile width a head_dim (a multiple of 8, at most 256) is padded to.
FS_HD constexpr int padded_head_dim(int64_t head_dim) { return int((head_dim + 63) / 64 * 64); }

// The row of the table sub-step IDEAS uses for a problem: one per tile width and masking.
FS_HD constexpr int choose_config(int ideas, int64_t head_dim, bool causal) {
  const int width = padded_head_dim(head_dim);
  if (ideas < kTileSizes) return width / 64 - 1;  // kD64 … kD256
  if (ideas >= kThreeConsumers && width == 64) return kD64_Q192;
  return width == 64 ? (causal ? kD64 : kD64_N192)
         : width == 128 ? (causal ? kD128 : kD128_N176)
         : width == 192 ? kD192_N112
                        : kD256_N80;
}

inline constexpr int COLS_PER_BLOCK = 64;       // elements of a row of one column block (one TMA box)
inline constexpr uint32_t ROW_BYTES = 128;      // ... in bytes: the span of the 128-byte swizzle
inline constexpr uint32_t SWIZZLE_ATOM = 1024;  // 8 rows of 128 bytes: the swizzle's repeat

// Bytes of one tile of `rows` rows, and the shared memory of a block: q_smem, KV_STAGES K and V
// tiles, the mbarriers (Q; then full and empty, for K and for V, per stage), and 1 KiB of slack to
// align the tiles to the swizzle's 1024-byte repeat.
FS_HD constexpr int tile_bytes(int rows, int head_dim) { return rows * head_dim * 2; }
FS_HD constexpr int num_barriers(const Config& c) { return 2 + 4 * c.kv_stages; }
FS_HD constexpr int smem_bytes(const Config& c) {
  return tile_bytes(block_q(c.consumers), c.head_dim) + 2 * c.kv_stages * tile_bytes(c.block_kv, c.head_dim) +
         8 * num_barriers(c) + int(SWIZZLE_ATOM);
}

// The registers of one consumer thread's three arrays (o_acc, s_acc, p_frag), for the table's budget.
FS_HD constexpr int array_registers(const Config& c) { return c.head_dim / 2 + c.block_kv / 2 + c.block_kv / 4; }

// Whether a row leaves a consumer thread 32 registers beside its three arrays.
FS_HD constexpr bool fits_registers(const Config& c) {
  return array_registers(c) <= consumer_registers(c.consumers) - 32;
}

// Everything the kernel derives from one row of the table and the sub-step, as named constants.
template <int HEAD_DIM_, int BLOCK_KV_, int KV_STAGES_, int CONSUMERS_, int IDEAS_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_KV = BLOCK_KV_;
  static constexpr int KV_STAGES = KV_STAGES_;
  static constexpr int CONSUMERS = CONSUMERS_;
  static constexpr int IDEAS = IDEAS_;
  FS_HD static constexpr bool has(Idea idea) { return IDEAS >= idea; }
  static constexpr int BLOCK_Q = block_q(CONSUMERS);
  static constexpr int NUM_THREADS = num_threads(CONSUMERS);
  static constexpr int NUM_WARPS = NUM_THREADS / 32;
  static constexpr int NUM_CONSUMER_WARPS = consumer_warps(CONSUMERS);
  static constexpr int CONSUMER_REGISTERS = consumer_registers(CONSUMERS);
  static constexpr Config kConfig = {HEAD_DIM, BLOCK_KV, KV_STAGES, CONSUMERS};

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
  // q_full, q_empty, k_full[], v_full[], k_empty[], v_empty[]: 8 bytes each (barrier_offset).
  static constexpr int BARRIER_OFFSET = V_OFFSET + KV_STAGES * KV_BYTES;
  static constexpr int SMEM_BYTES = smem_bytes(kConfig);

  static_assert(HEAD_DIM % COLS_PER_BLOCK == 0 && HEAD_DIM <= 256,
                "tiles are 64-column blocks, and wgmma's N (P·V) is at most 256");
  static_assert(BLOCK_KV % 16 == 0 && BLOCK_KV <= 256,
                "P·V consumes keys 16 at a time; wgmma's N (S = Q·Kᵀ) and a TMA box's rows are at most 256");
  static_assert(KV_STAGES >= 1, "at least one K and one V stage");
  static_assert(Q_BYTES % SWIZZLE_ATOM == 0 && KV_BYTES % SWIZZLE_ATOM == 0 &&
                    (BLOCK_KV * ROW_BYTES) % SWIZZLE_ATOM == 0 && (BLOCK_Q * ROW_BYTES) % SWIZZLE_ATOM == 0,
                "every tile and every column block starts on the swizzle's 1024-byte repeat");
  static_assert(SMEM_BYTES <= 227 * 1024, "an sm_90 block may opt in to 227 KiB of shared memory");
  static_assert(fits_registers(kConfig),
                "o_acc, s_acc and p_frag leave a consumer thread 32 registers for addresses and the softmax");
  static_assert(BLOCK_Q <= 256, "Q arrives in boxes of BLOCK_Q rows, and a TMA box's rows are at most 256");
};

// The Traits of row CONFIG of the table for sub-step IDEAS.
template <int CONFIG, int IDEAS>
using TraitsOf = Traits<kConfigs[CONFIG].head_dim, kConfigs[CONFIG].block_kv, kConfigs[CONFIG].kv_stages,
                        kConfigs[CONFIG].consumers, IDEAS>;

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
inline constexpr uint32_t K_MAJOR_LBO = 16;            // encodes as 1
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
// A thread's columns are its first one, wgmma_acc(t, 0).col = 2·(t % 4), plus a constant of the
// register: a mask compares that constant (an immediate) with one per-thread bound.
FS_HD constexpr int acc_col_offset(int i) { return 8 * (i / 4) + i % 2; }
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
// O leaves per consumer: consumer c stores its own 64 rows, box [64, 64] cb of them starting
// o_box_offset(c, cb, BLOCK_Q) bytes into q_smem (a multiple of 1024: the swizzle pattern the TMA
// reads is the one tile_offset wrote), at the coordinates tma_box(cb, q0 + 64·c, …).
FS_HD constexpr uint32_t o_box_offset(int consumer, int cb, int block_q) {
  return box_offset(block_q, cb) + uint32_t(consumer * ROWS_PER_WARPGROUP) * ROW_BYTES;
}

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

// ---- the turns of a consumer -------------------------------------------------------------------
// A query tile visits `count` K/V tiles; visit k reads tile count - 1 - k (the masked ones first,
// as in step 08). A consumer works in count + 1 turns: turn k issues, back to back,
//     S(k) = Q·K(k)ᵀ          when k < count
//     O += P(k-1)·V(k-1)      when k > 0      (P(k-1): the softmax of the previous turn)
// then waits for them and runs the softmax of S(k), which makes P(k). So every turn but the first
// and the last has both products in flight at once, and the schedule needs P(k-1) (p_frag) beside
// S(k) (s_acc): FlashAttention-3's order of the loop.
FS_HD constexpr int num_turns(int count) { return count > 0 ? count + 1 : 0; }
FS_HD constexpr bool turn_has_s(int k, int count) { return k < count; }
FS_HD constexpr bool turn_has_pv(int k) { return k > 0; }
// Without the intra-warpgroup overlap the turn waits for both products (wgmma.wait_group 0) before
// its softmax. With it (09c), S(k) is committed first and P·V(k-1) second, so wgmma.wait_group 1
// waits for S(k) alone: the softmax of tile k runs while P·V of tile k - 1 is still in the tensor
// cores, and wait_group 0 comes only before the O rescale, which writes o_acc.
FS_HD constexpr bool softmax_under_pv(int ideas, bool has_s, bool has_pv) {
  return ideas >= kIntraOverlap && has_s && has_pv;
}

// ---- the producer's copies and the mbarrier rings ----------------------------------------------
// K and V have a ring of KV_STAGES stages each; visit t's K goes to K stage t % KV_STAGES, its V to
// V stage t % KV_STAGES. Each stage has two mbarriers:
//   full   1 arrival (the producer's arrive.expect_tx) + the bytes of the tile: "the tile is here";
//   empty  one arrival per consumer warp (Traits::NUM_CONSUMER_WARPS: lane 0 of each, after the
//          wgmma that read the stage has completed for its warp): "no one reads the stage any more".
// Fill n of a stage (visit t = n·KV_STAGES + stage) completes phase n of its full barrier, so the
// consumers wait for parity n % 2 (kv_parity). Before fill n ≥ 1 the producer waits for the
// release of fill n - 1, phase n - 1 of the empty barrier: parity (n - 1) % 2 (release_parity).
// Fill 0 finds the stage empty and waits for nothing (a fresh barrier has no completed phase; the
// ISA defines try_wait only for the current phase and the one just before it).
// Neither wait can be fooled by a phase two fills ahead: the producer does not issue fill n + 1
// before every consumer warp has released fill n, which each does after waiting for it; the
// consumers do not release fill n before it has been issued. The CPU test checks this by simulation.
FS_HD constexpr int kv_stage(int t, int kv_stages) { return t % kv_stages; }
FS_HD constexpr uint32_t kv_parity(int t, int kv_stages) { return uint32_t(t / kv_stages) & 1u; }
FS_HD constexpr bool waits_for_release(int t, int kv_stages) { return t >= kv_stages; }
// The barriers, 8 bytes each from BARRIER_OFFSET: Q's two, then KV_STAGES of each kind.
enum BarrierKind : int { kQFull, kQEmpty, kKFull, kVFull, kKEmpty, kVEmpty };
FS_HD constexpr uint32_t barrier_offset(BarrierKind kind, int stage, int kv_stages) {
  return kind <= kQEmpty ? 8u * uint32_t(kind) : 8u * uint32_t(2 + (int(kind) - 2) * kv_stages + stage);
}
FS_HD constexpr uint32_t release_parity(int t, int kv_stages) { return uint32_t(t / kv_stages - 1) & 1u; }

// The producer issues the copies in the order the consumers' turns need them: Q, K(0), then per
// turn k ≥ 1 K(k) and V(k - 1), and V(count - 1) last:
//     Q  K0  K1 V0  K2 V1  K3 V2 … K(count-1) V(count-2)  V(count-1)
// Copy i of the 2·count is kv_load(i, count). A copy that has to wait for its stage to be released
// waits only for turns that need copies issued before it, so the order cannot deadlock.
struct KvLoad {
  bool v;     // false: K, true: V
  int visit;  // the visit t whose tile it copies
};
FS_HD constexpr KvLoad kv_load(int i, int count) {
  return i == 0 ? KvLoad{false, 0}
         : i == 2 * count - 1 ? KvLoad{true, count - 1}
         : i % 2 == 1 ? KvLoad{false, (i + 1) / 2}
                      : KvLoad{true, i / 2 - 1};
}

// Q has two barriers: q_full (the producer's one arrival, with Q's bytes; without them for a tile
// that sees no key and loads none) and q_empty (one arrival per consumer, once the TMA store of its
// rows of O, staged in q_smem, has read them). Tile n of a block completes phase n of each; the
// producer waits for q_empty's phase n - 1 before it loads Q for tile n ≥ 1, and every consumer
// waits for q_full's phase n, so neither side gets two phases ahead. A block of 09a … 09e has one
// tile and never waits on q_empty.
// Where Q is issued among the copies of a block's tile n: first, or from 09f for n ≥ 1 second, after
// K(0): K(0)'s stage is released during the previous tile's turns, q_smem only after its epilogue,
// so K(0) goes out first. A block's first tile has no epilogue before it, and Q goes first; so does
// it in a tile that sees no key, whose one slot is Q's (q_full's arrival without bytes).
FS_HD constexpr int q_load_position(int ideas, int count, unsigned n) {
  return ideas >= kPersistent && n > 0 && count > 0 ? 1 : 0;
}

// ---- ping-pong: the consumers' turns on named barriers -----------------------------------------
// With kPingPong the n consumers issue their products in strict rotation:
//     consumer 0 turn 0, consumer 1 turn 0, …, consumer n-1 turn 0, consumer 0 turn 1, …
// Consumer c takes turn k with bar.sync on its turn barrier (256 threads: its own 128 waiting, the
// previous consumer's 128 arriving), issues the turn's products, then hands the turn on with
// bar.arrive on the next consumer's barrier (next_consumer: c + 1, after the last consumer 0). The
// last consumer grants consumer 0 its first turn before its own turns start, and hands nothing on
// after its last turn, since consumer 0 has no turn count + 1 to take (an arrival nobody waits for
// would be left on the barrier). So each turn barrier completes exactly num_turns(count) times, and
// a warp never arrives twice on a barrier before it completes (the ISA's rule for bar.arrive): the
// CPU test checks both by simulation, with two consumers and with three.
// Barrier 0 is __syncthreads (used once, before the roles split); every id is below 16.
inline constexpr int TURN_BARRIER_THREADS = 2 * 128;
inline constexpr int EPILOGUE_BARRIER_THREADS = 128;
FS_HD constexpr int turn_barrier(int consumer) { return 1 + consumer; }
FS_HD constexpr int next_consumer(int consumer, int consumers) { return (consumer + 1) % consumers; }
// O staged: barriers 3 and 4 with two consumers, 4 to 6 with three.
FS_HD constexpr int epilogue_barrier(int consumer, int consumers) { return 1 + consumers + consumer; }
FS_HD constexpr bool grants_first_turn(int consumer, int consumers) { return consumer == consumers - 1; }
FS_HD constexpr bool hands_over_after(int consumer, int k, int count, int consumers) {
  return !(consumer == consumers - 1 && k == count);
}

// ---- the work split (as step 08) ---------------------------------------------------------------
// One tile of work per (batch·head, query tile of block_q rows), 1-D; before 09f one block per tile,
// and plan() refuses more than 2^31 - 1 tiles.
FS_HD constexpr int64_t grid_blocks(const Problem& p, int block_q) {
  return (p.seqlen_q + block_q - 1) / block_q * p.batch * p.heads_q;
}
// From 09f the kernel is persistent: at most one block per SM (one fits: shared memory and
// registers), and the tiles are dealt out in rounds, below.
FS_HD constexpr int64_t persistent_blocks(int64_t tiles, int sm_count) { return tiles < sm_count ? tiles : sm_count; }

// ---- the persistent schedule (09f) -------------------------------------------------------------
// In round n each of the grid's blocks takes one position of the tile order: block x position
// n·grid + x in even rounds, n·grid + grid - 1 - x in odd ones (a snake: were the tiles of a round of
// different lengths, a block that took a longer one would take a shorter one next; 09f's tiles, all
// without causal masking, are equally long). A position past the last tile ends the block's work
// (only the last round is short).
FS_HD constexpr uint32_t persistent_position(uint32_t round, uint32_t block, uint32_t grid) {
  return round * grid + (round % 2 == 0 ? block : grid - 1 - block);
}
// With causal masking the tiles are not equally long, and static rounds balance them worse than the
// GPU's own dispatch of one block per tile (measured: notes/09, Appendix L), so there 09f's plan
// launches one block per tile, and 09e's kernel (step.cu, with_traits).

// Tile x is head bh = x / q_tiles, the last query tile of a head first (with causal masking
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

// From 09e, head_dim 64 with causal masking: the products a head's query tiles of block_q rows
// compute, padding included (block_q · block_kv per visited K/V tile). Counted from the last query
// tile, which sees the most keys, down to the first that sees none; the caller bounds the trip count.
FS_HD constexpr int64_t causal_tile_products(int64_t seqlen_q, int64_t seqlen_k, int block_q, int block_kv) {
  int64_t visits = 0;
  for (int64_t q0 = seqlen_q > 0 ? (seqlen_q - 1) / block_q * block_q : -1; q0 >= 0; q0 -= block_q) {
    const int64_t rows = seqlen_q - q0 < block_q ? seqlen_q - q0 : block_q;
    const int count = kv_tiles_for(q0, rows, block_kv, seqlen_q, seqlen_k, true).count;
    if (count == 0) break;
    visits += count;
  }
  return visits * block_q * block_kv;
}

// The row of the table for a problem: choose_config's, except one case. From 09e, at head_dim 64
// with causal masking, three consumers' 192-row tiles can pad the last query tile, the one that sees
// the most keys, with up to 191 rows of nothing: 1024 rows are 6 tiles of 192 (1152 rows) against 8
// of 128. Three consumers compute a product about 1.25x faster than two there (notes/09, Appendix
// K, measured), so they give way to two (kD64, 128 x 128 tiles) where their tiles compute more than
// 5/4 of the products of 128-row tiles. With more than 12288 rows and 12288 keys one tile's padding
// is about 3 % of a head's work at most, and the count is skipped; below, its loop visits at most
// 12288 / 128 + 2 query tiles.
inline constexpr int kD64Keys = 128;  // the K/V tile of both rows config_for weighs
static_assert(kConfigs[kD64_Q192].block_kv == kD64Keys && kConfigs[kD64].block_kv == kD64Keys &&
              kConfigs[kD64_Q192].consumers == 3 && kConfigs[kD64].consumers == 2);
FS_HD constexpr int config_for(int ideas, const Problem& p) {
  const int row = choose_config(ideas, p.head_dim, p.causal != 0);
  if (row != kD64_Q192 || !p.causal || (p.seqlen_q > 12288 && p.seqlen_k > 12288)) return row;
  const int64_t three = causal_tile_products(p.seqlen_q, p.seqlen_k, block_q(3), kD64Keys);
  const int64_t two = causal_tile_products(p.seqlen_q, p.seqlen_k, block_q(2), kD64Keys);
  return 4 * three > 5 * two ? kD64 : row;
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

}  // namespace fs::step09
