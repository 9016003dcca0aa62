#include "bank_report.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <stdexcept>

#include "bank_model.h"
#include "steps/03_smem_tiling/traits.h"
#include "steps/04_bank_conflicts/traits.h"

namespace fs::bank {

namespace {

constexpr int kElemBytes = 2;  // fp16 and bf16

// Adds one warp instruction to a count.
void add(AccessCount& count, const WarpAccess& a) {
  const int w = wavefronts(a);
  if (w < 0) throw std::logic_error("bank model: invalid access in " + count.what);
  count.instructions += 1;
  count.wavefronts += w;
  count.ideal += ideal_wavefronts(a);
  count.worst = std::max(count.worst, w);
}

// Replays every shared-memory instruction of one block of the step 03/04 kernel: the same index
// functions (step03::Traits) and the same layout the kernel uses, warp by warp.
template <int HEAD_DIM, class Layout>
std::vector<AccessCount> replay() {
  using Tr = step03::Traits<HEAD_DIM>;
  // q_smem, k_smem, v_smem one after the other, as in the kernel.
  const uint32_t q_base = 0;
  const uint32_t k_base = uint32_t(Layout::size(Tr::BLOCK_Q) * kElemBytes);
  const uint32_t v_base = k_base + uint32_t(Layout::size(Tr::BLOCK_KV) * kElemBytes);
  const int v_width = Tr::THREAD_COLS * kElemBytes;

  AccessCount copy_kv{"copy K and V tiles (store)", true, false, 16};
  AccessCount read_q{"S = Q·Kᵀ: read Q", false, false, 16};
  AccessCount read_k{"S = Q·Kᵀ: read K", false, false, 16};
  AccessCount read_v{"O += P·V: read V", false, false, v_width};
  AccessCount copy_q{"copy Q tile (store, once per block)", true, true, 16};

  for (int w = 0; w < Tr::NUM_WARPS; ++w) {
    auto thread = [w](int lane) { return w * kWarpSize + lane; };
    for (int it = 0; it < Tr::LOADS_PER_THREAD; ++it) {
      auto chunk = [&](int l) { return Coord{Tr::load_row(thread(l), it), Tr::load_col(thread(l), it)}; };
      add(copy_q, tile_access<Layout>(16, kElemBytes, q_base, chunk));
      add(copy_kv, tile_access<Layout>(16, kElemBytes, k_base, chunk));
      add(copy_kv, tile_access<Layout>(16, kElemBytes, v_base, chunk));
    }
    for (int d0 = 0; d0 < HEAD_DIM; d0 += Tr::CHUNK) {
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

template <template <int> class L>
std::vector<AccessCount> replay_for(int head_dim) {
  if (head_dim == 64) return replay<64, L<64>>();
  if (head_dim == 128) return replay<128, L<128>>();
  throw std::invalid_argument("steps 03 and 04 handle head_dim 64 and 128, not " + std::to_string(head_dim));
}

// Offset of element (row, col) of a [rows, head_dim] tile under a layout.
template <template <int> class L>
int offset_for(int head_dim, int row, int col) {
  return head_dim == 64 ? L<64>::offset(row, col) : L<128>::offset(row, col);
}

int tile_offset(TileLayout layout, int head_dim, int row, int col) {
  switch (layout) {
    case TileLayout::row_major: return offset_for<step03::RowMajorLayout>(head_dim, row, col);
    case TileLayout::padded16: return offset_for<step04::Padded16Layout>(head_dim, row, col);
    case TileLayout::swizzled128: return offset_for<step04::Swizzled128Layout>(head_dim, row, col);
  }
  return 0;
}

// `s` padded with spaces to `width` characters (UTF-8 aware: "Q·Kᵀ" is 4 characters, not 7 bytes).
std::string padded(const std::string& s, size_t width) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80 ? 1 : 0;
  return chars >= width ? s : s + std::string(width - chars, ' ');
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_bank_map(TileLayout layout, int head_dim, int rows) {
  const int chunks = head_dim / 8;
  std::cout << "  " << layout_name(layout) << " (" << step_of(layout) << ")\n  key \\ chunk";
  for (int c = 0; c < chunks; ++c) std::cout << std::setw(4) << c;
  std::cout << "\n";
  for (int r = 0; r < rows; ++r) {
    std::cout << "  " << std::setw(9) << r << "  ";
    for (int c = 0; c < chunks; ++c)
      std::cout << std::setw(4) << bank_of(uint32_t(tile_offset(layout, head_dim, r, c * 8) * kElemBytes));
    std::cout << "\n";
  }
  std::cout << "\n";
}

void print_counts(TileLayout layout, int head_dim) {
  std::cout << "  " << step_of(layout) << ", " << layout_name(layout) << ", head_dim " << head_dim << "\n";
  std::cout << "    " << padded("access", 38) << std::setw(7) << "bytes" << std::setw(9)
            << "instr" << std::setw(12) << "wavefronts" << std::setw(9) << "ideal" << std::setw(11) << "conflicts"
            << std::setw(13) << "worst/instr" << "\n";
  for (const AccessCount& c : tiling_access_counts(head_dim, layout))
    std::cout << "    " << padded(c.what, 38) << std::setw(7) << c.width << std::setw(9)
              << c.instructions << std::setw(12) << c.wavefronts << std::setw(9) << c.ideal << std::setw(11)
              << c.conflicts() << std::setw(13) << c.worst << "\n";
  std::cout << "\n";
}

}  // namespace

const char* layout_name(TileLayout layout) {
  switch (layout) {
    case TileLayout::row_major: return "row-major";
    case TileLayout::padded16: return "padded +16 B per row";
    case TileLayout::swizzled128: return "XOR-swizzled, chunk ^ row % 8";
  }
  return "?";
}

const char* step_of(TileLayout layout) {
  switch (layout) {
    case TileLayout::row_major: return "03_smem_tiling";
    case TileLayout::padded16: return "04_pad";
    case TileLayout::swizzled128: return "04_swizzle";
  }
  return "?";
}

std::vector<AccessCount> tiling_access_counts(int head_dim, TileLayout layout) {
  switch (layout) {
    case TileLayout::row_major: return replay_for<step03::RowMajorLayout>(head_dim);
    case TileLayout::padded16: return replay_for<step04::Padded16Layout>(head_dim);
    case TileLayout::swizzled128: return replay_for<step04::Swizzled128Layout>(head_dim);
  }
  throw std::invalid_argument("unknown tile layout");
}

LaunchPrediction predict_launch(const Problem& p, TileLayout layout) {
  const std::vector<AccessCount> counts = tiling_access_counts(int(p.head_dim), layout);
  constexpr int64_t BLOCK_Q = step03::Traits<128>::BLOCK_Q, BLOCK_KV = step03::Traits<128>::BLOCK_KV;
  LaunchPrediction r;
  const int64_t batch_heads = p.batch * p.heads_q;
  const int64_t q_tiles = (p.seqlen_q + BLOCK_Q - 1) / BLOCK_Q;
  for (int64_t qt = 0; qt < q_tiles; ++qt) {  // the K/V tiles of each query tile, as the kernel loops
    const int64_t last_row = std::min((qt + 1) * BLOCK_Q, p.seqlen_q) - 1;
    const int64_t kv_end = p.causal ? std::min(p.seqlen_k, last_row + p.seqlen_k - p.seqlen_q + 1) : p.seqlen_k;
    r.tiles += kv_end > 0 ? (kv_end + BLOCK_KV - 1) / BLOCK_KV : 0;
  }
  r.tiles *= batch_heads;
  r.blocks = q_tiles * batch_heads;
  for (const AccessCount& c : counts) {
    const int64_t times = c.once_per_block ? r.blocks : r.tiles;
    (c.store ? r.st_wavefronts : r.ld_wavefronts) += times * c.wavefronts;
    (c.store ? r.st_conflicts : r.ld_conflicts) += times * c.conflicts();
  }
  return r;
}

int banks_main() {
  std::cout
      << "flash-steps banks — shared-memory bank conflicts of steps 03 and 04, from the model in\n"
         "common/bank_model.h replaying the kernels' own index functions (no GPU needed).\n\n"
         "32 banks of 4 bytes; one wavefront delivers one 4-byte word per bank. Accesses of 4, 8 or 16\n"
         "bytes per lane are served in phases of 32, 16 or 8 lanes (128 bytes each); a phase takes as\n"
         "many wavefronts as its busiest bank has distinct words. Ideal: 1 wavefront per phase.\n\n";

  std::cout << "Bank map of a K tile [64 keys, 128] fp16: the first bank of each 16-byte chunk (8 elements,\n"
               "banks b..b+3). In S = Q·Kᵀ a quarter-warp reads one chunk (a column of this table) of 8\n"
               "consecutive keys: the 8 cells must all differ for the read to take 1 wavefront.\n\n";
  for (TileLayout layout : kTileLayouts) print_bank_map(layout, 128, 10);

  std::cout << "Shared-memory instructions of one block (8 warps), per K/V tile; wavefronts from the model\n\n";
  for (int head_dim : {128, 64})
    for (TileLayout layout : kTileLayouts) print_counts(layout, head_dim);

  const Problem p = make_problem(2, 2048, 2048, 16, 16, 128, DType::fp16, false);
  const LaunchPrediction shape = predict_launch(p, TileLayout::row_major);
  std::cout << "Predicted Nsight Compute counters for one launch at " << describe(p) << " (" << shape.blocks
            << " blocks, " << shape.tiles << " K/V tiles):\n";
  std::cout << "  " << std::left << std::setw(16) << "step" << std::right << std::setw(16) << "ld wavefronts"
            << std::setw(16) << "ld conflicts" << std::setw(16) << "st wavefronts" << std::setw(16) << "st conflicts"
            << "\n";
  for (TileLayout layout : kTileLayouts) {
    const LaunchPrediction r = predict_launch(p, layout);
    std::cout << "  " << std::left << std::setw(16) << step_of(layout) << std::right << std::setw(16)
              << with_commas(r.ld_wavefronts) << std::setw(16) << with_commas(r.ld_conflicts) << std::setw(16)
              << with_commas(r.st_wavefronts) << std::setw(16) << with_commas(r.st_conflicts) << "\n";
  }
  std::cout << "  (ld/st wavefronts: l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld/_op_st.sum; conflicts:\n"
               "   l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld/_op_st.sum)\n";
  return 0;
}

}  // namespace fs::bank
