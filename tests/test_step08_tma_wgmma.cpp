// Step 08's index math on the CPU (steps/08_tma_wgmma/traits.h), against tables written here again
// from the PTX ISA and the CUDA driver API, independently of the header's formulas:
//   - the matrix descriptor's bit fields (PTX ISA, "Matrix Descriptor Format");
//   - the 128-byte swizzle (PTX ISA, "Swizzling Modes": the table of 16-byte chunks per row);
//   - what the TMA writes for a box, and what wgmma reads through a descriptor, modelled from the
//     ISA's canonical layouts ("Shared Memory Matrix Layout"): the descriptor's view of every k16
//     slice of Q, K and V must be exactly the elements the TMA put there;
//   - the wgmma fragments (Figures "WGMMA .m64nNk16 register fragment layout" for D and for A, read
//     cell by cell, and CuTe's CLayout_64xN / ALayout_64x16 as a second, independent encoding), and
//     why S's accumulators are P's A operand;
//   - the TMA boxes and tensor-map shapes, the mbarrier phase sequence of the K/V ring (simulated
//     with the ISA's phase rules under random copy latencies), the work split and the refusals.
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
#include "ptx_isa.h"
#include "steps/08_tma_wgmma/traits.h"

namespace {

namespace s8 = fs::step08;
using fs::ptx_isa::isa_k_major_address;
using fs::ptx_isa::isa_mn_major_address;
using fs::ptx_isa::isa_swizzled_address;
using fs::ptx_isa::isa_tma_address;
using fs::step08::frag::Coord;

// ---- the PTX ISA's matrix descriptor: (first bit, width) of each field -------------------------
struct Field {
  int lo, bits;
};
constexpr Field kStart{0, 14}, kLbo{16, 14}, kSbo{32, 14}, kBaseOffset{49, 3}, kSwizzle{62, 2};
uint64_t field(uint64_t desc, Field f) { return (desc >> f.lo) & ((uint64_t(1) << f.bits) - 1); }
uint64_t isa_encode(uint32_t x) { return (x & 0x3FFFF) >> 4; }  // matrix-descriptor-encode(x)

TEST_CASE("step 08: matrix descriptors have the PTX ISA's bit fields", "[step08]") {
  // By hand: start 0x1000 -> 0x100, LBO 16 -> 1 at bit 16, SBO 1024 -> 64 at bit 32, 128-byte
  // swizzle = 1 at bit 62.
  CHECK(s8::matrix_descriptor(0x1000, 16, 1024) == 0x4000004000010100ull);
  // V at HEAD_DIM 128: start 0x20000 -> 0x2000, LBO 128 rows × 128 bytes = 16384 -> 1024.
  CHECK(s8::matrix_descriptor(0x20000, 16384, 1024) == 0x4000004004002000ull);
  for (uint32_t start = 0; start < (1u << 18); start += 16 * 37)
    for (uint32_t lbo : {16u, 8192u, 12288u, 16384u, 32768u})
      for (uint32_t sbo : {16u, 1024u, 2048u}) {
        const uint64_t d = s8::matrix_descriptor(start, lbo, sbo);
        CAPTURE(start, lbo, sbo);
        CHECK(field(d, kStart) == isa_encode(start));
        CHECK(field(d, kLbo) == isa_encode(lbo));
        CHECK(field(d, kSbo) == isa_encode(sbo));
        CHECK(field(d, kBaseOffset) == 0);  // every tile starts on the swizzle's 1024-byte repeat
        CHECK(field(d, kSwizzle) == 1);     // 1 = 128-byte swizzle on sm_90
        // Nothing outside the fields (bits 14-15, 30-31, 46-48, 52-61 are reserved).
        const uint64_t fields = (((1ull << 14) - 1) << 0) | (((1ull << 14) - 1) << 16) | (((1ull << 14) - 1) << 32) |
                                (7ull << 49) | (3ull << 62);
        CHECK((d & ~fields) == 0);
      }
}

// The tiles of one table row at a given shared-memory base (1024-byte aligned).
template <class Tr>
void check_advance(uint32_t base) {
  CAPTURE(Tr::HEAD_DIM, base);
  const uint32_t q = base + Tr::Q_OFFSET, k = base + Tr::K_OFFSET, v = base + Tr::V_OFFSET;
  for (int wg = 0; wg < 2; ++wg)
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
      const uint32_t qw = q + uint32_t(wg * s8::ROWS_PER_WARPGROUP) * s8::ROW_BYTES;
      const uint32_t off = s8::k_major_step_offset(Tr::BLOCK_Q, ks);
      CHECK(s8::advance(s8::matrix_descriptor(qw, s8::K_MAJOR_LBO, s8::SBO_8_ROWS), off) ==
            s8::matrix_descriptor(qw + off, s8::K_MAJOR_LBO, s8::SBO_8_ROWS));
    }
  for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
    const uint32_t st = uint32_t(stage * Tr::KV_BYTES);
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks) {
      const uint32_t off = st + s8::k_major_step_offset(Tr::BLOCK_KV, ks);
      CHECK(s8::advance(s8::matrix_descriptor(k, s8::K_MAJOR_LBO, s8::SBO_8_ROWS), off) ==
            s8::matrix_descriptor(k + off, s8::K_MAJOR_LBO, s8::SBO_8_ROWS));
    }
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
      const uint32_t off = st + s8::mn_major_step_offset(kk);
      const uint32_t lbo = s8::mn_major_lbo(Tr::BLOCK_KV);
      CHECK(s8::advance(s8::matrix_descriptor(v, lbo, s8::SBO_8_ROWS), off) == s8::matrix_descriptor(v + off, lbo, s8::SBO_8_ROWS));
    }
  }
}
template <int... I>
void check_advance_all(std::integer_sequence<int, I...>) {
  // Any 1024-byte-aligned base that leaves room for the tiles in the 228 KiB of an sm_90 SM.
  for (uint32_t base = 0; base < 228 * 1024; base += 1024)
    ((base + s8::smem_bytes(s8::kConfigs[I]) <= 228 * 1024 + 1024
          ? check_advance<s8::Traits<s8::kConfigs[I].head_dim, s8::kConfigs[I].block_kv, s8::kConfigs[I].kv_stages>>(base)
          : void()),
     ...);
}

TEST_CASE("step 08: stepping a descriptor by additions equals encoding the moved address", "[step08]") {
  check_advance_all(std::make_integer_sequence<int, s8::kNumConfigs>{});
}

TEST_CASE("step 08: the 128-byte swizzle is the PTX ISA's table and a bijection", "[step08]") {
  for (uint32_t a = 0; a < 4 * 1024; ++a) CHECK(s8::swizzle_128b(a) == isa_swizzled_address(a));
  std::set<uint32_t> seen;
  for (uint32_t a = 0; a < 16 * 1024; ++a) seen.insert(s8::swizzle_128b(a));
  CHECK(seen.size() == 16 * 1024);
  CHECK(*seen.rbegin() == 16 * 1024 - 1);
}

template <class Tr>
void check_tile_layout() {
  CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
  for (int rows : {Tr::BLOCK_Q, Tr::BLOCK_KV}) {
    std::set<uint32_t> offsets;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < Tr::HEAD_DIM; ++c) {
        const uint32_t o = s8::tile_offset(rows, r, c);
        offsets.insert(o);
        // The tile lives at a 1024-byte-aligned address (here 0x5400) like every tile of the kernel.
        REQUIRE(0x5400 + o == isa_tma_address(0x5400, rows, c / 64, r, c % 64));
      }
    CHECK(offsets.size() == size_t(rows * Tr::HEAD_DIM));  // a bijection onto [0, tile bytes) in 2-byte steps
    CHECK(*offsets.rbegin() == uint32_t(rows * Tr::HEAD_DIM * 2 - 2));
  }
}

template <class Tr>
void check_descriptor_views() {
  CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
  const uint32_t base = 0x1c00;  // a 1024-byte-aligned shared address, like the kernel's
  const uint32_t q = base + Tr::Q_OFFSET, k = base + Tr::K_OFFSET, v = base + Tr::V_OFFSET;
  // S = Q·Kᵀ, k16 step ks: A = 64 rows of this warpgroup × 16 head dims of Q, B = BLOCK_KV keys × 16
  // head dims of K (B(k, n) = K[n][16·ks + k]).
  for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
    for (int kk = 0; kk < 16; ++kk) {
      for (int wg = 0; wg < 2; ++wg) {
        const uint32_t start = q + uint32_t(wg * 64) * 128 + s8::k_major_step_offset(Tr::BLOCK_Q, ks);
        for (int m = 0; m < 64; ++m)
          REQUIRE(isa_k_major_address(start, s8::SBO_8_ROWS, m, kk) ==
                  isa_tma_address(q, Tr::BLOCK_Q, (16 * ks + kk) / 64, 64 * wg + m, (16 * ks + kk) % 64));
      }
      for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
        const uint32_t tile = k + uint32_t(stage * Tr::KV_BYTES);
        const uint32_t start = tile + s8::k_major_step_offset(Tr::BLOCK_KV, ks);
        for (int n = 0; n < Tr::BLOCK_KV; ++n)
          REQUIRE(isa_k_major_address(start, s8::SBO_8_ROWS, n, kk) ==
                  isa_tma_address(tile, Tr::BLOCK_KV, (16 * ks + kk) / 64, n, (16 * ks + kk) % 64));
      }
    }
  // O += P·V, k16 step kk: B = 16 keys × HEAD_DIM of V, B(k, n) = V[16·kk + k][n].
  for (int stage = 0; stage < Tr::KV_STAGES; ++stage) {
    const uint32_t tile = v + uint32_t(stage * Tr::KV_BYTES);
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) {
      const uint32_t start = tile + s8::mn_major_step_offset(kk);
      for (int key = 0; key < 16; ++key)
        for (int n = 0; n < Tr::HEAD_DIM; ++n)
          REQUIRE(isa_mn_major_address(start, s8::mn_major_lbo(Tr::BLOCK_KV), s8::SBO_8_ROWS, key, n) ==
                  isa_tma_address(tile, Tr::BLOCK_KV, n / 64, 16 * kk + key, n % 64));
    }
  }
}

template <int... I>
void check_layouts(std::integer_sequence<int, I...>) {
  (check_tile_layout<s8::Traits<s8::kConfigs[I].head_dim, s8::kConfigs[I].block_kv, s8::kConfigs[I].kv_stages>>(), ...);
  (check_descriptor_views<s8::Traits<s8::kConfigs[I].head_dim, s8::kConfigs[I].block_kv, s8::kConfigs[I].kv_stages>>(),
   ...);
}

TEST_CASE("step 08: tiles are where the TMA writes them, and every descriptor reads exactly those elements",
          "[step08]") {
  check_layouts(std::make_integer_sequence<int, s8::kNumConfigs>{});
}

// ---- wgmma fragments ----------------------------------------------------------------------------
// Figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D", read cell by cell:
// rows 16w … 16w + 15 belong to warp w; in each 8 × 8 block of a warp's rows (0-7 or 8-15) and
// columns (8j …), the 4 threads of row group g = row % 8 are T4g … T4g+3, two columns each, holding
// d(4j), d(4j+1) in the upper block and d(4j+2), d(4j+3) in the lower one.
struct ThreadReg {
  int thread, reg;
};
ThreadReg isa_acc_owner(int row, int col) {
  const int warp = row / 16, lower = (row % 16) / 8, g = row % 8;
  return {32 * warp + 4 * g + (col % 8) / 2, 4 * (col / 8) + 2 * lower + col % 2};
}
// CuTe's CLayout_64xN, ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)): (thread, value) -> m + 64·n.
Coord cute_clayout(int thread, int value) {
  const int t0 = thread % 4, t1 = (thread / 4) % 8, t2 = thread / 32;
  const int v0 = value % 2, v1 = (value / 2) % 2, v2 = value / 4;
  const int offset = 128 * t0 + t1 + 16 * t2 + 64 * v0 + 8 * v1 + 512 * v2;
  return {offset % 64, offset / 64};
}

TEST_CASE("step 08: the wgmma accumulator map matches the PTX ISA figure and CuTe's layout", "[step08]") {
  for (int n : {64, 96, 128, 192, 256}) {
    std::set<std::pair<int, int>> cells;
    for (int row = 0; row < 64; ++row)
      for (int col = 0; col < n; ++col) {
        const ThreadReg o = isa_acc_owner(row, col);
        CAPTURE(n, row, col, o.thread, o.reg);
        REQUIRE(s8::wgmma_acc(o.thread, o.reg) == Coord{row, col});
        cells.insert({o.thread, o.reg});
      }
    CHECK(cells.size() == size_t(64 * n));  // every (thread, register) holds one cell
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < n / 2; ++i) REQUIRE(s8::wgmma_acc(t, i) == cute_clayout(t, i));
  }
  // A few cells read off the figure by hand.
  CHECK(s8::wgmma_acc(0, 0) == Coord{0, 0});
  CHECK(s8::wgmma_acc(1, 1) == Coord{0, 3});
  CHECK(s8::wgmma_acc(4, 2) == Coord{9, 0});
  CHECK(s8::wgmma_acc(3, 5) == Coord{0, 15});
  CHECK(s8::wgmma_acc(32, 0) == Coord{16, 0});
  CHECK(s8::wgmma_acc(127, 63) == Coord{63, 127});
}

// Figure "WGMMA .m64nNk16 register fragment layout for matrix A" (fp16/bf16), cell by cell: warp w
// has rows 16w …; in row group g the threads T4g … T4g+3 hold two columns each: a0 a1 in columns
// 0-7 of the upper 8 rows, a2 a3 in columns 0-7 of the lower 8, a4 a5 and a6 a7 in columns 8-15.
ThreadReg isa_a_owner(int row, int col) {
  const int warp = row / 16, lower = (row % 16) / 8, g = row % 8;
  return {32 * warp + 4 * g + (col % 8) / 2, 4 * (col / 8) + 2 * lower + col % 2};  // reg = element a_i
}

TEST_CASE("step 08: the wgmma register-A map matches the PTX ISA figure, and S's accumulators are P's A", "[step08]") {
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 16; ++col) {
      const ThreadReg o = isa_a_owner(row, col);  // element a_i, i = o.reg: register i / 2, half i % 2
      CAPTURE(row, col, o.thread, o.reg);
      REQUIRE(s8::wgmma_a(o.thread, o.reg / 2, o.reg % 2) == Coord{row, col});
    }
  // CuTe: ALayout_64x16 = CLayout_64x16 for 16-bit types (value 2r + half).
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) REQUIRE(s8::wgmma_a(t, r, h) == cute_clayout(t, 2 * r + h));
  CHECK(s8::wgmma_a(0, 0, 0) == Coord{0, 0});
  CHECK(s8::wgmma_a(5, 3, 1) == Coord{9, 11});
  CHECK(s8::wgmma_a(33, 1, 0) == Coord{24, 2});

  // The accumulators of S for keys 16·kk … are A register r of k16 step kk: p_source(kk, r) (low
  // half) and p_source(kk, r) + 1 (high half) sit at the A element's row and column + 16·kk.
  for (int block_kv : {64, 96, 128})
    for (int t = 0; t < 128; ++t)
      for (int kk = 0; kk < block_kv / 16; ++kk)
        for (int r = 0; r < 4; ++r)
          for (int h = 0; h < 2; ++h) {
            const Coord a = s8::wgmma_a(t, r, h);
            CAPTURE(block_kv, t, kk, r, h);
            REQUIRE(s8::p_source(kk, r) + h < block_kv / 2);
            REQUIRE(s8::wgmma_acc(t, s8::p_source(kk, r) + h) == Coord{a.row, a.col + 16 * kk});
          }
}

TEST_CASE("step 08: the epilogue's stores of O into shared memory are conflict-free", "[step08][bank]") {
  // Warp w of warpgroup wg, 8-column group nt, row r: every lane stores the 4-byte pair of
  // accumulators 4nt + 2r, 4nt + 2r + 1 at tile_offset of its (row, column).
  for (int wg = 0; wg < 2; ++wg)
    for (int w = 0; w < 4; ++w)
      for (int head_dim : {64, 128, 192, 256})
        for (int nt = 0; nt < head_dim / 8; ++nt)
          for (int r = 0; r < 2; ++r) {
            fs::bank::WarpAccess a{};
            a.width = 4;
            for (int lane = 0; lane < 32; ++lane) {
              const Coord c = s8::wgmma_acc(32 * w + lane, 4 * nt + 2 * r);
              a.addr[lane] = s8::tile_offset(s8::BLOCK_Q, 64 * wg + c.row, c.col);
            }
            CAPTURE(wg, w, head_dim, nt, r);
            REQUIRE(fs::bank::wavefronts(a) == 1);
          }
}

// ---- TMA boxes and tensor maps -------------------------------------------------------------------
template <class Tr>
void check_boxes() {
  CAPTURE(Tr::HEAD_DIM, Tr::BLOCK_KV);
  for (int rows : {Tr::BLOCK_Q, Tr::BLOCK_KV}) {
    // The driver's rules for a box with 128-byte swizzle: each dimension 1-256, the inner one a
    // multiple of 16 bytes and at most the 128-byte swizzle span.
    CHECK((rows >= 1 && rows <= 256));
    CHECK(s8::COLS_PER_BLOCK * 2 % 16 == 0);
    CHECK(s8::COLS_PER_BLOCK * 2 <= 128);
    uint32_t bytes = 0;
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      const s8::BoxCoord c = s8::tma_box(cb, 3 * rows, 5, 7);
      CHECK(c.col == 64 * cb);
      CHECK(c.row == 3 * rows);
      CHECK(c.head == 5);
      CHECK(c.batch == 7);
      CHECK(s8::box_offset(rows, cb) % s8::SWIZZLE_ATOM == 0);  // each box starts a swizzle repeat
      CHECK(s8::box_offset(rows, cb) == bytes);                  // boxes one after the other
      bytes += s8::box_bytes(rows);
    }
    // The bytes the barrier expects are the whole tile: the TMA writes every element of a box.
    CHECK(bytes == uint32_t(rows == Tr::BLOCK_Q ? Tr::Q_BYTES : Tr::KV_BYTES));
  }
}
template <int... I>
void check_all_boxes(std::integer_sequence<int, I...>) {
  (check_boxes<s8::Traits<s8::kConfigs[I].head_dim, s8::kConfigs[I].block_kv, s8::kConfigs[I].kv_stages>>(), ...);
}

TEST_CASE("step 08: a tile is HEAD_DIM / 64 TMA boxes, back to back, whose bytes the barrier expects", "[step08]") {
  check_all_boxes(std::make_integer_sequence<int, s8::kNumConfigs>{});
}

TEST_CASE("step 08: tensor maps carry the problem's strides in bytes and meet the driver's rules", "[step08]") {
  // Contiguous K of (batch 3, seqlen 100, 4 heads, head_dim 72).
  const fs::Problem p = fs::make_problem(3, 50, 100, 8, 4, 72, fs::DType::bf16, true);
  const s8::TensorMapShape k = s8::tensor_map_shape(p.k, p.seqlen_k, p.heads_kv, p.batch, p.head_dim, 96);
  CHECK(k.dims[0] == 72);
  CHECK(k.dims[1] == 100);
  CHECK(k.dims[2] == 4);
  CHECK(k.dims[3] == 3);
  CHECK(k.strides[0] == 4 * 72 * 2);        // row: heads · head_dim elements
  CHECK(k.strides[1] == 72 * 2);            // head: head_dim elements
  CHECK(k.strides[2] == 100 * 4 * 72 * 2);  // batch
  CHECK(k.box[0] == 64);
  CHECK(k.box[1] == 96);
  CHECK(k.box[2] == 1);
  CHECK(k.box[3] == 1);
  // Extent-1 dimensions get the packed stride, whatever the caller passed.
  fs::Strides odd{0, 1 << 30, 0, 1};  // batch 1, seqlen 1, heads 1: no stride is ever used
  const s8::TensorMapShape one = s8::tensor_map_shape(odd, 1, 1, 1, 64, 128);
  CHECK(one.strides[0] == 128);
  CHECK(one.strides[1] == 128);
  CHECK(one.strides[2] == 128);
  // Every problem the harness and the step's limits accept gives strides the driver takes:
  // multiples of 16 bytes, below 2^40, and dims in [1, 2^32].
  std::mt19937 rng(8);
  int checked = 0;
  for (int i = 0; i < 2000; ++i) {
    fs::Problem q = fs::make_problem(1 + rng() % 4, 1 + rng() % 300, 1 + rng() % 300, 8, 2, 8 * (1 + rng() % 32),
                                     fs::DType::fp16, rng() % 2);
    q.k.row = q.head_dim + 8 * int64_t(rng() % 40);
    q.k.head = 8 * int64_t(rng() % 100);
    q.k.batch = int64_t(8) * (rng() % 3 == 0 ? 0 : int64_t(rng()));
    const fs::Step* step = fs::find_step("08_tma_wgmma");
    REQUIRE(step != nullptr);
    if (!fs::static_refusal(*step, q).empty()) continue;
    ++checked;
    const s8::TensorMapShape m = s8::tensor_map_shape(q.k, q.seqlen_k, q.heads_kv, q.batch, q.head_dim, 128);
    for (uint64_t s : m.strides) {
      CHECK(s % 16 == 0);
      CHECK(s < (uint64_t(1) << 40));
    }
    for (uint64_t d : m.dims) CHECK((d >= 1 && d <= (uint64_t(1) << 32)));
  }
  CHECK(checked > 500);
}

// ---- mbarrier phases of the K/V ring -------------------------------------------------------------
// The PTX ISA's mbarrier, as far as the ring uses it: a phase completes when its pending arrivals
// and its tx-count are both zero; the barrier then moves to the next phase with the expected
// arrival count restored. try_wait.parity is only valid for the current (incomplete) phase, where it
// returns false, and the one just before it, where it returns true.
struct Mbarrier {
  int phase = 0;    // the current, incomplete phase
  int pending = 1;  // init count 1: the producer's arrive.expect_tx
  int64_t tx = 0;
  void complete_if_done() {
    if (pending == 0 && tx == 0) {
      ++phase;
      pending = 1;
    }
  }
  void arrive_expect_tx(int64_t bytes) {
    tx += bytes;
    --pending;
    complete_if_done();
  }
  void complete_tx(int64_t bytes) {
    tx -= bytes;
    complete_if_done();
  }
  // The wait of a consumer that wants the completion of phase `want` (it knows which fill it needs);
  // fails the test if the parity would be ambiguous.
  bool try_wait_parity(uint32_t parity, int want) {
    REQUIRE((want == phase || want == phase - 1));
    REQUIRE(uint32_t(want & 1) == parity);
    return uint32_t(phase & 1) != parity;
  }
};

// The kernel's K/V schedule run by 2 warpgroups, thread 0 (in warpgroup 0) and a copy engine that
// completes copies in random order after random delays, under a random interleaving. Checks that
// every wait returns true exactly when the tile it wants has landed, that no copy overwrites a
// stage someone may still read, and that the run ends.
void simulate_ring(int stages, int count, uint32_t seed) {
  CAPTURE(stages, count, seed);
  std::mt19937 rng(seed);
  const int64_t kBytes = 32768;
  std::vector<Mbarrier> k_full(static_cast<size_t>(stages)), v_full(static_cast<size_t>(stages));
  std::vector<int> k_data(static_cast<size_t>(stages), -1), v_data(static_cast<size_t>(stages), -1);  // visit in a stage
  std::vector<int> readers_done(static_cast<size_t>(count), 0);  // warpgroups done with visit v
  struct Copy {
    bool is_k;
    int stage, visit;
  };
  std::vector<Copy> in_flight;
  auto issue = [&](int visit) {  // thread 0's load_kv(visit)
    const int s = s8::kv_stage(visit, stages);
    if (visit >= stages) REQUIRE(readers_done[size_t(visit - stages)] == 2);  // the stage's old tile is read
    k_full[size_t(s)].arrive_expect_tx(kBytes);
    in_flight.push_back({true, s, visit});
    v_full[size_t(s)].arrive_expect_tx(kBytes);
    in_flight.push_back({false, s, visit});
  };
  for (int v = 0; v < s8::prologue_fills(count, stages); ++v) issue(v);

  // Per warpgroup: the visit and the step inside it (0 wait K, 1 wait V, 2 at the block barrier).
  int visit[2] = {0, 0}, step[2] = {0, 0}, at_barrier = 0;
  int rounds = 0;
  while (visit[0] < count || visit[1] < count) {
    REQUIRE(++rounds < 100 * count + 1000);  // no deadlock
    // A copy lands now and then (random order, random delay).
    if (!in_flight.empty() && rng() % 3 == 0) {
      const size_t i = rng() % in_flight.size();
      const Copy c = in_flight[i];
      in_flight.erase(in_flight.begin() + long(i));
      (c.is_k ? k_data : v_data)[size_t(c.stage)] = c.visit;
      (c.is_k ? k_full : v_full)[size_t(c.stage)].complete_tx(kBytes);
      continue;
    }
    const int wg = int(rng() % 2);
    if (visit[wg] >= count) continue;
    const int v = visit[wg], s = s8::kv_stage(v, stages), fill = v / stages;
    const uint32_t parity = s8::kv_parity(v, stages);
    if (step[wg] == 0 && k_full[size_t(s)].try_wait_parity(parity, fill)) {
      REQUIRE(k_data[size_t(s)] == v);  // S = Q·Kᵀ reads the right tile
      step[wg] = 1;
    } else if (step[wg] == 1 && v_full[size_t(s)].try_wait_parity(parity, fill)) {
      REQUIRE(v_data[size_t(s)] == v);  // O += P·V reads the right tile
      ++readers_done[size_t(v)];
      step[wg] = 2;
      ++at_barrier;
    } else if (step[wg] == 2 && at_barrier == 2) {
      // __syncthreads: both warpgroups are through visit v; thread 0 refills its stage.
      at_barrier = 0;
      for (int g = 0; g < 2; ++g) {
        step[g] = 0;
        ++visit[g];
      }
      if (s8::refills_after(v, count, stages)) issue(v + stages);
    }
  }
  CHECK(in_flight.empty());
  for (int v = 0; v < count; ++v) CHECK(readers_done[size_t(v)] == 2);
}

TEST_CASE("step 08: the K/V ring's mbarrier parities are right over hundreds of tiles", "[step08]") {
  // The parity sequence of a stage alternates 0, 1, 0, … with its fills.
  for (int stages : {2, 3, 4})
    for (int t = 0; t < 50; ++t) {
      CHECK(s8::kv_stage(t, stages) == t % stages);
      CHECK(s8::kv_parity(t, stages) == uint32_t((t / stages) % 2));
    }
  for (int stages : {2, 3, 4})
    for (int count : {1, 2, 3, 5, 17, 300})
      for (uint32_t seed = 1; seed <= 8; ++seed) simulate_ring(stages, count, seed);
}

// ---- the work split and the table ----------------------------------------------------------------
TEST_CASE("step 08: K/V tile ranges and the mask match the causal rule and the end of K", "[step08]") {
  for (bool causal : {false, true})
    for (int64_t sq : {1, 63, 64, 65, 128, 129, 300})
      for (int64_t sk : {1, 63, 64, 65, 96, 129, 300})
        for (int block_kv : {64, 96, 128})
          for (int64_t q0 = 0; q0 < sq; q0 += s8::BLOCK_Q) {
            const int64_t q_rows = std::min<int64_t>(s8::BLOCK_Q, sq - q0);
            const s8::KvTiles r = s8::kv_tiles_for(q0, q_rows, block_kv, sq, sk, causal);
            CAPTURE(causal, sq, sk, block_kv, q0, r.count, r.unmasked);
            REQUIRE((0 <= r.unmasked && r.unmasked <= r.count));
            for (int64_t j = 0; j * block_kv < sk; ++j) {
              bool some = false, all = true;
              for (int64_t i = q0; i < q0 + q_rows; ++i)
                for (int64_t key = j * block_kv; key < (j + 1) * block_kv; ++key) {
                  const bool seen = key < sk && (!causal || fs::causal_allows(i, key, sq, sk));
                  some = some || seen;
                  all = all && seen;
                }
              CHECK(some == (j < r.count));
              if (j < r.unmasked) CHECK(all);
              for (int64_t i = q0; i < q0 + q_rows; ++i) {
                const int last = s8::last_visible_key(i, j * block_kv, block_kv, sq, sk, causal);
                for (int key = 0; key < block_kv; ++key) {
                  const bool seen = j * block_kv + key < sk && (!causal || fs::causal_allows(i, j * block_kv + key, sq, sk));
                  REQUIRE(seen == (key <= last));
                }
              }
            }
          }
  // The grid: every (head, query tile) once, the last query tile of a head first.
  for (uint32_t q_tiles : {1u, 3u, 8u}) {
    std::set<std::pair<uint32_t, int>> seen;
    for (uint32_t block = 0; block < 5 * q_tiles; ++block) {
      const s8::BlockTile t = s8::block_tile(block, q_tiles);
      CHECK(seen.insert({t.bh, t.q_tile}).second);
      if (block % q_tiles == 0) CHECK(uint32_t(t.q_tile) == q_tiles - 1);
    }
    CHECK(seen.size() == size_t(5 * q_tiles));
  }
}

TEST_CASE("step 08: every head_dim has a tile width, with a real column in every column block", "[step08]") {
  for (int64_t d = 8; d <= 256; d += 8) {
    const int i = s8::config_for(d);
    REQUIRE((i >= 0 && i < s8::kNumConfigs));
    const s8::Config& c = s8::kConfigs[i];
    CAPTURE(d, c.head_dim);
    CHECK(c.head_dim == s8::padded_head_dim(d));
    CHECK(c.head_dim >= d);
    CHECK(c.head_dim - 64 < d);  // so no TMA box lies wholly past head_dim
    CHECK(s8::smem_bytes(c) <= 227 * 1024);
  }
  CHECK(s8::smem_bytes(s8::kConfigs[s8::config_for(128)]) == 32768 + 4 * 32768 + 5 * 8 + 1024);
}

TEST_CASE("step 08 runs on sm_90 only and refuses, in a sentence, what the TMA or the GPU cannot do", "[step08][registry]") {
  const fs::Step* s = fs::find_step("08_tma_wgmma");
  REQUIRE(s != nullptr);
  CHECK(s->min_compute_capability == 90);
  CHECK(s->arch_specific == 90);
  const fs::Problem p = fs::make_problem(2, 1000, 1000, 8, 2, 128, fs::DType::bf16, true);
  const fs::DeviceInfo h200 = fake_device(90, 227 * 1024);
  const fs::Plan plan = fs::plan(*s, p, h200);
  REQUIRE(plan.accepted());
  CHECK(plan.config == s8::config_for(128));
  REQUIRE(plan.kernels.size() == 1);
  CHECK(plan.kernels[0].threads == 256);
  CHECK(plan.kernels[0].smem_bytes == size_t(s8::smem_bytes(s8::kConfigs[plan.config])));
  CHECK(plan.kernels[0].blocks == 8 * 2 * 8);
  CHECK(plan.kernels[0].function != nullptr);
  CHECK(s->forward.claims(p, h200));
  CHECK_FALSE(s->forward.claims(p, fake_device(80, 163 * 1024)));
  CHECK(fs::plan(*s, p, fake_device(80, 163 * 1024)).refusal ==
        "step 08_tma_wgmma needs compute capability 9.0 or newer; this GPU is 8.0");
  CHECK(fs::plan(*s, p, fake_device(100, 227 * 1024)).refusal ==
        "step 08_tma_wgmma is built for sm_90a only (architecture-specific instructions), which runs on compute "
        "capability 9.0 alone; this GPU is 10.0");
  CHECK(fs::plan(*s, p, fake_device(90, 100 * 1024)).refusal ==
        "head_dim 128 runs on 128-wide tiles, which need 164904 bytes of shared memory per block; this GPU allows "
        "102400");
  // A batch stride of 2^39 elements is 2^40 bytes: past what a tensor map can hold.
  fs::Problem far = p;
  far.k.batch = int64_t(1) << 39;
  CHECK(fs::plan(*s, far, h200).refusal ==
        "K's batch stride is 549755813888 elements (1099511627776 bytes); the TMA addresses strides below 2^40 bytes");
  CHECK_FALSE(s->forward.claims(far, h200));
  // ... unless the dimension has one entry, so the stride is never used.
  far.batch = 1;
  CHECK(fs::plan(*s, far, h200).accepted());
  // 2^31 query tiles of 128 rows: one 1-D grid cannot hold them.
  fs::Problem big = fs::make_problem(1 << 17, 128 * 1024, 1, 16, 16, 64, fs::DType::fp16, false);
  CHECK(fs::plan(*s, big, h200).refusal ==
        "this step launches one block per 128 query rows per batch and head, 2147483648 blocks here, more than "
        "the grid limit of 2147483647");
  CHECK_FALSE(s->forward.claims(big, h200));
}

TEST_CASE("step 08 explains its maps without a GPU", "[step08]") {
  const fs::Step* s = fs::find_step("08_tma_wgmma");
  REQUIRE(s != nullptr);
  REQUIRE(s->explain);
  std::ostringstream out;
  s->explain(out);
  const std::string text = out.str();
  CHECK(text.find("row 1: 1 0 3 2 5 4 7 6") != std::string::npos);  // the ISA's swizzle table
  CHECK(text.find("0x4000004000010000") != std::string::npos);      // Q's first descriptor: start 0
  CHECK(text.find("d2 (8,0)") != std::string::npos);
}

}  // namespace
