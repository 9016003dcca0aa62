// The backward pass on the GPU: the cuBLAS reference against the fp64 CPU one.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "catch.h"
#include "common/backward.h"

namespace {

// Gradients as contiguous arrays: dq (batch, seqlen_q, heads_q, head_dim), dk and dv (batch, seqlen_k,
// heads_kv, head_dim).
using Gradients = fs::BackwardReference;

std::vector<double> download_doubles(const fs::DeviceBuffer& b) {
  std::vector<float> host(b.bytes() / sizeof(float));
  if (!host.empty()) CHECK_CUDA(cudaMemcpy(host.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return std::vector<double>(host.begin(), host.end());
}

// The fp32 cuBLAS reference on the workload's tensors.
Gradients gpu_gradients(const fs::BackwardWorkload& w, fs::GpuBackwardReference& gpu, bool rounded) {
  const fs::Problem& f = w.problem().forward;
  const size_t q_bytes = size_t(f.batch * f.seqlen_q * f.heads_q * f.head_dim) * sizeof(float);
  const size_t kv_bytes = size_t(f.batch * f.seqlen_k * f.heads_kv * f.head_dim) * sizeof(float);
  fs::DeviceBuffer dq(q_bytes), dk(kv_bytes), dv(kv_bytes);
  gpu.run(w.problem(), w.tensors(), rounded, dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return Gradients{download_doubles(dq), download_doubles(dk), download_doubles(dv)};
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t e = 0; e < a.size(); ++e) m = std::max(m, std::fabs(a[e] - b[e]));
  return m;
}

}  // namespace

TEST_CASE("the cuBLAS backward reference matches the fp64 CPU reference", "[backward]") {
  struct Shape {
    int64_t b, sq, sk, hq, hkv, d;
    bool causal;
    fs::DType dtype;
    size_t scratch;  // the reference's scratch budget; 0: the default (one chunk)
  };
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, 8, false, fs::DType::fp16, 0},
      {2, 17, 33, 4, 2, 64, true, fs::DType::bf16, 0},
      {1, 65, 17, 8, 2, 128, true, fs::DType::fp16, 0},  // causal, seqlen_q > seqlen_k: rows with no key
      {1, 100, 100, 8, 1, 40, false, fs::DType::bf16, 0},
      {2, 100, 57, 4, 2, 64, true, fs::DType::fp16, 16384},  // chunks of 6 rows: dK, dV summed across chunks
  };
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    const fs::BackwardProblem p = fs::make_backward_problem(s.b, s.sq, s.sk, s.hq, s.hkv, s.d, s.dtype, s.causal, 0);
    CAPTURE(fs::describe(p.forward), s.scratch);
    const fs::BackwardWorkload w(p, seed++);
    const fs::BackwardHostInputs in = w.download_inputs();
    const Gradients exact = fs::reference_cpu_backward(p, in, false);
    const Gradients low = fs::reference_cpu_backward(p, in, true);
    fs::GpuBackwardReference gpu;
    if (s.scratch) gpu.set_max_scratch_bytes(s.scratch);
    const Gradients got = gpu_gradients(w, gpu, false);
    const Gradients got_low = gpu_gradients(w, gpu, true);
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
