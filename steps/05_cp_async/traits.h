// Step 05 — how the kernel (kernel.cuh) splits its work among threads, which thread reads which
// shared-memory element, and how a tile is laid out in shared memory: step 04's traits with the
// swizzled layout only (this step extends 04_swizzle) and room for two K/V buffers.
//
// The kernel computes every shared-memory address from these functions, and the bank-conflict
// model (common/model/bank_model.h through common/model/bank_report.h: `flash-steps banks`,
// tests/test_bank_model.cpp) replays the very same functions, so the conflicts it predicts are
// those of the code that runs.
#pragma once

#include "common/step/hd.h"

namespace fs::step05 {

// Compile-time choices of this step. Everything else is derived from them.
template <int HEAD_DIM_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_Q = 64;       // query rows per block (Q tile)
  static constexpr int BLOCK_KV = 64;      // keys per K/V tile
  static constexpr int NUM_THREADS = 256;  // 8 warps
  static constexpr int NUM_WARPS = NUM_THREADS / 32;
  static constexpr int CHUNK = 8;          // elements per 16-byte shared/global access

  // The block's threads form a 16 × 16 grid: 16 row groups × 16 key groups. The 16 threads of a
  // row group are one half-warp and share their query rows, so row max and row sum are reduced
  // with shuffles inside the half-warp.
  static constexpr int GROUP = 16;
  static constexpr int ROW_GROUPS = NUM_THREADS / GROUP;    // 16
  static constexpr int THREAD_ROWS = BLOCK_Q / ROW_GROUPS;  // 4: rows of S and of O per thread
  static constexpr int THREAD_KEYS = BLOCK_KV / GROUP;      // 4: keys (columns of S) per thread
  static constexpr int THREAD_COLS = HEAD_DIM / GROUP;      // 8 (d = 128) or 4 (d = 64): columns of O
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / CHUNK;
  static constexpr int LOADS_PER_THREAD = BLOCK_KV * CHUNKS_PER_ROW / NUM_THREADS;  // 16-byte copies per tile

  static_assert(HEAD_DIM % (GROUP * 4) == 0, "each thread's O columns must be one 8- or 16-byte access");
  static_assert(THREAD_COLS == 4 || THREAD_COLS == 8, "V is read with one 8- or 16-byte access per key");
  static_assert(BLOCK_Q % ROW_GROUPS == 0 && BLOCK_KV % GROUP == 0, "the thread grid must tile S exactly");
  static_assert(BLOCK_Q == BLOCK_KV, "Q, K and V tiles are copied by the same loop");
  static_assert((BLOCK_KV * CHUNKS_PER_ROW) % NUM_THREADS == 0, "every thread copies the same number of chunks");

  // Query rows of thread t (0..255): q_row(t, 0..3) = t/16, t/16 + 16, t/16 + 32, t/16 + 48.
  // All 8 lanes of a quarter-warp share them, so a read of Q is a broadcast.
  FS_HD static constexpr int q_row(int t, int i) { return t / GROUP + ROW_GROUPS * i; }

  // Keys (rows of K, columns of S) of thread t: key(t, 0..3) = t%16, t%16 + 16, t%16 + 32, t%16 + 48.
  // A quarter-warp therefore reads 8 consecutive K rows at the same column: the access whose bank
  // conflicts the swizzled layout below removes.
  FS_HD static constexpr int key(int t, int j) { return t % GROUP + GROUP * j; }

  // First of the THREAD_COLS consecutive O columns of thread t; a quarter-warp (d = 128) or a
  // half-warp (d = 64) reads 128 consecutive bytes of a V row.
  FS_HD static constexpr int o_col(int t) { return t % GROUP * THREAD_COLS; }

  // Cooperative tile copy: in round `it` thread t copies the 16-byte chunk that starts at element
  // (load_row, load_col). Consecutive threads take consecutive chunks of a row, so a warp's global
  // reads are contiguous 256- or 128-byte rows.
  FS_HD static constexpr int load_row(int t, int it) { return (t + it * NUM_THREADS) / CHUNKS_PER_ROW; }
  FS_HD static constexpr int load_col(int t, int it) { return (t + it * NUM_THREADS) % CHUNKS_PER_ROW * CHUNK; }

  // Shared memory of the Q tile and of two buffers each for K and V under `Layout`, for elements of
  // `elem_bytes` bytes.
  template <class Layout>
  FS_HD static constexpr int smem_bytes(int elem_bytes) {
    return (Layout::size(BLOCK_Q) + 4 * Layout::size(BLOCK_KV)) * elem_bytes;
  }
};

// The layout of a Q, K or V tile of 2-byte elements (fp16 / bf16) in shared memory, as a function
// (row, col) -> element offset. Shared memory has 32 banks of 4 bytes; a warp's request is served
// in one wavefront per 128 bytes when no two threads touch different words of the same bank
// (common/model/bank_model.h counts them).
//
// 04_swizzle: XOR swizzle on 16-byte chunks (8 elements): within each group of 8 chunks (128 bytes)
// of a row, chunk c is stored at chunk c ^ (row % 8). Eight consecutive rows then put the same
// logical chunk in eight different 16-byte bank groups, so a 16-byte access per thread down a
// column (or an ldmatrix: 8 rows × 16 bytes) is conflict-free, with no extra memory. Needs COLS to
// be a multiple of 64.
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

}  // namespace fs::step05
