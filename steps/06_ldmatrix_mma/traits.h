// Step 06 — how the kernel (kernel.cuh) splits its work among warps and lanes, and how a tile is laid
// out in shared memory: step 05's traits with the thread grid of the CUDA-core products replaced by
// the tensor cores' fragments: which lane of a warp holds which element of an mma operand, and where
// each lane points ldmatrix.
//
// The kernel computes its ldmatrix addresses and the coordinates of its accumulator elements with
// these very functions, and tests/test_fragment_layout.cpp checks them on the CPU against the PTX
// ISA's tables, so the index math that runs on the GPU is the index math that was tested.
#pragma once

#include "common/step/hd.h"

namespace fs::step06 {

// Compile-time choices of this step. Everything else is derived from them.
template <int HEAD_DIM_>
struct Traits {
  static constexpr int HEAD_DIM = HEAD_DIM_;
  static constexpr int BLOCK_Q = 64;       // query rows per block (Q tile)
  static constexpr int BLOCK_KV = 64;      // keys per K/V tile
  static constexpr int NUM_THREADS = 128;  // 4 warps: one m16 tile of query rows each
  static constexpr int NUM_WARPS = NUM_THREADS / 32;
  static constexpr int CHUNK = 8;          // elements per 16-byte shared/global access

  // Each warp owns 16 query rows, the M of one mma.m16n8k16, for the whole kernel. Its 32 lanes
  // hold S and O in the mma's accumulator layout (frag::mma_c): each row is shared by 4 lanes, so
  // row max and row sum are reduced with two shuffles.
  static constexpr int ROWS_PER_WARP = BLOCK_Q / NUM_WARPS;  // 16
  static constexpr int QK_K_STEPS = HEAD_DIM / 16;           // k16 steps of S = Q·Kᵀ (over head dims)
  static constexpr int S_N_TILES = BLOCK_KV / 8;             // n8 tiles of S (over keys)
  static constexpr int PV_K_STEPS = BLOCK_KV / 16;           // k16 steps of O = P·V (over keys)
  static constexpr int O_N_TILES = HEAD_DIM / 8;             // n8 tiles of O (over head dims)
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / CHUNK;
  static constexpr int LOADS_PER_THREAD = BLOCK_KV * CHUNKS_PER_ROW / NUM_THREADS;  // 16-byte copies per tile

  static_assert(ROWS_PER_WARP == 16, "one m16 tile of query rows per warp");
  static_assert(HEAD_DIM % 16 == 0 && BLOCK_KV % 16 == 0 && O_N_TILES % 2 == 0,
                "k16 steps over head dims and keys; V is read two n8 tiles at a time");
  static_assert(BLOCK_Q == BLOCK_KV, "Q, K and V tiles are copied by the same loop");
  static_assert((BLOCK_KV * CHUNKS_PER_ROW) % NUM_THREADS == 0, "every thread copies the same number of chunks");

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

// ---- Which lane of a warp holds which matrix element ---------------------------------------------
// The register layouts of mma.sync.aligned.m16n8k16 (fp16/bf16 inputs, fp32 accumulators) and of
// ldmatrix.m8n8 (.x1, .x2, .x4, with and without .trans), written as constexpr maps
// (lane, register, half) -> (row, col).
//
// Conventions. A "register" is 32 bits. Registers of A and B hold two 16-bit elements; `half` 0 is
// the low 16 bits, the element with the smaller column (A) or row (B) index. Lanes come in 8 groups
// of 4: g = lane / 4 ("groupID" in the PTX ISA) picks the row, t = lane % 4 ("threadID_in_group")
// the pair of columns.
namespace frag {

struct Coord {
  int row;
  int col;
};
FS_HD constexpr bool operator==(Coord a, Coord b) { return a.row == b.row && a.col == b.col; }
FS_HD constexpr bool operator!=(Coord a, Coord b) { return !(a == b); }

inline constexpr int kWarpSize = 32;

FS_HD constexpr int group_of(int lane) { return lane / 4; }
FS_HD constexpr int thread_in_group(int lane) { return lane % 4; }

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 -------------------------------
//
// A: 16×16 (rows = M, cols = K), 4 registers. Register reg covers rows g + 8·(reg % 2) and the
// column pair 2t, 2t+1 of the left (reg < 2) or right (reg >= 2) 8 columns:
//     a[0] = (g, 2t..2t+1)   a[1] = (g+8, 2t..2t+1)   a[2] = (g, 8+2t..)   a[3] = (g+8, 8+2t..)
FS_HD constexpr Coord mma_a(int lane, int reg, int half) {
  return {group_of(lane) + 8 * (reg % 2), 8 * (reg / 2) + 2 * thread_in_group(lane) + half};
}

// B: 16×8 (rows = K, cols = N), 2 registers. Lane l holds column g; register reg holds the row pair
// 8·reg + 2t, 8·reg + 2t + 1. Row-major in K for each column: that is what ".col" means.
FS_HD constexpr Coord mma_b(int lane, int reg, int half) {
  return {8 * reg + 2 * thread_in_group(lane) + half, group_of(lane)};
}

// C/D: 16×8 fp32, 4 registers of one element each: d[0], d[1] = row g, columns 2t, 2t+1;
// d[2], d[3] = row g+8, the same columns.
FS_HD constexpr Coord mma_c(int lane, int i) {
  return {group_of(lane) + 8 * (i / 2), 2 * thread_in_group(lane) + i % 2};
}

// The accumulators of two neighbouring n8 tiles of S are, element for element, the A fragment of P
// for one k16 step: C element i of the n8 tile `n_half` (0: columns 0-7 of the k16 step, 1: columns
// 8-15) and C element i+1 (i even) sit at the same row and neighbouring columns, which is exactly
// the pair that this A register holds. So P = softmax(S) needs no shared-memory round trip.
FS_HD constexpr int mma_a_reg_of_c(int n_half, int i) { return i / 2 + 2 * n_half; }

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 -----------------------------------
//
// Loads N = 1, 2 or 4 matrices of 8×8 16-bit elements. Each matrix is given as 8 row addresses of
// 16 bytes each (the rows need not be contiguous: any 16-byte-aligned address works, which is what
// lets a swizzled layout be read); lane 8·m + r gives the address of row r of matrix m. Only the
// first 8·N lanes' addresses are used. Register m of every lane receives two elements of matrix m.

FS_HD constexpr int ldmatrix_address_lanes(int num_matrices) { return 8 * num_matrices; }
FS_HD constexpr int ldmatrix_address_lane(int matrix, int row) { return 8 * matrix + row; }
FS_HD constexpr int ldmatrix_matrix_of(int lane) { return lane / 8; }  // which matrix lane's address is a row of
FS_HD constexpr int ldmatrix_row_of(int lane) { return lane % 8; }     // ... and which row

// The element (row, col) of the stored 8×8 matrix that half `half` of each destination register of
// `lane` receives (row = which of the 8 addresses, col = which element of its 16 bytes). Without
// .trans a lane gets row g, columns 2t, 2t+1 (four lanes share a row); with .trans it gets the same
// positions of the transposed matrix: column g, rows 2t, 2t+1.
FS_HD constexpr Coord ldmatrix_element(int lane, int half, bool trans) {
  return trans ? Coord{2 * thread_in_group(lane) + half, group_of(lane)}
               : Coord{group_of(lane), 2 * thread_in_group(lane) + half};
}

// ---- The operand tiles of this step: where each lane points ldmatrix ----------------------------
// Each function returns (row, col) inside the operand tile of the first element of the 16-byte row
// that `lane` supplies (col is a multiple of 8); the kernel adds the tile's origin and passes the
// result through its shared-memory layout.

// A 16×16 tile read as four 8×8 quadrants in the order of the A registers: matrix 0 = rows 0-7,
// cols 0-7; 1 = rows 8-15, cols 0-7; 2 = rows 0-7, cols 8-15; 3 = rows 8-15, cols 8-15.
FS_HD constexpr Coord ldmatrix_x4_quadrants(int lane) {
  const int m = ldmatrix_matrix_of(lane);
  return {8 * (m % 2) + ldmatrix_row_of(lane), 8 * (m / 2)};
}

// Q·Kᵀ's A operand: 16 query rows × 16 head dims of Q, stored [row][dim]. ldmatrix.x4 with these
// addresses returns registers 0-3 of the A fragment (ldmatrix's register m = quadrant m = a[m]).
FS_HD constexpr Coord ldmatrix_x4_a(int lane) { return ldmatrix_x4_quadrants(lane); }

// Q·Kᵀ's B operand: B = Kᵀ (16 dims × 8 keys) but K is stored [key][dim], i.e. B column-major, so
// no transpose is needed: ldmatrix.x2 over 8 keys × 16 dims, matrix 0 = dims 0-7 (b[0]), matrix 1
// = dims 8-15 (b[1]). .x2 reads lanes 0-15 only; lanes 16-31 repeat lanes 0-15 so that every lane
// computes an address inside the tile.
FS_HD constexpr Coord ldmatrix_x2_b(int lane) {
  const int l = lane % ldmatrix_address_lanes(2);
  return {ldmatrix_row_of(l), 8 * ldmatrix_matrix_of(l)};
}

// P·V's B operand: B = V (16 keys × 8 dims per n8 tile) stored [key][dim], i.e. B row-major, so
// ldmatrix needs .trans. ldmatrix.x4.trans over 16 keys × 16 dims (the quadrant order) returns the
// B fragments of two neighbouring n8 tiles: r[0], r[1] = b[0], b[1] of dims 0-7; r[2], r[3] = b[0],
// b[1] of dims 8-15.
FS_HD constexpr Coord ldmatrix_x4_trans_b(int lane) { return ldmatrix_x4_quadrants(lane); }

}  // namespace frag

}  // namespace fs::step06
