// Step 02 — online softmax: what it accepts (limits, plan, claims), how it launches the kernel of
// kernel.cuh, and its registration.
#include <algorithm>
#include <string>

#include "common/step/dispatch.h"
#include "common/step/step.h"
#include "steps/02_online_softmax/kernel.cuh"

namespace fs::step02 {
namespace {

// One warp per query row, NUM_WARPS rows per block; (batch, head) pairs along y, looped over past
// 65535. Computed here once, for plan() (Plan::kernels) and launch().
template <class Tr>
dim3 grid_for(const Problem& p) {
  return dim3(unsigned((p.seqlen_q + Tr::NUM_WARPS - 1) / Tr::NUM_WARPS),
              unsigned(std::min<int64_t>(p.batch * p.heads_q, 65535)));
}

template <typename T, int CHUNKS_PER_LANE>
KernelLaunch kernel_launch(const Problem& p) {
  using Tr = Traits<CHUNKS_PER_LANE>;
  const dim3 grid = grid_for<Tr>(p);
  return {reinterpret_cast<const void*>(&online_softmax_kernel<T, CHUNKS_PER_LANE>), Tr::NUM_THREADS, 0,
          int64_t(grid.x) * grid.y};
}

template <typename T, int CHUNKS_PER_LANE>
void launch_for(const Problem& p, const Tensors& t, cudaStream_t stream) {
  using Tr = Traits<CHUNKS_PER_LANE>;
  const dim3 grid = grid_for<Tr>(p);
  online_softmax_kernel<T, CHUNKS_PER_LANE><<<grid, Tr::NUM_THREADS, 0, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse, p);
  CHECK_LAUNCH();
}

// Every problem the harness accepts (head_dim 8..256 in steps of 8, GQA, causal, any seqlens).
std::string limits(const Problem&) { return ""; }
bool claims(const Problem&, const DeviceInfo&) { return true; }

// Plan::config is CHUNKS_PER_LANE: 1 for head_dim <= 128, 2 above.
Plan plan(const Problem& p, const DeviceInfo&) {
  Plan pl;
  pl.config = chunks_per_lane(p.head_dim);
  pl.kernels = {dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return pl.config == 1 ? kernel_launch<T, 1>(p) : kernel_launch<T, 2>(p);
  })};
  return pl;
}

void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (plan.config == 1)
      launch_for<T, 1>(p, t, stream);
    else
      launch_for<T, 2>(p, t, stream);
  });
}

}  // namespace
}  // namespace fs::step02

namespace fs {

void register_step_02_online_softmax(Registry& r) {
  using namespace step02;
  r.add({.id = "02_online_softmax",
         .name = "online softmax",
         .lesson = "one fused kernel: running max and sum over the keys, S never stored (memory O(N·d), not O(N²))",
         .forward = {limits, plan, launch, claims}});
}

}  // namespace fs
