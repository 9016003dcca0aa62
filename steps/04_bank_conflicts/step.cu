// Step 04 — bank conflicts: what it accepts (limits, plan, claims), how it launches the kernel of
// kernel.cuh, and the registration of its two variants, 04_pad and 04_swizzle.
#include <algorithm>
#include <functional>
#include <ostream>
#include <string>

#include "common/model/bank_report.h"
#include "common/step/dispatch.h"
#include "common/step/step.h"
#include "steps/04_bank_conflicts/kernel.cuh"

namespace fs::step04 {
namespace {

// One block per BLOCK_Q query rows; (batch, head) pairs along y, looped over past 65535. Computed
// here once, for plan() (Plan::kernels) and launch().
template <class Tr>
dim3 grid_for(const Problem& p) {
  return dim3(unsigned((p.seqlen_q + Tr::BLOCK_Q - 1) / Tr::BLOCK_Q),
              unsigned(std::min<int64_t>(p.batch * p.heads_q, 65535)));
}

template <typename T, int HEAD_DIM, template <int> class TileLayout>
KernelLaunch kernel_launch(const Problem& p) {
  using Tr = Traits<HEAD_DIM>;
  const dim3 grid = grid_for<Tr>(p);
  return {reinterpret_cast<const void*>(&smem_tiling_kernel<T, HEAD_DIM, TileLayout>), Tr::NUM_THREADS,
          size_t(Tr::template smem_bytes<TileLayout<HEAD_DIM>>(int(sizeof(T)))), int64_t(grid.x) * grid.y};
}

template <typename T, int HEAD_DIM, template <int> class TileLayout>
void launch_for(const Problem& p, const Tensors& t, cudaStream_t stream) {
  using Tr = Traits<HEAD_DIM>;
  const int smem_bytes = Tr::template smem_bytes<TileLayout<HEAD_DIM>>(int(sizeof(T)));
  const auto kernel = smem_tiling_kernel<T, HEAD_DIM, TileLayout>;
  // Above 48 KB a block must opt in to more dynamic shared memory; plan() checked the limit.
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  const dim3 grid = grid_for<Tr>(p);
  kernel<<<grid, Tr::NUM_THREADS, smem_bytes, stream>>>(static_cast<const T*>(t.q), static_cast<const T*>(t.k),
                                                        static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse, p);
  CHECK_LAUNCH();
}

std::string limits(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    return "head_dim is " + std::to_string(p.head_dim) +
           "; this step handles head_dim 64 and 128 only (each of the 16 threads of a row owns head_dim/16 "
           "columns of O, read as one 8- or 16-byte access)";
  return "";
}

bool claims(const Problem& p, const DeviceInfo&) { return p.head_dim == 64 || p.head_dim == 128; }

// Plan::config is the HEAD_DIM to instantiate: 64 or 128.
template <template <int> class TileLayout>
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = int(p.head_dim);
  pl.kernels = {dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return pl.config == 64 ? kernel_launch<T, 64, TileLayout>(p) : kernel_launch<T, 128, TileLayout>(p);
  })};
  const size_t smem_bytes = pl.kernels[0].smem_bytes;
  if (smem_bytes > dev.smem_per_block_optin)
    pl.refusal = "this step needs " + std::to_string(smem_bytes) + " bytes of shared memory per block for head_dim " +
                 std::to_string(p.head_dim) + "; this GPU allows " + std::to_string(dev.smem_per_block_optin);
  return pl;
}

template <template <int> class TileLayout>
void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (plan.config == 64)
      launch_for<T, 64, TileLayout>(p, t, stream);
    else
      launch_for<T, 128, TileLayout>(p, t, stream);
  });
}

// What `flash-steps banks` prints for this step (Step::explain): the bank conflicts of every shared
// access of the kernel under TileLayout, replayed from traits.h by common/model/bank_report.h.
template <template <int> class TileLayout>
std::function<void(std::ostream&)> bank_report(std::string step, std::string layout) {
  return [=](std::ostream& out) {
    bank::explain_tiling<Traits, TileLayout>(out, {step, layout, "steps/04_bank_conflicts/traits.h"});
  };
}

}  // namespace
}  // namespace fs::step04

namespace fs {

void register_step_04_bank_conflicts(Registry& r) {
  using namespace step04;
  r.add({.id = "04_pad",
         .name = "bank conflicts: padding",
         .lesson = "step 03 with each shared row 16 bytes longer: 8 consecutive K rows start in 8 different bank "
                   "groups, no conflict",
         .forward = {limits, plan<Padded16Layout>, launch<Padded16Layout>, claims},
         .explain = bank_report<Padded16Layout>("04_pad", "padded +16 B per row")});
  r.add({.id = "04_swizzle",
         .name = "bank conflicts: XOR swizzle",
         .lesson = "step 03 with the 16-byte chunks of each shared row XOR-swizzled by row % 8: no conflict, no "
                   "extra memory",
         .forward = {limits, plan<Swizzled128Layout>, launch<Swizzled128Layout>, claims},
         .explain = bank_report<Swizzled128Layout>("04_swizzle", "XOR-swizzled, chunk ^ row % 8")});
}

}  // namespace fs
