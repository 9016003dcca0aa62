// Step 06's fragment maps (steps/06_ldmatrix_mma/traits.h) against the PTX ISA, and step 06's ldmatrix
// addresses simulated on the CPU over swizzled shared-memory tiles.
//
// The PTX ISA's tables (tests/ptx_isa.h) are written in the ISA's own terms (element index a_i / b_i
// / c_i, groupID, threadID_in_group; for ldmatrix, which lane receives each element of the stored
// matrix), independently of the header's (lane, register, half) functions.
#include <algorithm>
#include <array>
#include <set>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/model/bank_model.h"
#include "ptx_isa.h"
#include "steps/03_smem_tiling/traits.h"
#include "steps/04_bank_conflicts/traits.h"
#include "steps/06_ldmatrix_mma/traits.h"

namespace {

namespace frag = fs::step06::frag;
using frag::Coord;
using fs::ptx_isa::kLanes;
using fs::ptx_isa::LaneHalf;
using fs::ptx_isa::ldmatrix_wavefronts;
using fs::ptx_isa::Regs;

// The ISA's tables as step 06's Coord.
Coord isa_a(int lane, int i) {
  const fs::ptx_isa::Element e = fs::ptx_isa::mma_a(lane, i);
  return {e.row, e.col};
}
Coord isa_b(int lane, int i) {
  const fs::ptx_isa::Element e = fs::ptx_isa::mma_b(lane, i);
  return {e.row, e.col};
}
Coord isa_c(int lane, int i) {
  const fs::ptx_isa::Element e = fs::ptx_isa::mma_c(lane, i);
  return {e.row, e.col};
}
LaneHalf isa_ldmatrix_receiver(int row, int col, bool trans) { return fs::ptx_isa::ldmatrix_receiver(row, col, trans); }
Regs ldmatrix_cpu(const std::vector<int>& smem, const std::array<int, kLanes>& address, int num_matrices, bool trans) {
  return fs::ptx_isa::ldmatrix(smem, address, num_matrices, trans);
}

// A [rows, cols] tile stored with `Layout`; the element at logical (r, c) holds code(r, c).
int code(int r, int c) { return r * 1000 + c; }
template <class Layout>
std::vector<int> make_tile(int rows) {
  std::vector<int> smem(size_t(Layout::size(rows)), -1);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < Layout::kCols; ++c) smem[size_t(Layout::offset(r, c))] = code(r, c);
  return smem;
}

// Step 06's lane addresses, written exactly as the kernel writes them
// (steps/06_ldmatrix_mma/kernel.cuh): Layout::offset(tile origin + the frag:: map of the lane).
template <class Layout>
std::array<int, kLanes> q_addresses(int warp_row0, int ks) {
  std::array<int, kLanes> a{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const Coord c = frag::ldmatrix_x4_a(lane);
    a[size_t(lane)] = Layout::offset(warp_row0 + c.row, ks * 16 + c.col);
  }
  return a;
}
template <class Layout>
std::array<int, kLanes> k_addresses(int nt, int ks) {
  std::array<int, kLanes> a{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const Coord c = frag::ldmatrix_x2_b(lane);
    a[size_t(lane)] = Layout::offset(nt * 8 + c.row, ks * 16 + c.col);
  }
  return a;
}
template <class Layout>
std::array<int, kLanes> v_addresses(int kk, int np) {
  std::array<int, kLanes> a{};
  for (int lane = 0; lane < kLanes; ++lane) {
    const Coord c = frag::ldmatrix_x4_trans_b(lane);
    a[size_t(lane)] = Layout::offset(kk * 16 + c.row, np * 16 + c.col);
  }
  return a;
}

// Step 06's tiles: 4 warps × 16 query rows, 64 keys per K/V tile.
constexpr int kBlockQ = 64, kBlockKV = 64;

template <int HEAD_DIM>
void check_step06_loads() {
  using Layout = fs::step06::Swizzled128Layout<HEAD_DIM>;
  CAPTURE(HEAD_DIM);

  // Q: ldmatrix.x4 per (warp, k16 step) must give the A fragment of rows 16w…16w+15, dims 16ks….
  const std::vector<int> q_smem = make_tile<Layout>(kBlockQ);
  for (int w = 0; w < kBlockQ / 16; ++w)
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
      const Regs r = ldmatrix_cpu(q_smem, q_addresses<Layout>(16 * w, ks), 4, false);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 8; ++i) {
          const Coord e = isa_a(lane, i);
          INFO("Q warp " << w << " ks " << ks << " lane " << lane << " a" << i);
          CHECK(r[size_t(lane)][size_t(i / 2)][size_t(i % 2)] == code(16 * w + e.row, 16 * ks + e.col));
        }
    }

  // K: ldmatrix.x2 per (n8 tile of keys, k16 step) must give B = Kᵀ: B(k, n) = K[8nt + n][16ks + k].
  const std::vector<int> k_smem = make_tile<Layout>(kBlockKV);
  for (int nt = 0; nt < kBlockKV / 8; ++nt)
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
      const Regs r = ldmatrix_cpu(k_smem, k_addresses<Layout>(nt, ks), 2, false);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int i = 0; i < 4; ++i) {
          const Coord e = isa_b(lane, i);  // (k, n)
          INFO("K nt " << nt << " ks " << ks << " lane " << lane << " b" << i);
          CHECK(r[size_t(lane)][size_t(i / 2)][size_t(i % 2)] == code(8 * nt + e.col, 16 * ks + e.row));
        }
    }

  // V: ldmatrix.x4.trans per (k16 step of keys, pair of n8 tiles of dims) must give B = V for the
  // n8 tiles 2np (registers 0, 1) and 2np+1 (registers 2, 3): B(k, n) = V[16kk + k][8·tile + n].
  const std::vector<int> v_smem = make_tile<Layout>(kBlockKV);
  for (int kk = 0; kk < kBlockKV / 16; ++kk)
    for (int np = 0; np < HEAD_DIM / 16; ++np) {
      const Regs r = ldmatrix_cpu(v_smem, v_addresses<Layout>(kk, np), 4, true);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int tile = 0; tile < 2; ++tile)
          for (int i = 0; i < 4; ++i) {
            const Coord e = isa_b(lane, i);
            INFO("V kk " << kk << " np " << np << " lane " << lane << " tile " << tile << " b" << i);
            CHECK(r[size_t(lane)][size_t(2 * tile + i / 2)][size_t(i % 2)] ==
                  code(16 * kk + e.row, 8 * (2 * np + tile) + e.col));
          }
    }
}

template <class Layout, int HEAD_DIM>
int worst_step06_wavefronts() {
  int worst = 0;
  for (int w = 0; w < kBlockQ / 16; ++w)
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) worst = std::max(worst, ldmatrix_wavefronts(q_addresses<Layout>(16 * w, ks), 4));
  for (int nt = 0; nt < kBlockKV / 8; ++nt)
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) worst = std::max(worst, ldmatrix_wavefronts(k_addresses<Layout>(nt, ks), 2));
  for (int kk = 0; kk < kBlockKV / 16; ++kk)
    for (int np = 0; np < HEAD_DIM / 16; ++np) worst = std::max(worst, ldmatrix_wavefronts(v_addresses<Layout>(kk, np), 4));
  return worst;
}

}  // namespace

TEST_CASE("fragment layout: mma.m16n8k16 A, B and C/D match the PTX ISA", "[fragment]") {
  for (int lane = 0; lane < kLanes; ++lane) {
    CAPTURE(lane);
    for (int i = 0; i < 8; ++i) CHECK(frag::mma_a(lane, i / 2, i % 2) == isa_a(lane, i));
    for (int i = 0; i < 4; ++i) CHECK(frag::mma_b(lane, i / 2, i % 2) == isa_b(lane, i));
    for (int i = 0; i < 4; ++i) CHECK(frag::mma_c(lane, i) == isa_c(lane, i));
  }
  // A few cells read off the ISA's figures by hand.
  CHECK(frag::mma_a(0, 0, 0) == Coord{0, 0});
  CHECK(frag::mma_a(5, 3, 0) == Coord{9, 10});   // T5: a6 is row 9, column 10
  CHECK(frag::mma_a(31, 3, 1) == Coord{15, 15});
  CHECK(frag::mma_b(6, 1, 1) == Coord{13, 1});   // T6: b3 is row 13, column 1
  CHECK(frag::mma_c(30, 3) == Coord{15, 5});     // T30: c3 is row 15, column 5
}

TEST_CASE("fragment layout: every element is held exactly once", "[fragment]") {
  std::set<std::pair<int, int>> a, b, c;
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Coord e = frag::mma_a(lane, reg, half);
        CHECK((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 16));
        a.insert({e.row, e.col});
      }
    for (int reg = 0; reg < 2; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Coord e = frag::mma_b(lane, reg, half);
        CHECK((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 8));
        b.insert({e.row, e.col});
      }
    for (int i = 0; i < 4; ++i) {
      const Coord e = frag::mma_c(lane, i);
      CHECK((e.row >= 0 && e.row < 16 && e.col >= 0 && e.col < 8));
      c.insert({e.row, e.col});
    }
  }
  // 256 = 32 lanes × 8 elements over 16×16, 128 = 32 × 4 over 16×8: a full cover without repeats.
  CHECK(a.size() == 256);
  CHECK(b.size() == 128);
  CHECK(c.size() == 128);

  for (bool trans : {false, true}) {
    CAPTURE(trans);
    std::set<std::pair<int, int>> m;
    for (int lane = 0; lane < kLanes; ++lane)
      for (int half = 0; half < 2; ++half) {
        const Coord e = frag::ldmatrix_element(lane, half, trans);
        CHECK((e.row >= 0 && e.row < 8 && e.col >= 0 && e.col < 8));
        m.insert({e.row, e.col});
      }
    CHECK(m.size() == 64);
  }
}

TEST_CASE("fragment layout: ldmatrix x1/x2/x4 with and without .trans match the PTX ISA", "[fragment]") {
  for (bool trans : {false, true})
    for (int row = 0; row < 8; ++row)
      for (int col = 0; col < 8; ++col) {
        const LaneHalf to = isa_ldmatrix_receiver(row, col, trans);
        CAPTURE(trans, row, col);
        CHECK(frag::ldmatrix_element(to.lane, to.half, trans) == Coord{row, col});
      }
  // Address lanes: .x1 uses lanes 0-7, .x2 0-15, .x4 all 32; lane 8m + r is row r of matrix m.
  CHECK(frag::ldmatrix_address_lanes(1) == 8);
  CHECK(frag::ldmatrix_address_lanes(2) == 16);
  CHECK(frag::ldmatrix_address_lanes(4) == 32);
  for (int lane = 0; lane < kLanes; ++lane) {
    CHECK(frag::ldmatrix_address_lane(frag::ldmatrix_matrix_of(lane), frag::ldmatrix_row_of(lane)) == lane);
  }

  // Simulated on a plain 8×8 .. 32×8 row-major buffer: x1, x2 and x4, both directions. Matrix m
  // occupies rows 8m … 8m+7; register m of lane l must hold frag::ldmatrix_element(l, half) of it.
  using Plain = fs::step03::RowMajorLayout<8>;
  const std::vector<int> smem = make_tile<Plain>(32);
  for (int num : {1, 2, 4})
    for (bool trans : {false, true}) {
      std::array<int, kLanes> address{};
      for (int lane = 0; lane < kLanes; ++lane)
        address[size_t(lane)] = lane < frag::ldmatrix_address_lanes(num) ? Plain::offset(lane, 0) : 0;
      const Regs r = ldmatrix_cpu(smem, address, num, trans);
      for (int lane = 0; lane < kLanes; ++lane)
        for (int m = 0; m < num; ++m)
          for (int half = 0; half < 2; ++half) {
            const Coord e = frag::ldmatrix_element(lane, half, trans);
            CAPTURE(num, trans, lane, m, half);
            CHECK(r[size_t(lane)][size_t(m)][size_t(half)] == code(8 * m + e.row, e.col));
          }
    }
}

TEST_CASE("fragment layout: S accumulators are P's A fragment, register for register", "[fragment]") {
  // C elements i, i+1 of n8 tile n_half (columns 8·n_half … of the k16 step) = A register
  // mma_a_reg_of_c(n_half, i), halves 0 and 1.
  for (int lane = 0; lane < kLanes; ++lane)
    for (int n_half = 0; n_half < 2; ++n_half)
      for (int i = 0; i < 4; i += 2) {
        CAPTURE(lane, n_half, i);
        const int reg = frag::mma_a_reg_of_c(n_half, i);
        for (int half = 0; half < 2; ++half) {
          const Coord c = isa_c(lane, i + half);
          CHECK(frag::mma_a(lane, reg, half) == Coord{c.row, c.col + 8 * n_half});
        }
      }
}

TEST_CASE("fragment layout: step 06's operand address maps point at 16-byte rows inside the tile", "[fragment]") {
  for (int lane = 0; lane < kLanes; ++lane) {
    CAPTURE(lane);
    for (Coord c : {frag::ldmatrix_x4_a(lane), frag::ldmatrix_x4_trans_b(lane)}) {
      CHECK((c.row >= 0 && c.row < 16 && (c.col == 0 || c.col == 8)));
    }
    const Coord k = frag::ldmatrix_x2_b(lane);
    CHECK((k.row >= 0 && k.row < 8 && (k.col == 0 || k.col == 8)));
  }
}

TEST_CASE("fragment layout: step 06's ldmatrix addresses load the intended elements from swizzled tiles", "[fragment]") {
  check_step06_loads<64>();
  check_step06_loads<128>();
}

TEST_CASE("bank model: step 06's ldmatrix phases are conflict-free swizzled, 8-way row-major", "[fragment][bank]") {
  // Worst phase over every ldmatrix step 06 issues: 1 wavefront = no conflict.
  CHECK(worst_step06_wavefronts<fs::step06::Swizzled128Layout<64>, 64>() == 1);
  CHECK(worst_step06_wavefronts<fs::step06::Swizzled128Layout<128>, 128>() == 1);
  // Rows of 128 or 256 bytes all start in bank 0: the 8 rows of a phase hit the same 4 banks.
  CHECK(worst_step06_wavefronts<fs::step03::RowMajorLayout<64>, 64>() == 8);
  CHECK(worst_step06_wavefronts<fs::step03::RowMajorLayout<128>, 128>() == 8);
  // 16 bytes of padding per row also spreads the 8 rows over all 32 banks (at 16 bytes more per row).
  CHECK(worst_step06_wavefronts<fs::step04::PaddedLayout<64, 8>, 64>() == 1);
  CHECK(worst_step06_wavefronts<fs::step04::PaddedLayout<128, 8>, 128>() == 1);
}
