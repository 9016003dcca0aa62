// The registry × shape matrix: every registered step on every shape, against the reference.
// A new step is covered by registering it; nothing here names a step. Backward-only steps (no
// forward pass, Step::forward) are left out: the backward tests cover them.
#include <algorithm>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/harness/tensors.h"
#include "gpu_test_config.h"

namespace {

struct Shape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv;
};

// Seqlens 1, 17, 64, 128, 257, 1000; seqlen_q ≠ seqlen_k both ways; heads_q/heads_kv of 1, 2 and 8.
const Shape kShapes[] = {
    {1, 1, 1, 1, 1},      {2, 17, 17, 2, 1},    {1, 64, 64, 8, 8},     {2, 128, 128, 8, 2},
    {1, 257, 257, 2, 2},  {1, 1000, 1000, 8, 1}, {1, 17, 257, 8, 2},   {2, 257, 64, 2, 1},
    {1, 1, 1000, 8, 8},   {1, 1000, 128, 2, 2}, {1, 128, 1000, 2, 1},
};
const int64_t kHeadDims[] = {40, 64, 128};

struct Case {
  fs::Problem problem;
  uint64_t seed;
  fs::Layout layout = fs::Layout::separate;
  fs::Offsets offsets = {};  // a variable-length batch's (varlen_cases); the Workload copies them to the device
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const Shape& s : kShapes)
    for (int64_t d : kHeadDims)
      for (bool causal : {false, true})
        for (fs::DType dt : {fs::DType::fp16, fs::DType::bf16})
          cases.push_back({fs::make_problem(s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, d, dt, causal),
                           uint64_t(cases.size() + 1)});
  return cases;
}

// Issue 7's edge shapes: seqlens around tile boundaries, Sq ≠ Sk with causal, every head_dim,
// GQA ratios up to 32, batch 64, and Q, K, V as strided views into one packed QKV buffer.
std::vector<Case> edge_cases() {
  std::vector<Case> cases;
  auto add = [&](int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, fs::DType dt, bool causal,
                 fs::Layout layout = fs::Layout::separate) {
    cases.push_back({fs::make_problem(b, sq, sk, hq, hkv, d, dt, causal), uint64_t(1000 + cases.size()), layout});
  };
  for (int64_t n : {1, 7, 63, 64, 65, 127, 129, 4095})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) add(1, n, n, 2, 1, d, n % 2 ? fs::DType::fp16 : fs::DType::bf16, causal);
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{65, 129}, {129, 65}, {1, 4095}, {4095, 7}, {63, 64}, {64, 63}})
    for (int64_t d : {64, 128}) add(2, sq, sk, 4, 2, d, fs::DType::fp16, true);
  for (int64_t d = 8; d <= 256; d += 8) add(1, 65, 65, 2, 2, d, d % 16 ? fs::DType::bf16 : fs::DType::fp16, d % 24 == 0);
  for (int64_t ratio : {1, 2, 4, 8, 32}) add(1, 63, 130, 32, 32 / ratio, 64, fs::DType::bf16, true);
  add(64, 33, 33, 2, 1, 64, fs::DType::fp16, true);
  add(64, 17, 100, 1, 1, 128, fs::DType::bf16, false);
  for (int64_t d : {40, 64, 128})
    for (bool causal : {false, true}) add(2, 129, 129, 4, 2, d, fs::DType::fp16, causal, fs::Layout::packed_qkv);
  // K and V broadcast over the batch (batch stride 0, as expand() gives them): flash_steps.h's aliasing rule.
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      add(3, 65, 129, 4, 2, d, d == 64 ? fs::DType::bf16 : fs::DType::fp16, causal);
      cases.back().problem.k.batch = cases.back().problem.v.batch = 0;
    }
  return cases;
}

// What a step documents that it runs: its claims, with softcapping only where it has it (Step::softcap),
// and a sliding window and variable-length batches likewise (Step::window, Step::varlen).
bool claims(const fs::Step& s, const fs::Problem& p, const fs::DeviceInfo& dev) {
  return s.forward.claims(p, dev) && (p.softcap == 0 || s.softcap) && (p.window == 0 || s.window) &&
         (!fs::is_varlen(p) || s.varlen);
}

// Logit softcapping: caps from tiny (every logit near 0: O near the mean of V) through the size of
// the logits (tanh bends) to huge (the plain softmax) on odd lengths, GQA, causal or not, head_dims
// 64 and 128 and a few others. Steps without softcapping refuse each with a sentence.
std::vector<Case> softcap_cases() {
  std::vector<Case> cases;
  const Shape shapes[] = {{1, 1, 1, 1, 1},    {2, 17, 17, 2, 1}, {2, 128, 128, 8, 2}, {1, 257, 257, 2, 2},
                          {1, 1000, 1000, 8, 1}, {1, 17, 257, 8, 2}, {2, 257, 64, 2, 1}};
  const float caps[] = {1e-3f, 0.5f, 2.0f, 15.0f, 50.0f, 1e6f};
  int k = 0;
  for (const Shape& s : shapes)
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        const fs::DType dt = k % 2 ? fs::DType::bf16 : fs::DType::fp16;
        cases.push_back({fs::make_problem(s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, d, dt, causal),
                         uint64_t(3000 + k)});
        cases.back().problem.softcap = caps[k++ % 6];
      }
  for (int64_t d : {8, 40, 96, 136, 192, 256}) {
    cases.push_back({fs::make_problem(1, 129, 200, 4, 2, d, fs::DType::bf16, d % 64 == 0), uint64_t(3000 + k)});
    cases.back().problem.softcap = caps[k++ % 6];
  }
  return cases;
}

// Sliding windows, each on a shape where it bites: left-only, right-only, both, the diagonal alone, wider
// than the sequence, causal on top, softcapped, GQA and MQA, odd lengths across many tiles, seqlen_q
// below seqlen_k (one row: decoding's shape) and above it (rows that see no key: O = 0, LSE = -inf), at
// head_dims 64 and 128; then the other head_dims up to 256. Steps without windows refuse each with a sentence.
std::vector<Case> window_cases() {
  struct Band {
    Shape shape;
    bool causal;
    int32_t left, right;
    float softcap;
  };
  const Band bands[] = {
      {{1, 1000, 1000, 8, 1}, false, 127, 0, 0.0f},    // Mistral's: the last 128 keys up to the diagonal
      {{2, 257, 257, 2, 2}, false, 64, -1, 0.0f},      // left-only
      {{1, 257, 257, 2, 1}, false, -1, 64, 0.0f},      // right-only
      {{2, 128, 128, 8, 2}, false, 16, 16, 0.0f},      // both sides
      {{1, 129, 129, 2, 2}, false, 0, 0, 0.0f},        // the diagonal alone
      {{1, 300, 300, 4, 2}, false, 5000, 5000, 0.0f},  // wider than the sequence: full attention
      {{1, 1000, 1000, 8, 2}, true, 200, 7, 0.0f},     // causal on top: the right bound is 0
      {{1, 257, 257, 2, 1}, false, 100, 20, 15.0f},    // softcapped
      {{1, 65, 4095, 4, 2}, false, 1000, 200, 0.0f},   // odd lengths across many K/V tiles
      {{1, 17, 1000, 8, 2}, false, 128, 0, 0.0f},      // seqlen_q < seqlen_k
      {{1, 1, 1000, 8, 8}, false, 255, 0, 2.0f},       // one query row, softcapped
      {{2, 1000, 128, 2, 2}, false, 32, 0, 0.0f},      // seqlen_q > seqlen_k: rows 0 … 871 see no key
      {{1, 257, 64, 2, 1}, true, 3, 1, 0.0f},          // the same with causal: rows 0 … 192 see none
      {{1, 1024, 1024, 4, 2}, false, 300, -1, 0.0f},   // the first visits unmasked, masked ones at the end
      {{1, 2048, 2048, 4, 4}, true, 512, 0, 0.0f},     // masked, unmasked, masked in one query tile (note 13)
  };
  std::vector<Case> cases;
  int k = 0;
  auto add = [&](const Shape& s, int64_t d, bool causal, int32_t left, int32_t right, float softcap) {
    const fs::DType dt = k % 2 ? fs::DType::bf16 : fs::DType::fp16;
    cases.push_back({fs::make_problem(s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, d, dt, causal),
                     uint64_t(4000 + k++)});
    fs::Problem& p = cases.back().problem;
    p.window = 1, p.window_left = left, p.window_right = right, p.softcap = softcap;
  };
  for (const Band& b : bands)
    for (int64_t d : {64, 128}) add(b.shape, d, b.causal, b.left, b.right, b.softcap);
  for (int64_t d : {8, 40, 96, 136, 192, 256}) add({1, 129, 200, 4, 2}, d, d % 64 == 0, 50, 10, d == 96 ? 5.0f : 0.0f);
  return cases;
}

// Variable-length batches: sequences of 0, 1 and odd lengths around the tiles, a query length unlike the key
// length in each sequence (separate cu_seqlens), causal and windows per sequence (left only, right only,
// both, wider than every sequence, 0), softcapping tiny and huge, GQA and MQA, fp16 and bf16, head_dim 64 and
// 128, then 8, 72, 256 and a few others; and 64 sequences of random lengths. Steps without them refuse each.
std::vector<Case> varlen_cases() {
  struct Batch {
    std::vector<int32_t> lq, lk;  // lk empty: lq's
    int64_t heads_q, heads_kv;
    bool causal;
    int32_t window, left, right;
    float softcap;
  };
  const std::vector<int32_t> mix{0, 1, 7, 64, 65, 128, 300}, q_side{1, 64, 300, 0, 129, 17}, k_side{300, 65, 64, 17, 0, 1};
  const Batch batches[] = {
      {mix, {}, 4, 2, false, 0, 0, 0, 0.0f},           {mix, {}, 4, 2, true, 0, 0, 0, 0.0f},
      {q_side, k_side, 8, 1, false, 0, 0, 0, 0.0f},    {q_side, k_side, 8, 2, true, 0, 0, 0, 0.0f},
      {k_side, q_side, 2, 2, true, 0, 0, 0, 0.0f},     {mix, {}, 4, 4, false, 1, 100, -1, 0.0f},   // left only
      {q_side, k_side, 4, 2, false, 1, -1, 30, 0.0f},  {mix, {}, 4, 1, false, 1, 20, 10, 0.0f},    // right, both
      {q_side, k_side, 2, 1, false, 1, 5000, 5000, 0.0f}, {mix, {}, 2, 2, false, 1, 0, 0, 0.0f},   // wide, 0
      {q_side, k_side, 4, 2, true, 1, 50, 0, 0.0f},    {mix, {}, 4, 2, false, 0, 0, 0, 0.05f},     // causal band
      {q_side, k_side, 4, 2, true, 0, 0, 0, 1e30f},    {mix, {}, 4, 2, false, 1, 64, 64, 15.0f},   // softcap huge
  };
  std::vector<Case> cases;
  auto add = [&](const Batch& b, int64_t d, fs::DType dt) {
    fs::Problem shape = fs::make_problem(1, 1, 1, b.heads_q, b.heads_kv, d, dt, b.causal);
    shape.window = b.window, shape.window_left = b.left, shape.window_right = b.right, shape.softcap = b.softcap;
    Case c{{}, uint64_t(3000 + cases.size()), fs::Layout::separate, fs::offsets_of(b.lq, b.lk)};
    c.problem = fs::varlen_problem(shape, c.offsets);  // its host pointers are never read: the Workload's are
    cases.push_back(std::move(c));
  };
  for (const Batch& b : batches)
    for (int64_t d : {64, 128}) add(b, d, cases.size() % 2 ? fs::DType::bf16 : fs::DType::fp16);
  for (int64_t d : {8, 40, 72, 96, 136, 192, 256}) add(batches[d % 3 == 0 ? 1 : 3], d, fs::DType::fp16);
  std::mt19937 rng(64);
  std::vector<int32_t> many(64), many_k(64);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int32_t(rng() % 300), many_k[i] = int32_t(rng() % 300);
  add({many, many_k, 8, 2, true, 0, 0, 0, 0.0f}, 128, fs::DType::bf16);
  add({many, {}, 8, 2, false, 1, 128, 0, 0.0f}, 64, fs::DType::fp16);
  return cases;
}

bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (v == v) return false;
  return true;
}

// Runs every selected step on one case and compares with the reference. A step may refuse only what
// it does not claim (Step::claims, its documented support), and must then say why and leave O
// untouched: no step passes by refusing.
void check_all_steps(const Case& c) {
  const fs::DeviceInfo dev = fs::current_device();
  fs::Workload w(c.problem, c.seed, c.layout, c.offsets);
  fs::GpuReference gpu;
  bool reference_ready = false;
  fs::Reference ref;
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || !fs::test::step_selected(s.id)) continue;
    INFO("step " << s.id << " on " << fs::describe(w.problem()) << (c.layout == fs::Layout::packed_qkv ? " packed QKV" : "")
                 << (w.problem().k.batch == 0 ? " K/V broadcast over the batch" : ""));
    const fs::Plan plan = fs::plan(s, w.problem(), dev);
    if (!plan.accepted()) {
      INFO("refusal: " << plan.refusal);
      CHECK_FALSE(claims(s, w.problem(), dev));  // the step documents that it runs this problem
      // A refusal is a sentence, and nothing is launched: O keeps its poison.
      CHECK(plan.refusal.size() > 10);
      w.poison();
      CHECK_THROWS_AS(fs::run(s, w.problem(), plan, w.tensors(), nullptr, 0, nullptr), fs::Error);
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK(all_nan(w.download_o()));
      continue;
    }
    if (!reference_ready) {
      ref = fs::make_reference(w, gpu);
      reference_ready = true;
    }
    const fs::Comparison cmp = fs::run_and_compare(s, w, ref, dev);
    INFO(cmp.summary());
    CHECK(cmp.pass());
  }
}

}  // namespace

TEST_CASE("every step matches the reference on the shape matrix", "[steps]") {
  static const std::vector<Case> cases = all_cases();
  check_all_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("every step matches the reference on the edge shapes", "[edge]") {
  static const std::vector<Case> cases = edge_cases();
  check_all_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("steps with softcapping match the reference; the others refuse it", "[steps][softcap]") {
  static const std::vector<Case> cases = softcap_cases();
  check_all_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("steps with windows match the reference; the others refuse it", "[steps][window]") {
  static const std::vector<Case> cases = window_cases();
  check_all_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("steps with variable-length batches match the reference; the others refuse them", "[steps][varlen]") {
  static const std::vector<Case> cases = varlen_cases();
  check_all_steps(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("variable-length batches: empty work, and offsets checked on the device", "[steps][varlen]") {
  const fs::DeviceInfo dev = fs::current_device();
  const std::vector<int32_t> lq{3, 0, 5}, lk{0, 0, 0}, none{0, 0, 0}, keys{4, 9, 1};
  const fs::Problem shape = fs::make_problem(1, 1, 1, 2, 1, 64, fs::DType::fp16, true);
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || !s.varlen || !fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    // No key in any sequence: O = 0 and LSE = -inf on every row; no query row: nothing to do.
    const fs::Offsets no_keys = fs::offsets_of(lq, lk), no_rows = fs::offsets_of(none, keys);
    fs::Workload w(fs::varlen_problem(shape, no_keys), 4, fs::Layout::separate, no_keys);
    w.poison();
    fs::Prepared(s, w.problem(), dev).launch(w.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (float x : w.download_o()) CHECK(x == 0.0f);
    for (float x : w.download_lse()) CHECK(x == -INFINITY);
    fs::Workload e(fs::varlen_problem(shape, no_rows), 4, fs::Layout::separate, no_rows);
    fs::Prepared(s, e.problem(), dev).launch(e.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  // fs_check_offsets reads the device arrays and names the first bad offset; a step launched on broken
  // offsets reads and writes nothing outside the packed tensors (compute-sanitizer: tests/sanitize_steps.cpp).
  const fs::Offsets cu = fs::offsets_of(std::vector<int32_t>{5, 80, 7}, std::vector<int32_t>{9, 70, 3});
  fs::Workload w(fs::varlen_problem(shape, cu), 5, fs::Layout::separate, cu);
  const fs::Problem p = w.problem();
  CHECK(fs_check_offsets(&p, nullptr) == FS_OK);
  const struct {
    std::vector<int32_t> q, k;
    const char* sentence;
  } broken[] = {
      {{0, 60, 5, 92}, cu.k, "cu_seqlens_q[2] is 5, below cu_seqlens_q[1] = 60: the offsets must not decrease"},
      {cu.q, {0, 9, 79, 83}, "cu_seqlens_k[3] (the last) is 83; it must equal total_k (82)"},
      {{3, 5, 85, 92}, cu.k, "cu_seqlens_q[0] is 3; it must be 0"},
      {cu.q, {0, 79, 79, 82}, "sequence 0 has 79 key rows (cu_seqlens_k[1] - cu_seqlens_k[0]); seqlen_k, the bound "
                              "on every sequence's length, is 70"},
  };
  for (const auto& b : broken) {
    CAPTURE(b.sentence);
    CHECK_CUDA(cudaMemcpy(const_cast<int32_t*>(p.cu_seqlens_q), b.q.data(), 16, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(const_cast<int32_t*>(p.cu_seqlens_k), b.k.data(), 16, cudaMemcpyHostToDevice));
    CHECK(fs_check_offsets(&p, nullptr) == FS_ERR_INVALID);
    CHECK(std::string(fs_last_error()) == b.sentence);
    for (const fs::Step& s : fs::steps())
      if (s.forward.present() && s.varlen && fs::test::step_selected(s.id)) {
        CAPTURE(s.id);
        fs::Prepared(s, p, dev).launch(w.tensors(), nullptr);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
      }
  }
}

TEST_CASE("variable-length batches: the cuBLAS reference per sequence matches the fp64 one", "[harness][varlen]") {
  const std::vector<int32_t> lq{0, 1, 7, 64, 65, 130}, lk{3, 0, 64, 7, 65, 200};
  for (bool causal : {false, true}) {
    fs::Problem shape = fs::make_problem(1, 1, 1, 4, 2, 64, fs::DType::bf16, causal);
    shape.window = causal ? 0 : 1, shape.softcap = causal ? 0.0f : 8.0f;  // causal alone, or a window and softcap
    if (shape.window) shape.window_left = 20, shape.window_right = 5;
    const fs::Offsets cu = fs::offsets_of(lq, lk);
    fs::Workload w(fs::varlen_problem(shape, cu), 11, fs::Layout::separate, cu);
    fs::GpuReference gpu;
    gpu.set_max_scratch_bytes(4096);  // several row chunks in the longest sequence
    const fs::Reference cpu = fs::reference_cpu(w.problem(), w.download_inputs());
    const fs::Reference got = fs::gpu_reference(w, gpu);
    REQUIRE(got.o.size() == cpu.o.size());
    REQUIRE(got.lse.size() == cpu.lse.size());
    std::vector<float> o(got.o.begin(), got.o.end()), lse(got.lse.begin(), got.lse.end());
    // O is contiguous (total_q, heads_q, head_dim), as the packed problem's strides are.
    const fs::Comparison cmp = fs::compare(w.problem(), o, lse, cpu, w.max_abs_v());
    INFO(cmp.summary());
    CHECK(cmp.pass());
  }
}

TEST_CASE("every step handles empty work", "[steps]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || !fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    // seqlen_k == 0: no key for any row, so O = 0 and LSE = -inf.
    fs::Workload w(fs::make_problem(2, 5, 0, 2, 1, 64, fs::DType::fp16, false), 4);
    w.poison();
    fs::Prepared(s, w.problem(), dev).launch(w.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (float x : w.download_o()) CHECK(x == 0.0f);
    for (float x : w.download_lse()) CHECK(x == -INFINITY);
    // seqlen_q == 0: nothing to do, nothing launched.
    fs::Workload e(fs::make_problem(1, 0, 16, 1, 1, 64, fs::DType::bf16, true), 4);
    fs::Prepared(s, e.problem(), dev).launch(e.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
}

TEST_CASE("numerics: huge and equal scores stay finite, and runs are bitwise identical", "[steps]") {
  const fs::DeviceInfo dev = fs::current_device();
  struct Variant {
    const char* what;
    float scale;
  };
  // Entries are N(0.25, 1): q·k is about ±10 at head_dim 64, so scale 1000 makes |scale·q·k| ~ 1e4;
  // scale 1e-20 makes every score 0 to fp32 precision, so P is uniform.
  for (const Variant v : {Variant{"|scores| ~ 1e4", 1000.0f}, Variant{"all scores equal", 1e-20f}})
    for (bool causal : {false, true}) {
      fs::Problem p = fs::make_problem(1, 200, 300, 2, 1, 64, fs::DType::fp16, causal);
      p.softmax_scale = v.scale;
      fs::Workload w(p, 77);
      const fs::Reference ref = fs::reference_cpu(p, w.download_inputs());
      for (const fs::Step& s : fs::steps()) {
        if (!s.forward.present() || !fs::test::step_selected(s.id)) continue;
        INFO("step " << s.id << ", " << v.what << (causal ? ", causal" : ""));
        if (const fs::Plan plan = fs::plan(s, p, dev); !plan.accepted()) {
          INFO("refusal: " << plan.refusal);
          CHECK_FALSE(s.forward.claims(p, dev));
          continue;
        }
        const fs::Comparison c = fs::run_and_compare(s, w, ref, dev);
        INFO(c.summary());
        CHECK(c.nonfinite == 0);
        CHECK(c.pass());
      }
    }

  const fs::Problem p = fs::make_problem(2, 300, 301, 4, 2, 128, fs::DType::bf16, true);
  fs::Workload w(p, 78);
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || !fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    if (const fs::Plan plan = fs::plan(s, p, dev); !plan.accepted()) {
      INFO("refusal: " << plan.refusal);
      CHECK_FALSE(s.forward.claims(p, dev));
      continue;
    }
    std::vector<float> o[2], lse[2];
    const fs::Prepared prepared(s, p, dev);
    for (int run = 0; run < 2; ++run) {
      w.poison();
      prepared.launch(w.tensors(), nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      o[run] = w.download_o();
      lse[run] = w.download_lse();
    }
    CHECK(std::memcmp(o[0].data(), o[1].data(), o[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * sizeof(float)) == 0);
  }
}

namespace {

// Checks batch `b` of O and LSE, as a step wrote them, against the GPU reference run on that batch alone.
void check_batch(const fs::Problem& p, const fs::Tensors& t, int64_t b, float max_abs_v, fs::GpuReference& gpu) {
  CAPTURE(b);
  fs::Problem one = p;  // one batch of p, same strides
  one.batch = 1;
  const int64_t o_elems = one.seqlen_q * one.heads_q * one.head_dim, lse_elems = one.heads_q * one.seqlen_q;
  auto at = [&](const void* base, const fs::Strides& st) {
    return static_cast<const char*>(base) + b * st.batch * 2;  // 2-byte elements
  };
  const fs::Tensors slice{at(t.q, p.q), at(t.k, p.k), at(t.v, p.v), const_cast<char*>(at(t.o, p.o)),
                          t.lse + b * lse_elems};
  fs::DeviceBuffer o32(size_t(o_elems) * sizeof(float)), lse32(size_t(lse_elems) * sizeof(float));
  fs::Tensors ref_in = slice;
  ref_in.o = nullptr;
  ref_in.lse = lse32.as<float>();
  gpu.run(one, ref_in, o32.as<float>(), nullptr);
  std::vector<float> ref_o(static_cast<size_t>(o_elems)), ref_lse(static_cast<size_t>(lse_elems)),
      lse(static_cast<size_t>(lse_elems));
  CHECK_CUDA(cudaMemcpy(ref_o.data(), o32.get(), o32.bytes(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ref_lse.data(), lse32.get(), lse32.bytes(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse.data(), slice.lse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const fs::Reference ref{std::vector<double>(ref_o.begin(), ref_o.end()),
                          std::vector<double>(ref_lse.begin(), ref_lse.end())};
  const std::vector<float> o =
      fs::download_as_float(slice.o, fs::view_extent(one.o, 1, one.seqlen_q, one.heads_q, one.head_dim), p.dtype);
  const fs::Comparison c = fs::compare(one, o, lse, ref, max_abs_v);
  INFO(c.summary());
  CHECK(c.pass());
}

constexpr double kGiB = double(1 << 30);

}  // namespace

TEST_CASE("tensors of more than 2^32 elements use 64-bit offsets", "[large]") {
  // Q and O hold 32·129·8448·128 = 4,463,788,032 elements (2^32 = 4,294,967,296), K and V
  // 32·129·4224·128 = 2,231,894,016 (2^31 = 2,147,483,648). The last batch starts past 2^32 elements in
  // Q and O and past 2^31 in K and V, so its every offset needs more than 32 bits. Each step runs the
  // whole problem; its output is checked on the first and the last batch against the reference run
  // on that batch alone. A step that claims the problem (Step::claims) must run it.
  const fs::Problem p = fs::make_problem(32, 129, 129, 8448, 4224, 128, fs::DType::fp16, false);
  REQUIRE(fs::validate(p).empty());
  const int64_t q_elems = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
  const int64_t kv_elems = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
  REQUIRE((p.batch - 1) * p.q.batch > (int64_t(1) << 32));
  REQUIRE((p.batch - 1) * p.k.batch > (int64_t(1) << 31));
  const fs::DeviceInfo dev = fs::current_device();

  // Device memory: Q, K, V, O, LSE; the largest workspace a step asks; the reference on one batch
  // (its fp32 O, its scratch S of at most 1 GiB, V as fp32) and a downloaded batch of O as fp32; 1 GiB
  // of headroom.
  size_t workspace = 0;
  for (const fs::Step& s : fs::steps())
    if (fs::test::step_selected(s.id))
      if (const fs::Plan plan = fs::plan(s, p, dev); plan.accepted()) workspace = std::max(workspace, plan.workspace_bytes);
  const double batch_o32 = double(p.seqlen_q * p.heads_q * p.head_dim) * 4;
  const double needed = double(2 * q_elems + 2 * kv_elems) * 2 + double(p.batch * p.heads_q * p.seqlen_q) * 4 +
                        double(workspace) + 2 * batch_o32 + double(p.seqlen_k * p.head_dim) * 4 + 2 * kGiB;
  if (double(dev.free_bytes) < needed) {
    std::ostringstream m;
    m << "the 2^32-element test needs " << std::fixed << std::setprecision(1) << needed / kGiB
      << " GiB of free device memory; this GPU has " << double(dev.free_bytes) / kGiB << " GiB free";
    fs::test::skip(m.str());
    return;
  }

  fs::Workload w(p, 99);
  fs::GpuReference gpu;
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || !fs::test::step_selected(s.id)) continue;
    INFO("step " << s.id);
    const fs::Plan plan = fs::plan(s, p, dev);
    if (!plan.accepted()) {
      INFO("refusal: " << plan.refusal);
      CHECK_FALSE(s.forward.claims(p, dev));  // a step that claims the problem must run it
      std::cout << "step " << s.id << " does not claim the 2^32-element problem and refuses it: " << plan.refusal << "\n";
      continue;
    }
    w.poison();
    const fs::Tensors t = w.tensors();
    fs::Prepared(s, p, plan).launch(t, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int64_t b : {int64_t(0), p.batch - 1}) check_batch(p, t, b, w.max_abs_v(), gpu);
  }
}

TEST_CASE("the cuBLAS reference takes row strides above 2^31 elements", "[large]") {
  // Q, K and V are views whose row stride is 2^31 + 64 elements (4 GiB apart): two rows each, so the
  // GEMMs' leading dimensions exceed 32 bits and are used. The same rows, gathered into a contiguous
  // problem, give the fp64 CPU reference. Two query heads share the K/V head (the batched GEMM's stride).
  const int64_t row = (int64_t(1) << 31) + 64, B = 1, S = 2, H = 2, HKV = 1, D = 64;
  fs::Problem p = fs::make_problem(B, S, S, H, HKV, D, fs::DType::bf16, true);
  p.q.row = p.k.row = p.v.row = row;
  p.q.batch = p.k.batch = p.v.batch = S * row;
  REQUIRE(fs::validate(p).empty());
  const fs::DeviceInfo dev = fs::current_device();
  const double needed = 3.0 * double(fs::view_extent(p.q, B, S, H, D)) * 2 + 2 * kGiB;
  if (double(dev.free_bytes) < needed) {
    std::ostringstream m;
    m << "the 2^31-row-stride test needs " << std::fixed << std::setprecision(1) << needed / kGiB
      << " GiB of free device memory; this GPU has " << double(dev.free_bytes) / kGiB << " GiB free";
    fs::test::skip(m.str());
    return;
  }
  fs::Workload w(p, 123);
  const fs::Tensors t = w.tensors();
  // The rows of Q, K, V, gathered into one contiguous (Q, K, V) host buffer, as floats.
  const fs::Problem dense = fs::make_problem(B, S, S, H, HKV, D, fs::DType::bf16, true);
  fs::HostInputs in;
  in.q = 0;
  in.k = S * H * D;
  in.v = in.k + S * HKV * D;
  for (auto [base, heads] : {std::pair{t.q, H}, std::pair{t.k, HKV}, std::pair{t.v, HKV}})
    for (int64_t i = 0; i < S; ++i) {
      const std::vector<float> r =
          fs::download_as_float(static_cast<const char*>(base) + i * row * 2, heads * D, p.dtype);
      in.data.insert(in.data.end(), r.begin(), r.end());
    }
  const fs::Reference cpu = fs::reference_cpu(dense, in);
  w.poison();
  fs::GpuReference gpu;
  gpu.run(p, t, nullptr, nullptr);  // O in the problem's dtype, contiguous (O's strides are dense)
  CHECK_CUDA(cudaDeviceSynchronize());
  const fs::Comparison c = fs::compare(p, w.download_o(), w.download_lse(), cpu, w.max_abs_v());
  INFO(c.summary());
  CHECK(c.pass());
}
