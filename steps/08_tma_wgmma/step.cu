// Step 08 — limits, plan, launch and registration of the TMA + wgmma kernel (kernel.cuh): the row
// of the tile table for the problem's head_dim, the four tensor maps, the launch; and explain(),
// which prints the layouts the kernel relies on without a GPU.
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/step/dispatch.h"
#include "common/step/dtype.cuh"
#include "common/step/step.h"
#include "common/step/tensor_map.h"
#include "steps/08_tma_wgmma/kernel.cuh"

namespace fs {
namespace {

namespace s8 = step08;

// ---- limits, plan, claims ----------------------------------------------------------------------

std::string limits(const Problem& p) {
  std::string why;
  if (why.empty()) why = check_tma_strides("Q", p.q, p.seqlen_q, p.heads_q, p.batch, s8::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("K", p.k, p.seqlen_k, p.heads_kv, p.batch, s8::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("V", p.v, p.seqlen_k, p.heads_kv, p.batch, s8::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("O", p.o, p.seqlen_q, p.heads_q, p.batch, s8::kMaxTmaStrideBytes);
  return why;
}

// The most shared memory any row of the table needs.
constexpr int max_smem_bytes() {
  int most = 0;
  for (const s8::Config& c : s8::kConfigs) most = s8::smem_bytes(c) > most ? s8::smem_bytes(c) : most;
  return most;
}

// Documented support: every problem the harness accepts whose strides the TMA can address and whose
// grid fits in 2^31 - 1 blocks, on a GPU of compute capability 9.0 (H100, H200: 227 KiB per block).
bool claims(const Problem& p, const DeviceInfo& dev) {
  return dev.compute_capability == 90 && dev.smem_per_block_optin >= size_t(max_smem_bytes()) && limits(p).empty() &&
         s8::grid_blocks(p) <= INT32_MAX;
}

Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = s8::config_for(p.head_dim);
  const int smem = s8::smem_bytes(s8::kConfigs[pl.config]);
  if (dev.smem_per_block_optin < size_t(smem)) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << s8::padded_head_dim(p.head_dim) << "-wide tiles, which need "
      << smem << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const int64_t blocks = s8::grid_blocks(p);
  if (blocks > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << s8::BLOCK_Q << " query rows per batch and head, " << blocks
      << " blocks here, more than the grid limit of " << INT32_MAX;
    pl.refusal = m.str();
    return pl;
  }
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<s8::kNumConfigs>(pl.config, [&](auto c) {
      constexpr s8::Config k = s8::kConfigs[decltype(c)::value];
      const void* kernel = reinterpret_cast<const void*>(&s8::tma_wgmma_kernel<T, k.head_dim, k.block_kv, k.kv_stages>);
      pl.kernels = {KernelLaunch{kernel, s8::NUM_THREADS, size_t(smem), blocks}};
    });
  });
  return pl;
}

// ---- launch ------------------------------------------------------------------------------------

template <typename T, int HEAD_DIM, int BLOCK_KV, int KV_STAGES>
void launch_tiles(const Problem& p, const Tensors& t, const Plan& plan, cudaStream_t stream) {
  using Tr = s8::Traits<HEAD_DIM, BLOCK_KV, KV_STAGES>;
  auto* kernel = s8::tma_wgmma_kernel<T, HEAD_DIM, BLOCK_KV, KV_STAGES>;
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap q_map =
      make_tensor_map("Q", t.q, type, s8::tensor_map_shape(p.q, p.seqlen_q, p.heads_q, p.batch, p.head_dim, Tr::BLOCK_Q));
  const CUtensorMap k_map =
      make_tensor_map("K", t.k, type, s8::tensor_map_shape(p.k, p.seqlen_k, p.heads_kv, p.batch, p.head_dim, BLOCK_KV));
  const CUtensorMap v_map =
      make_tensor_map("V", t.v, type, s8::tensor_map_shape(p.v, p.seqlen_k, p.heads_kv, p.batch, p.head_dim, BLOCK_KV));
  const CUtensorMap o_map =
      make_tensor_map("O", t.o, type, s8::tensor_map_shape(p.o, p.seqlen_q, p.heads_q, p.batch, p.head_dim, Tr::BLOCK_Q));
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::SMEM_BYTES));
  const float scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);  // scale · log2(e)
  kernel<<<unsigned(plan.kernels.front().blocks), Tr::NUM_THREADS, Tr::SMEM_BYTES, stream>>>(q_map, k_map, v_map, o_map,
                                                                                             t.lse, p, scale_log2);
  CHECK_LAUNCH();
}

void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    with_config<s8::kNumConfigs>(plan.config, [&](auto c) {
      constexpr s8::Config k = s8::kConfigs[decltype(c)::value];
      launch_tiles<typename decltype(tag)::type, k.head_dim, k.block_kv, k.kv_stages>(p, t, plan, stream);
    });
  });
}

// ---- explain -----------------------------------------------------------------------------------

std::string hex(uint64_t x) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(x));
  return buf;
}

// One descriptor, its start given as a byte offset from the 1024-byte-aligned shared memory base.
void print_descriptor(std::ostream& out, const char* what, uint32_t start, uint32_t lbo, uint32_t sbo) {
  out << "  " << what << ": start +" << start << ", LBO " << lbo << ", SBO " << sbo << ", 128-byte swizzle  ->  "
      << hex(s8::matrix_descriptor(start, lbo, sbo)) << "\n";
}

void explain(std::ostream& out) {
  using Tr = s8::Traits<128, 128, 2>;  // the head_dim-128 row of the table
  constexpr int BQ = Tr::BLOCK_Q, BKV = Tr::BLOCK_KV;
  out << "Tile table (head_dim padded to HEAD_DIM; two warpgroups of 64 query rows, BLOCK_Q = " << BQ << "):\n";
  for (const s8::Config& c : s8::kConfigs)
    out << "  HEAD_DIM " << c.head_dim << ": BLOCK_KV " << c.block_kv << ", " << c.kv_stages
        << " K/V stages, shared memory " << s8::smem_bytes(c) << " bytes\n";

  out << "\nThe 128-byte swizzle (TMA CU_TENSOR_MAP_SWIZZLE_128B = wgmma swizzle mode 1). In each 1024-byte\n"
         "atom of 8 rows × 128 bytes, the 16-byte chunk at each position of a row (chunk c of row r sits at c ^ r):\n";
  for (int r = 0; r < 8; ++r) {
    out << "  row " << r << ":";
    for (int pos = 0; pos < 8; ++pos)
      for (int c = 0; c < 8; ++c)
        if (s8::swizzle_128b(uint32_t(r) * s8::ROW_BYTES + uint32_t(c) * 16u) == uint32_t(r) * s8::ROW_BYTES + uint32_t(pos) * 16u)
          out << " " << c;
    out << "\n";
  }

  out << "\nShared memory at HEAD_DIM 128 (bytes from the 1024-byte-aligned base): q_smem +" << Tr::Q_OFFSET << " ("
      << Tr::Q_BYTES << "), k_smem +" << Tr::K_OFFSET << " (2 × " << Tr::KV_BYTES << "), v_smem +" << Tr::V_OFFSET
      << " (2 × " << Tr::KV_BYTES << "), mbarriers +" << Tr::BARRIER_OFFSET << ".\n"
      << "Each tile is HEAD_DIM / 64 = " << Tr::COL_BLOCKS << " column blocks [rows, 64] of 128-byte rows; element (row, col)\n"
      << "of q_smem is at tile_offset: (0, 0) +" << s8::tile_offset(BQ, 0, 0) << ", (1, 0) +" << s8::tile_offset(BQ, 1, 0)
      << ", (1, 8) +" << s8::tile_offset(BQ, 1, 8) << ", (9, 70) +" << s8::tile_offset(BQ, 9, 70) << ".\n";

  out << "\nMatrix descriptors (bits 0-13 start/16, 16-29 LBO/16, 32-45 SBO/16, 62-63 swizzle; the kernel adds\n"
         "the base address to start). K-major Q and K: k16 step ks starts at column block ks / 4, + 32 bytes per step:\n";
  for (int wg = 0; wg < 2; ++wg)
    for (int ks : {0, 1, 3, 4}) {
      const std::string what = "Q, warpgroup " + std::to_string(wg) + ", k16 step " + std::to_string(ks);
      print_descriptor(out, what.c_str(),
                       Tr::Q_OFFSET + uint32_t(wg * s8::ROWS_PER_WARPGROUP) * s8::ROW_BYTES + s8::k_major_step_offset(BQ, ks),
                       s8::K_MAJOR_LBO, s8::SBO_8_ROWS);
    }
  for (int stage = 0; stage < 2; ++stage)
    for (int ks : {0, 1, 4}) {
      const std::string what = "K, stage " + std::to_string(stage) + ", k16 step " + std::to_string(ks);
      print_descriptor(out, what.c_str(), Tr::K_OFFSET + uint32_t(stage * Tr::KV_BYTES) + s8::k_major_step_offset(BKV, ks),
                       s8::K_MAJOR_LBO, s8::SBO_8_ROWS);
    }
  out << "N-major V (imm-trans-b = 1): LBO = the next 64 head dims (one column block), SBO = the next 8 keys;\n"
         "k16 step kk (keys 16kk …) starts 2048 bytes further:\n";
  for (int stage = 0; stage < 2; ++stage)
    for (int kk : {0, 1, 7}) {
      const std::string what = "V, stage " + std::to_string(stage) + ", k16 step " + std::to_string(kk);
      print_descriptor(out, what.c_str(), Tr::V_OFFSET + uint32_t(stage * Tr::KV_BYTES) + s8::mn_major_step_offset(kk),
                       s8::mn_major_lbo(BKV), s8::SBO_8_ROWS);
    }

  out << "\nwgmma m64nNk16 fp32 accumulator, warp 0 of a warpgroup: register i of thread t holds (row, col);\n"
         "registers 4j … 4j + 3 repeat the pattern 8 columns further (warp w: rows 16w …):\n";
  for (int t = 0; t < 32; ++t) {
    out << "  thread " << (t < 10 ? " " : "") << t << ":";
    for (int i = 0; i < 8; ++i) {
      const s8::frag::Coord c = s8::wgmma_acc(t, i);
      out << "  d" << i << " (" << c.row << "," << c.col << ")";
    }
    out << "\n";
  }
  out << "\nwgmma A from registers (fp16/bf16, one k16 step), warp 0: register r = two elements (row, col), (row, col+1):\n";
  for (int t = 0; t < 32; ++t) {
    out << "  thread " << (t < 10 ? " " : "") << t << ":";
    for (int r = 0; r < 4; ++r) {
      const s8::frag::Coord c = s8::wgmma_a(t, r, 0);
      out << "  a" << r << " (" << c.row << "," << c.col << "-" << c.col + 1 << ")";
    }
    out << "\n";
  }
  out << "So A register r of k16 step kk (keys 16kk …) = s_acc[8kk + 2r] (low half), s_acc[8kk + 2r + 1]: the same\n"
         "thread, row and columns, rounded to fp16/bf16 in place. E.g. thread 5, kk 1, r 3: s_acc["
      << s8::p_source(1, 3) << "] at (" << s8::wgmma_acc(5, s8::p_source(1, 3)).row << ","
      << s8::wgmma_acc(5, s8::p_source(1, 3)).col << ") = A (" << s8::wgmma_a(5, 3, 0).row << ","
      << s8::wgmma_a(5, 3, 0).col << ") + 16 columns.\n";

  out << "\nTMA boxes of one tile at HEAD_DIM 128 (coordinates innermost first: column, row, head, batch):\n";
  for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
    const s8::BoxCoord c = s8::tma_box(cb, 0, 0, 0);
    out << "  Q query tile q0: box {64, " << BQ << ", 1, 1} at (" << c.col << ", q0, h, b) -> q_smem +"
        << s8::box_offset(BQ, cb) << "\n";
  }
  for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
    const s8::BoxCoord c = s8::tma_box(cb, 0, 0, 0);
    out << "  K, V tile j: box {64, " << BKV << ", 1, 1} at (" << c.col << ", " << BKV
        << "·j, h_kv, b) -> stage + " << s8::box_offset(BKV, cb) << "\n";
  }
  out << "  bytes each barrier expects per phase: Q " << Tr::Q_BYTES << ", K " << Tr::KV_BYTES << ", V " << Tr::KV_BYTES
      << " (out-of-bounds elements arrive as zeros and count)\n";

  out << "\nmbarrier phases of the K/V ring (" << Tr::KV_STAGES << " stages): visit t waits on stage t % "
      << Tr::KV_STAGES << " for the parity (t / " << Tr::KV_STAGES << ") % 2:\n  visit :";
  for (int t = 0; t < 8; ++t) out << " " << t;
  out << "\n  stage :";
  for (int t = 0; t < 8; ++t) out << " " << s8::kv_stage(t, Tr::KV_STAGES);
  out << "\n  parity:";
  for (int t = 0; t < 8; ++t) out << " " << s8::kv_parity(t, Tr::KV_STAGES);
  out << "\n";
}

}  // namespace

void register_step_08_tma_wgmma(Registry& r) {
  r.add({.id = "08_tma_wgmma",
         .name = "TMA + wgmma",
         .lesson = "Hopper's data path: tiles copied by the TMA into 128-byte-swizzled shared memory, mbarrier "
                   "phases, both products on wgmma (sm_90a)",
         .forward = {limits, plan, launch, claims},
         .explain = explain});
}

}  // namespace fs
