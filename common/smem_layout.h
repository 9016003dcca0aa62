// Shared-memory layouts of a tile of 2-byte elements (fp16 / bf16), as functions
// (row, col) -> element offset. The kernels use these very functions, and the CPU tests (bank-
// conflict model, bijection checks) call them too, so what is tested is what runs.
//
// Shared memory has 32 banks of 4 bytes; a warp's request is served in one wavefront per 128 bytes
// when no two threads touch different words of the same bank (common/bank_model.h counts them).
#pragma once

#include "problem.h"  // FS_HD

namespace fs {

// Plain row-major: row r starts at r * COLS. Rows of 64 or 128 elements (128 or 256 bytes) all
// start in bank 0, which is what makes column-wise access conflict.
template <int COLS>
struct RowMajorLayout {
  static constexpr int kCols = COLS;
  static constexpr int kRowStride = COLS;  // elements
  FS_HD static constexpr int offset(int row, int col) { return row * kRowStride + col; }
  FS_HD static constexpr int size(int rows) { return rows * kRowStride; }
};

// Row-major with PAD extra elements per row: consecutive rows start PAD*2 bytes further along the
// banks. Costs PAD elements per row of shared memory.
template <int COLS, int PAD>
struct PaddedLayout {
  static constexpr int kCols = COLS;
  static constexpr int kRowStride = COLS + PAD;
  FS_HD static constexpr int offset(int row, int col) { return row * kRowStride + col; }
  FS_HD static constexpr int size(int rows) { return rows * kRowStride; }
};

// XOR swizzle on 16-byte chunks (8 elements): within each group of 8 chunks (128 bytes) of a row,
// chunk c is stored at chunk c ^ (row % 8). Eight consecutive rows then put the same logical chunk
// in eight different 16-byte bank groups, so an ldmatrix (8 rows × 16 bytes) or a 16-byte store
// per thread is conflict-free, with no extra memory. Needs COLS to be a multiple of 64.
template <int COLS>
struct Swizzled128Layout {
  static_assert(COLS % 64 == 0, "the 128-byte XOR swizzle needs rows of a multiple of 64 elements");
  static constexpr int kCols = COLS;
  static constexpr int kRowStride = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ (row % 8)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
};

// The same XOR idea for rows of an odd multiple of 32 elements (64, 192, ... bytes: head_dim 32 and
// 96), where chunk ^ (row % 8) would leave the row. Such rows start alternately at bank group 0 and
// 4 (a row is an odd number of 64-byte halves), so XOR-ing the chunk inside its aligned group of 4
// chunks (64 bytes) with (row / 2) % 4 is enough: eight consecutive rows, starting at a multiple of
// 8, then put the same logical chunk in eight different 16-byte bank groups.
template <int COLS>
struct Swizzled64Layout {
  static_assert(COLS % 32 == 0 && (COLS / 32) % 2 == 1,
                "the 64-byte XOR swizzle is for rows of an odd multiple of 32 elements");
  static constexpr int kCols = COLS;
  static constexpr int kRowStride = COLS;
  FS_HD static constexpr int offset(int row, int col) {
    const int chunk = col / 8;
    return row * COLS + ((chunk ^ ((row / 2) % 4)) * 8) + col % 8;
  }
  FS_HD static constexpr int size(int rows) { return rows * COLS; }
};

// Row-major with 8 elements (16 bytes) of padding per row: row r starts 16·r bytes further along
// the banks, so the same 16-byte chunk of 8 consecutive rows lands in 8 different groups of 4 banks
// (step 04_pad). One template parameter, like RowMajorLayout and Swizzled128Layout, so that a
// kernel can take any of the three as `template <int> class TileLayout`.
template <int COLS>
using Padded16Layout = PaddedLayout<COLS, 8>;

}  // namespace fs
