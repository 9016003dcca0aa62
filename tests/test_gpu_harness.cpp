// GPU tests of the harness itself: the cuBLAS reference against the fp64 one, poisoning, timing,
// empty work (the backward's too) and the C ABI on real pointers.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/backward/check.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/harness/tensors.h"
#include "common/harness/timing.h"
#include "stub_step.h"

namespace {

struct Shape {
  int64_t b, sq, sk, hq, hkv, d;
  bool causal;
  int32_t window = 0, left = 0, right = 0;  // fs_problem's sliding window
  float softcap = 0.0f;
  size_t scratch = 0;  // the reference's scratch budget; 0: the default (one chunk)
};

}  // namespace

TEST_CASE("GPU fp32 reference matches the fp64 CPU reference", "[harness]") {
  // Windows too: each side alone, both, the diagonal alone, causal and softcapping on top, rows with no key
  // (200 × 70, (5, 0): rows 0 … 129), and in chunks of 35 rows, whose row index the mask must keep.
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, 8, false},      {2, 17, 33, 4, 2, 40, true},    {1, 129, 64, 8, 1, 64, true},
      {1, 64, 257, 2, 2, 128, false}, {2, 100, 100, 8, 8, 256, true}, {1, 33, 5, 4, 4, 64, true},
      {1, 129, 257, 4, 2, 64, false, 1, 16, 8},       {1, 33, 300, 4, 4, 256, false, 1, -1, 7},
      {2, 200, 70, 2, 1, 128, false, 1, 5, 0},        {1, 64, 64, 1, 1, 8, false, 1, 0, 0},
      {1, 100, 100, 2, 2, 40, true, 1, 30, -1, 2.0f}, {2, 100, 57, 4, 2, 64, false, 1, 9, 2, 0.0f, 16384},
  };
  int seed = 100;
  for (const Shape& s : shapes)
    for (fs::DType dt : {fs::DType::fp16, fs::DType::bf16}) {
      fs::Problem p = fs::make_problem(s.b, s.sq, s.sk, s.hq, s.hkv, s.d, dt, s.causal);
      p.window = s.window, p.window_left = s.left, p.window_right = s.right;
      p.softcap = s.softcap;
      CAPTURE(fs::describe(p), s.scratch);
      fs::Workload w(p, uint64_t(++seed));
      const fs::Reference cpu = fs::reference_cpu(p, w.download_inputs());
      fs::GpuReference gpu;
      if (s.scratch) gpu.set_max_scratch_bytes(s.scratch);
      const fs::Reference g = fs::gpu_reference(w, gpu);
      std::vector<float> o(g.o.begin(), g.o.end()), lse(g.lse.begin(), g.lse.end());
      // The GPU reference is fp32 with fp32 O: hold it to a tolerance far tighter than any step's.
      double max_err = 0;
      for (size_t i = 0; i < o.size(); ++i) max_err = std::max(max_err, std::fabs(o[i] - cpu.o[i]));
      CHECK(max_err < 1e-4 * w.max_abs_v());
      for (size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(cpu.lse[i])) CHECK(lse[i] == cpu.lse[i]);
        else CHECK(std::fabs(lse[i] - cpu.lse[i]) < 1e-5 * (1 + std::fabs(cpu.lse[i])));
      }
    }
}

TEST_CASE("GPU reference writes the dtype output in the problem's strides (packed QKV)", "[harness]") {
  fs::GpuReference gpu;
  const fs::Problem shape = fs::make_problem(2, 70, 70, 4, 2, 64, fs::DType::bf16, true);
  fs::Workload w(shape, 5, fs::Layout::packed_qkv);
  const fs::Reference cpu = fs::reference_cpu(w.problem(), w.download_inputs());
  w.poison();
  gpu.run(w.problem(), w.tensors(), nullptr, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const fs::Comparison c = fs::compare(w.problem(), w.download_o(), w.download_lse(), cpu, w.max_abs_v());
  INFO(c.summary());
  CHECK(c.pass());
}

TEST_CASE("poisoned outputs that a step never writes fail the check", "[harness]") {
  const fs::Step lazy{.id = "90_lazy",
                      .name = "lazy",
                      .lesson = "writes nothing",
                      .forward = accept_everything_entry()};
  const fs::Problem p = fs::make_problem(1, 16, 16, 1, 1, 64, fs::DType::fp16, false);
  fs::Workload w(p, 3);
  const fs::Reference ref = fs::reference_cpu(p, w.download_inputs());
  const fs::Comparison c = fs::run_and_compare(lazy, w, ref, fs::current_device());
  CHECK_FALSE(c.pass());
  CHECK(c.nonfinite == 16 * 64 + 16);  // every O element and every LSE entry is still NaN
}

TEST_CASE("inputs are random, seeded and not zero-mean", "[harness]") {
  const fs::Problem p = fs::make_problem(1, 256, 256, 2, 2, 64, fs::DType::fp16, false);
  fs::Workload a(p, 1), b(p, 1), c(p, 2);
  const fs::HostInputs ha = a.download_inputs(), hb = b.download_inputs(), hc = c.download_inputs();
  CHECK(ha.data == hb.data);
  CHECK(ha.data != hc.data);
  double sum = 0;
  for (float x : ha.data) sum += x;
  const double mean = sum / double(ha.data.size());
  CHECK(std::fabs(mean - fs::kInputOffset) < 0.02);
  CHECK(a.max_abs_v() > 2.0f);
}

TEST_CASE("timing returns the median of positive samples", "[harness]") {
  fs::DeviceBuffer buf(size_t(64) << 20);
  const fs::Timing t = fs::time_launches(
      [&](cudaStream_t s) { CHECK_CUDA(cudaMemsetAsync(buf.get(), 1, buf.bytes(), s)); }, fs::TimingOptions{1, 9, true});
  CHECK(t.samples_ms.size() == 9);
  CHECK(t.min_ms > 0);
  CHECK(t.min_ms <= t.median_ms);
  CHECK(t.median_ms <= t.max_ms);
}

TEST_CASE("C ABI runs every step on device pointers", "[harness]") {
  const fs::Problem shape = fs::make_problem(2, 100, 77, 4, 2, 64, fs::DType::fp16, true);
  fs::Workload w(shape, 9);
  const fs::Problem& p = w.problem();
  const fs::Reference ref = fs::reference_cpu(p, w.download_inputs());
  const fs::DeviceInfo dev = fs::current_device();
  int ran = 0;
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present()) continue;  // a backward-only step: fs_check refuses it (the C ABI tests say so)
    CAPTURE(s.id);
    if (fs_check(s.id.c_str(), &p) != FS_OK) {
      INFO("refusal: " << fs_last_error());
      CHECK(std::string(fs_last_error()).size() > 0);
      CHECK_FALSE(s.forward.claims(p, dev));  // no step passes by refusing what it documents
      continue;
    }
    ++ran;
    w.poison();
    const fs::Tensors t = w.tensors();
    uint64_t bytes = 0;
    REQUIRE(fs_workspace_size(s.id.c_str(), &p, &bytes) == FS_OK);
    const fs::DeviceBuffer workspace{size_t(bytes)};
    REQUIRE(fs_run(s.id.c_str(), &p, t.q, t.k, t.v, t.o, t.lse, workspace.get(), bytes, nullptr) == FS_OK);
    CHECK_CUDA(cudaDeviceSynchronize());
    const fs::Comparison c = fs::compare(p, w.download_o(), w.download_lse(), ref, w.max_abs_v());
    INFO(c.summary());
    CHECK(c.pass());
  }
  CHECK(ran > 0);
}

TEST_CASE("an allocation larger than the device is fs::OutOfMemory, naming the bytes", "[harness]") {
  const size_t bytes = size_t(1) << 50;  // 1 PiB
  try {
    fs::DeviceBuffer huge(bytes);
    FAIL("a 1 PiB cudaMalloc succeeded");
  } catch (const fs::OutOfMemory& e) {
    CHECK(e.bytes == bytes);
    CHECK(std::string(e.what()).find("1125899906842624 bytes") != std::string::npos);
  }
  // The failed allocation leaves no error behind for the next checked call.
  fs::DeviceBuffer small(256);
  CHECK_CUDA(cudaMemset(small.get(), 0, small.bytes()));
  CHECK_CUDA(cudaGetLastError());
}

TEST_CASE("C ABI: refusals that need no device are FS_ERR_INVALID on a GPU too", "[harness]") {
  fs_problem p;
  fs_problem_init(&p, 1, 64, 64, 2, 2, 40, FS_FP16, 0);
  CHECK(fs_check("06_ldmatrix_mma", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("head_dim is 40") != std::string::npos);
  fs_problem_init(&p, 1, 64, 64, 2, 2, 64, FS_FP16, 0);
  CHECK(fs_check("06_ldmatrix_mma", &p) == FS_OK);
}

TEST_CASE("run_backward writes the gradients of empty problems, strided, and nothing else", "[harness]") {
  // A backward-only step whose launch must not be called: run_backward handles empty work itself.
  fs::Step s;
  s.id = "95_empty_only";
  s.backward.limits = [](const fs::BackwardProblem&) { return std::string(); };
  s.backward.plan = [](const fs::BackwardProblem&, const fs::DeviceInfo&) { return fs::Plan{}; };
  s.backward.launch = [](const fs::BackwardProblem&, const fs::BackwardTensors&, const fs::Plan&, void*,
                         cudaStream_t) { FAIL("launch() was called on empty work"); };
  s.backward.claims = [](const fs::BackwardProblem&, const fs::DeviceInfo&) { return true; };
  const fs::DeviceInfo dev = fs::current_device();
  // One gradient view of (batch 2, rows, heads 2, head_dim 64) fp16 with padded rows and batches,
  // poisoned with NaN: after the run, zeros inside the view and NaN in the padding.
  struct Gradient {
    fs::Strides s;
    int64_t rows;
    fs::DeviceBuffer mem;
    int64_t elems = 0;
    explicit Gradient(int64_t r) : s(fs::contiguous_strides(r, 2, 64)), rows(r) {
      s.row *= 2;
      s.batch *= 3;
      elems = fs::view_extent(s, 2, rows, 2, 64);
      mem = fs::DeviceBuffer(size_t(elems) * 2);
      if (elems > 0) CHECK_CUDA(cudaMemset(mem.get(), 0xFF, mem.bytes()));
    }
    void check(bool zeroed) const {
      if (elems == 0) return;
      const std::vector<float> x = fs::download_as_float(mem.get(), elems, FS_FP16);
      std::vector<bool> in_view(size_t(elems), false);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t d = 0; d < 64; ++d) in_view[size_t(b * s.batch + i * s.row + h * s.head + d)] = true;
      int64_t wrong = 0;
      for (int64_t e = 0; e < elems; ++e) {
        const float v = x[size_t(e)];
        wrong += zeroed && in_view[size_t(e)] ? v != 0.0f : !std::isnan(v);
      }
      CHECK(wrong == 0);
    }
  };
  for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{5, 0}, {0, 7}}) {
    CAPTURE(sq, sk);
    Gradient dq(sq), dk(sk), dv(sk);
    fs::BackwardProblem p = fs::make_backward_problem(2, sq, sk, 2, 2, 64, fs::DType::fp16, false, false);
    p.dq = dq.s;
    p.dk = dk.s;
    p.dv = dv.s;
    REQUIRE(fs::validate(p).empty());
    fs::BackwardTensors t;
    t.dq = sq > 0 ? dq.mem.get() : nullptr;
    t.dk = sk > 0 ? dk.mem.get() : nullptr;
    t.dv = sk > 0 ? dv.mem.get() : nullptr;
    fs::Prepared(s, p, dev).launch(t, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    dq.check(sk == 0);  // no key: dQ = 0
    dk.check(sq == 0);  // no query: dK = dV = 0
    dv.check(sq == 0);
  }
}
