// Step 07 — FlashAttention-2 (kernel.cuh): its sub-steps 07a … 07g, one per idea, the row of the
// table (traits.h) each picks for a problem and a GPU, and their launch.
#include <sstream>
#include <utility>

#include "common/step/dispatch.h"
#include "common/step/dtype.cuh"
#include "common/step/step.h"
#include "steps/07_flash_attention2/kernel.cuh"

namespace fs::step07 {
namespace {

template <int IDEAS>
std::string limits(const Problem& p) {
  if (IDEAS < kHeadDimTable && p.head_dim != 64 && p.head_dim != 128) {
    std::ostringstream m;
    m << "head_dim is " << p.head_dim
      << "; this sub-step has tiles for head_dim 64 and 128 only (07g_flash_attention2 adds every head_dim)";
    return m.str();
  }
  return "";
}

// Documented support: head_dim 64 and 128 before 07g, every problem the harness accepts from 07g on,
// on a GPU whose blocks may opt in to 99 KiB (sm_80 and newer).
template <int IDEAS>
bool claims(const Problem& p, const DeviceInfo& dev) {
  return (IDEAS >= kHeadDimTable || p.head_dim == 64 || p.head_dim == 128) && dev.smem_per_block_optin >= 99 * KiB;
}

// The launch of configuration CONFIG: the kernel, its block size and shared memory, and the grid.
template <typename T, int IDEAS, int CONFIG>
KernelLaunch kernel_launch(const Problem& p, dim3& grid) {
  using Tr = TraitsOf<CONFIG, IDEAS>;
  if constexpr (Tr::has(kWorkOrder))
    grid = dim3(unsigned(grid_blocks(p, Tr::BLOCK_Q)));
  else
    grid = dim3(unsigned(query_tiles(p.seqlen_q, Tr::BLOCK_Q)), unsigned(grid_y(p)));
  return KernelLaunch{reinterpret_cast<const void*>(&flash_attention2_kernel<T, Tr>), Tr::NUM_THREADS,
                      size_t(Tr::SMEM_BYTES), int64_t(grid.x) * grid.y};
}

template <int IDEAS>
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = choose_config(IDEAS, p.head_dim, int64_t(dev.smem_per_block_optin));
  if (pl.config < 0) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << padded_head_dim(p.head_dim) << "-wide tiles, which need at least "
      << min_smem_bytes(IDEAS, p.head_dim) << " bytes of shared memory per block; this GPU allows "
      << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const int block_q = kConfigs[pl.config].block_q;
  const int64_t blocks = IDEAS >= kWorkOrder ? grid_blocks(p, block_q) : query_tiles(p.seqlen_q, block_q);
  if (blocks > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << block_q << " query rows"
      << (IDEAS >= kWorkOrder ? " per batch and head, " : ", ") << blocks << " blocks here, more than the grid limit of "
      << INT32_MAX;
    pl.refusal = m.str();
    return pl;
  }
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(pl.config, [&](auto c) {
      if constexpr (has_config(IDEAS, decltype(c)::value)) {
        dim3 grid;
        pl.kernels = {kernel_launch<T, IDEAS, decltype(c)::value>(p, grid)};
      }
    });
  });
  return pl;
}

template <int IDEAS>
void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  const float scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);  // scale · log2(e)
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(plan.config, [&](auto c) {
      if constexpr (has_config(IDEAS, decltype(c)::value)) {
        using Tr = TraitsOf<decltype(c)::value, IDEAS>;
        dim3 grid;
        const KernelLaunch kl = kernel_launch<T, IDEAS, decltype(c)::value>(p, grid);
        auto* kernel = flash_attention2_kernel<T, Tr>;
        CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kl.smem_bytes)));
        // The largest shared-memory carveout (228 of the SM's 256 KiB of L1/shared memory on sm_90), so that
        // two blocks fit (cp.async.cg bypasses L1, so the kernel loses little).
        CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        kernel<<<grid, kl.threads, kl.smem_bytes, stream>>>(static_cast<const T*>(t.q), static_cast<const T*>(t.k),
                                                           static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse, p,
                                                           scale_log2);
        CHECK_LAUNCH();
      }
    });
  });
}

template <int IDEAS>
Step sub_step(const char* id, const char* name, const char* lesson) {
  return {.id = id, .name = name, .lesson = lesson, .forward = {limits<IDEAS>, plan<IDEAS>, launch<IDEAS>, claims<IDEAS>}};
}

}  // namespace
}  // namespace fs::step07

namespace fs {

void register_step_07_flash_attention2(Registry& r) {
  using namespace step07;
  r.add(sub_step<kRows32>("07a_rows32", "FlashAttention-2: 32 rows per warp",
                          "step 06 with 32 query rows per warp (two m16 tiles): each K/V fragment read from "
                          "shared memory feeds two mma"));
  r.add(sub_step<kWorkOrder>("07b_work_order", "FlashAttention-2: work order",
                             "+ masked tiles apart: K/V tiles from the diagonal down, only the masked ones build "
                             "a mask; a 1-D grid"));
  r.add(sub_step<kLdmatrixPipeline>("07c_ldmatrix_pipeline", "FlashAttention-2: ldmatrix pipeline",
                                    "+ ldmatrix double-buffered in registers: the next fragment requested before "
                                    "the current one's mma"));
  r.add(sub_step<kSmemEpilogue>("07d_smem_epilogue", "FlashAttention-2: shared-memory epilogue",
                                "+ O staged through shared memory and stored in 16-byte coalesced chunks"));
  r.add(sub_step<kRescaleSkip>("07e_rescale_skip", "FlashAttention-2: rescale skip",
                               "+ no O rescale in a warp whose row maxima did not grow"));
  r.add(sub_step<kFastExp2>("07f_fast_exp2", "FlashAttention-2: fast exp2",
                            "+ ex2.approx.ftz (one MUFU instruction) instead of exp2f (2 ulp, full range)"));
  r.add(sub_step<kHeadDimTable>("07g_flash_attention2", "FlashAttention-2",
                                "+ every head_dim and GPU (tile table): the FlashAttention-2 forward on mma.sync "
                                "(no varlen, dropout, sliding window, paged KV, split-KV or backward)"));
}

}  // namespace fs
