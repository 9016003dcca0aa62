// Step 09's index math and protocols on the CPU (steps/09_warp_specialized/traits.h), against tables
// written here again from the PTX ISA and the CUDA driver API, independently of the header's formulas:
//   - the layouts step 09 copies from step 08 (swizzle, descriptors, fragments, boxes), for every
//     row of 09's table, whose new tile sizes (80, 112, 176, 192 keys) step 08's tests never saw,
//     and the epilogue's new per-consumer TMA store;
//   - the register budgets of setmaxnreg (PTX ISA, "setmaxnreg": a per-CTA pool, 24 … 256 in steps
//     of 8) and the table;
//   - the producer's copy order and, in one simulation, the whole block's protocol: the producer
//     thread, the copy engine, the eight (or, with three consumers, twelve) consumer warps, their
//     wgmma groups and the tensor cores,
//     the full and empty mbarriers (PTX ISA, "mbarrier": phases, arrival counts, tx-counts,
//     try_wait.parity valid for the current and the preceding phase only) and the named barriers
//     (PTX ISA, "bar, barrier": thread counts in warps, reset on completion, no second operation by
//     a warp before the reset), under random timings, for every sub-step;
//   - the work split, the table and the refusals.
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "fake_device.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "common/model/bank_model.h"
#include "steps/09_warp_specialized/traits.h"

namespace {

namespace s9 = fs::step09;
using fs::step09::frag::Coord;

// Calls f.template operator()<Traits>() for every row of the table (IDEAS does not change layouts).
template <class F, int... I>
void for_each_row(F&& f, std::integer_sequence<int, I...>) {
  (f(s9::TraitsOf<I, s9::kThreeConsumers>{}), ...);
}
template <class F>
void for_each_row(F&& f) {
  for_each_row(f, std::make_integer_sequence<int, s9::kNumConfigs>{});
}

// ---- the PTX ISA's matrix descriptor: (first bit, width) of each field -------------------------
struct Field {
  int lo, bits;
};
constexpr Field kStart{0, 14}, kLbo{16, 14}, kSbo{32, 14}, kBaseOffset{49, 3}, kSwizzle{62, 2};
uint64_t field(uint64_t desc, Field f) { return (desc >> f.lo) & ((uint64_t(1) << f.bits) - 1); }
uint64_t isa_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }  // matrix-descriptor-encode(x)

TEST_CASE("step 09: descriptors have the PTX ISA's fields for every tile of the table", "[step09]") {
  // By hand: V at BLOCK_KV 176: LBO 176 rows × 128 bytes = 22528 -> 1408 at bit 16; start 0x21000.
  CHECK(s9::matrix_descriptor(0x21000, 22528, 1024) == 0x4000004005802100ull);
  for_each_row([](auto tr) {
    using Tr = decltype(tr);
    CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
    for (uint32_t base = 0; base + Tr::SMEM_BYTES <= 228 * 1024 + 1024; base += 1024) {
      const uint32_t q = base + Tr::Q_OFFSET, k = base + Tr::K_OFFSET, v = base + Tr::V_OFFSET;
      const uint32_t lbo_v = s9::mn_major_lbo(Tr::BLOCK_KV);
      REQUIRE(isa_encode(lbo_v) < (1u << 14));  // the LBO fits its field
      const uint64_t dv = s9::matrix_descriptor(v, lbo_v, s9::SBO_8_ROWS);
      REQUIRE(field(dv, kLbo) == isa_encode(lbo_v));
      REQUIRE(field(dv, kSbo) == 64);
      REQUIRE(field(dv, kBaseOffset) == 0);
      REQUIRE(field(dv, kSwizzle) == 1);
      // Stepping by additions equals encoding the moved address (the start field never carries).
      for (int c = 0; c < Tr::CONSUMERS; ++c)
        for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
          const uint32_t qc = q + uint32_t(c * s9::ROWS_PER_WARPGROUP) * s9::ROW_BYTES;
          const uint32_t off = s9::k_major_step_offset(Tr::BLOCK_Q, ks);
          REQUIRE(s9::advance(s9::matrix_descriptor(qc, s9::K_MAJOR_LBO, s9::SBO_8_ROWS), off) ==
                  s9::matrix_descriptor(qc + off, s9::K_MAJOR_LBO, s9::SBO_8_ROWS));
        }
      for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
        const uint32_t st = uint32_t(stage * Tr::KV_BYTES);
        for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
          const uint32_t off = st + s9::k_major_step_offset(Tr::BLOCK_KV, ks);
          REQUIRE(s9::advance(s9::matrix_descriptor(k, s9::K_MAJOR_LBO, s9::SBO_8_ROWS), off) ==
                  s9::matrix_descriptor(k + off, s9::K_MAJOR_LBO, s9::SBO_8_ROWS));
        }
        for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
          const uint32_t off = st + s9::mn_major_step_offset(kk);
          REQUIRE(s9::advance(dv, off) == s9::matrix_descriptor(v + off, lbo_v, s9::SBO_8_ROWS));
        }
      }
    }
  });
}

// ---- the PTX ISA's 128-byte swizzle table ("Swizzling Modes"): the 16-byte chunk found at each
// position of the 8 rows of a 1024-byte-aligned block.
constexpr int kIsaSwizzle128[8][8] = {
    {0, 1, 2, 3, 4, 5, 6, 7}, {1, 0, 3, 2, 5, 4, 7, 6}, {2, 3, 0, 1, 6, 7, 4, 5}, {3, 2, 1, 0, 7, 6, 5, 4},
    {4, 5, 6, 7, 0, 1, 2, 3}, {5, 4, 7, 6, 1, 0, 3, 2}, {6, 7, 4, 5, 2, 3, 0, 1}, {7, 6, 5, 4, 3, 2, 1, 0},
};
uint32_t isa_swizzled_address(uint32_t a) {
  const int row = int(a >> 7) & 7, chunk = int(a >> 4) & 7;
  int pos = -1;
  for (int p = 0; p < 8; ++p)
    if (kIsaSwizzle128[row][p] == chunk) pos = p;
  return (a & ~0x70u) | uint32_t(pos) << 4;
}
// What the TMA writes (or, storing, reads) for element (r, c) of one box [rows, 64] at shared address
// `box`: row-major, 128-byte rows, swizzled by address.
uint32_t isa_box_address(uint32_t box, int r, int c) { return isa_swizzled_address(box + uint32_t(r * 128 + c * 2)); }
// wgmma's view, from the ISA's canonical layouts with 128-byte swizzle (T = 8 elements of 16 bytes):
// K-major Swizzle<3,4,3> ∘ ((8,m),(T,2k)):((8T,SBO),(1,T)), MN-major
// Swizzle<3,4,3> ∘ ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)).
uint32_t isa_k_major_address(uint32_t start, uint32_t sbo, int i, int k) {
  return isa_swizzled_address(start + (uint32_t(i % 8) * 64 + uint32_t(k)) * 2 + uint32_t(i / 8) * sbo);
}
uint32_t isa_mn_major_address(uint32_t start, uint32_t lbo, uint32_t sbo, int k, int n) {
  return isa_swizzled_address(start + (uint32_t(n % 64) + uint32_t(k % 8) * 64) * 2 + uint32_t(n / 64) * lbo +
                              uint32_t(k / 8) * sbo);
}

TEST_CASE("step 09: the swizzle is the ISA's table, and every descriptor reads what the TMA wrote", "[step09]") {
  for (uint32_t a = 0; a < 4 * 1024; ++a) REQUIRE(s9::swizzle_128b(a) == isa_swizzled_address(a));
  for_each_row([](auto tr) {
    using Tr = decltype(tr);
    CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
    const uint32_t base = 0x2c00;  // a 1024-byte-aligned shared address, like the kernel's
    const uint32_t q = base + Tr::Q_OFFSET, k = base + Tr::K_OFFSET, v = base + Tr::V_OFFSET;
    // Where the TMA puts element (r, col) of a tile of `rows` rows at `tile`: box col / 64.
    auto tma = [](uint32_t tile, int rows, int r, int col) {
      return isa_box_address(tile + s9::box_offset(rows, col / 64), r, col % 64);
    };
    for (int rows : {Tr::BLOCK_Q, Tr::BLOCK_KV}) {
      std::set<uint32_t> offsets;
      for (int r = 0; r < rows; ++r)
        for (int col = 0; col < Tr::HEAD_DIM; ++col) {
          REQUIRE(base + s9::tile_offset(rows, r, col) == tma(base, rows, r, col));
          offsets.insert(s9::tile_offset(rows, r, col));
        }
      CHECK(offsets.size() == size_t(rows * Tr::HEAD_DIM));
    }
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
      for (int kk = 0; kk < 16; ++kk) {
        for (int c = 0; c < Tr::CONSUMERS; ++c) {
          const uint32_t start = q + uint32_t(c * 64) * 128 + s9::k_major_step_offset(Tr::BLOCK_Q, ks);
          for (int m = 0; m < 64; ++m)
            REQUIRE(isa_k_major_address(start, s9::SBO_8_ROWS, m, kk) == tma(q, Tr::BLOCK_Q, 64 * c + m, 16 * ks + kk));
        }
        for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
          const uint32_t tile = k + uint32_t(stage * Tr::KV_BYTES);
          for (int n = 0; n < Tr::BLOCK_KV; ++n)
            REQUIRE(isa_k_major_address(tile + s9::k_major_step_offset(Tr::BLOCK_KV, ks), s9::SBO_8_ROWS, n, kk) ==
                    tma(tile, Tr::BLOCK_KV, n, 16 * ks + kk));
        }
      }
    for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
      const uint32_t tile = v + uint32_t(stage * Tr::KV_BYTES);
      for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
        for (int key = 0; key < 16; ++key)
          for (int n = 0; n < Tr::HEAD_DIM; ++n)
            REQUIRE(isa_mn_major_address(tile + s9::mn_major_step_offset(kk), s9::mn_major_lbo(Tr::BLOCK_KV),
                                         s9::SBO_8_ROWS, key, n) == tma(tile, Tr::BLOCK_KV, 16 * kk + key, n));
    }
    // The epilogue: consumer c's TMA store reads box [64, 64] cb from q_smem + o_box_offset(c, cb);
    // element (r, col) of that box must be where the consumer wrote O row 64c + r, column 64cb + col.
    for (int c = 0; c < Tr::CONSUMERS; ++c)
      for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
        REQUIRE(s9::o_box_offset(c, cb, Tr::BLOCK_Q) % s9::SWIZZLE_ATOM == 0);
        for (int r = 0; r < s9::ROWS_PER_WARPGROUP; ++r)
          for (int col = 0; col < 64; ++col)
            REQUIRE(isa_box_address(q + s9::o_box_offset(c, cb, Tr::BLOCK_Q), r, col) ==
                    q + s9::tile_offset(Tr::BLOCK_Q, 64 * c + r, 64 * cb + col));
      }
  });
}

// ---- wgmma fragments: the ISA figure for D (m64nNk16), cell by cell, and CuTe's CLayout_64xN --
struct ThreadReg {
  int thread, reg;
};
ThreadReg isa_acc_owner(int row, int col) {
  const int warp = row / 16, lower = (row % 16) / 8, g = row % 8;
  return {32 * warp + 4 * g + (col % 8) / 2, 4 * (col / 8) + 2 * lower + col % 2};
}
Coord cute_clayout(int thread, int value) {
  const int offset = 128 * (thread % 4) + (thread / 4) % 8 + 16 * (thread / 32) + 64 * (value % 2) +
                     8 * ((value / 2) % 2) + 512 * (value / 4);
  return {offset % 64, offset / 64};
}

TEST_CASE("step 09: the wgmma fragments of every N of the table, the mask's columns, P from S", "[step09]") {
  for (int n : {64, 80, 96, 112, 128, 176, 192, 256}) {
    CAPTURE(n);
    for (int row = 0; row < 64; ++row)
      for (int col = 0; col < n; ++col) {
        const ThreadReg o = isa_acc_owner(row, col);
        REQUIRE(s9::wgmma_acc(o.thread, o.reg) == Coord{row, col});
      }
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < n / 2; ++i) {
        REQUIRE(s9::wgmma_acc(t, i) == cute_clayout(t, i));
        // The mask compares acc_col_offset(i), a constant, with one bound per thread and row.
        REQUIRE(s9::wgmma_acc(t, i).col == s9::wgmma_acc(t, 0).col + s9::acc_col_offset(i));
        REQUIRE(s9::wgmma_acc(t, i).row == s9::wgmma_acc(t, 2 * ((i / 2) % 2)).row);
      }
  }
  // The register-A fragment is CuTe's ALayout_64x16 = CLayout_64x16 for 16-bit types, and P's A
  // register r of k16 step kk is S's accumulators p_source(kk, r), p_source(kk, r) + 1.
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) REQUIRE(s9::wgmma_a(t, r, h) == cute_clayout(t, 2 * r + h));
  for (int block_kv : {64, 80, 96, 112, 128, 176, 192})
    for (int t = 0; t < 128; ++t)
      for (int kk = 0; kk < block_kv / 16; ++kk)
        for (int r = 0; r < 4; ++r)
          for (int h = 0; h < 2; ++h) {
            const Coord a = s9::wgmma_a(t, r, h);
            REQUIRE(s9::p_source(kk, r) + h < block_kv / 2);
            REQUIRE(s9::wgmma_acc(t, s9::p_source(kk, r) + h) == Coord{a.row, a.col + 16 * kk});
          }
}

TEST_CASE("step 09: the epilogue's stores of O into shared memory are conflict-free", "[step09][bank]") {
  for (int consumers : {2, 3})
    for (int c = 0; c < consumers; ++c)
      for (int w = 0; w < 4; ++w)
        for (int head_dim : {64, 128, 192, 256})
          for (int nt = 0; nt < head_dim / 8; ++nt)
            for (int r = 0; r < 2; ++r) {
              fs::bank::WarpAccess a{};
              a.width = 4;
              for (int lane = 0; lane < 32; ++lane) {
                const Coord e = s9::wgmma_acc(32 * w + lane, 4 * nt + 2 * r);
                a.addr[lane] = s9::tile_offset(s9::block_q(consumers), 64 * c + e.row, e.col);
              }
              CAPTURE(consumers, c, w, head_dim, nt, r);
              REQUIRE(fs::bank::wavefronts(a) == 1);
            }
}

// ---- TMA boxes and tensor maps -------------------------------------------------------------------
TEST_CASE("step 09: tiles are HEAD_DIM / 64 boxes the driver accepts, O leaves in 64-row boxes", "[step09]") {
  for_each_row([](auto tr) {
    using Tr = decltype(tr);
    CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
    for (int rows : {Tr::BLOCK_Q, Tr::BLOCK_KV, s9::ROWS_PER_WARPGROUP}) {
      CHECK((rows >= 1 && rows <= 256));  // the driver: every box dimension 1-256
      CHECK(s9::box_offset(rows, 1) % s9::SWIZZLE_ATOM == 0);
    }
    uint32_t bytes = 0;
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      CHECK(s9::box_offset(Tr::BLOCK_KV, cb) == bytes);
      CHECK(s9::tma_box(cb, 7, 5, 3).col == 64 * cb);
      bytes += s9::box_bytes(Tr::BLOCK_KV);
    }
    CHECK(bytes == uint32_t(Tr::KV_BYTES));  // the bytes a K or V full barrier expects per fill
  });
  const fs::Problem p = fs::make_problem(3, 50, 100, 8, 4, 72, fs::DType::bf16, true);
  const s9::TensorMapShape o = s9::tensor_map_shape(p.o, p.seqlen_q, p.heads_q, p.batch, p.head_dim, 64);
  CHECK(o.dims[0] == 72);
  CHECK(o.dims[1] == 50);
  CHECK(o.strides[0] == 8 * 72 * 2);
  CHECK(o.box[0] == 64);
  CHECK(o.box[1] == 64);
}

// ---- registers and the table ---------------------------------------------------------------------
TEST_CASE("step 09: setmaxnreg moves the block's pool of registers, and the table fits both budgets",
          "[step09]") {
  // By hand: 65536 / 384 = 170.67, rounded down to the granule of 8: 168 at launch (what ptxas
  // reports for every two-consumer kernel of the step); 384 × 168 = 64512 in the pool. With three
  // consumers 65536 / 512 = 128 at launch, and 65536 in the pool.
  CHECK(s9::num_threads(2) == 384);
  CHECK(s9::num_threads(3) == 512);
  CHECK(s9::block_q(3) == 192);
  CHECK(s9::consumer_warps(3) == 12);
  CHECK(s9::launch_registers(384) == 168);
  CHECK(s9::launch_registers(512) == 128);
  CHECK(s9::launch_registers(256) == 256);
  CHECK(s9::registers_after_reallocation(2) == 128 * 24 + 256 * 240);
  CHECK(s9::registers_after_reallocation(2) == 384 * 168);  // the whole pool, not one register more
  CHECK(s9::registers_after_reallocation(3) == 128 * 24 + 384 * 160);
  CHECK(s9::registers_after_reallocation(3) <= 512 * 128);
  CHECK(s9::registers_after_reallocation(3) + 3 * 128 * 8 > 512 * 128);  // 8 more each would not fit
  for (int r = 0; r <= 264; ++r) CHECK(s9::valid_setmaxnreg(r) == (r >= 24 && r <= 256 && r % 8 == 0));
  // FlashAttention-3's budgets with TMA: 24 for the producer, 240 for two consumer warpgroups, 160
  // for three.
  CHECK(s9::PRODUCER_REGISTERS == 24);
  CHECK(s9::consumer_registers(2) == 240);
  CHECK(s9::consumer_registers(3) == 160);
  CHECK((s9::valid_reallocation(2) && s9::valid_reallocation(3)));

  for (int i = 0; i < s9::kNumConfigs; ++i) {
    const s9::Config& c = s9::kConfigs[i];
    CAPTURE(i, c.head_dim, c.block_kv, c.consumers);
    CHECK(s9::smem_bytes(c) <= 227 * 1024);
    CHECK(s9::array_registers(c) <= s9::consumer_registers(c.consumers) - 32);
    CHECK(s9::fits_registers(c));
    CHECK(c.block_kv % 16 == 0);
    CHECK((c.consumers == 2 || (c.consumers == 3 && c.head_dim == 64)));
  }
  // The table's comment, by hand.
  CHECK(s9::array_registers(s9::kConfigs[s9::kD128_N176]) == 64 + 88 + 44);
  CHECK(s9::smem_bytes(s9::kConfigs[s9::kD128_N176]) == 32768 + 4 * 45056 + 8 * 10 + 1024);
  CHECK(s9::smem_bytes(s9::kConfigs[s9::kD256_N80]) == 65536 + 4 * 40960 + 8 * 10 + 1024);
  CHECK(s9::array_registers(s9::kConfigs[s9::kD64_Q192]) == 32 + 64 + 32);
  CHECK(s9::smem_bytes(s9::kConfigs[s9::kD64_Q192]) == 24576 + 4 * 16384 + 8 * 10 + 1024);
  CHECK_FALSE(s9::fits_registers({64, 192, 2, 3}));  // 09d's 192 keys at head_dim 64: 176 of 160

  // Every head_dim, masking and sub-step has a row of its own width, with a real column in every box.
  for (int ideas = s9::kWarpSpecialization; ideas <= s9::kThreeConsumers; ++ideas)
    for (bool causal : {false, true})
      for (int64_t d = 8; d <= 256; d += 8) {
        const int i = s9::choose_config(ideas, d, causal);
        CAPTURE(ideas, causal, d, i);
        REQUIRE((i >= 0 && i < s9::kNumConfigs));
        CHECK(s9::has_config(ideas, i));
        CHECK(s9::kConfigs[i].head_dim == s9::padded_head_dim(d));
        CHECK(s9::kConfigs[i].head_dim - 64 < d);
      }
  // Before 09d step 08's tiles; 09d FlashAttention-3's.
  const int before[] = {128, 128, 96, 64};
  for (int w = 0; w < 4; ++w)
    for (bool causal : {false, true}) {
      CHECK(s9::kConfigs[s9::choose_config(s9::kIntraOverlap, 64 * (w + 1), causal)].block_kv == before[w]);
    }
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 128, false)].block_kv == 176);
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 128, true)].block_kv == 128);
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 64, false)].block_kv == 192);
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 64, true)].block_kv == 128);
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 192, true)].block_kv == 112);
  CHECK(s9::kConfigs[s9::choose_config(s9::kTileSizes, 256, false)].block_kv == 80);
  // 09e: three consumers at head_dim 64, with and without causal masking; 09d's rows elsewhere.
  for (bool causal : {false, true}) {
    CHECK(s9::choose_config(s9::kThreeConsumers, 64, causal) == s9::kD64_Q192);
    CHECK(s9::choose_config(s9::kThreeConsumers, 40, causal) == s9::kD64_Q192);
    for (int64_t d : {128, 192, 256})
      CHECK(s9::choose_config(s9::kThreeConsumers, d, causal) == s9::choose_config(s9::kTileSizes, d, causal));
  }
  // config_for: the products of a head's causal tiles, counted by hand. 1024 rows and keys: 8 tiles of
  // 128 rows visit 1 + 2 + ... + 8 = 36 tiles of 128 keys; 6 tiles of 192 rows (the last with 64 real
  // rows) visit 2, 3, 5, 6, 8 and 8. 2048: 11 tiles of 192 visit 101, 16 of 128 visit 136.
  CHECK(s9::causal_tile_products(1024, 1024, 128, 128) == int64_t(128) * 128 * 36);
  CHECK(s9::causal_tile_products(1024, 1024, 192, 128) == int64_t(192) * 128 * 32);
  CHECK(s9::causal_tile_products(2048, 2048, 128, 128) == int64_t(128) * 128 * 136);
  CHECK(s9::causal_tile_products(2048, 2048, 192, 128) == int64_t(192) * 128 * 101);
  CHECK(s9::causal_tile_products(0, 1024, 192, 128) == 0);
  // 64 rows, 100000 keys: one tile, 782 K/V tiles, 192 or 128 rows of products for 64 real ones.
  CHECK(s9::causal_tile_products(64, 100000, 192, 128) == int64_t(192) * 128 * 782);
  // Rows that see no key (seqlen_q > seqlen_k) are not counted: 4096 rows, 100 keys: the last tile only.
  CHECK(s9::causal_tile_products(4096, 100, 128, 128) == int64_t(128) * 128 * 1);
  auto row_for = [](int ideas, int64_t sq, int64_t sk, int64_t d, bool causal) {
    return s9::config_for(ideas, fs::make_problem(1, sq, sk, 4, 4, d, fs::DType::fp16, causal));
  };
  for (int ideas : {s9::kThreeConsumers, s9::kPersistent}) {
    CHECK(row_for(ideas, 1024, 1024, 64, true) == s9::kD64);       // 786432 > 5/4 · 589824
    CHECK(row_for(ideas, 512, 512, 64, true) == s9::kD64);
    CHECK(row_for(ideas, 2048, 2048, 64, true) == s9::kD64_Q192);  // 101 · 192 < 5/4 · 136 · 128
    CHECK(row_for(ideas, 1536, 1536, 64, true) == s9::kD64_Q192);  // 8 whole tiles of 192
    CHECK(row_for(ideas, 64, 100000, 64, true) == s9::kD64);       // 1.5x the products
    CHECK(row_for(ideas, 20000, 20000, 64, true) == s9::kD64_Q192);  // not counted
    CHECK(row_for(ideas, 1024, 1024, 64, false) == s9::kD64_Q192);  // without masking: the table's
    CHECK(row_for(ideas, 1024, 1024, 128, true) == s9::kD128);
  }
  CHECK(row_for(s9::kTileSizes, 1024, 1024, 64, true) == s9::kD64);  // before 09e: the table's row anyway
  CHECK(row_for(s9::kTileSizes, 2048, 2048, 64, true) == s9::kD64);
  for (int i = 0; i < s9::kNumConfigs; ++i)
    for (int ideas = s9::kWarpSpecialization; ideas < s9::kThreeConsumers; ++ideas)
      if (s9::has_config(ideas, i)) CHECK(s9::kConfigs[i].consumers == 2);
  // The mbarriers: distinct, 8-byte aligned, all inside the 8 · num_barriers bytes smem_bytes counts.
  for (int stages = 1; stages <= 4; ++stages) {
    std::set<uint32_t> at;
    at.insert(s9::barrier_offset(s9::kQFull, 0, stages));
    at.insert(s9::barrier_offset(s9::kQEmpty, 0, stages));
    for (int st = 0; st < stages; ++st)
      for (s9::BarrierKind k : {s9::kKFull, s9::kVFull, s9::kKEmpty, s9::kVEmpty}) at.insert(s9::barrier_offset(k, st, stages));
    CHECK(at.size() == size_t(2 + 4 * stages));
    for (uint32_t o : at) CHECK((o % 8 == 0 && o < uint32_t(8 * s9::num_barriers({64, 128, stages, 2}))));
  }
  // Named barriers: 0 is __syncthreads; the others distinct, below 16, thread counts whole warps.
  for (int consumers : {2, 3}) {
    std::set<int> ids = {0};
    for (int c = 0; c < consumers; ++c) {
      CHECK(ids.insert(s9::turn_barrier(c)).second);
      CHECK(ids.insert(s9::epilogue_barrier(c, consumers)).second);
    }
    CHECK(*ids.rbegin() < 16);
  }
  CHECK(s9::TURN_BARRIER_THREADS == 2 * 128);  // one consumer waits, the other arrives
  CHECK(s9::TURN_BARRIER_THREADS % 32 == 0);
  CHECK(s9::EPILOGUE_BARRIER_THREADS == 128);
}

// ---- the producer's order --------------------------------------------------------------------------
TEST_CASE("step 09: the producer copies in the order the turns need, each copy once", "[step09]") {
  // By hand.
  auto order = [](int count) {
    std::string s;
    for (int i = 0; i < 2 * count; ++i) {
      const s9::KvLoad l = s9::kv_load(i, count);
      s += (l.v ? "V" : "K") + std::to_string(l.visit) + " ";
    }
    return s;
  };
  CHECK(order(1) == "K0 V0 ");
  CHECK(order(2) == "K0 K1 V0 V1 ");
  CHECK(order(4) == "K0 K1 V0 K2 V1 K3 V2 V3 ");
  for (int count = 1; count <= 64; ++count) {
    CAPTURE(count);
    std::set<std::pair<bool, int>> seen;
    // The turn that first needs copy i: K(t) in turn t, V(t) in turn t + 1. Needing turns never
    // decrease along the order, so a copy never waits for a turn that needs a later copy.
    int last_turn = 0;
    for (int i = 0; i < 2 * count; ++i) {
      const s9::KvLoad l = s9::kv_load(i, count);
      REQUIRE((l.visit >= 0 && l.visit < count));
      REQUIRE(seen.insert({l.v, l.visit}).second);
      const int turn = l.visit + (l.v ? 1 : 0);
      REQUIRE(turn >= last_turn);
      last_turn = turn;
    }
    CHECK(seen.size() == size_t(2 * count));
  }
}

// ---- the whole block's protocol, simulated ---------------------------------------------------------
// The PTX ISA's mbarrier, as the kernel uses it: a phase completes when its pending arrivals and its
// tx-count are both zero, and the barrier then starts the next phase with the expected count
// restored. try_wait.parity is defined for the current (incomplete) phase, where it is false, and the
// one just before it, where it is true; the waiter knows which phase it wants (`want`).
struct Mbarrier {
  int expected, pending, phase = 0;
  int64_t tx = 0;
  explicit Mbarrier(int count) : expected(count), pending(count) {}
  void complete_if_done() {
    if (pending == 0 && tx == 0) {
      ++phase;
      pending = expected;
    }
  }
  void arrive(int64_t expect_tx) {
    REQUIRE(pending > 0);
    tx += expect_tx;
    --pending;
    complete_if_done();
  }
  void complete_tx(int64_t bytes) {
    tx -= bytes;
    REQUIRE(tx >= 0);
    complete_if_done();
  }
  bool try_wait_parity(uint32_t parity, int want) const {
    REQUIRE((want == phase || want == phase - 1));  // else the parity would be ambiguous
    REQUIRE(uint32_t(want & 1) == parity);
    return phase > want;
  }
};

// The PTX ISA's named barrier: warps arrive (bar.arrive) or arrive and wait (bar.sync), each counting
// 32 threads towards the expected thread count; when it is reached the waiting warps go on and the
// barrier resets. A warp must not operate on a barrier again before that reset.
struct NamedBarrier {
  int expected = 0, arrived = 0, completions = 0;
  std::set<int> counted;  // warps counted in the current use
  int arrive(int warp, int threads) {
    REQUIRE(counted.count(warp) == 0);
    if (expected == 0) expected = threads;
    REQUIRE(expected == threads);
    arrived += 32;
    counted.insert(warp);
    REQUIRE(arrived <= expected);
    const int use = completions;
    if (arrived == expected) {
      ++completions;
      arrived = expected = 0;
      counted.clear();
    }
    return use;
  }
};

// What a consumer warp does, op by op, generated from traits.h as kernel.cuh does it, for the tiles
// of one block (counts[n]: the K/V tiles tile n visits; one tile before 09f, any number from it).
enum class OpKind { Arrive, WaitQ, WaitFull, Sync, Issue, WaitGroups, Release, Finish, Epilogue, ReleaseQ };
struct Op {
  OpKind kind;
  int a = 0, b = 0;  // Arrive/Sync: barrier id; WaitQ/Epilogue/ReleaseQ: tile; WaitFull/Release: ring (0 K,
                     // 1 V), the block's visit; Issue: turn, tile; WaitGroups: groups that may stay pending;
                     // Finish: turn (O rescale and P rounding)
};
std::vector<Op> consumer_program(int ideas, int warp, const std::vector<int>& counts, int consumers) {
  std::vector<Op> prog;
  const bool ping_pong = ideas >= s9::kPingPong;
  const int c = warp / 4, next = s9::turn_barrier(s9::next_consumer(c, consumers));
  int base = 0;  // visits of the earlier tiles
  for (int n = 0; n < int(counts.size()); ++n) {
    const int count = counts[size_t(n)];
    prog.push_back({OpKind::WaitQ, n});
    if (count > 0 && ping_pong && s9::grants_first_turn(c, consumers)) prog.push_back({OpKind::Arrive, next});
    for (int k = 0; k < s9::num_turns(count); ++k) {
      const bool has_s = s9::turn_has_s(k, count), has_pv = s9::turn_has_pv(k);
      const bool under = s9::softmax_under_pv(ideas, has_s, has_pv);
      if (has_s) prog.push_back({OpKind::WaitFull, 0, base + k});
      if (has_pv) prog.push_back({OpKind::WaitFull, 1, base + k - 1});
      if (ping_pong) prog.push_back({OpKind::Sync, s9::turn_barrier(c)});
      prog.push_back({OpKind::Issue, k, n});  // S(k) committed first, then P·V(k-1), as kernel.cuh does
      if (ping_pong && s9::hands_over_after(c, k, count, consumers)) prog.push_back({OpKind::Arrive, next});
      prog.push_back({OpKind::WaitGroups, under ? 1 : 0});
      if (has_pv && !under) prog.push_back({OpKind::Release, 1, base + k - 1});
      if (has_s) prog.push_back({OpKind::Release, 0, base + k});  // after the softmax of S(k)
      if (under) {
        prog.push_back({OpKind::WaitGroups, 0});
        prog.push_back({OpKind::Release, 1, base + k - 1});
      }
      if (has_s) prog.push_back({OpKind::Finish, k});
    }
    // O into the consumer's rows of q_smem, its named barrier, the TMA store; its first warp then
    // releases q_smem (after the store has read it).
    prog.push_back({OpKind::Epilogue, n});
    if (warp % 4 == 0) prog.push_back({OpKind::ReleaseQ, n});
    base += count;
  }
  return prog;
}

struct Group {
  bool pv;
  int visit;  // the block's visit whose K (S) or V (P·V) it reads
  bool done;
};

// One run of a block over its tiles: the producer thread, the copy engine (copies land in random
// order after random delays), the 4 · consumers consumer warps, their wgmma groups (completing in any
// order: the ISA promises only what wait_group says), all interleaved at random. Checks, on every
// operation:
//   - a copy into a stage is issued only when all consumer warps have released the stage's previous fill
//     and no wgmma reading the stage is in flight (it would overwrite a tile being read);
//   - Q is loaded only when no consumer warp still writes or stores the previous tile's O from q_smem;
//   - every product reads the tile it should, after its copy has landed, and Q of its own tile;
//   - every wait's parity is unambiguous (Mbarrier), every named barrier is used by the ISA's rules
//     (NamedBarrier), a warp touches S's accumulators only once S's group is complete and o_acc or
//     p_frag only once P·V's is, and releases a stage only once its wgmma reading it is complete;
//   - with ping-pong, the consumers issue their turns in strict rotation, across tiles too;
//   - the run ends (no deadlock), with every barrier back at rest and every fill released.
void simulate_block(int ideas, int stages, const std::vector<int>& counts, uint32_t seed, int consumers) {
  CAPTURE(ideas, stages, counts, seed, consumers);
  std::mt19937 rng(seed);
  const int64_t kTileBytes = 4096, kQBytes = 8192;
  const bool ping_pong = ideas >= s9::kPingPong;
  const int tiles = int(counts.size());
  int visits = 0;
  for (int count : counts) visits += count;
  Mbarrier q_full(1), q_empty(consumers);
  std::vector<Mbarrier> full[2], empty[2];  // [ring: K, V][stage]
  for (int ring = 0; ring < 2; ++ring)
    for (int s = 0; s < stages; ++s) {
      full[ring].emplace_back(1);
      empty[ring].emplace_back(s9::consumer_warps(consumers));
    }
  std::vector<int> landed[2] = {std::vector<int>(size_t(stages), -1), std::vector<int>(size_t(stages), -1)};
  std::vector<int> released[2] = {std::vector<int>(size_t(visits), 0), std::vector<int>(size_t(visits), 0)};
  int q_landed = -1;  // the tile whose Q is in q_smem
  NamedBarrier named[16];
  struct Copy {
    int ring, stage, visit;  // ring -1: Q of tile `visit`
  };
  std::vector<Copy> in_flight;

  const int W = s9::consumer_warps(consumers);
  std::vector<std::vector<Op>> prog(W);
  std::vector<size_t> pc(W, 0);
  std::vector<std::vector<Group>> groups(W);
  std::vector<int> waiting_use(W, -1), waiting_id(W, -1), turns_issued(W, 0), s_visit(W, -1), tile_of(W, -1);
  std::vector<int> epilogues(W, 0);  // tiles whose O the warp has written and (its consumer) stored
  for (int w = 0; w < W; ++w) prog[size_t(w)] = consumer_program(ideas, w, counts, consumers);

  // The producer: per tile, Q at q_load_position among its copies (kv_load), each copy after its
  // stage's release, Q after q_smem's.
  int tile = 0, next_copy = 0, base = 0;  // next_copy: position among the tile's 2·count + 1 copies
  auto producer_step = [&]() -> bool {
    if (tile >= tiles) return false;
    const int count = counts[size_t(tile)], q_at = s9::q_load_position(ideas, count, unsigned(tile));
    if (next_copy == q_at) {
      if (tile > 0 && !q_empty.try_wait_parity(uint32_t((tile - 1) & 1), tile - 1)) return false;
      for (int w = 0; w < W; ++w) REQUIRE(epilogues[size_t(w)] >= tile);  // no one writes or stores O there
      if (count > 0) {
        q_full.arrive(kQBytes);
        in_flight.push_back({-1, 0, tile});
      } else {
        q_full.arrive(0);
      }
    } else {
      const s9::KvLoad l = s9::kv_load(next_copy - (next_copy > q_at ? 1 : 0), count);
      const int visit = base + l.visit, ring = l.v ? 1 : 0, s = s9::kv_stage(visit, stages);
      if (s9::waits_for_release(visit, stages) &&
          !empty[ring][size_t(s)].try_wait_parity(s9::release_parity(visit, stages), visit / stages - 1))
        return false;
      // The stage is free: the previous fill released by every warp, no wgmma reading it in flight.
      if (visit >= stages) REQUIRE(released[ring][size_t(visit - stages)] == W);
      for (int w = 0; w < W; ++w)
        for (const Group& g : groups[size_t(w)])
          if (!g.done) REQUIRE(!(g.pv == bool(ring) && s9::kv_stage(g.visit, stages) == s));
      full[ring][size_t(s)].arrive(kTileBytes);
      in_flight.push_back({ring, s, visit});
    }
    if (++next_copy > 2 * count) {
      next_copy = 0;
      base += count;
      ++tile;
    }
    return true;
  };
  auto copy_step = [&]() -> bool {
    if (in_flight.empty()) return false;
    const size_t i = rng() % in_flight.size();
    const Copy c = in_flight[i];
    in_flight.erase(in_flight.begin() + long(i));
    if (c.ring < 0) {
      q_landed = c.visit;
      q_full.complete_tx(kQBytes);
    } else {
      landed[c.ring][size_t(c.stage)] = c.visit;
      full[c.ring][size_t(c.stage)].complete_tx(kTileBytes);
    }
    return true;
  };
  auto tensor_step = [&]() -> bool {
    std::vector<std::pair<int, size_t>> pending;
    for (int w = 0; w < W; ++w)
      for (size_t g = 0; g < groups[size_t(w)].size(); ++g)
        if (!groups[size_t(w)][g].done) pending.push_back({w, g});
    if (pending.empty()) return false;
    const auto [w, g] = pending[rng() % pending.size()];
    groups[size_t(w)][g].done = true;
    return true;
  };
  auto group_done = [&](int w, bool pv, int visit) {
    for (const Group& g : groups[size_t(w)])
      if (g.pv == pv && g.visit == visit) return g.done;
    return false;
  };
  auto warp_step = [&](int w) -> bool {
    if (pc[size_t(w)] >= prog[size_t(w)].size()) return false;
    const Op op = prog[size_t(w)][pc[size_t(w)]];
    const int c = w / 4;
    switch (op.kind) {
      case OpKind::WaitQ:
        if (!q_full.try_wait_parity(uint32_t(op.a & 1), op.a)) return false;
        tile_of[size_t(w)] = op.a;
        break;
      case OpKind::WaitFull: {
        const int s = s9::kv_stage(op.b, stages);
        if (!full[op.a][size_t(s)].try_wait_parity(s9::kv_parity(op.b, stages), op.b / stages)) return false;
        REQUIRE(landed[op.a][size_t(s)] == op.b);
        break;
      }
      case OpKind::Arrive:
        named[op.a].arrive(w, s9::TURN_BARRIER_THREADS);
        break;
      case OpKind::Sync:
        if (waiting_id[size_t(w)] < 0) {  // arrive, then wait for the barrier to complete
          waiting_use[size_t(w)] = named[op.a].arrive(w, s9::TURN_BARRIER_THREADS);
          waiting_id[size_t(w)] = op.a;
          return true;
        }
        if (named[op.a].completions <= waiting_use[size_t(w)]) return false;
        waiting_id[size_t(w)] = -1;
        break;
      case OpKind::Issue: {
        const int k = op.a, count = counts[size_t(op.b)], turn = turns_issued[size_t(w)];
        if (ping_pong) {  // strict rotation: turn T of c after turn T of every c' < c, before that of every c' > c
          for (int o = 0; o < W; ++o)
            if (o / 4 != c) REQUIRE(turns_issued[size_t(o)] == (o / 4 < c ? turn + 1 : turn));
        }
        // Registers: S's accumulators and P·V's operands are free (their last groups are complete).
        for (const Group& g : groups[size_t(w)]) REQUIRE(g.done);
        groups[size_t(w)].clear();
        int base_of_tile = 0;
        for (int n = 0; n < op.b; ++n) base_of_tile += counts[size_t(n)];
        s_visit[size_t(w)] = -1;
        if (s9::turn_has_s(k, count)) {
          const int v = base_of_tile + k;
          REQUIRE(q_landed == op.b);                                 // S(k) reads this tile's Q
          REQUIRE(landed[0][size_t(s9::kv_stage(v, stages))] == v);  // and K(k)
          groups[size_t(w)].push_back({false, v, false});
          s_visit[size_t(w)] = v;
        }
        if (s9::turn_has_pv(k)) {
          const int v = base_of_tile + k - 1;
          REQUIRE(landed[1][size_t(s9::kv_stage(v, stages))] == v);  // P·V(k-1) reads V(k-1)
          groups[size_t(w)].push_back({true, v, false});
        }
        ++turns_issued[size_t(w)];
        break;
      }
      case OpKind::WaitGroups: {
        // wgmma.wait_group N: every group but the N most recent is complete.
        const auto& gs = groups[size_t(w)];
        for (size_t g = 0; g + size_t(op.a) < gs.size(); ++g)
          if (!gs[g].done) return false;
        // What the turn reads next: S's accumulators (the softmax) need S's group complete.
        if (s_visit[size_t(w)] >= 0) REQUIRE(group_done(w, false, s_visit[size_t(w)]));
        break;
      }
      case OpKind::Release: {
        REQUIRE(group_done(w, op.a == 1, op.b));  // the wgmma that read the stage has completed
        empty[op.a][size_t(s9::kv_stage(op.b, stages))].arrive(0);
        ++released[op.a][size_t(op.b)];
        break;
      }
      case OpKind::Finish:
        for (const Group& g : groups[size_t(w)]) REQUIRE(g.done);  // o_acc and p_frag are free
        break;
      case OpKind::Epilogue:
        for (const Group& g : groups[size_t(w)]) REQUIRE(g.done);  // O is final; Q is read no more
        REQUIRE(tile_of[size_t(w)] == op.a);
        ++epilogues[size_t(w)];
        break;
      case OpKind::ReleaseQ:
        // The consumer's first thread, after the named barrier: all its 4 warps have written O.
        for (int o = 4 * c; o < 4 * c + 4; ++o)
          if (epilogues[size_t(o)] <= op.a) return false;
        q_empty.arrive(0);
        break;
    }
    ++pc[size_t(w)];
    return true;
  };

  auto finished = [&]() {
    if (tile < tiles || !in_flight.empty()) return false;
    for (int w = 0; w < W; ++w)
      if (pc[size_t(w)] < prog[size_t(w)].size()) return false;
    return true;
  };
  // Entities: 0 producer, 1 copy engine, 2 tensor cores, 3 … 2 + W the warps.
  auto step = [&](int e) { return e == 0 ? producer_step() : e == 1 ? copy_step() : e == 2 ? tensor_step() : warp_step(e - 3); };
  int rounds = 0;
  while (!finished()) {
    REQUIRE(++rounds < 25 * W * (visits + 10 * tiles + 10));
    if (step(int(rng() % (3 + W)))) continue;
    // No progress: some entity must be able to move, or the protocol deadlocks.
    std::vector<int> order(3 + W);
    for (int e = 0; e < 3 + W; ++e) order[size_t(e)] = e;
    std::shuffle(order.begin(), order.end(), rng);
    bool moved = false;
    for (int e : order)
      if (step(e)) {
        moved = true;
        break;
      }
    REQUIRE(moved);
  }
  while (tensor_step()) {
  }
  // At rest: every named barrier idle, each turn barrier used once per turn (with ping-pong), every
  // fill released by all W warps, every barrier in the phase its fills put it in.
  int turns = 0;
  for (int count : counts) turns += s9::num_turns(count);
  for (const NamedBarrier& n : named) CHECK(n.arrived == 0);
  for (int c = 0; c < consumers; ++c) CHECK(named[s9::turn_barrier(c)].completions == (ping_pong ? turns : 0));
  for (int ring = 0; ring < 2; ++ring) {
    for (int v = 0; v < visits; ++v) CHECK(released[ring][size_t(v)] == W);
    for (int s = 0; s < stages; ++s) {
      const int fills = visits > s ? (visits - s + stages - 1) / stages : 0;
      CHECK(full[ring][size_t(s)].phase == fills);
      CHECK(empty[ring][size_t(s)].phase == fills);
    }
  }
  CHECK(q_full.phase == tiles);
  CHECK(q_empty.phase == tiles);
}

TEST_CASE("step 09: the block's protocol is safe and ends, for every sub-step, under random timings",
          "[step09]") {
  // The parities, by hand: stage t % S, fill t / S; consumers wait for parity (t / S) % 2, the
  // producer (before fill n ≥ 1) for the release of fill n - 1, parity (n - 1) % 2.
  for (int t = 0; t < 12; ++t) {
    CHECK(s9::kv_stage(t, 2) == t % 2);
    CHECK(s9::kv_parity(t, 2) == uint32_t((t / 2) % 2));
    CHECK(s9::waits_for_release(t, 2) == (t >= 2));
    if (t >= 2) CHECK(s9::release_parity(t, 2) == uint32_t((t / 2 - 1) % 2));
  }
  // The turns, by hand, for 3 tiles: S0 | S1 PV0 | S2 PV1 | PV2; the softmax runs under P·V only
  // from 09c on, and only in the turns that have both.
  CHECK(s9::num_turns(0) == 0);
  CHECK(s9::num_turns(3) == 4);
  CHECK((s9::turn_has_s(0, 3) && !s9::turn_has_pv(0)));
  CHECK((s9::turn_has_s(2, 3) && s9::turn_has_pv(2)));
  CHECK((!s9::turn_has_s(3, 3) && s9::turn_has_pv(3)));
  CHECK_FALSE(s9::softmax_under_pv(s9::kPingPong, true, true));
  CHECK(s9::softmax_under_pv(s9::kIntraOverlap, true, true));
  CHECK_FALSE(s9::softmax_under_pv(s9::kIntraOverlap, true, false));
  CHECK_FALSE(s9::softmax_under_pv(s9::kTileSizes, false, true));
  // The last consumer grants consumer 0 the first turn and does not hand over after its last; the
  // others hand on to the next.
  CHECK((s9::grants_first_turn(1, 2) && !s9::grants_first_turn(0, 2)));
  CHECK((s9::hands_over_after(0, 3, 3, 2) && !s9::hands_over_after(1, 3, 3, 2) && s9::hands_over_after(1, 2, 3, 2)));
  CHECK((s9::next_consumer(0, 2) == 1 && s9::next_consumer(1, 2) == 0));
  CHECK((s9::grants_first_turn(2, 3) && !s9::grants_first_turn(1, 3) && !s9::grants_first_turn(0, 3)));
  CHECK((s9::hands_over_after(1, 3, 3, 3) && !s9::hands_over_after(2, 3, 3, 3) && s9::hands_over_after(2, 2, 3, 3)));
  CHECK((s9::next_consumer(0, 3) == 1 && s9::next_consumer(1, 3) == 2 && s9::next_consumer(2, 3) == 0));

  // A block of 09a … 09e has one tile; from 09f it works through several, the rings, the Q barriers
  // and the turn rotation running on from one to the next (tiles of 0 keys included: causal, Sq > Sk).
  const std::vector<std::vector<int>> persistent = {{1, 1, 1}, {3, 0, 5}, {0, 0, 2, 1}, {17, 4, 9, 2, 1}, {2, 150, 3}};
  for (int consumers : {2, 3})
    for (int ideas = s9::kWarpSpecialization; ideas <= s9::kPersistent; ++ideas) {
      for (int stages : {1, 2, 3, 4})
        for (int count : {0, 1, 2, 3, 4, 5, 9, 17})
          for (uint32_t seed = 1; seed <= 6; ++seed) simulate_block(ideas, stages, {count}, seed, consumers);
      simulate_block(ideas, 2, {150}, 99, consumers);
      if (ideas >= s9::kPersistent)
        for (int stages : {1, 2, 3})
          for (const std::vector<int>& counts : persistent)
            for (uint32_t seed = 1; seed <= 4; ++seed) simulate_block(ideas, stages, counts, seed, consumers);
    }
}

// ---- the work split ----------------------------------------------------------------------------------
TEST_CASE("step 09: K/V tile ranges and the mask match the causal rule and the end of K", "[step09]") {
  for (bool causal : {false, true})
    for (int64_t sq : {1, 63, 64, 65, 128, 129, 300})
      for (int64_t sk : {1, 63, 64, 65, 96, 129, 300})
        for (int block_kv : {80, 112, 128, 176, 192})
          for (int64_t bq : {128, 192})  // BLOCK_Q with two consumers and with three
          for (int64_t q0 = 0; q0 < sq; q0 += bq) {
            const int64_t q_rows = std::min<int64_t>(bq, sq - q0);
            const s9::KvTiles r = s9::kv_tiles_for(q0, q_rows, block_kv, sq, sk, causal);
            CAPTURE(causal, sq, sk, block_kv, bq, q0, r.count, r.unmasked);
            REQUIRE((0 <= r.unmasked && r.unmasked <= r.count));
            for (int64_t j = 0; j * block_kv < sk; ++j) {
              bool some = false, all = true;
              for (int64_t i = q0; i < q0 + q_rows; ++i)
                for (int64_t key = j * block_kv; key < (j + 1) * block_kv; ++key) {
                  const bool seen = key < sk && (!causal || fs::causal_allows(i, key, sq, sk));
                  some = some || seen;
                  all = all && seen;
                  const int last = s9::last_visible_key(i, j * block_kv, block_kv, sq, sk, causal);
                  REQUIRE(seen == (key - j * block_kv <= last));
                }
              CHECK(some == (j < r.count));
              if (j < r.unmasked) CHECK(all);
            }
          }
  for (uint32_t q_tiles : {1u, 3u, 8u}) {
    std::set<std::pair<uint32_t, int>> seen;
    for (uint32_t block = 0; block < 5 * q_tiles; ++block) {
      const s9::BlockTile t = s9::block_tile(block, q_tiles);
      CHECK(seen.insert({t.bh, t.q_tile}).second);
      if (block % q_tiles == 0) CHECK(uint32_t(t.q_tile) == q_tiles - 1);
    }
  }
  // 09f: each round deals every position once (a snake: block x takes x, then grid - 1 - x, ...).
  CHECK(s9::persistent_position(0, 3, 132) == 3);
  CHECK(s9::persistent_position(1, 3, 132) == 132 + 128);
  CHECK(s9::persistent_position(2, 3, 132) == 264 + 3);
  for (uint32_t grid : {1u, 5u, 132u})
    for (uint32_t round = 0; round < 4; ++round) {
      std::set<uint32_t> at;
      for (uint32_t x = 0; x < grid; ++x) at.insert(s9::persistent_position(round, x, grid));
      CHECK((at.size() == grid && *at.begin() == round * grid && *at.rbegin() == round * grid + grid - 1));
    }
}

// ---- the registry -------------------------------------------------------------------------------------
TEST_CASE("step 09: six sub-steps, in idea order, on sm_90 only, each with its tiles", "[step09][registry]") {
  const char* ids[] = {"09a_producer_consumer", "09b_pingpong", "09c_intra_overlap", "09d_tile_sizes",
                       "09e_three_consumers", "09f_persistent"};
  const fs::DeviceInfo h200 = fake_device(90, 227 * 1024);
  for (int ideas = 1; ideas <= 6; ++ideas) {
    const fs::Step* s = fs::find_step(ids[ideas - 1]);
    REQUIRE(s != nullptr);
    CAPTURE(s->id);
    CHECK(s->dir == "09_warp_specialized");
    CHECK(s->min_compute_capability == 90);
    CHECK(s->arch_specific == 90);
    REQUIRE(s->explain);
    for (bool causal : {false, true})
      for (int64_t d : {40, 64, 128, 200, 256}) {
        const fs::Problem p = fs::make_problem(2, 1000, 1000, 8, 2, d, fs::DType::bf16, causal);
        const fs::Plan plan = fs::plan(*s, p, h200);
        REQUIRE(plan.accepted());
        CHECK(s->forward.claims(p, h200));
        CHECK(plan.config == s9::config_for(ideas, p));
        REQUIRE(plan.kernels.size() == 1);
        // 384 threads and 128-row query tiles (8 of 1000 rows), or from 09e at head_dim 64 512 and 192 (6);
        // with causal masking 1000 rows in 192-row tiles pad too much (config_for), and 09e keeps two.
        const bool three = ideas >= s9::kThreeConsumers && d <= 64 && !causal;
        CHECK(s9::kConfigs[plan.config].consumers == (three ? 3 : 2));
        CHECK(plan.kernels[0].threads == (three ? 512 : 384));
        CHECK(plan.kernels[0].smem_bytes == size_t(s9::smem_bytes(s9::kConfigs[plan.config])));
        // One block per tile, or from 09f without causal masking one per SM (132) where there are more tiles.
        const int64_t tiles = (three ? 6 : 8) * 2 * 8;
        CHECK(plan.kernels[0].blocks == tiles);
        const bool three_4000 = ideas >= s9::kThreeConsumers && d <= 64;  // 4000 rows, 1000 keys: little padding
        CHECK(s->forward.plan(fs::make_problem(4, 4000, 1000, 8, 2, d, fs::DType::bf16, causal), h200).kernels[0].blocks ==
              (ideas >= s9::kPersistent && !causal ? 132 : (three_4000 ? 21 : 32) * 4 * 8));
        CHECK(plan.kernels[0].function != nullptr);
      }
    const fs::Problem p = fs::make_problem(2, 1000, 1000, 8, 2, 128, fs::DType::fp16, false);
    CHECK(fs::plan(*s, p, fake_device(100, 227 * 1024)).refusal ==
          "step " + s->id +
              " is built for sm_90a only (architecture-specific instructions), which runs on compute capability "
              "9.0 alone; this GPU is 10.0");
    CHECK_FALSE(s->forward.claims(p, fake_device(80, 163 * 1024)));
  }
  // With causal masking 09f launches 09e's kernel (a block per tile, no persistent loop); without, its own.
  const fs::Step *e = fs::find_step("09e_three_consumers"), *f = fs::find_step("09f_persistent");
  REQUIRE((e && f));
  for (bool causal : {false, true})
    for (int64_t d : {64, 128, 256})
      for (int64_t n : {1000, 4096}) {
        CAPTURE(causal, d, n);
        const fs::Problem p = fs::make_problem(2, n, n, 8, 2, d, fs::DType::fp16, causal);
        const fs::Plan pe = fs::plan(*e, p, h200), pf = fs::plan(*f, p, h200);
        REQUIRE((pe.accepted() && pf.accepted()));
        CHECK(pe.config == pf.config);
        CHECK((pe.kernels[0].function == pf.kernels[0].function) == causal);
        if (causal) CHECK(pe.kernels[0].blocks == pf.kernels[0].blocks);
      }
  // Different sub-steps and tiles are different kernels.
  const fs::Problem p = fs::make_problem(2, 1000, 1000, 8, 2, 128, fs::DType::fp16, false);
  std::set<const void*> kernels;
  for (const char* id : ids) kernels.insert(fs::plan(*fs::find_step(id), p, h200).kernels[0].function);
  CHECK(kernels.size() == 6);
  // 09d at head_dim 128: 128 × 176 tiles, 209 KiB; a GPU with less shared memory is refused in a sentence.
  CHECK(fs::plan(*fs::find_step("09d_tile_sizes"), p, fake_device(90, 200 * 1024)).refusal ==
        "head_dim 128 runs on 128-wide tiles of 176 keys, which need 214096 bytes of shared memory per block; this "
        "GPU allows 204800");
  // 2^31 query tiles of 128 rows: one 1-D grid cannot hold them.
  const fs::Problem big = fs::make_problem(1 << 17, 128 * 1024, 1, 16, 16, 64, fs::DType::fp16, false);
  CHECK(fs::plan(*fs::find_step("09a_producer_consumer"), big, h200).refusal ==
        "this step launches one block per 128 query rows per batch and head, 2147483648 blocks here, more than the "
        "grid limit of 2147483647");
  // 09e takes that head_dim 64 problem in 192-row tiles: 683 · 16 · 2^17 = 1432354816 blocks fit; with
  // 1.5 times the batch, 683 · 16 · 196608 = 2148532224 do not.
  CHECK(fs::plan(*fs::find_step("09e_three_consumers"), big, h200).accepted());
  CHECK(fs::find_step("09e_three_consumers")->forward.claims(big, h200));
  CHECK_FALSE(fs::find_step("09a_producer_consumer")->forward.claims(big, h200));
  const fs::Problem bigger = fs::make_problem(3 << 16, 128 * 1024, 1, 16, 16, 64, fs::DType::fp16, false);
  CHECK(fs::plan(*fs::find_step("09e_three_consumers"), bigger, h200).refusal ==
        "this step launches one block per 192 query rows per batch and head, 2148532224 blocks here, more than the "
        "grid limit of 2147483647");
  // A stride the TMA cannot address.
  fs::Problem far = p;
  far.v.head = int64_t(1) << 39;
  CHECK(fs::plan(*fs::find_step("09c_intra_overlap"), far, h200).refusal ==
        "V's head stride is 549755813888 elements (1099511627776 bytes); the TMA addresses strides below 2^40 bytes");
}

TEST_CASE("step 09 explains its schedule and protocol without a GPU", "[step09]") {
  std::ostringstream a, c, e;
  fs::find_step("09a_producer_consumer")->explain(a);
  fs::find_step("09c_intra_overlap")->explain(c);
  fs::find_step("09e_three_consumers")->explain(e);
  CHECK(a.str().find("setmaxnreg.dec 24") != std::string::npos);
  CHECK(a.str().find("384 x 168 = 64512") != std::string::npos);
  CHECK(a.str().find("bar.sync") == std::string::npos);  // 09a has no ping-pong
  CHECK(c.str().find("V0: stage 0, fill 0, first fill: no wait") != std::string::npos);
  CHECK(c.str().find("K2: stage 0, fill 1, waits k_empty[0] parity 0") != std::string::npos);
  CHECK(c.str().find("consumer 1, before its turns: bar.arrive 1") != std::string::npos);
  CHECK(c.str().find("consumer 0 turn 2: wait K2 V1; bar.sync 1; issue S2 = Q.K2 O += P1.V1; bar.arrive 2; "
                     "wait_group 1; softmax S2; release K2; wait_group 0: release V1; rescale O, round P2\n") !=
        std::string::npos);
  CHECK(c.str().find("consumer 1 turn 4: wait V3; bar.sync 2; issue O += P3.V3; wait_group 0: release V3\n") !=
        std::string::npos);
  CHECK(c.str().find("With 3 consumers") == std::string::npos);
  // 09e: both blocks, and the turns of three consumers in rotation (1 -> 2 -> 3 -> 1 on the barriers).
  CHECK(e.str().find("a pool of 384 x 168 = 64512") != std::string::npos);
  CHECK(e.str().find("With 3 consumers: 512 threads") != std::string::npos);
  CHECK(e.str().find("consumers: setmaxnreg.inc 160 (take 3 x 128 x 32)") != std::string::npos);
  CHECK(e.str().find("HEAD_DIM 64 BLOCK_Q 192 BLOCK_KV 128, 2 stages: registers 32 + 64 + 32 = 128 of 160") !=
        std::string::npos);
  CHECK(e.str().find("consumer 2, before its turns: bar.arrive 1 (consumer 0 takes turn 0 first)") != std::string::npos);
  CHECK(e.str().find("consumer 1 turn 2: wait K2 V1; bar.sync 2; issue S2 = Q.K2 O += P1.V1; bar.arrive 3;") !=
        std::string::npos);
  CHECK(e.str().find("consumer 2 turn 4: wait V3; bar.sync 3; issue O += P3.V3; wait_group 0: release V3\n") !=
        std::string::npos);
}

}  // namespace
