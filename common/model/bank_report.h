// The bank-conflict report of a tiled kernel (steps 03-05): every shared-memory access of one block,
// replayed through the bank model (common/model/bank_model.h) from the step's own index functions and
// tile layout, and the Nsight Compute counters that this predicts for a launch. No GPU needed.
//
// An instrument, not a lesson: nothing here knows a step. A step instantiates it with the Traits
// and the layout of its traits.h and prints it as its Step::explain (`flash-steps banks`):
//     bank::explain_tiling<Traits, RowMajorLayout>(out, {"03_smem_tiling", "row-major", "steps/...traits.h"});
// Traits<HEAD_DIM> must give the tile sizes (BLOCK_Q, BLOCK_KV, NUM_WARPS, CHUNK, GROUP, THREAD_ROWS,
// THREAD_KEYS, THREAD_COLS, LOADS_PER_THREAD) and who touches what (q_row, key, o_col, load_row,
// load_col); Layout<HEAD_DIM> maps (row, col) to an element (offset, size).
#pragma once

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "forward/problem.h"
#include "model/bank_model.h"

namespace fs::bank {

// Which Nsight Compute counters see a shared-memory access.
enum class Counter {
  ld,    // l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld, l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld
  st,    // the same, _op_st: STS instructions
  none,  // neither: cp.async writes shared memory without an STS instruction
};

// One shared-memory instruction of the kernel, counted over the warps of a block.
struct AccessCount {
  std::string what;               // e.g. "S = Q·Kᵀ: read K"
  Counter counter = Counter::ld;
  bool once_per_block = false;    // the Q copy: once per block and (b, h); the others once per K/V tile
  int width = 0;                  // bytes per lane
  int64_t instructions = 0;       // warp instructions
  int64_t wavefronts = 0;         // their wavefronts, from the model
  int64_t ideal = 0;              // their conflict-free minimum
  int worst = 0;                  // the most wavefronts of any one of them
  int64_t conflicts() const { return wavefronts - ideal; }
};

// What the report needs to know of a tiled kernel besides its Traits and layout.
struct TilingKernel {
  std::string step;         // "04_swizzle"
  std::string layout;       // "XOR-swizzled, chunk ^ row % 8"
  std::string traits_file;  // "steps/04_bank_conflicts/traits.h": where the replayed functions are
  int kv_buffers = 1;       // K and V buffers of [BLOCK_KV, HEAD_DIM] each, after the Q tile
  bool cp_async = false;    // the tiles are copied by cp.async (Counter::none), not by STS
};

// What ncu should count for one launch on a problem (its K/V tile loop, causal skipping included):
// l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st} and l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.
struct LaunchPrediction {
  int64_t blocks = 0, tiles = 0;  // blocks × (b, h) pairs, and K/V tiles over all of them
  int64_t ld_wavefronts = 0, ld_conflicts = 0, st_wavefronts = 0, st_conflicts = 0;
};

// ---- the non-template parts (bank_report.cpp) ---------------------------------------------------
// Adds one warp instruction to a count; throws std::logic_error for an access the model rejects.
void add(AccessCount& count, const WarpAccess& a);
// The counters of a launch on `p` whose blocks own block_q query rows and walk K/V tiles of block_kv keys.
LaunchPrediction predict_launch(const Problem& p, int block_q, int block_kv, const std::vector<AccessCount>& counts);
// The shape the runner times by default (batch 2, 16 heads, seqlen 2048, head_dim 128, fp16).
Problem default_shape();
// The parts of the report, in the order explain_tiling prints them.
void print_model(std::ostream& out, const TilingKernel& kernel);
void print_bank_map(std::ostream& out, int block_kv, int head_dim, const std::vector<std::vector<int>>& banks);
void print_counts(std::ostream& out, int head_dim, const std::vector<AccessCount>& counts);
void print_prediction(std::ostream& out, const TilingKernel& kernel, const Problem& p, const LaunchPrediction& r);

// ---- the replay -----------------------------------------------------------------------------------
// Every shared-memory instruction of one block of the kernel, warp by warp, with the index functions
// of Tr and the layout the kernel itself uses (2-byte elements: fp16, bf16): per K/V tile, and the
// Q copy per block.
template <class Tr, class Layout>
std::vector<AccessCount> replay(const TilingKernel& kernel) {
  constexpr int kElemBytes = 2;
  // q_smem, then the K buffers, then the V buffers, one after the other as in the kernel. Each buffer
  // is a whole number of 128-byte rows of banks, so the first one stands for all of them.
  static_assert(Layout::size(Tr::BLOCK_KV) * kElemBytes % kWavefrontBytes == 0, "buffers start in bank 0");
  const uint32_t q_base = 0;
  const uint32_t k_base = uint32_t(Layout::size(Tr::BLOCK_Q) * kElemBytes);
  const uint32_t v_base = k_base + uint32_t(kernel.kv_buffers * Layout::size(Tr::BLOCK_KV) * kElemBytes);
  const int v_width = Tr::THREAD_COLS * kElemBytes;
  const Counter copy = kernel.cp_async ? Counter::none : Counter::st;
  const std::string how = kernel.cp_async ? "cp.async" : "store";

  AccessCount copy_kv{"copy K and V tiles (" + how + ")", copy, false, 16};
  AccessCount read_q{"S = Q·Kᵀ: read Q", Counter::ld, false, 16};
  AccessCount read_k{"S = Q·Kᵀ: read K", Counter::ld, false, 16};
  AccessCount read_v{"O += P·V: read V", Counter::ld, false, v_width};
  AccessCount copy_q{"copy Q tile (" + how + ", once per block)", copy, true, 16};

  for (int w = 0; w < Tr::NUM_WARPS; ++w) {
    auto thread = [w](int lane) { return w * kWarpSize + lane; };
    for (int it = 0; it < Tr::LOADS_PER_THREAD; ++it) {
      auto chunk = [&](int l) { return Coord{Tr::load_row(thread(l), it), Tr::load_col(thread(l), it)}; };
      add(copy_q, tile_access<Layout>(16, kElemBytes, q_base, chunk));
      add(copy_kv, tile_access<Layout>(16, kElemBytes, k_base, chunk));
      add(copy_kv, tile_access<Layout>(16, kElemBytes, v_base, chunk));
    }
    for (int d0 = 0; d0 < Tr::HEAD_DIM; d0 += Tr::CHUNK) {
      for (int i = 0; i < Tr::THREAD_ROWS; ++i)
        add(read_q, tile_access<Layout>(16, kElemBytes, q_base,
                                        [&](int l) { return Coord{Tr::q_row(thread(l), i), d0}; }));
      for (int j = 0; j < Tr::THREAD_KEYS; ++j)
        add(read_k, tile_access<Layout>(16, kElemBytes, k_base,
                                        [&](int l) { return Coord{Tr::key(thread(l), j), d0}; }));
    }
    for (int j = 0; j < Tr::THREAD_KEYS; ++j)
      for (int src = 0; src < Tr::GROUP; ++src)
        add(read_v, tile_access<Layout>(v_width, kElemBytes, v_base,
                                        [&](int l) { return Coord{Tr::key(src, j), Tr::o_col(thread(l))}; }));
  }
  return {copy_kv, read_q, read_k, read_v, copy_q};
}

// The replay for head_dim 64 or 128, the two the tiled kernels are built for (else std::invalid_argument).
template <template <int> class Traits, template <int> class Layout>
std::vector<AccessCount> tiling_access_counts(int head_dim, const TilingKernel& kernel) {
  if (head_dim == 64) return replay<Traits<64>, Layout<64>>(kernel);
  if (head_dim == 128) return replay<Traits<128>, Layout<128>>(kernel);
  throw std::invalid_argument("the tiled kernels handle head_dim 64 and 128, not " + std::to_string(head_dim));
}

template <template <int> class Traits, template <int> class Layout>
LaunchPrediction predict_launch(const Problem& p, const TilingKernel& kernel) {
  const std::vector<AccessCount> counts = tiling_access_counts<Traits, Layout>(int(p.head_dim), kernel);
  return predict_launch(p, Traits<128>::BLOCK_Q, Traits<128>::BLOCK_KV, counts);
}

// bank_of the first byte of each 16-byte chunk (8 elements) of the first `rows` rows of a tile.
template <class Layout>
std::vector<std::vector<int>> bank_map(int rows) {
  std::vector<std::vector<int>> banks(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < Layout::kCols / 8; ++c)
      banks[size_t(r)].push_back(bank_of(uint32_t(Layout::offset(r, c * 8) * 2)));  // 2-byte elements
  return banks;
}

// The whole report, as the step's Step::explain: the bank map of a K tile at head_dim 128, the
// wavefronts of every shared access at head_dim 128 and 64, and the ncu counters predicted for one
// launch at the default shape.
template <template <int> class Traits, template <int> class Layout>
void explain_tiling(std::ostream& out, const TilingKernel& kernel) {
  print_model(out, kernel);
  print_bank_map(out, Traits<128>::BLOCK_KV, 128, bank_map<Layout<128>>(10));
  out << "Shared-memory instructions of one block (" << Traits<128>::NUM_WARPS
      << " warps), per K/V tile; wavefronts from the model\n\n";
  for (int head_dim : {128, 64}) print_counts(out, head_dim, tiling_access_counts<Traits, Layout>(head_dim, kernel));
  const Problem p = default_shape();
  print_prediction(out, kernel, p, predict_launch<Traits, Layout>(p, kernel));
}

}  // namespace fs::bank
