// The backward pass on the GPU. First the cuBLAS reference against the fp64 CPU one; then every step
// with a backward entry (Step::backward) on the shape list below, against the references by the
// acceptance rule (backward_bound, common/backward/check.h). A new step is covered by registering its
// backward; nothing here names a step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/backward/check.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "gpu_test_config.h"
#include "max_error.h"

namespace {

using fs::test::max_abs;
using fs::test::max_diff;

// Gradients as contiguous arrays: dq (batch, seqlen_q, heads_q, head_dim), dk and dv (batch, seqlen_k,
// heads_kv, head_dim).
using Gradients = fs::BackwardReference;

}  // namespace

TEST_CASE("the cuBLAS backward reference matches the fp64 CPU reference", "[backward]") {
  struct Shape {
    int64_t b, sq, sk, hq, hkv, d;
    bool causal;
    fs::DType dtype;
    size_t scratch;  // the reference's scratch budget; 0: the default (one chunk)
    int32_t window = 0, left = 0, right = 0;  // fs_problem's sliding window
    float softcap = 0.0f;
  };
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, 8, false, fs::DType::fp16, 0},
      {2, 17, 33, 4, 2, 64, true, fs::DType::bf16, 0},
      {1, 65, 17, 8, 2, 128, true, fs::DType::fp16, 0},  // causal, seqlen_q > seqlen_k: rows with no key
      {1, 100, 100, 8, 1, 40, false, fs::DType::bf16, 0},
      {2, 100, 57, 4, 2, 64, true, fs::DType::fp16, 16384},  // chunks of 6 rows: dK, dV summed across chunks
      // Windows: both sides; left-only with rows that see no key (65 × 17, (4, 0)); softcapped and causal,
      // in chunks of 6 rows, whose row index the mask must keep.
      {2, 40, 77, 4, 2, 64, false, fs::DType::bf16, 0, 1, 8, 3},
      {1, 65, 17, 8, 2, 128, false, fs::DType::fp16, 0, 1, 4, 0},
      {2, 100, 57, 4, 2, 64, true, fs::DType::fp16, 16384, 1, 20, -1, 2.0f},
  };
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    fs::BackwardProblem p = fs::make_backward_problem(s.b, s.sq, s.sk, s.hq, s.hkv, s.d, s.dtype, s.causal, 0);
    p.attention.window = s.window, p.attention.window_left = s.left, p.attention.window_right = s.right;
    p.attention.softcap = s.softcap;
    CAPTURE(fs::describe(p.attention), s.scratch);
    const fs::BackwardWorkload w(p, seed++);
    const fs::BackwardHostInputs in = w.download_inputs();
    const Gradients exact = fs::reference_cpu(p, in, false);
    const Gradients low = fs::reference_cpu(p, in, true);
    fs::GpuReference gpu;
    if (s.scratch) gpu.set_max_scratch_bytes(s.scratch);
    const Gradients got = fs::gpu_reference(w, gpu, false);
    const Gradients got_low = fs::gpu_reference(w, gpu, true);
    for (auto [name, e, l, g, gl] : {std::tuple{"dQ", &exact.dq, &low.dq, &got.dq, &got_low.dq},
                                     std::tuple{"dK", &exact.dk, &low.dk, &got.dk, &got_low.dk},
                                     std::tuple{"dV", &exact.dv, &low.dv, &got.dv, &got_low.dv}}) {
      CAPTURE(name);
      // fp32 against fp64: the inputs are exact in both; each product sums at most a few hundred
      // terms (head_dim, seqlen_k, seqlen_q), whose fp32 rounding is at worst n·2^-24 ≈ 2e-5 of the
      // sum of magnitudes, about 1e-6 in practice. 1e-4 of the tensor's largest value covers both.
      const double tol = 1e-4 * max_abs(*e);
      CHECK(max_diff(*g, *e) <= tol);
      // Rounded: fp32 and fp64 may round a P or dS that lies within their difference of a tie to
      // neighbouring dtype values. Each such flip moves a gradient by one rounding of one term, a
      // small part of the whole rounding effect max |low - exact|; half of it is allowed.
      CHECK(max_diff(*gl, *l) <= tol + 0.5 * max_diff(*l, *e));
      for (double x : *g) CHECK(std::isfinite(x));
      for (double x : *gl) CHECK(std::isfinite(x));
    }
  }
}

namespace {

// ---- every step's backward -------------------------------------------------------------------------

struct BackwardCase {
  fs::BackwardProblem problem;
  uint64_t seed;
  fs::Layout layout = fs::Layout::separate;
  bool padded = false;  // dO and dQ with a padded head stride
  fs::Offsets offsets = {};  // a variable-length batch's (varlen_backward_cases); the workload copies them to the device
};

// The shapes every step's backward runs, each with deterministic = 0 and 1:
//   every head_dim (multiples of 8 up to 256) on a small shape;
//   odd lengths 1, 17, 100, 257 with seqlen_q ≠ seqlen_k both ways, causal or not, GQA (8/2), MQA
//   (8/1) and one head per K/V head, fp16 and bf16;
//   Q, K, V as views into one packed QKV buffer with dO and dQ of padded head stride;
//   larger problems (checked against the GPU reference);
//   seqlen_q == 0 and seqlen_k == 0 (the gradients are zero).
std::vector<BackwardCase> backward_cases() {
  std::vector<BackwardCase> cases;
  auto add = [&](int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, fs::DType dt, bool causal,
                 fs::Layout layout = fs::Layout::separate, bool padded = false) {
    for (int deterministic : {0, 1}) {
      fs::BackwardProblem p = fs::make_backward_problem(b, sq, sk, hq, hkv, d, dt, causal, deterministic);
      if (padded) p.d_o = p.dq = fs::contiguous_strides(sq, hq, d + 8);  // 8 unused elements after each head
      cases.push_back({p, uint64_t(2000 + cases.size()), layout, padded});
    }
  };
  for (int64_t d = 8; d <= 256; d += 8)
    add(1, 33, 47, 2, 1, d, d % 16 ? fs::DType::bf16 : fs::DType::fp16, d % 24 == 0);
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1},    {17, 17},  {100, 100}, {257, 257}, {1, 257},
                                                 {257, 1},  {17, 100}, {100, 17},  {257, 100}, {100, 257}};
  const std::pair<int64_t, int64_t> heads[] = {{8, 2}, {8, 1}, {2, 2}};
  int k = 0;
  for (auto [sq, sk] : lengths)
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        const auto [hq, hkv] = heads[k % 3];
        add(1, sq, sk, hq, hkv, d, k % 2 ? fs::DType::bf16 : fs::DType::fp16, causal);
        ++k;
      }
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) add(2, 129, 129, 4, 2, d, fs::DType::fp16, causal, fs::Layout::packed_qkv, true);
  add(2, 1024, 1024, 8, 2, 64, fs::DType::bf16, true);
  add(2, 1024, 1024, 8, 2, 128, fs::DType::fp16, false);
  add(1, 2048, 777, 8, 1, 128, fs::DType::fp16, true);
  add(1, 777, 2048, 8, 8, 64, fs::DType::bf16, true);
  add(2, 0, 64, 4, 2, 64, fs::DType::fp16, false);
  add(2, 37, 0, 4, 2, 64, fs::DType::bf16, true);
  // Logit softcapping (steps without it refuse): caps from tiny to huge on odd lengths, GQA, causal or
  // not, head_dims 64 and 128, a larger problem on the GPU reference, and head_dim 256 (step 11's kernels).
  const float caps[] = {1e-3f, 0.5f, 2.0f, 15.0f, 50.0f, 1e6f};
  const std::pair<int64_t, int64_t> capped_lengths[] = {{1, 1}, {17, 100}, {100, 17}, {257, 257}, {129, 65}, {64, 64}};
  for (size_t i = 0; i < 6; ++i)
    for (int64_t d : {64, 128}) {
      const auto [sq, sk] = capped_lengths[i];
      add(1, sq, sk, 8, d == 64 ? 2 : 1, d, d == 64 ? fs::DType::bf16 : fs::DType::fp16, (i + d / 64) % 2 == 1);
      for (size_t j = cases.size() - 2; j < cases.size(); ++j) cases[j].problem.attention.softcap = caps[(i + d / 64) % 6];
    }
  for (auto [d, cap] : {std::pair<int64_t, float>{64, 30.0f}, {128, 1.0f}, {256, 5.0f}}) {
    add(2, 1024, 1024, 8, 2, d, d == 128 ? fs::DType::fp16 : fs::DType::bf16, d != 128);
    for (size_t j = cases.size() - 2; j < cases.size(); ++j) cases[j].problem.attention.softcap = cap;
  }
  // Sliding windows (steps without them refuse): left-only, right-only, both, the diagonal alone, wider
  // than the sequence, causal on top, softcapped, on odd lengths with seqlen_q ≠ seqlen_k both ways
  // (seqlen_q 257 against 17 keys with (5, 0): 235 rows see no key), GQA and MQA, at head_dims 64 and 128;
  // larger problems on the GPU reference; head_dims above 128 (step 11's kernels).
  auto window_last = [&](int32_t left, int32_t right, float softcap = 0.0f) {  // the two cases add() made last
    for (size_t j = cases.size() - 2; j < cases.size(); ++j) {
      fs::Problem& f = cases[j].problem.attention;
      f.window = 1, f.window_left = left, f.window_right = right, f.softcap = softcap;
    }
  };
  struct Band {
    int64_t sq, sk;
    bool causal;
    int32_t left, right;
    float softcap;
  };
  const Band bands[] = {
      {100, 100, false, 16, -1, 0.0f}, {100, 100, false, -1, 16, 0.0f}, {257, 257, false, 30, 10, 0.0f},
      {129, 129, false, 0, 0, 0.0f},   {65, 65, false, 500, 500, 0.0f},  {257, 100, true, 40, 3, 0.0f},
      {17, 257, false, 64, 0, 2.0f},   {257, 17, false, 5, 0, 0.0f},     {100, 257, true, 20, 0, 15.0f},
  };
  k = 0;
  for (const Band& band : bands)
    for (int64_t d : {64, 128}) {
      add(1, band.sq, band.sk, 8, k % 2 ? 1 : 2, d, k % 2 ? fs::DType::bf16 : fs::DType::fp16, band.causal);
      window_last(band.left, band.right, band.softcap);
      ++k;
    }
  add(2, 1024, 1024, 8, 2, 64, fs::DType::bf16, true);
  window_last(255, 0);
  add(2, 1024, 2048, 8, 2, 128, fs::DType::fp16, false);
  window_last(256, 256, 30.0f);
  for (int64_t d : {160, 192, 256}) {
    add(1, 200, 150, 4, 2, d, d == 192 ? fs::DType::fp16 : fs::DType::bf16, d == 192);
    window_last(30, d == 160 ? -1 : 10, d == 256 ? 5.0f : 0.0f);
  }
  // K and V broadcast over the batch (batch stride 0): each batch's dK and dV are its own.
  for (int64_t d : {64, 128}) {
    add(3, 65, 129, 4, 2, d, d == 64 ? fs::DType::bf16 : fs::DType::fp16, true);
    for (size_t i = cases.size() - 2; i < cases.size(); ++i) cases[i].problem.attention.k.batch = cases[i].problem.attention.v.batch = 0;
  }
  return cases;
}

// Variable-length batches (steps without them refuse): the forward's mixes (tests/test_gpu_steps.cpp) of
// sequences of 0, 1 and odd lengths around the tiles, a query length unlike the key length per sequence,
// causal and windows per sequence (left only, right only, both, wider than every sequence, 0), softcapping,
// GQA and MQA, fp16 and bf16, head_dim 64 and 128, each with deterministic = 0 and 1; small batches the fp64
// reference checks; Q, K, V packed into one buffer, dO and dQ of padded head stride; other head_dims (above
// 128: refused by the steps whose backward has no such tiles); 64 sequences of random lengths.
std::vector<BackwardCase> varlen_backward_cases() {
  struct Batch {
    std::vector<int32_t> lq, lk;  // lk empty: lq's
    int64_t heads_q, heads_kv;
    bool causal;
    int32_t window, left, right;
    float softcap;
  };
  const std::vector<int32_t> mix{0, 1, 7, 64, 65, 128, 300}, q_side{1, 64, 300, 0, 129, 17}, k_side{300, 65, 64, 17, 0, 1};
  const std::vector<int32_t> small_q{0, 1, 7, 33, 5}, small_k{3, 0, 7, 20, 40};
  const Batch batches[] = {
      {mix, {}, 4, 2, false, 0, 0, 0, 0.0f},              {mix, {}, 4, 2, true, 0, 0, 0, 0.0f},
      {q_side, k_side, 8, 1, false, 0, 0, 0, 0.0f},       {q_side, k_side, 8, 2, true, 0, 0, 0, 0.0f},
      {k_side, q_side, 2, 2, true, 0, 0, 0, 0.0f},        {mix, {}, 4, 4, false, 1, 100, -1, 0.0f},   // left only
      {q_side, k_side, 4, 2, false, 1, -1, 30, 0.0f},     {mix, {}, 4, 1, false, 1, 20, 10, 0.0f},    // right, both
      {q_side, k_side, 2, 1, false, 1, 5000, 5000, 0.0f}, {mix, {}, 2, 2, false, 1, 0, 0, 0.0f},      // wide, 0
      {q_side, k_side, 4, 2, true, 1, 50, 0, 0.0f},       {mix, {}, 4, 2, false, 0, 0, 0, 0.05f},     // causal band
      {q_side, k_side, 4, 2, true, 0, 0, 0, 1e30f},       {mix, {}, 4, 2, false, 1, 64, 64, 15.0f},   // softcap huge
      {small_q, small_k, 4, 2, true, 0, 0, 0, 0.0f},      {small_q, small_k, 2, 1, false, 1, 3, 2, 2.0f},  // fp64
  };
  std::vector<BackwardCase> cases;
  auto add = [&](const Batch& b, int64_t d, fs::DType dt, fs::Layout layout = fs::Layout::separate,
                 bool padded = false) {
    fs::Problem shape = fs::make_problem(1, 1, 1, b.heads_q, b.heads_kv, d, dt, b.causal);
    shape.window = b.window, shape.window_left = b.left, shape.window_right = b.right, shape.softcap = b.softcap;
    const fs::Offsets cu = fs::offsets_of(b.lq, b.lk);
    for (int deterministic : {0, 1}) {
      // The problem's host pointers are never read (the workload's device copies replace them).
      fs::BackwardProblem p = fs::backward_of(fs::varlen_problem(shape, cu), deterministic);
      if (padded) {  // 8 unused elements after each head of dO and dQ
        p.d_o = p.dq = fs::contiguous_strides(p.attention.total_q, b.heads_q, d + 8);
        p.d_o.batch = p.dq.batch = 0;
      }
      cases.push_back({p, uint64_t(4000 + cases.size()), layout, padded, cu});
    }
  };
  for (const Batch& b : batches)
    for (int64_t d : {64, 128}) add(b, d, (cases.size() / 2) % 2 ? fs::DType::bf16 : fs::DType::fp16);
  for (int64_t d : {64, 128}) {
    add(batches[1], d, fs::DType::fp16, fs::Layout::packed_qkv, true);  // total_q == total_k
    add(batches[3], d, fs::DType::bf16, fs::Layout::separate, true);
  }
  for (int64_t d : {8, 40, 72, 96, 136, 192, 256}) add(batches[d % 3 == 0 ? 1 : 3], d, fs::DType::fp16);
  std::mt19937 rng(65);
  std::vector<int32_t> many(64), many_k(64);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int32_t(rng() % 300), many_k[i] = int32_t(rng() % 300);
  add({many, many_k, 8, 2, true, 0, 0, 0, 0.0f}, 128, fs::DType::bf16);
  add({many, {}, 8, 2, false, 1, 128, 0, 0.0f}, 64, fs::DType::fp16);
  for (BackwardCase& c : cases)  // each case's pointers at its own host copies (never read, but not dangling)
    c.problem.attention.cu_seqlens_q = c.offsets.q.data(), c.problem.attention.cu_seqlens_k = c.offsets.k.data();
  return cases;
}

std::string describe(const BackwardCase& c) {
  std::ostringstream m;
  m << fs::describe(c.problem) << (c.layout == fs::Layout::packed_qkv ? " packed QKV" : "") << (c.padded ? " padded dO/dQ" : "")
    << (c.problem.attention.k.batch == 0 && !fs::is_varlen(c.problem.attention) ? " K/V broadcast over the batch" : "");
  return m.str();
}

bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (v == v) return false;
  return true;
}

// Elements of a gradient's storage that are not NaN: after a poisoned launch, exactly the view's
// elements (the padding between heads keeps its poison).
int64_t written(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return v == v; });
}

// Runs every selected step's backward on one case: refusals only where the step does not claim the
// problem (and then nothing is written), otherwise the three gradients within the bound, finite,
// and bitwise repeatable when deterministic.
void check_backward_steps(const BackwardCase& c) {
  const fs::DeviceInfo dev = fs::current_device();
  fs::BackwardWorkload w(c.problem, c.seed, c.layout, c.offsets);
  const fs::BackwardProblem& p = w.problem();
  const fs::Problem f = fs::dense_view(p.attention);  // the tensors' sizes: a variable-length batch's packed rows
  bool references_ready = false;
  fs::BackwardReferences ref;
  for (const fs::Step& s : fs::steps()) {
    if (!fs::test::step_selected(s.id) || !s.backward.present()) continue;
    INFO("step " << s.id << " backward on " << describe(c));
    const fs::Plan plan = fs::plan(s, p, dev);
    if (!plan.accepted()) {
      INFO("refusal: " << plan.refusal);
      CHECK_FALSE((s.backward.claims(p, dev) && (f.softcap == 0 || s.softcap) &&  // documented: it runs this problem
                   (f.window == 0 || s.window) && (!fs::is_varlen(p.attention) || s.varlen)));
      CHECK(plan.refusal.size() > 10);
      w.poison();
      CHECK_THROWS_AS(fs::run(s, p, plan, w.tensors(), nullptr, 0, nullptr), fs::Error);
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK(all_nan(w.download_dq()));
      CHECK(all_nan(w.download_dk()));
      CHECK(all_nan(w.download_dv()));
      continue;
    }
    if (!references_ready) {
      fs::GpuReference gpu;
      ref = fs::make_reference(w, gpu);  // fp64 on the CPU when cheap, else fp32 cuBLAS
      references_ready = true;
    }
    const fs::Prepared prepared(s, p, plan);
    std::vector<float> dq[2], dk[2], dv[2];
    const int runs = p.deterministic ? 2 : 1;
    for (int run = 0; run < runs; ++run) {
      w.poison();
      prepared.launch(w.tensors(), nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      dq[run] = w.download_dq();
      dk[run] = w.download_dk();
      dv[run] = w.download_dv();
    }
    for (const fs::GradComparison& g : fs::compare_gradients(p, dq[0], dk[0], dv[0], ref)) {
      INFO(g.summary());
      CHECK(g.pass());
    }
    CHECK(written(dq[0]) == f.batch * f.seqlen_q * f.heads_q * f.head_dim);
    CHECK(written(dk[0]) == f.batch * f.seqlen_k * f.heads_kv * f.head_dim);
    CHECK(written(dv[0]) == f.batch * f.seqlen_k * f.heads_kv * f.head_dim);
    if (p.deterministic) {
      CHECK(std::memcmp(dq[0].data(), dq[1].data(), dq[0].size() * sizeof(float)) == 0);
      CHECK(std::memcmp(dk[0].data(), dk[1].data(), dk[0].size() * sizeof(float)) == 0);
      CHECK(std::memcmp(dv[0].data(), dv[1].data(), dv[0].size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

// PyTorch's autograd runs the backward on a thread of its own, which may have made no CUDA call: no
// context is current there, and a driver call (the TMA's tensor-map encoding) must not depend on one.
TEST_CASE("every step's backward runs from a thread that has made no CUDA call", "[backward]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const float softcap : {0.0f, 2.0f}) {
    fs::BackwardProblem p = fs::make_backward_problem(1, 130, 200, 4, 2, 64, fs::DType::fp16, true, 0);
    p.attention.softcap = softcap;
    fs::BackwardWorkload w(p, 77);
    bool references_ready = false;
    fs::BackwardReferences ref;
    for (const fs::Step& s : fs::steps()) {
      if (!fs::test::step_selected(s.id) || !s.backward.present()) continue;
      const fs::Plan plan = fs::plan(s, p, dev);
      if (!plan.accepted()) continue;  // refusals are the other tests' subject
      INFO("step " << s.id << " softcap " << softcap);
      if (!references_ready) {
        fs::GpuReference gpu;
        ref = fs::make_reference(w, gpu);
        references_ready = true;
      }
      const fs::Prepared prepared(s, p, plan);
      w.poison();
      CHECK_CUDA(cudaDeviceSynchronize());
      std::string error;
      std::thread fresh([&] {
        try {
          prepared.launch(w.tensors(), nullptr);
          CHECK_CUDA(cudaDeviceSynchronize());
        } catch (const std::exception& e) {
          error = e.what();
        }
      });
      fresh.join();
      CHECK(error == "");
      for (const fs::GradComparison& g : fs::compare_gradients(p, w.download_dq(), w.download_dk(), w.download_dv(), ref)) {
        INFO(g.summary());
        CHECK(g.pass());
      }
    }
  }
}

TEST_CASE("every step's backward matches the references on the backward shapes", "[backward]") {
  static const std::vector<BackwardCase> cases = backward_cases();
  check_backward_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("steps whose backward has variable-length batches match the references; the others refuse them",
          "[backward][varlen]") {
  static const std::vector<BackwardCase> cases = varlen_backward_cases();
  check_backward_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

// The backward of a batch without work on one side: no key in any sequence (dQ = 0), no query row in any
// sequence (dK = dV = 0), and a batch of empty sequences only.
TEST_CASE("variable-length batches: the backward of empty sides", "[backward][varlen]") {
  const fs::DeviceInfo dev = fs::current_device();
  const std::vector<int32_t> some{3, 0, 5}, none{0, 0, 0};
  for (const fs::Step& s : fs::steps()) {
    if (!fs::test::step_selected(s.id) || !s.backward.present() || !s.varlen) continue;
    for (const auto& [lq, lk] : {std::pair{some, none}, std::pair{none, some}, std::pair{none, none}})
      for (const int deterministic : {0, 1}) {
        const fs::Offsets cu = fs::offsets_of(lq, lk);
        fs::Problem shape = fs::make_problem(1, 1, 1, 4, 2, 64, fs::DType::fp16, true);
        fs::BackwardWorkload w(fs::backward_of(fs::varlen_problem(shape, cu), deterministic), 6,
                               fs::Layout::separate, cu);
        INFO("step " << s.id << " backward on " << fs::describe(w.problem()));
        w.poison();
        fs::Prepared(s, w.problem(), dev).launch(w.tensors(), nullptr);
        CHECK_CUDA(cudaDeviceSynchronize());
        for (const std::vector<float>& g : {w.download_dq(), w.download_dk(), w.download_dv()})
          for (float x : g) CHECK(x == 0.0f);
      }
  }
}

TEST_CASE("variable-length batches: the cuBLAS backward reference per sequence matches the fp64 one",
          "[backward][varlen]") {
  const std::vector<int32_t> lq{0, 1, 7, 64, 65, 130}, lk{3, 0, 64, 7, 65, 200};
  for (const bool causal : {false, true}) {
    fs::Problem shape = fs::make_problem(1, 1, 1, 4, 2, 64, fs::DType::bf16, causal);
    shape.window = causal ? 0 : 1, shape.softcap = causal ? 0.0f : 8.0f;  // causal alone, or a window and softcap
    if (shape.window) shape.window_left = 20, shape.window_right = 5;
    const fs::Offsets cu = fs::offsets_of(lq, lk);
    const fs::BackwardWorkload w(fs::backward_of(fs::varlen_problem(shape, cu), 0), 31, fs::Layout::separate, cu);
    CAPTURE(fs::describe(w.problem()));
    const fs::BackwardHostInputs in = w.download_inputs();
    const Gradients exact = fs::reference_cpu(w.problem(), in, false);
    const Gradients low = fs::reference_cpu(w.problem(), in, true);
    fs::GpuReference gpu;
    gpu.set_max_scratch_bytes(16384);  // several row chunks in the longest sequences
    const Gradients got = fs::gpu_reference(w, gpu, false);
    const Gradients got_low = fs::gpu_reference(w, gpu, true);
    for (auto [name, e, l, g, gl] : {std::tuple{"dQ", &exact.dq, &low.dq, &got.dq, &got_low.dq},
                                     std::tuple{"dK", &exact.dk, &low.dk, &got.dk, &got_low.dk},
                                     std::tuple{"dV", &exact.dv, &low.dv, &got.dv, &got_low.dv}}) {
      CAPTURE(name);
      REQUIRE(g->size() == e->size());
      const double tol = 1e-4 * max_abs(*e);  // as for the dense shapes above
      CHECK(max_diff(*g, *e) <= tol);
      CHECK(max_diff(*gl, *l) <= tol + 0.5 * max_diff(*l, *e));
      for (double x : *g) CHECK(std::isfinite(x));
    }
  }
}

// A step plans for the GPU it is given: planned for a GPU whose blocks may opt in to 99 KiB of shared
// memory (sm_86, sm_89), step 11 takes its smaller rows, which then run here (this GPU has more) and
// must match the references like any other plan. A step that does not claim such a GPU (step 12, for
// sm_90 only, whose every GPU allows 227 KiB) refuses it with a sentence.
TEST_CASE("the backward's plans for a GPU with 99 KiB of shared memory per block run and match", "[backward]") {
  fs::DeviceInfo small = fs::current_device();
  small.smem_per_block_optin = 99 * 1024;
  for (const fs::Step& s : fs::steps()) {
    if (!fs::test::step_selected(s.id) || !s.backward.present()) continue;
    for (const int64_t d : {64, 128, 160, 256})
      for (const bool deterministic : {false, true}) {
        const fs::BackwardProblem p =
            fs::make_backward_problem(1, 100, 77, 4, 2, d, fs::DType::bf16, true, deterministic);
        INFO("step " << s.id << " planned for 99 KiB: " << fs::describe(p));
        const fs::Plan plan = fs::plan(s, p, small);
        if (!s.backward.claims(p, small)) {
          CHECK_FALSE(plan.accepted());
          CHECK(plan.refusal.size() > 10);
          continue;
        }
        REQUIRE(plan.accepted());
        for (const fs::KernelLaunch& k : plan.kernels) CHECK(k.smem_bytes <= small.smem_per_block_optin);
        fs::BackwardWorkload w(p, 21);
        fs::GpuReference gpu;
        const fs::BackwardReferences ref = fs::make_reference(w, gpu);
        for (const fs::GradComparison& g : fs::run_and_compare(s, w, ref, plan)) {
          INFO(g.summary());
          CHECK(g.pass());
        }
      }
  }
}
