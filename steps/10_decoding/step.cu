// Step 10 — decoding (kernel.cuh): what it accepts, the row of the table (traits.h) and the number of
// splits it picks for a problem and a GPU, and its launch. It has a decoding entry (Step::decode:
// per-sequence lengths, a paged cache) and a forward one, which runs a forward problem as the
// decoding problem it is (a contiguous cache, every sequence at seqlen_k keys).
#include <ostream>
#include <sstream>
#include <utility>

#include "common/decode/problem.h"
#include "common/step/dispatch.h"
#include "common/step/dtype.cuh"
#include "common/step/step.h"
#include "steps/10_decoding/kernel.cuh"

namespace fs::step10 {
namespace {

// The decoding regime: a few new tokens per sequence. Prefill (long queries) belongs to steps 07 and 08,
// whose tiles reuse each K/V tile for 128 query rows.
constexpr int64_t kMaxSeqlenQ = 16;
// Keys are counted in 32-bit integers, rounded up to whole tiles of at most 128 keys.
constexpr int64_t kMaxSeqlenK = INT32_MAX - 255;

std::string limits(const DecodeProblem& dp) {
  const Problem& p = dp.attention;
  std::ostringstream m;
  if (p.seqlen_q > kMaxSeqlenQ) {
    m << "seqlen_q is " << p.seqlen_q << "; this step is the decoding kernel and runs up to " << kMaxSeqlenQ
      << " new tokens per sequence (prefill belongs to steps 07 and 08, whose tiles reuse each K/V tile for 128 "
         "query rows)";
    return m.str();
  }
  if (p.seqlen_k > kMaxSeqlenK) {
    m << "seqlen_k is " << p.seqlen_k << "; this step counts keys in 32-bit integers, rounded up to whole tiles, "
      << "and runs seqlen_k up to " << kMaxSeqlenK;
    return m.str();
  }
  if (const int64_t rows = packed_rows(p.heads_q, p.heads_kv, p.seqlen_q); rows > INT32_MAX) {
    m << "heads_q / heads_kv * seqlen_q is " << rows << " packed rows per KV head; this step runs at most " << INT32_MAX;
    return m.str();
  }
  return "";
}

// The blocks of the split kernel: batch · heads_kv · row tiles · splits.
struct Grid {
  int64_t base_blocks;  // without a split
  int splits;
  int64_t blocks() const { return base_blocks * splits; }
};
Grid grid_of(const DecodeProblem& dp, int config, const DeviceInfo& dev) {
  const Problem& p = dp.attention;
  const Config& c = kConfigs[config];
  const int64_t base = p.batch * p.heads_kv * row_tiles(packed_rows(p.heads_q, p.heads_kv, p.seqlen_q));
  const int64_t slots = int64_t(dev.sm_count > 0 ? dev.sm_count : 1) * blocks_per_sm(c, int64_t(dev.smem_per_block_optin));
  const int splits = dp.num_splits ? dp.num_splits : num_splits_for(base, kv_tiles(p.seqlen_k, c.block_kv), slots);
  return {base, splits};
}

// Documented support: every decoding problem the harness accepts with seqlen_q <= 16 (and the limits
// above) on a GPU whose blocks may opt in to 99 KiB (sm_80 and newer), as long as the grid stays within
// 2^31 - 1 blocks (only a forced num_splits on a huge batch goes past it).
bool claims(const DecodeProblem& p, const DeviceInfo& dev) {
  if (!limits(p).empty() || dev.smem_per_block_optin < 99 * KiB) return false;
  const int config = choose_config(p.attention.head_dim, int64_t(dev.smem_per_block_optin));
  return config >= 0 && grid_of(p, config, dev).blocks() <= INT32_MAX;
}

inline constexpr int kCombineThreads = kCombineWarps * 32;

Plan plan(const DecodeProblem& dp, const DeviceInfo& dev) {
  const Problem& p = dp.attention;
  Plan pl;
  pl.config = choose_config(p.head_dim, int64_t(dev.smem_per_block_optin));
  if (pl.config < 0) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << padded_head_dim(p.head_dim) << "-wide tiles, which need at least "
      << min_smem_bytes(p.head_dim) << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const Grid grid = grid_of(dp, pl.config, dev);
  if (grid.blocks() > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per 16 packed rows, KV head, sequence and split: " << grid.base_blocks
      << " * " << grid.splits << " blocks here, more than the grid limit of " << INT32_MAX;
    pl.refusal = m.str();
    return pl;
  }
  pl.splits = grid.splits;
  const int64_t rows_all = p.batch * p.heads_q * p.seqlen_q;
  pl.workspace_bytes = size_t(workspace_layout(grid.splits, rows_all, p.head_dim).bytes);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(pl.config, [&](auto c) {
      using Tr = TraitsOf<decltype(c)::value>;
      pl.kernels = {KernelLaunch{reinterpret_cast<const void*>(&split_kv_kernel<T, Tr>), Tr::NUM_THREADS,
                                 size_t(Tr::SMEM_BYTES), grid.blocks()}};
      if (grid.splits > 1)
        pl.kernels.push_back(KernelLaunch{reinterpret_cast<const void*>(&combine_kernel<T>), kCombineThreads, 0,
                                          grid_stride_blocks(rows_all, kCombineWarps)});
    });
  });
  return pl;
}

void launch(const DecodeProblem& dp, const DecodeTensors& t, const Plan& plan, void* workspace, cudaStream_t stream) {
  const Problem& p = dp.attention;
  const int64_t rows = packed_rows(p.heads_q, p.heads_kv, p.seqlen_q), rows_all = p.batch * p.heads_q * p.seqlen_q;
  const Args a{int(p.heads_q / p.heads_kv), int(rows), int(row_tiles(rows)), plan.splits, rows_all,
               float(double(p.softmax_scale) * 1.4426950408889634)};  // scale · log2(e)
  const WorkspaceLayout ws = workspace_layout(plan.splits, rows_all, p.head_dim);
  float* part_lse = plan.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + ws.lse_offset) : nullptr;
  float* part_o = plan.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + ws.o_offset) : nullptr;
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(plan.config, [&](auto c) {
      using Tr = TraitsOf<decltype(c)::value>;
      const KernelLaunch& kl = plan.kernels[0];
      auto* kernel = split_kv_kernel<T, Tr>;
      CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kl.smem_bytes)));
      // All of the SM's unified L1/shared memory as shared memory, so that two blocks fit (cp.async.cg
      // bypasses L1, so the kernel loses nothing).
      CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
      kernel<<<unsigned(kl.blocks), kl.threads, kl.smem_bytes, stream>>>(
          static_cast<const T*>(t.q), static_cast<const T*>(t.k_cache), static_cast<const T*>(t.v_cache),
          t.block_table, t.cache_seqlens, static_cast<T*>(t.o), t.lse, part_o, part_lse, dp, a);
      CHECK_LAUNCH();
      if (plan.splits > 1) {
        const KernelLaunch& combine = plan.kernels[1];
        combine_kernel<T><<<unsigned(combine.blocks), combine.threads, 0, stream>>>(
            part_o, part_lse, static_cast<T*>(t.o), t.lse, p, plan.splits, rows_all);
        CHECK_LAUNCH();
      }
    });
  });
}

// `flash-steps explain --step 10_decoding`: the splits the heuristic picks on an H200 (132 SMs, 227 KiB
// per block) for the five decoding shapes of notes/10_decoding.md, seqlen_q 1, head_dim 128.
void explain(std::ostream& out) {
  DeviceInfo h200;
  h200.compute_capability = 90;
  h200.sm_count = 132;
  h200.smem_per_block_optin = 227 * KiB;
  const int config = choose_config(128, int64_t(h200.smem_per_block_optin));
  const Config& c = kConfigs[config];
  out << "head_dim 128 runs on the row with BLOCK_KV " << c.block_kv << ", " << c.num_warps << " warps, "
      << c.kv_stages << " stages (" << smem_bytes(c) / KiB << " KiB): " << blocks_per_sm(c, int64_t(h200.smem_per_block_optin))
      << " blocks per SM, so " << 132 * blocks_per_sm(c, int64_t(h200.smem_per_block_optin))
      << " slots on an H200 (132 SMs).\n"
      << "split-KV heuristic (traits.h, num_splits_for), seqlen_q 1:\n";
  const struct { int64_t batch, seqlen_k, heads_q, heads_kv; } shapes[] = {
      {1, 131072, 32, 8}, {8, 32768, 32, 8}, {64, 4096, 32, 8}, {128, 2048, 64, 8}, {16, 16384, 32, 32}};
  for (const auto& s : shapes) {
    DecodeProblem p{};  // the sizes grid_of reads; num_splits 0: the heuristic
    p.attention.batch = s.batch, p.attention.seqlen_q = 1, p.attention.seqlen_k = s.seqlen_k;
    p.attention.heads_q = s.heads_q, p.attention.heads_kv = s.heads_kv, p.attention.head_dim = 128;
    const Grid g = grid_of(p, config, h200);
    out << "  b" << s.batch << " sk" << s.seqlen_k << " h" << s.heads_q << "/" << s.heads_kv << ": " << g.base_blocks
        << " blocks without a split, " << kv_tiles(s.seqlen_k, c.block_kv) << " K/V tiles per sequence -> " << g.splits
        << (g.splits == 1 ? " split" : " splits") << ", " << g.blocks() << " blocks\n";
  }
}

}  // namespace
}  // namespace fs::step10

namespace fs {

void register_step_10_decoding(Registry& r) {
  using namespace step10;
  r.add({.id = "10_decoding",
         .name = "decoding",
         .lesson = "split-KV for a few new tokens against a long KV cache: GQA packing, the keys of a sequence cut "
                   "into splits merged by the LSE rule, per-sequence lengths, a paged cache",
         // The forward entry: a forward problem is the decoding problem of a contiguous cache with every
         // sequence at seqlen_k keys.
         .forward = {[](const Problem& p) { return limits(decode_of(p)); },
                     [](const Problem& p, const DeviceInfo& dev) { return plan(decode_of(p), dev); },
                     [](const Problem& p, const Tensors& t, const Plan& pl, void* workspace, cudaStream_t stream) {
                       launch(decode_of(p), DecodeTensors{t.q, t.k, t.v, nullptr, nullptr, t.o, t.lse}, pl,
                              workspace, stream);
                     },
                     [](const Problem& p, const DeviceInfo& dev) { return claims(decode_of(p), dev); }},
         .decode = {limits, plan, launch, claims},
         .explain = explain});
}

}  // namespace fs
