// Step 01 — naive attention: what it accepts (limits, plan, claims), how it launches its three
// kernels (kernel.cuh), and its registration.
#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

#include "common/step/dispatch.h"
#include "common/step/overflow.h"
#include "common/step/step.h"
#include "steps/01_naive/kernel.cuh"

namespace fs::step01 {
namespace {

// Blocks for a grid-stride loop over n items (64-bit n: S can have more than 2^31 elements).
unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + THREADS - 1) / THREADS, 1 << 20)); }

// The grid of each kernel, computed here once for plan() (Plan::kernels) and launch().
struct Grids {
  unsigned scores, softmax, output;
};
Grids grids_for(const Problem& p) {
  return {blocks_for(score_elements(p)), blocks_for(score_rows(p)), blocks_for(output_elements(p))};
}

// Bytes of S, B·H·Sq·Sk·4; nothing when that does not fit in 64 bits (limits() refuses those problems).
std::optional<int64_t> score_bytes(const Problem& p) {
  return checked_product({p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, int64_t(sizeof(float))});
}

std::string limits(const Problem& p) {
  if (score_bytes(p)) return "";
  std::ostringstream m;
  m << "the score matrix S would need batch·heads·seqlen_q·seqlen_k·4 = " << p.batch << "·" << p.heads_q << "·"
    << p.seqlen_q << "·" << p.seqlen_k << "·4 bytes, which overflows 64 bits";
  return m.str();
}

// S is the launch's workspace: B·H·Sq·Sk fp32, which must fit in device memory with 10 % left.
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  const int64_t bytes = *score_bytes(p);  // limits() passed
  const double free_budget = 0.9 * double(dev.free_bytes);
  if (double(bytes) > free_budget) {
    std::ostringstream m;
    m << "the score matrix S needs " << bytes / (1 << 20) << " MiB (batch·heads·seqlen_q·seqlen_k·4 bytes)"
      << " but only " << int64_t(free_budget) / (1 << 20) << " MiB (90 % of free device memory) is available";
    pl.refusal = m.str();
    return pl;
  }
  pl.workspace_bytes = size_t(bytes);
  const Grids g = grids_for(p);
  pl.kernels = dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return std::vector<KernelLaunch>{{reinterpret_cast<const void*>(&scores_kernel<T>), THREADS, 0, g.scores},
                                     {reinterpret_cast<const void*>(&softmax_kernel), THREADS, 0, g.softmax},
                                     {reinterpret_cast<const void*>(&output_kernel<T>), THREADS, 0, g.output}};
  });
  return pl;
}

// Documented support: every problem whose S takes at most half of the free device memory.
bool claims(const Problem& p, const DeviceInfo& dev) {
  const std::optional<int64_t> bytes = score_bytes(p);
  return bytes && double(*bytes) <= 0.5 * double(dev.free_bytes);
}

void launch(const Problem& p, const Tensors& t, const Plan&, void* workspace, cudaStream_t stream) {
  float* s = static_cast<float*>(workspace);
  const Grids g = grids_for(p);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scores_kernel<T><<<g.scores, THREADS, 0, stream>>>(static_cast<const T*>(t.q), static_cast<const T*>(t.k), s, p);
    CHECK_LAUNCH();
    softmax_kernel<<<g.softmax, THREADS, 0, stream>>>(s, t.lse, p);
    CHECK_LAUNCH();
    output_kernel<T><<<g.output, THREADS, 0, stream>>>(s, static_cast<const T*>(t.v), static_cast<T*>(t.o), p);
    CHECK_LAUNCH();
  });
}

}  // namespace
}  // namespace fs::step01

namespace fs {

void register_step_01_naive(Registry& r) {
  using namespace step01;
  r.add({.id = "01_naive",
         .name = "naive attention",
         .lesson = "textbook attention: S = QKᵀ, softmax and P·V as three kernels, S in global memory",
         .forward = {limits, plan, launch, claims},
         .reads_free_memory = true});  // plan() and claims() weigh S against free memory
}

}  // namespace fs
