// The registry × shape matrix: every registered step on every shape, against the reference.
// A new step is covered by registering it; nothing here names a step.
#include <string>
#include <vector>

#include "catch.h"
#include "common/check.h"
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

bool all_nan(const std::vector<float>& x) {
  for (float v : x)
    if (v == v) return false;
  return true;
}

}  // namespace

TEST_CASE("every step matches the reference on the shape matrix", "[steps]") {
  static const std::vector<Case> cases = all_cases();
  const Case& c = cases[size_t(GENERATE(range(size_t(0), cases.size())))];
  const fs::DeviceInfo dev = fs::current_device();
  fs::Workload w(c.problem, c.seed);
  fs::GpuReference gpu;
  bool reference_ready = false;
  fs::Reference ref;
  for (const fs::Step& s : fs::steps()) {
    if (!fs::test::step_selected(s.id)) continue;
    INFO("step " << s.id << " on " << fs::describe(c.problem));
    const std::string refused = fs::check(s, c.problem, dev);
    if (!refused.empty()) {
      // A refusal is a sentence, and nothing is launched: O keeps its poison.
      CHECK(refused.size() > 10);
      w.poison();
      CHECK_THROWS_AS(fs::run(s, w.problem(), w.tensors(), nullptr, dev), fs::Error);
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

TEST_CASE("every step handles empty work", "[steps]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const fs::Step& s : fs::steps()) {
    if (!fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    // seqlen_k == 0: no key for any row, so O = 0 and LSE = -inf.
    fs::Workload w(fs::make_problem(2, 5, 0, 2, 1, 64, fs::DType::fp16, false), 4);
    w.poison();
    fs::run(s, w.problem(), w.tensors(), nullptr, dev);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (float x : w.download_o()) CHECK(x == 0.0f);
    for (float x : w.download_lse()) CHECK(x == -INFINITY);
    // seqlen_q == 0: nothing to do, nothing launched.
    fs::Workload e(fs::make_problem(1, 0, 16, 1, 1, 64, fs::DType::bf16, true), 4);
    fs::run(s, e.problem(), e.tensors(), nullptr, dev);
    CHECK_CUDA(cudaDeviceSynchronize());
  }
}
