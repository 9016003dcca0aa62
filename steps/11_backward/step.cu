// Step 11 — the backward pass (kernel.cuh): what it accepts, its workspace, the row of the table
// (traits.h) it picks, and its launch. It has a backward entry only (Step::backward): the forward
// that produces O and LSE is any forward step's (they share the LSE convention of flash_steps.h).
#include <optional>
#include <sstream>
#include <utility>

#include "common/backward/problem.h"
#include "common/step/dispatch.h"
#include "common/step/overflow.h"
#include "common/step/features.h"
#include "common/step/step.h"
#include "steps/11_backward/kernel.cuh"

namespace fs::step11 {
namespace {

// Row indices are 32-bit inside the kernels and tiles round them up by at most 127.
constexpr int64_t kMaxSeqlen = INT32_MAX - 127;
constexpr double kLog2e = 1.4426950408889634;  // exp(x) = 2^(x·log2(e))

std::string limits(const BackwardProblem& p) {
  for (const auto& [name, len] : {std::pair{"seqlen_q", p.attention.seqlen_q}, std::pair{"seqlen_k", p.attention.seqlen_k}})
    if (len > kMaxSeqlen) {
      std::ostringstream m;
      m << name << " is " << len << "; this step counts rows in 32-bit integers, rounded up to whole tiles, and runs "
        << "seqlens up to " << kMaxSeqlen;
      return m.str();
    }
  return "";
}

// The kernels of one launch, in order, with their grids: preprocess, the main kernel, then convert_dq
// (atomic dQ) or dq_kernel (deterministic).
template <typename T, int CONFIG, bool SOFTCAP, bool WINDOW, bool VARLEN>
std::vector<KernelLaunch> kernels_of(const BackwardProblem& p, const Workspace& w) {
  using Tr = TraitsOf<CONFIG>;
  using DqTr = DqTraitsOf<CONFIG>;
  static_assert(main_smem_bytes(kConfigs[CONFIG]) == Tr::SMEM_BYTES && dq_smem_bytes(kConfigs[CONFIG]) == DqTr::SMEM_BYTES,
                "the table's byte counts (choose_config) are what the kernels allocate");
  const Problem& f = p.attention;
  std::vector<KernelLaunch> k;
  k.push_back({reinterpret_cast<const void*>(&preprocess_kernel<T, VARLEN>), kPreprocessWarps * 32, 0,
               tiles(w.rows, kPreprocessWarps)});
  const int64_t main_blocks = tiles(f.seqlen_k, Tr::BLOCK_KV) * Tr::D_SLICES * f.batch * f.heads_kv;
  if (p.deterministic) {
    k.push_back({reinterpret_cast<const void*>(&backward_kernel<T, Tr, false, SOFTCAP, WINDOW, VARLEN>), Tr::NUM_THREADS,
                 size_t(Tr::SMEM_BYTES), main_blocks});
    k.push_back({reinterpret_cast<const void*>(&dq_kernel<T, DqTr, SOFTCAP, WINDOW, VARLEN>), DqTr::NUM_THREADS, size_t(DqTr::SMEM_BYTES),
                 tiles(f.seqlen_q, DqTr::BLOCK_Q) * DqTr::D_SLICES * f.batch * f.heads_q});
  } else {
    k.push_back({reinterpret_cast<const void*>(&backward_kernel<T, Tr, true, SOFTCAP, WINDOW, VARLEN>), Tr::NUM_THREADS,
                 size_t(Tr::SMEM_BYTES), main_blocks});
    k.push_back({reinterpret_cast<const void*>(&convert_dq_kernel<T, Tr::HEAD_DIM, VARLEN>), kConvertThreads, 0,
                 tiles(f.batch * f.heads_q * f.seqlen_q * (f.head_dim / 8), kConvertThreads)});
  }
  return k;
}

Plan plan(const BackwardProblem& p, const DeviceInfo& dev) {
  Plan pl;
  const bool deterministic = p.deterministic != 0;
  pl.config = choose_config(p.attention.head_dim, deterministic, int64_t(dev.smem_per_block_optin));
  std::ostringstream m;
  if (pl.config < 0) {
    m << "head_dim " << p.attention.head_dim << " runs on " << padded_width(p.attention.head_dim)
      << "-wide tiles, which need at least " << min_smem_needed(p.attention.head_dim, deterministic)
      << " bytes of shared memory per block" << (deterministic ? " in the deterministic mode" : "")
      << "; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const std::optional<Workspace> w = workspace_of(p.attention, p.deterministic, kConfigs[pl.config].head_dim);
  if (!w) {
    m << "the workspace of batch " << p.attention.batch << " · heads_q " << p.attention.heads_q << " · seqlen_q "
      << p.attention.seqlen_q << " rows does not fit in 64-bit byte counts";
    pl.refusal = m.str();
    return pl;
  }
  pl.workspace_bytes = size_t(w->bytes);
  dispatch_dtype(p.attention.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(pl.config, [&](auto c) {
      with_packed_features(p.attention, [&](auto capped, auto windowed, auto packed) {
        pl.kernels = kernels_of<T, decltype(c)::value, decltype(capped)::value, decltype(windowed)::value,
                                decltype(packed)::value>(p, *w);
      });
    });
  });
  for (const KernelLaunch& k : pl.kernels)
    if (k.blocks > INT32_MAX) {
      m << "this problem needs " << k.blocks << " blocks in one of the backward's grids, more than the grid limit of "
        << INT32_MAX;
      pl.refusal = m.str();
      pl.kernels.clear();
      return pl;
    }
  return pl;
}

// Documented support: every problem the harness accepts with seqlens up to kMaxSeqlen, on a GPU whose
// blocks may opt in to 96 KiB (the largest of the smallest rows of each width; every GPU from sm_80 on
// allows at least 99 KiB), as long as the grids stay within 2^31 - 1 blocks: at most 2^33 padded query rows (the preprocessing's
// grid, the largest of the query side) and 2^31 / 4 K/V blocks.
bool claims(const BackwardProblem& p, const DeviceInfo& dev) {
  const Problem& f = p.attention;
  return limits(p).empty() &&
         choose_config(f.head_dim, p.deterministic != 0, int64_t(dev.smem_per_block_optin)) >= 0 &&
         f.batch * f.heads_q <= (int64_t(1) << 33) / padded_rows(f.seqlen_q) &&
         f.batch * f.heads_kv <= INT32_MAX / 4 / tiles(f.seqlen_k, 64);
}

// The kernels of the plan, in its order, for dtype T, tile row CONFIG, SOFTCAP, WINDOW and VARLEN.
template <typename T, int CONFIG, bool SOFTCAP, bool WINDOW, bool VARLEN>
void launch_config(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, const Workspace& w,
                   char* base, cudaStream_t stream) {
  using Tr = TraitsOf<CONFIG>;
  using DqTr = DqTraitsOf<CONFIG>;
  float* lse2 = reinterpret_cast<float*>(base + w.lse2);
  float* d_rows = reinterpret_cast<float*>(base + w.d_rows);
  float* dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
  const float scale_log2 = float(double(logit_scale(p.attention)) * kLog2e);  // softcap·log2(e) when capped
  const Softcap cap = softcap_of(p.attention);
  const KernelLaunch& pre = plan.kernels.at(0);
  const KernelLaunch& main = plan.kernels.at(1);
  const KernelLaunch& dq = plan.kernels.at(2);
  const T* q = static_cast<const T*>(t.q);
  const T* k = static_cast<const T*>(t.k);
  const T* v = static_cast<const T*>(t.v);
  const T* d_o = static_cast<const T*>(t.d_o);
  if (!p.deterministic) CHECK_CUDA(cudaMemsetAsync(dq_accum, 0, size_t(w.bytes - w.dq_accum), stream));
  preprocess_kernel<T, VARLEN><<<unsigned(pre.blocks), pre.threads, 0, stream>>>(static_cast<const T*>(t.o), d_o,
                                                                                  t.lse, lse2, d_rows, p);
  CHECK_LAUNCH();
  auto run_main = [&](auto atomic) {
    auto* kernel = backward_kernel<T, Tr, decltype(atomic)::value, SOFTCAP, WINDOW, VARLEN>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(main.smem_bytes)));
    kernel<<<unsigned(main.blocks), main.threads, main.smem_bytes, stream>>>(
        q, k, v, d_o, static_cast<T*>(t.dk), static_cast<T*>(t.dv), dq_accum, lse2, d_rows, p, scale_log2, cap);
    CHECK_LAUNCH();
  };
  if (p.deterministic) {
    run_main(std::false_type{});
    auto* kernel = dq_kernel<T, DqTr, SOFTCAP, WINDOW, VARLEN>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq.smem_bytes)));
    kernel<<<unsigned(dq.blocks), dq.threads, dq.smem_bytes, stream>>>(q, k, v, d_o, static_cast<T*>(t.dq), lse2,
                                                                       d_rows, p, scale_log2, cap);
    CHECK_LAUNCH();
  } else {
    run_main(std::true_type{});
    convert_dq_kernel<T, Tr::HEAD_DIM, VARLEN><<<unsigned(dq.blocks), dq.threads, 0, stream>>>(dq_accum, static_cast<T*>(t.dq), p);
    CHECK_LAUNCH();
  }
}

void launch(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, void* workspace,
            cudaStream_t stream) {
  const Workspace w = *workspace_of(p.attention, p.deterministic, kConfigs[plan.config].head_dim);
  dispatch_dtype(p.attention.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(plan.config, [&](auto c) {
      with_packed_features(p.attention, [&](auto capped, auto windowed, auto packed) {
        launch_config<T, decltype(c)::value, decltype(capped)::value, decltype(windowed)::value,
                      decltype(packed)::value>(p, t, plan, w, static_cast<char*>(workspace), stream);
      });
    });
  });
}

}  // namespace
}  // namespace fs::step11

namespace fs {

void register_step_11_backward(Registry& r) {
  using namespace step11;
  r.add({.id = "11_backward",
         .name = "FlashAttention-2 backward",
         .lesson = "dQ, dK, dV without storing P: P recomputed from the forward's LSE, blocks own K/V tiles and loop "
                   "over queries, dQ summed with fp32 atomics (or, deterministic, by a second kernel that owns query "
                   "rows)",
         .backward = {limits, plan, launch, claims},
         .softcap = true,
         .window = true,
         .varlen = true});
}

}  // namespace fs
