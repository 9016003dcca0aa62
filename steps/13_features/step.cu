// Step 13 — the production features (kernel.cuh), forward and backward in one step: the host code of
// step 09f (forward) and step 12c (backward) as those steps have it, except that each launch picks the
// kernel instantiation with or without the features the problem asks for (with_packed_features), and that a
// window picks the tiles and schedule step 09 gives causal masking. Diff the forward part against
// steps/09_warp_specialized/step.cu and the backward part against steps/12_hopper_backward/step.cu.
// The sub-steps 13a and 13b share these functions: the harness refuses a window to 13a (Step::window).
#include <algorithm>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/backward/problem.h"
#include "common/step/dispatch.h"
#include "common/step/features.h"
#include "common/step/step.h"
#include "common/step/tensor_map.h"
#include "steps/13_features/kernel.cuh"

namespace fs::step13 {
namespace {

constexpr double kLog2e = 1.4426950408889634;  // exp(x) = 2^(x·log2(e))

// ==== the forward: step 09f's host code ==========================================================
namespace fwd {
using namespace forward_pass;

std::string limits(const Problem& p) {
  const Problem m = dense_view(p);  // what the tensor maps see (13c: the packed rows)
  std::string why = check_tma_strides("Q", p.q, m.seqlen_q, p.heads_q, m.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("K", p.k, m.seqlen_k, p.heads_kv, m.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("V", p.v, m.seqlen_k, p.heads_kv, m.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("O", p.o, m.seqlen_q, p.heads_q, m.batch, kMaxTmaStrideBytes);
  return why;
}

constexpr int max_smem_bytes() {
  int most = 0;
  for (int i = 0; i < kNumConfigs; ++i)
    if (has_config(kForwardIdeas, i) && smem_bytes(kConfigs[i]) > most) most = smem_bytes(kConfigs[i]);
  return most;
}

// Step 09's row of the tile table. A window is a band like causal masking's: 13b gives it the same
// square tiles (fewer keys masked at the band's two edges) without 09's test of causal padding; so does
// 13c a packed batch, whose sequences' masks are bands.
int forward_config(const Problem& p) {
  return p.window || is_varlen(p) ? choose_config(kForwardIdeas, p.head_dim, true) : config_for(kForwardIdeas, p);
}

bool claims(const Problem& p, const DeviceInfo& dev) {
  const int config = forward_config(p);
  if (config < 0 || config >= kNumConfigs) return false;
  return dev.compute_capability == 90 && dev.smem_per_block_optin >= size_t(max_smem_bytes()) && limits(p).empty() &&
         grid_blocks(p, block_q(kConfigs[config].consumers)) <= INT32_MAX;
}

template <class Tr>
struct TraitsTag {
  using type = Tr;
};

// 09f's traits, or with causal masking 09e's (a block per tile, no persistent loop), as step 09 picks; a
// window too, whose first query tiles see fewer keys than the others, and a packed batch (13c), whose
// grid holds a block for every tile a sequence as long as the bound would have.
template <class F>
void with_traits(const Problem& p, int config, F&& f) {
  with_config<kNumConfigs>(config, [&](auto c) {
    constexpr int CONFIG = decltype(c)::value;
    if constexpr (has_config(kForwardIdeas, CONFIG)) {
      if (p.causal || p.window || is_varlen(p)) return f(TraitsTag<TraitsOf<CONFIG, kThreeConsumers>>{});
      f(TraitsTag<TraitsOf<CONFIG, kForwardIdeas>>{});
    }
  });
}

// The kernel for the problem's features. A packed batch only ever comes with one block per tile
// (with_traits); the persistent traits have no packed kernel, and reaching them with one is a bug.
template <typename T, class Tr>
auto* kernel_of(const Problem& p) {
  using Kernel = decltype(&forward_kernel<T, Tr, false, false, false>);
  return with_packed_features(p, [&](auto capped, auto windowed, auto packed) -> Kernel {
    constexpr bool SOFTCAP = decltype(capped)::value, WINDOW = decltype(windowed)::value;
    if constexpr (decltype(packed)::value && Tr::has(kPersistent)) {
      throw Error("13c: a packed batch reached the persistent forward, which has no packed kernel (a bug)");
    } else {
      return &forward_kernel<T, Tr, SOFTCAP, WINDOW, decltype(packed)::value>;
    }
  });
}

Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = forward_config(p);
  const int smem = smem_bytes(kConfigs[pl.config]), rows = block_q(kConfigs[pl.config].consumers);
  if (dev.smem_per_block_optin < size_t(smem)) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << padded_head_dim(p.head_dim) << "-wide tiles of "
      << kConfigs[pl.config].block_kv << " keys, which need " << smem
      << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const int64_t tiles = grid_blocks(p, rows);
  if (tiles > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << rows << " query rows per batch and head, " << tiles
      << " blocks here, more than the grid limit of " << INT32_MAX;
    pl.refusal = m.str();
    return pl;
  }
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_traits(p, pl.config, [&](auto tr) {
      using Tr = typename decltype(tr)::type;
      const int64_t blocks = Tr::has(kPersistent) ? persistent_blocks(tiles, dev.sm_count > 0 ? dev.sm_count : 1) : tiles;
      pl.kernels = {KernelLaunch{reinterpret_cast<const void*>(kernel_of<T, Tr>(p)), Tr::NUM_THREADS,
                                 size_t(Tr::SMEM_BYTES), blocks}};
    });
  });
  return pl;
}

void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  const float scale_log2 = float(double(logit_scale(p)) * kLog2e);  // softcap·log2(e) when capped
  const Softcap cap = softcap_of(p);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const CUtensorMapDataType type =
        std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    with_traits(p, plan.config, [&](auto tr) {
      using Tr = typename decltype(tr)::type;
      const Problem m = dense_view(p);  // what the tensor maps see (13c: the packed rows)
      const CUtensorMap q_map = make_tensor_map(
          "Q", t.q, type, tensor_map_shape(p.q, m.seqlen_q, p.heads_q, m.batch, p.head_dim, Tr::BLOCK_Q));
      const CUtensorMap k_map = make_tensor_map(
          "K", t.k, type, tensor_map_shape(p.k, m.seqlen_k, p.heads_kv, m.batch, p.head_dim, Tr::BLOCK_KV));
      const CUtensorMap v_map = make_tensor_map(
          "V", t.v, type, tensor_map_shape(p.v, m.seqlen_k, p.heads_kv, m.batch, p.head_dim, Tr::BLOCK_KV));
      const CUtensorMap o_map = make_tensor_map(
          "O", t.o, type, tensor_map_shape(p.o, m.seqlen_q, p.heads_q, m.batch, p.head_dim, ROWS_PER_WARPGROUP));
      auto* kernel = kernel_of<T, Tr>(p);
      CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::SMEM_BYTES));
      kernel<<<unsigned(plan.kernels.front().blocks), Tr::NUM_THREADS, Tr::SMEM_BYTES, stream>>>(
          q_map, k_map, v_map, o_map, t.lse, p, scale_log2, cap, static_cast<T*>(t.o));
      CHECK_LAUNCH();
    });
  });
}

}  // namespace fwd

// ==== the backward: step 12c's host code =========================================================
namespace bwd {
using namespace backward_pass;
using step11::Workspace;
using step11::workspace_of;

constexpr int64_t kMaxSeqlen = INT32_MAX - 127;  // 32-bit rows, rounded up to whole tiles (step 11)
using DqTr = step11::DqTraits<128, 1, 64, 64>;   // step 11's deterministic dQ kernel, 128-wide tiles
using DqTr64 = step11::DqTraits<64, 1, 64, 64>;  // ... and 64-wide

std::string limits(const BackwardProblem& p) {
  const Problem& f = p.attention;
  if (config_for(f.head_dim) < 0) {
    std::ostringstream m;
    m << "head_dim " << f.head_dim << " is above 128: this step keeps dK and dV of 64 keys × head_dim in each "
      << "warpgroup's registers, which hold up to 128 columns (step 11_backward runs every head_dim up to 256, "
      << "softcapping, windows and packed batches too)";
    return m.str();
  }
  for (const auto& [name, len] : {std::pair{"seqlen_q", f.seqlen_q}, std::pair{"seqlen_k", f.seqlen_k}})
    if (len > kMaxSeqlen) {
      std::ostringstream m;
      m << name << " is " << len << "; this step counts rows in 32-bit integers, rounded up to whole tiles, and runs "
        << "seqlens up to " << kMaxSeqlen;
      return m.str();
    }
  const Problem m = dense_view(f);  // what the tensor maps see (13c: the packed rows)
  std::string why = check_tma_strides("Q", f.q, m.seqlen_q, f.heads_q, m.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("K", f.k, m.seqlen_k, f.heads_kv, m.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("V", f.v, m.seqlen_k, f.heads_kv, m.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("dO", p.d_o, m.seqlen_q, f.heads_q, m.batch, step08::kMaxTmaStrideBytes);
  return why;
}

constexpr int max_smem_bytes() {
  int most = 0;
  for (const Config& c : kConfigs) most = smem_bytes(c, kBackwardIdeas) > most ? smem_bytes(c, kBackwardIdeas) : most;
  return most > DqTr::SMEM_BYTES ? most : DqTr::SMEM_BYTES;
}

template <typename T, int CONFIG, bool SOFTCAP, bool WINDOW, bool VARLEN>
std::vector<KernelLaunch> kernels_of(const BackwardProblem& p, const Workspace& w) {
  constexpr Config c = kConfigs[CONFIG];
  using Dq = std::conditional_t<c.head_dim == 64, DqTr64, DqTr>;
  const Problem& f = p.attention;
  std::vector<KernelLaunch> k;
  k.push_back({reinterpret_cast<const void*>(&step11::preprocess_kernel<T, VARLEN>), step11::kPreprocessWarps * 32, 0,
               step11::tiles(w.rows, step11::kPreprocessWarps)});
  const void* main =
      p.deterministic
          ? reinterpret_cast<const void*>(&backward_kernel<T, c.head_dim, c.block_q, false, SOFTCAP, WINDOW, VARLEN>)
          : reinterpret_cast<const void*>(&backward_kernel<T, c.head_dim, c.block_q, true, SOFTCAP, WINDOW, VARLEN>);
  k.push_back({main, NUM_THREADS, size_t(smem_bytes(c, kBackwardIdeas)), grid_blocks(f)});
  if (p.deterministic)
    k.push_back({reinterpret_cast<const void*>(&step11::dq_kernel<T, Dq, SOFTCAP, WINDOW, VARLEN>), Dq::NUM_THREADS,
                 size_t(Dq::SMEM_BYTES), step11::tiles(f.seqlen_q, Dq::BLOCK_Q) * f.batch * f.heads_q});
  else  // 12c's conversion: every padded row of the accumulator
    k.push_back({reinterpret_cast<const void*>(&convert_dq_tiles_kernel<T, c.head_dim, c.block_q, VARLEN>),
                 step11::kConvertThreads, 0, step11::tiles(w.rows * (c.head_dim / 8), step11::kConvertThreads)});
  return k;
}

Plan plan(const BackwardProblem& p, const DeviceInfo& dev) {
  Plan pl;
  std::ostringstream m;
  pl.config = config_for(p.attention.head_dim);
  const int smem = smem_bytes(kConfigs[pl.config], kBackwardIdeas);
  if (dev.smem_per_block_optin < size_t(max_smem_bytes())) {
    m << "head_dim " << p.attention.head_dim << " runs on " << kConfigs[pl.config].head_dim
      << "-wide tiles, which need " << (smem > DqTr::SMEM_BYTES ? smem : DqTr::SMEM_BYTES)
      << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
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

bool claims(const BackwardProblem& p, const DeviceInfo& dev) {
  const Problem& f = p.attention;
  return dev.compute_capability == 90 && dev.smem_per_block_optin >= size_t(max_smem_bytes()) && limits(p).empty() &&
         f.batch * f.heads_q <= (int64_t(1) << 33) / step11::padded_rows(f.seqlen_q) &&
         f.batch * f.heads_kv <= INT32_MAX / 4 / step11::tiles(f.seqlen_k, 64);
}

template <typename T, int CONFIG, bool SOFTCAP, bool WINDOW, bool VARLEN>
void launch_config(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, const Workspace& w,
                   char* base, cudaStream_t stream) {
  constexpr Config c = kConfigs[CONFIG];
  using Dq = std::conditional_t<c.head_dim == 64, DqTr64, DqTr>;
  const Problem& f = p.attention;
  float* lse2 = reinterpret_cast<float*>(base + w.lse2);
  float* d_rows = reinterpret_cast<float*>(base + w.d_rows);
  float* dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
  const float scale_log2 = float(double(logit_scale(f)) * kLog2e);  // softcap·log2(e) when capped
  const Softcap cap = softcap_of(f);
  const KernelLaunch& pre = plan.kernels.at(0);
  const KernelLaunch& main = plan.kernels.at(1);
  const KernelLaunch& dq = plan.kernels.at(2);
  const T* q = static_cast<const T*>(t.q);
  const T* k = static_cast<const T*>(t.k);
  const T* v = static_cast<const T*>(t.v);
  const T* d_o = static_cast<const T*>(t.d_o);

  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const Problem m = dense_view(f);  // what the tensor maps see (13c: the packed rows)
  using step08::tensor_map_shape;
  const CUtensorMap q_map =
      make_tensor_map("Q", q, type, tensor_map_shape(f.q, m.seqlen_q, f.heads_q, m.batch, f.head_dim, c.block_q));
  const CUtensorMap do_map =
      make_tensor_map("dO", d_o, type, tensor_map_shape(p.d_o, m.seqlen_q, f.heads_q, m.batch, f.head_dim, c.block_q));
  const CUtensorMap k_map =
      make_tensor_map("K", k, type, tensor_map_shape(f.k, m.seqlen_k, f.heads_kv, m.batch, f.head_dim, BLOCK_KV));
  const CUtensorMap v_map =
      make_tensor_map("V", v, type, tensor_map_shape(f.v, m.seqlen_k, f.heads_kv, m.batch, f.head_dim, BLOCK_KV));

  if (!p.deterministic) CHECK_CUDA(cudaMemsetAsync(dq_accum, 0, size_t(w.bytes - w.dq_accum), stream));
  step11::preprocess_kernel<T, VARLEN>
      <<<unsigned(pre.blocks), pre.threads, 0, stream>>>(static_cast<const T*>(t.o), d_o, t.lse, lse2, d_rows, p);
  CHECK_LAUNCH();
  auto run_main = [&](auto atomic) {
    auto* kernel = backward_kernel<T, c.head_dim, c.block_q, decltype(atomic)::value, SOFTCAP, WINDOW, VARLEN>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(main.smem_bytes)));
    kernel<<<unsigned(main.blocks), main.threads, main.smem_bytes, stream>>>(
        q_map, k_map, v_map, do_map, static_cast<T*>(t.dk), static_cast<T*>(t.dv), dq_accum, lse2, d_rows, p,
        scale_log2, cap);
    CHECK_LAUNCH();
  };
  if (p.deterministic) {
    run_main(std::false_type{});
    auto* kernel = step11::dq_kernel<T, Dq, SOFTCAP, WINDOW, VARLEN>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq.smem_bytes)));
    kernel<<<unsigned(dq.blocks), dq.threads, dq.smem_bytes, stream>>>(q, k, v, d_o, static_cast<T*>(t.dq), lse2,
                                                                       d_rows, p, scale_log2, cap);
    CHECK_LAUNCH();
  } else {
    run_main(std::true_type{});
    convert_dq_tiles_kernel<T, c.head_dim, c.block_q, VARLEN>
        <<<unsigned(dq.blocks), dq.threads, 0, stream>>>(dq_accum, static_cast<T*>(t.dq), p);
    CHECK_LAUNCH();
  }
}

void launch(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, void* workspace,
            cudaStream_t stream) {
  const Workspace w = *workspace_of(p.attention, p.deterministic, kConfigs[plan.config].head_dim);
  dispatch_dtype(p.attention.dtype, [&](auto tag) {
    with_config<kNumConfigs>(plan.config, [&](auto c) {
      with_packed_features(p.attention, [&](auto capped, auto windowed, auto packed) {
        launch_config<typename decltype(tag)::type, decltype(c)::value, decltype(capped)::value,
                      decltype(windowed)::value, decltype(packed)::value>(p, t, plan, w,
                                                                          static_cast<char*>(workspace), stream);
      });
    });
  });
}

}  // namespace bwd

void explain(std::ostream& out) {
  fs_problem p{};
  p.softmax_scale = 0.125f;  // head_dim 64
  p.softcap = 30.0f;
  out << "13a softcapping: each raw score s becomes t = tanh(s·pre) where it sits in registers (one FMUL, one\n"
         "MUFU.TANH beside the softmax's one MUFU.EX2), and softcap replaces the scale in the exponent's factor\n"
         "and the LSE: the logit is softcap·t. The softmax and the masks are unchanged.\n"
         "  head_dim 64 (scale 1/8), softcap 30: pre = scale / softcap = "
      << softcap_of(p).pre << ", exponent factor softcap·log2(e) = " << logit_scale(p) * kLog2e
      << " (uncapped: scale·log2(e) = " << p.softmax_scale * kLog2e << ")\n"
         "  forward  (step 09f's kernel): s_acc[i] = tanh(s_acc[i]·pre) after S = Q·Kᵀ, before the masks and row max\n"
         "  backward (step 12c's kernel): P from t, then s_acc keeps P·(1 - t²), the slope that\n"
         "           dSᵀ = Pᵀ ∘ (dPᵀ - D) ∘ (1 - t²) needs; the deterministic mode's dQ kernel (step 11) the same\n";
}

// 13b: what the forward visits for one head of a problem, from kv_span, the function the kernel calls.
struct Visits {
  int block_q, block_kv, q_tiles = 0, kv_tiles = 0, visited = 0, masked = 0;
  double pairs = 0;               // (row, key) pairs visible
  std::vector<std::string> rows{};  // per query tile, per K/V tile: '.' skipped, 'M' masked, 'F' full
  // The share of the scores the visited tiles compute that are visible: the rest is masked or padding.
  double useful() const { return visited ? pairs / (double(visited) * block_q * block_kv) : 0; }
};
Visits visits_of(const fs_problem& p) {
  const Band band = band_of(p);
  const step09::Config c = step09::kConfigs[fwd::forward_config(p)];
  Visits v{.block_q = step09::block_q(c.consumers), .block_kv = c.block_kv};
  v.q_tiles = int((p.seqlen_q + v.block_q - 1) / v.block_q), v.kv_tiles = int((p.seqlen_k + v.block_kv - 1) / v.block_kv);
  for (int qt = 0; qt < v.q_tiles; ++qt) {
    const int64_t q0 = int64_t(qt) * v.block_q;
    const KvSpan span = kv_span(band, q0, std::min<int64_t>(v.block_q, p.seqlen_q - q0), v.block_kv);
    std::string row(size_t(v.kv_tiles), '.');
    for (int k = 0; k < span.count; ++k) {  // visit k reads tile first + count - 1 - k
      const bool mask = k < span.masked_top || k >= span.count - span.masked_bottom;
      row[size_t(span.first + span.count - 1 - k)] = mask ? 'M' : 'F';
      v.visited += 1, v.masked += mask;
    }
    v.rows.push_back(row);
  }
  v.pairs = visible_pairs(band, p.seqlen_q);
  return v;
}

std::string percent(double share) {  // "89.1 %", without touching the stream's own format
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << share * 100 << " %";
  return s.str();
}

fs_problem window_problem(int64_t seqlen, int64_t head_dim, bool causal, int left, int right) {
  fs_problem p{};
  p.batch = p.heads_q = p.heads_kv = 1, p.seqlen_q = p.seqlen_k = seqlen, p.head_dim = head_dim, p.causal = causal;
  if (left >= -1) p.window = 1, p.window_left = left, p.window_right = right;  // left < -1: no window
  return p;
}

// 13b: the tile maps of three bands at seqlen 2048, head_dim 128 (the tiles fwd::plan picks; note 13's
// picture, which bench/figures.py draws from these lines), then the share of the computed scores that
// are visible at the shapes bench/window_sweep.sh times: what the masked and padded edges cost.
void explain_window(std::ostream& out) {
  out << "13b sliding window: row i sees the keys j with i + shift - left <= j <= i + shift + right (shift =\n"
         "seqlen_k - seqlen_q; -1 unbounded; causal is (-1, 0)). Both ends grow with i, so a query tile's keys are\n"
         "one run of K/V tiles: the forward visits only those, the last down, and masks only the visits at\n"
         "the run's two ends (kv_span); the backward's K/V tiles visit only the query tiles that see them (q_span).\n"
         "Tile maps ('.' skipped, 'M' masked, 'F' full: no mask):\n";
  struct Mask {
    bool causal;
    int left, right;  // window (left, right), or none when left < -1
  };
  for (const Mask& b : {Mask{true, -2, 0}, Mask{true, 512, 0}, Mask{false, 256, 256}}) {
    const fs_problem p = window_problem(2048, 128, b.causal, b.left, b.right);
    const Visits v = visits_of(p);
    out << "map seqlen_q=" << p.seqlen_q << " seqlen_k=" << p.seqlen_k << " block_q=" << v.block_q
        << " block_kv=" << v.block_kv << " causal=" << p.causal << " window=";
    if (p.window)
      out << p.window_left << "," << p.window_right << "\n";
    else
      out << "off\n";
    for (int qt = 0; qt < v.q_tiles; ++qt) out << "q" << (qt < 10 ? "0" : "") << qt << " " << v.rows[size_t(qt)] << "\n";
    out << "  " << v.visited << " of " << v.q_tiles * v.kv_tiles << " tiles visited, " << v.masked
        << " of them masked; " << int64_t(v.pairs) * 100 / (p.seqlen_q * p.seqlen_k) << " % of the (row, key) pairs visible, "
        << int(v.useful() * 100 + 0.5) << " % of the computed scores\n";
  }
  out << "\nSeqlen 16384, one head: tiles visited (masked) and the share of their scores that are visible\n"
         "  head_dim  band                 tiles      visible / computed\n";
  for (const int64_t d : {64, 128})
    for (const Mask& b : {Mask{false, -2, 0}, Mask{true, -2, 0}, Mask{true, 1024, 0}, Mask{true, 4096, 0},
                           Mask{false, 512, 512}}) {
      const Visits v = visits_of(window_problem(16384, d, b.causal, b.left, b.right));
      std::ostringstream band;
      band << (b.causal ? "causal" : "full") << (b.left >= -1 ? " (" + std::to_string(b.left) + ", " +
                                                                    std::to_string(b.right) + ")" : std::string());
      out << "  " << std::setw(8) << d << "  " << std::left << std::setw(19) << band.str() << std::right
          << std::setw(6) << v.visited << " (" << v.masked << ")" << std::setw(12) << percent(v.useful()) << "\n";
    }
}

// 13c: which block of the padded batch's grid takes which rows of which sequence, for the forward's
// query tiles (head_dim 128) and the backward's K/V tiles, on five sequences of lengths 300, 0, 1, 700
// and 129; then, for 64 lengths drawn between 128 and 8192, how many blocks find a tile.
void explain_varlen(std::ostream& out) {
  out << "13c variable-length batches: sequences packed one after another into one (total, heads, head_dim)\n"
         "tensor, sequence b at rows cu_seqlens[b] ... cu_seqlens[b + 1] - 1 (causal and the window per sequence).\n"
         "The grid is the padded batch's, tiles x batch x heads blocks (tiles = tiles_of(max_seqlen)): the\n"
         "tiles of one (sequence, head) are neighbours, as in the dense kernels, and a block whose sequence has\n"
         "no tile j exits at once. No tile spans two sequences; a sequence shorter than the longest costs one\n"
         "empty block per tile it lacks. The forward counts its query tiles from each sequence's end (the last\n"
         "tile, which sees the most keys under causal masking, starts first), the backward its K/V tiles from\n"
         "the start.\n";
  const std::vector<int64_t> lengths = {300, 0, 1, 700, 129};
  const fs_problem p = window_problem(700, 128, true, -1, 0);  // a band, as a packed batch takes
  const int64_t block_q = step09::block_q(step09::kConfigs[fwd::forward_config(p)].consumers);
  for (const auto& [pass, block, from_end] :
       {std::tuple{"forward, query tiles", block_q, true}, std::tuple{"backward, K/V tiles", int64_t(128), false}}) {
    out << "\n" << pass << " of " << block << " rows (one head); a cell is the rows of the sequence the block\n"
        << "of row j takes, '-' an empty block:\n       ";
    int64_t max_len = 0, working = 0, launched = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      out << std::setw(13) << ("seq" + std::to_string(b) + " (" + std::to_string(lengths[b]) + ")");
      max_len = std::max(max_len, lengths[b]);
    }
    out << "\n";
    for (int64_t j = 0; j < tiles_of(max_len, block); ++j) {
      out << "  j=" << j << "  ";
      for (const int64_t len : lengths) {
        const int64_t tiles = tiles_of(len, block), t = from_end ? tiles - 1 - j : j;
        std::string cell = "-";
        if (j < tiles) {
          const int64_t r0 = t * block, r1 = std::min(len, r0 + block) - 1;
          cell = std::to_string(r0) + "-" + std::to_string(r1);
          working += 1;
        }
        launched += 1;
        out << std::setw(13) << cell;
      }
      out << "\n";
    }
    out << "  " << working << " of " << launched << " blocks have a tile\n";
  }
  // 64 lengths from a fixed linear congruential generator, uniform in [128, 8192] (bench/varlen_bench.py
  // draws its own with Python's random; the shares are alike).
  uint64_t state = 1;
  std::vector<int64_t> drawn;
  for (int i = 0; i < 64; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    drawn.push_back(128 + int64_t((state >> 33) % (8192 - 128 + 1)));
  }
  const int64_t longest = *std::max_element(drawn.begin(), drawn.end());
  int64_t tiles = 0, rows = 0;
  for (const int64_t len : drawn) tiles += tiles_of(len, block_q), rows += len;
  out << "\n64 lengths between 128 and 8192 (sum " << rows << ", longest " << longest << "), forward tiles of "
      << block_q << " rows:\n  " << tiles << " of " << tiles_of(longest, block_q) * 64 << " blocks per head have a tile ("
      << percent(double(tiles) / double(tiles_of(longest, block_q) * 64)) << "); their rows are "
      << percent(double(rows) / double(tiles * block_q)) << " real (the rest past a sequence's end)\n";
}

}  // namespace
}  // namespace fs::step13

namespace fs {

void register_step_13_features(Registry& r) {
  using namespace step13;
  r.add({.id = "13a_softcap",
         .name = "production features: softcapping",
         .lesson = "logit softcapping (Gemma 2), softcap·tanh(s / softcap) fused where the scores are in registers: "
                   "step 09f's forward and step 12c's backward, whose dS takes the slope 1 - tanh² (sm_90a)",
         .forward = {fwd::limits, fwd::plan, fwd::launch, fwd::claims},
         .backward = {bwd::limits, bwd::plan, bwd::launch, bwd::claims},
         .explain = explain,
         .softcap = true});
  r.add({.id = "13b_window",
         .name = "production features: sliding window",
         .lesson = "+ a sliding window (Mistral, Gemma): each query tile visits only the K/V tiles its band touches "
                   "and masks only those at the band's edges, so the cost follows the visible pairs, forward and "
                   "backward",
         .forward = {fwd::limits, fwd::plan, fwd::launch, fwd::claims},
         .backward = {bwd::limits, bwd::plan, bwd::launch, bwd::claims},
         .explain = explain_window,
         .softcap = true,
         .window = true});
  r.add({.id = "13c_varlen",
         .name = "production features: variable-length batches",
         .lesson = "+ variable-length batches (FlashAttention's varlen): sequences packed into one tensor, cut by "
                   "cu_seqlens offsets; a block per (tile, sequence, head) of the padded batch, and a block past its "
                   "sequence's end exits at once, so no tile spans two sequences",
         .forward = {fwd::limits, fwd::plan, fwd::launch, fwd::claims},
         .backward = {bwd::limits, bwd::plan, bwd::launch, bwd::claims},
         .explain = explain_varlen,
         .softcap = true,
         .window = true,
         .varlen = true});
}

}  // namespace fs
