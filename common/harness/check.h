// Checking a step against a reference, the part every pass shares: when the fp64 CPU reference is
// used, and one checked launch (outputs poisoned, the launch, a compare). Each pass's check.h has its
// workload (inputs and poisoned outputs on the device), its references and its comparison.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>

#include "forward/problem.h"
#include "harness/chain.h"

struct fs_backward_problem;

namespace fs {

struct BackwardTensors;

// The fp32 cuBLAS references (forward/ and backward/reference_gpu.cu), sharing a handle and scratch memory,
// in row chunks that keep the scratch under max_scratch_bytes (1 GiB; the tests lower it).
class GpuReference {
 public:
  GpuReference();
  ~GpuReference();
  GpuReference(const GpuReference&) = delete;
  GpuReference& operator=(const GpuReference&) = delete;

  // Enqueues the forward reference on `stream`. Writes, where the pointer is not null:
  //   o32   fp32 O, (batch, seqlen_q, heads_q, head_dim) contiguous
  //   t.o   O in the problem's dtype and strides (the runner's "unfused cuBLAS" baseline)
  //   t.lse fp32 LSE
  // A variable-length batch: each sequence on its own (its offsets read back from the device, `stream`
  // synchronized once), in the packed layout: o32 (total_q, heads_q, head_dim), LSE (heads_q, total_q).
  void run(const Problem& p, const Tensors& t, float* o32, cudaStream_t stream);

  // The backward reference (backward/check.h): contiguous fp32 dq (batch, seqlen_q, heads_q, head_dim),
  // dk, dv (batch, seqlen_k, heads_kv, head_dim), from device tensors (t.o and t.lse are not read: P is
  // recomputed); rounded: the same computation done in the dtype. A variable-length batch: each sequence
  // on its own (its offsets read back from the device, `stream` synchronized once), in the packed layout:
  // dq (total_q, heads_q, head_dim), dk, dv (total_k, heads_kv, head_dim).
  void run(const fs_backward_problem& p, const BackwardTensors& t, bool rounded, float* dq32, float* dk32,
           float* dv32, cudaStream_t stream);

  void set_max_scratch_bytes(size_t bytes) { max_scratch_bytes_ = bytes; }

 private:
  static void reserve(size_t bytes, DeviceBuffer& buf);
  void run_varlen(const Problem& p, const Tensors& t, float* o32, cudaStream_t stream);
  void run_varlen(const fs_backward_problem& p, const BackwardTensors& t, bool rounded, float* dq32, float* dk32,
                  float* dv32, cudaStream_t stream);
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer s_;    // scores, then probabilities, fp32 (the backward: all its scratch)
  DeviceBuffer v32_;  // V of one K/V head as fp32
  DeviceBuffer o32_;  // fp32 O when the caller gives none
  DeviceBuffer lse_;  // one sequence's LSE of a variable-length batch, before it joins the packed (heads, total_q)
  size_t max_scratch_bytes_ = size_t(1) << 30;
};

// Problems whose fp64 CPU reference costs at most this many multiply-adds use it; larger ones use
// the GPU fp32 reference (itself tested against the CPU one).
inline constexpr double kCpuReferenceMaxCost = double(1 << 27);

// The unit roundoff of the dtype: fp16 2^-11, bf16 2^-8.
inline double unit_roundoff(int32_t dtype) { return dtype == FS_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

enum class Layout {
  separate,    // Q, K, V each in its own region, with the problem's strides
  packed_qkv,  // one (batch, seqlen, heads_q + 2*heads_kv, head_dim) buffer; Q, K, V are strided views
};

// Poisons the workload's outputs with NaN, enqueues `launch` on the default stream, waits, and compares
// the outputs with `ref`: a Comparison (forward, decode) or the gradients' comparisons (backward).
template <typename Workload, typename Reference>
auto launch_and_compare(const std::function<void(cudaStream_t)>& launch, Workload& w, const Reference& ref) {
  w.poison();
  launch(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return w.compare(ref);
}

// The same for a step's plan for the workload's problem (fs::Error if the plan is a refusal): gives it the
// workspace it asks for, then launch_and_compare.
template <typename Workload, typename Reference>
auto run_and_compare(const Step& step, Workload& w, const Reference& ref, Plan plan) {
  const Prepared prepared(step, w.problem(), std::move(plan));
  const auto t = w.tensors();
  return launch_and_compare([&](cudaStream_t s) { prepared.launch(t, s); }, w, ref);
}
// ... planning it first.
template <typename Workload, typename Reference>
auto run_and_compare(const Step& step, Workload& w, const Reference& ref, const DeviceInfo& dev) {
  return run_and_compare(step, w, ref, plan(step, w.problem(), dev));
}

}  // namespace fs
