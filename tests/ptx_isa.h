// The PTX ISA's fragment tables and ldmatrix, written out for the CPU tests of the mma.sync steps
// (test_fragment_layout.cpp, test_step11_backward.cpp), independently of any step's traits.h.
//
// Everything is in the ISA's own terms: element index a_i / b_i / c_i, groupID, threadID_in_group;
// for ldmatrix, which lane receives each element of a stored 8×8 matrix. A step's (lane, register,
// half) maps are checked against these, never against themselves.
#pragma once

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/model/bank_model.h"

namespace fs::ptx_isa {

inline constexpr int kLanes = 32;

// (row, col) of an element of a fragment's matrix.
struct Element {
  int row;
  int col;
};

// ---- "Matrix Fragments for mma.m16n8k16 with floating point type" --------------------------------
// groupID = laneid >> 2, threadID_in_group = laneid % 4.
// A (.f16/.bf16, 16×16): elements a0..a7, two per .f16x2 register (a0, a1 in the first).
inline Element mma_a(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
  const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
  return {row, col};
}
// B (16×8, k × n): elements b0..b3.
inline Element mma_b(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  const int row = i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
  return {row, group};
}
// C/D (.f32, 16×8): elements c0..c3.
inline Element mma_c(int lane, int i) {
  const int group = lane >> 2, tig = lane % 4;
  return {i < 2 ? group : group + 8, tig * 2 + (i & 1)};
}

// ---- ldmatrix: who receives element (row, col) of a stored 8×8 matrix -----------------------------
// Without .trans, the four lanes 4·row … 4·row+3 share row `row`, two consecutive elements each;
// with .trans the matrix is transposed first, so the same holds with row and col exchanged.
struct LaneHalf {
  int lane, half;
};
inline LaneHalf ldmatrix_receiver(int row, int col, bool trans) {
  if (trans) std::swap(row, col);
  return {4 * row + col / 2, col % 2};
}

// ---- a CPU ldmatrix ------------------------------------------------------------------------------
// `smem` holds 16-bit elements (here: codes), `address[l]` is the element offset of the 16-byte row
// that lane l supplies: lane 8m + r gives row r of matrix m (.x1 uses lanes 0-7, .x2 0-15, .x4 all).
// Returns value[lane][matrix][half].
using Regs = std::array<std::array<std::array<int, 2>, 4>, kLanes>;
inline Regs ldmatrix(const std::vector<int>& smem, const std::array<int, kLanes>& address, int num_matrices,
                     bool trans) {
  Regs out{};
  for (int m = 0; m < num_matrices; ++m)
    for (int row = 0; row < 8; ++row) {
      const int a = address[size_t(8 * m + row)];
      REQUIRE(a % 8 == 0);  // 16-byte aligned
      REQUIRE(a >= 0);
      REQUIRE(a + 8 <= int(smem.size()));
      for (int col = 0; col < 8; ++col) {
        const LaneHalf to = ldmatrix_receiver(row, col, trans);
        out[size_t(to.lane)][size_t(m)][size_t(to.half)] = smem[size_t(a + col)];
      }
    }
  return out;
}

// An ldmatrix as the bank model (common/model/bank_model.h) sees it: each address lane reads one 16-byte
// row, and the 8 rows of one 8×8 matrix (lanes 8m … 8m+7) are served together, like the 8 lanes of
// a phase of any 16-byte access. So ldmatrix.xN is a 16-byte access by lanes 0 … 8N-1, one phase
// per matrix; `address` holds element offsets of 2-byte elements from shared byte 0.
inline fs::bank::WarpAccess ldmatrix_access(const std::array<int, kLanes>& address, int num_matrices) {
  fs::bank::WarpAccess a{};
  a.width = 16;
  a.active = num_matrices == 4 ? 0xffffffffu : (1u << (8 * num_matrices)) - 1u;
  for (int l = 0; l < kLanes; ++l) a.addr[l] = uint32_t(address[size_t(l)] * 2);
  return a;
}

// Worst, over the phases of one ldmatrix, of the wavefronts a phase takes (1: conflict-free).
inline int ldmatrix_wavefronts(const std::array<int, kLanes>& address, int num_matrices) {
  const fs::bank::WarpAccess a = ldmatrix_access(address, num_matrices);
  int worst = 0;
  for (int m = 0; m < num_matrices; ++m) worst = std::max(worst, fs::bank::phase_wavefronts(a, m));
  REQUIRE(fs::bank::wavefronts(a) >= fs::bank::ideal_wavefronts(a));
  return worst;
}

}  // namespace fs::ptx_isa
