// The shared-memory accesses of steps 03 and 04, replayed through the bank model
// (common/bank_model.h) from the kernels' own index functions (steps/03_smem_tiling/tiling.h) and
// layouts (common/smem_layout.h), and the `flash-steps banks` report built from them. No GPU needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

namespace fs::bank {

// The Q, K, V tile layouts of 03_smem_tiling, 04_pad and 04_swizzle.
enum class TileLayout { row_major, padded16, swizzled128 };
inline constexpr TileLayout kTileLayouts[] = {TileLayout::row_major, TileLayout::padded16, TileLayout::swizzled128};
const char* layout_name(TileLayout layout);  // "row-major", "padded +16 B", "XOR-swizzled"
const char* step_of(TileLayout layout);      // "03_smem_tiling", "04_pad", "04_swizzle"

// One shared-memory instruction of the kernel, counted over the 8 warps of a block.
struct AccessCount {
  std::string what;             // e.g. "S = Q·Kᵀ: read K"
  bool store = false;           // counted by ncu's ..._op_st, else ..._op_ld
  bool once_per_block = false;  // the Q copy: once per block and (b, h); the others once per K/V tile
  int width = 0;                // bytes per lane
  int64_t instructions = 0;     // warp instructions
  int64_t wavefronts = 0;       // their wavefronts, from the model
  int64_t ideal = 0;            // their conflict-free minimum
  int worst = 0;                // the most wavefronts of any one of them
  int64_t conflicts() const { return wavefronts - ideal; }
};

// Every shared-memory access of the step 03/04 kernel for head_dim 64 or 128 (else
// std::invalid_argument), per block and K/V tile (the Q copy: per block).
std::vector<AccessCount> tiling_access_counts(int head_dim, TileLayout layout);

// What ncu should count for one launch of the kernel on `p` (its K/V tile loop, causal skipping
// included): l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st} and
// l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.
struct LaunchPrediction {
  int64_t blocks = 0, tiles = 0;  // blocks × (b, h) pairs, and K/V tiles over all of them
  int64_t ld_wavefronts = 0, ld_conflicts = 0, st_wavefronts = 0, st_conflicts = 0;
};
LaunchPrediction predict_launch(const Problem& p, TileLayout layout);

// `flash-steps banks`: bank maps of a K tile under each layout, the wavefronts of every shared
// access of steps 03 and 04, and the predicted ncu counters at the default shape. Returns 0.
int banks_main();

}  // namespace fs::bank
