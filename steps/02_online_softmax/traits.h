// Step 02 — the compile-time choices of the online-softmax kernel (kernel.cuh), and which
// instantiation a head_dim needs.
#pragma once

#include <cstdint>

#include "common/step/hd.h"

namespace fs::step02 {

template <int CHUNKS_PER_LANE_>
struct Traits {
  static constexpr int NUM_WARPS = 8;  // one query row per warp, 8 consecutive rows per block
  static constexpr int NUM_THREADS = NUM_WARPS * 32;
  static constexpr int CHUNK = 4;  // elements per lane per access (8 bytes)
  static constexpr int CHUNKS_PER_LANE = CHUNKS_PER_LANE_;  // 1 for head_dim <= 128, 2 up to 256
  static_assert(CHUNKS_PER_LANE == 1 || CHUNKS_PER_LANE == 2, "head_dim <= 256 needs at most 2 chunks per lane");
};

// Lane l owns the chunks l and l + 32 of a row: one chunk per lane covers 32·CHUNK = 128 columns.
FS_HD constexpr int chunks_per_lane(int64_t head_dim) { return head_dim <= 32 * Traits<1>::CHUNK ? 1 : 2; }

}  // namespace fs::step02
