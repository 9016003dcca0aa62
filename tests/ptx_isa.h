// The PTX ISA's fragment tables and ldmatrix, written out for the CPU tests of the mma.sync steps
// (test_fragment_layout.cpp, test_step11_backward.cpp) and the Hopper steps (08, 12), independently
// of any step's traits.h.
//
// Everything is in the ISA's own terms: element index a_i / b_i / c_i, groupID, threadID_in_group;
// for ldmatrix, which lane receives each element of a stored 8×8 matrix. A step's (lane, register,
// half) maps are checked against these, never against themselves.
#pragma once

#include <algorithm>
#include <cstdint>
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

// ---- Hopper: the 128-byte swizzle, the TMA's boxes, wgmma's canonical shared-memory layouts -------
// (test_step08_tma_wgmma.cpp, test_step12_hopper_backward.cpp)
// ---- the PTX ISA's 128-byte swizzle table: the 16-byte chunk found at each position of the 8 rows
// of a 1024-byte-aligned block ("Swizzling Modes", 128 byte swizzle mode).
inline constexpr int kIsaSwizzle128[8][8] = {
    {0, 1, 2, 3, 4, 5, 6, 7}, {1, 0, 3, 2, 5, 4, 7, 6}, {2, 3, 0, 1, 6, 7, 4, 5}, {3, 2, 1, 0, 7, 6, 5, 4},
    {4, 5, 6, 7, 0, 1, 2, 3}, {5, 4, 7, 6, 1, 0, 3, 2}, {6, 7, 4, 5, 2, 3, 0, 1}, {7, 6, 5, 4, 3, 2, 1, 0},
};
// Where the 128-byte swizzle puts the byte at unswizzled shared address `a`, by the table: the row of
// the block is bits 7-9, the chunk bits 4-6; the chunk moves to the position that holds it.
inline uint32_t isa_swizzled_address(uint32_t a) {
  const int row = int(a >> 7) & 7, chunk = int(a >> 4) & 7;
  int pos = -1;
  for (int p = 0; p < 8; ++p)
    if (kIsaSwizzle128[row][p] == chunk) pos = p;
  return (a & ~0x70u) | uint32_t(pos) << 4;
}

// What the TMA writes for box cb (columns 64·cb …) of a tile of `rows` rows at shared address
// `tile`: element (r, c) of the box (row-major, 128-byte rows) at the swizzled address.
inline uint32_t isa_tma_address(uint32_t tile, int rows, int cb, int r, int c) {
  return isa_swizzled_address(tile + uint32_t(cb * rows * 128 + r * 128 + c * 2));
}

// The address wgmma forms for element (i, k) of a K-major operand (i = row of A or column of B,
// k = the reduction index 0-15) from a descriptor with start address `start`, by the ISA's canonical
// K-major layout with 128-byte swizzle, Swizzle<3,4,3> ∘ ((8,m),(T,2k)):((8T,SBO),(1,T)), T = 8
// elements: rows 8T = 64 elements apart inside a group of 8, groups SBO bytes apart, k contiguous;
// then the swizzle of the address.
inline uint32_t isa_k_major_address(uint32_t start, uint32_t sbo, int i, int k) {
  const uint32_t elements = uint32_t(i % 8) * 64 + uint32_t(k);
  return isa_swizzled_address(start + elements * 2 + uint32_t(i / 8) * sbo);
}
// The same for an MN-major operand: element (k, n), k the reduction index (a key of V), n the N
// index (a head dim), by Swizzle<3,4,3> ∘ ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): n contiguous for
// 64 elements, then LBO bytes to the next 64; k rows 8T = 64 elements apart, 8-row groups SBO apart.
inline uint32_t isa_mn_major_address(uint32_t start, uint32_t lbo, uint32_t sbo, int k, int n) {
  const uint32_t elements = uint32_t(n % 64) + uint32_t(k % 8) * 64;
  return isa_swizzled_address(start + elements * 2 + uint32_t(n / 64) * lbo + uint32_t(k / 8) * sbo);
}

}  // namespace fs::ptx_isa
