// Checking a forward step: the workload (random inputs, poisoned outputs), the two references and the
// comparison with its tolerance.
//
// References:
//   reference_cpu: fp64 on the CPU, from the already-rounded fp16/bf16 inputs. Small shapes.
//   GpuReference::run: fp32 on the GPU with cuBLAS (S = scale·Q·Kᵀ GEMM, masked softmax kernel, O = P·V
//                  GEMM; harness/check.h). Large shapes; itself tested against reference_cpu. It is also
//                  the runner's "unfused cuBLAS" baseline row.
//
// Tolerance, per element: |out - ref| <= atol + rtol * |ref|, with u the unit roundoff of the dtype
// (fp16: 2^-11, bf16: 2^-8) and
//   rtol = 2u            O is rounded to the dtype once: at most u·|O|.
//   atol = 2u · max|V|   the fused steps round the probabilities P (each in [0, 1]) to the dtype
//                        before P·V: O = Σ p̃_j v_j / l with |p̃_j - p_j| <= u·p_j, so the error is at
//                        most u · Σ p_j |v_j| / l <= u · max|V|.
// Both bounds are worst cases and the factor 2 leaves room for the fp32 accumulation order and the
// exp2/log2 approximations (relative errors near 2^-22). LSE is fp32 throughout: |err| <= 1e-4 · (1 + |ref|).
// A NaN or infinity anywhere in O fails; in LSE only -inf where the reference has -inf passes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "forward/rules.h"
#include "harness/check.h"
#include "harness/tensors.h"

namespace fs {

// O as (batch, seqlen_q, heads_q, head_dim) contiguous; LSE as (batch, heads_q, seqlen_q). A
// variable-length batch's as its dense_view's: O (total_q, heads_q, head_dim), LSE (heads_q, total_q).
struct Reference {
  std::vector<double> o;
  std::vector<double> lse;
};

// Logit softcapping (fs_problem::softcap): the logit c = softcap·tanh(s / softcap) of a scaled score s
// (softcap 0: c = s), and dc/ds = 1 - (c / softcap)², the factor the backward applies to dS.
inline double capped_logit(double s, double softcap) { return softcap > 0 ? softcap * std::tanh(s / softcap) : s; }
inline double capped_slope(double c, double softcap) { return softcap > 0 ? 1 - (c / softcap) * (c / softcap) : 1; }

// The keys row i attends, [first, end) (none when end <= first), from flash_steps.h's definition of
// causal and the window, written out here apart from common/step/window.h, which the tests check
// against it. Both references use it: the CPU one, and the GPU one's softmax kernel (FS_HD).
struct KeyRange {
  int64_t first, end;
};
FS_HD inline KeyRange reference_keys(const Problem& p, int64_t i) {
  const int64_t diagonal = i + p.seqlen_k - p.seqlen_q;  // the key bottom-right causal stops at
  int64_t first = 0, last = p.seqlen_k - 1;
  if (p.causal) last = std::min(last, diagonal);
  if (p.window && p.window_left >= 0) first = std::max(first, diagonal - p.window_left);
  if (p.window && p.window_right >= 0) last = std::min(last, diagonal + p.window_right);
  return {first, last + 1};
}

struct Tolerance {
  double atol, rtol, lse_rtol;
};
Tolerance tolerance_for(int32_t dtype, double max_abs_v);

struct Comparison {
  double max_abs_err = 0;       // over O
  double rel_fro_err = 0;       // ||out - ref||_F / ||ref||_F over O
  double max_lse_err = 0;
  int64_t nonfinite = 0;        // NaN / inf in O, and NaN / wrong inf in LSE
  int64_t mismatches = 0;       // elements outside the tolerance (O and LSE)
  std::vector<std::string> first_mismatches;  // up to 8, with coordinates (b, s, h, d)
  bool pass() const { return nonfinite == 0 && mismatches == 0; }
  std::string summary() const;  // one line
};

// `o` is the O view's storage (index with p.o strides); `lse` is (batch, heads_q, seqlen_q), or
// empty to skip the LSE check. A variable-length batch is compared as its dense_view: its packed rows.
Comparison compare(const Problem& p, const std::vector<float>& o, const std::vector<float>& lse, const Reference& ref,
                   double max_abs_v);

// Host copies of the inputs as the exact float values of the fp16/bf16 elements; q/k/v index the
// problem's strides from these base offsets into `data`; a variable-length batch's offsets in `cu`.
struct HostInputs {
  std::vector<float> data;
  int64_t q = 0, k = 0, v = 0;
  Offsets cu = {};
  const float* q_ptr() const { return data.data() + q; }
  const float* k_ptr() const { return data.data() + k; }
  const float* v_ptr() const { return data.data() + v; }
};

// A variable-length batch: each sequence's dense reference (one_sequence, on its rows), in the packed layout.
Reference reference_cpu(const Problem& p, const HostInputs& in);
// Multiply-adds of the CPU reference, to decide when it is too slow (B·Hq·Sq·Sk·d; at the bounds for a
// variable-length batch).
double reference_cpu_cost(const Problem& p);


// O and LSE of one forward or decoding problem on the device: O with the problem's strides, LSE
// (batch, heads_q, seqlen_q) (a variable-length batch: its dense_view's), both poisoned with NaN before
// every checked launch.
struct Output {
  explicit Output(const Problem& p);
  DeviceTensor o;
  DeviceBuffer lse;
  void poison(cudaStream_t stream = nullptr);
  std::vector<float> download_lse() const;
};

// The inputs and outputs of one problem on the device: random Q, K, V (seeded, not zero-mean) and the
// Output.
class Workload {
 public:
  // `shape` gives the sizes, dtype, causal flag and scale. With Layout::separate its strides are
  // kept; with Layout::packed_qkv they are replaced (needs seqlen_q == seqlen_k; total_q == total_k).
  // A variable-length batch (varlen_problem) comes with the host copies of its offsets, which must keep
  // the contract (validate_offsets; else fs::Error): problem() points at the workload's device copies.
  Workload(const Problem& shape, uint64_t seed, Layout layout = Layout::separate, Offsets offsets = {});

  const Problem& problem() const { return p_; }
  Tensors tensors() const;

  void randomize(uint64_t seed);  // a fresh draw of Q, K, V
  void poison(cudaStream_t stream = nullptr) { out_.poison(stream); }

  HostInputs download_inputs() const;  // with the offsets
  std::vector<float> download_o() const { return out_.o.download(); }  // the O view's storage (p.o strides)
  std::vector<float> download_lse() const { return out_.download_lse(); }
  float max_abs_v() const { return max_abs_v_; }
  Comparison compare(const Reference& ref) const { return fs::compare(p_, download_o(), download_lse(), ref, max_abs_v_); }

 private:
  int64_t q_off_ = 0, k_off_ = 0, v_off_ = 0, input_elems_ = 0;  // set while p_ is (before it)
  Offsets cu_;           // host copies of a variable-length batch's offsets (before p_)
  DeviceBuffer cu_dev_;  // their device copies: cu_seqlens_q, then cu_seqlens_k (before p_)
  Problem p_;
  DeviceBuffer inputs_;  // Q, K, V (one buffer: they may be views of one packed tensor)
  Output out_;
  float max_abs_v_ = 0;
};

// The GPU reference of the workload's inputs, downloaded.
Reference gpu_reference(const Workload& w, GpuReference& gpu);
// The reference for the workload's current inputs: fp64 on the CPU when it costs at most
// kCpuReferenceMaxCost, else cuBLAS.
Reference make_reference(const Workload& w, GpuReference& gpu);

}  // namespace fs
