// Step 07 — registration and launcher of the FlashAttention-2 kernel (flash_attention2.cuh): picks
// the row of the traits table (traits.h) for the problem and this GPU's shared memory, then the
// instantiation for it (flash_attention2_d<width>.cu, one file per tile width).
#include <sstream>
#include <utility>

#include "common/dtype.cuh"
#include "common/registry.h"
#include "traits.h"

namespace fs {
namespace {

std::string limits(const Problem&) { return ""; }  // every head_dim the harness allows runs, padded

// Documented support: every problem the harness accepts, on a GPU whose blocks may opt in to 99 KiB.
bool claims(const Problem&, const DeviceInfo& dev) { return dev.smem_per_block_optin >= 99 * 1024; }

Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = fa2::choose_config(p.head_dim, p.dtype, p.causal != 0, int64_t(dev.smem_per_block_optin));
  if (pl.config < 0) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << fa2::padded_head_dim(p.head_dim)
      << "-wide tiles, which need at least " << fa2::min_smem_bytes(p.head_dim)
      << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const int block_q = fa2::kConfigs[pl.config].block_q;
  const int64_t blocks = fa2::grid_blocks(p, block_q);
  if (blocks > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << block_q << " query rows per batch and head, " << blocks
      << " blocks here, more than the grid limit of " << INT32_MAX;
    pl.refusal = m.str();
  }
  return pl;
}

// launch_config<CONFIG, T> for the run-time index `config`.
template <typename T, int... CONFIGS>
void launch_config_at(int config, const Problem& p, const Tensors& t, cudaStream_t stream,
                      std::integer_sequence<int, CONFIGS...>) {
  ((config == CONFIGS ? fa2::launch_config<CONFIGS, T>(p, t, stream) : void()), ...);
}

void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_config_at<T>(plan.config, p, t, stream, std::make_integer_sequence<int, fa2::kNumConfigs>{});
  });
}

}  // namespace

void register_step_07_flash_attention2(Registry& r) {
  r.add(Step{"07_flash_attention2", "FlashAttention-2",
             "32 query rows per warp, masked tiles apart, cp.async pipeline, coalesced epilogue: production FlashAttention-2",
             "", 80, 0, limits, plan, launch, claims});
}

}  // namespace fs
