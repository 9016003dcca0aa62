// Checking a backward step: the workload, the two references and the acceptance rule.
//
// The acceptance rule (backward_bound, fs_backward_bound), FlashAttention's: a step's gradient may
// be off the exact one (fp64 on the CPU, fp32 on the GPU) by at most twice what the same computation
// done in the dtype is off, plus u·G (u the unit roundoff, G the largest |exact| element of the three
// gradients dQ, dK, dV) so that a lucky low-precision reference cannot make the bound zero. G is the
// problem's scale, not the tensor's: with one key (seqlen_k = 1) P = 1, dS = P ∘ (dP − D) is exactly 0
// and so are dQ and dK, which a kernel computes as the fp32 difference of two equal sums — a rounding
// error of order 2^-24 · |dP| that only a bound with the problem's scale can allow. "The same
// computation done in the dtype": the reference with P, dS (and O, from which D is formed) rounded to
// the dtype where a fp16/bf16 implementation rounds them, each product still accumulated exactly
// (rounded = true below). The rule is relative to the difficulty of the problem: long rows and large
// values make both errors grow together.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backward/rules.h"
#include "forward/check.h"

namespace fs {

// Gradients as contiguous arrays: dq (batch, seqlen_q, heads_q, head_dim), dk and dv (batch, seqlen_k,
// heads_kv, head_dim); a variable-length batch's as its dense_view's, packed: dq (total_q, heads_q,
// head_dim), dk and dv (total_k, heads_kv, head_dim).
struct BackwardReference {
  std::vector<double> dq, dk, dv;
};
// The exact gradients and those of the same computation done in the dtype.
struct BackwardReferences {
  BackwardReference exact, lowp;
};

// Host copies of the backward's inputs as floats: Q, K, V as in HostInputs (index with the forward's
// strides; a variable-length batch's offsets in qkv.cu), dO contiguous (batch, seqlen_q, heads_q, head_dim)
// (a variable-length batch: (total_q, heads_q, head_dim)).
struct BackwardHostInputs {
  HostInputs qkv;
  std::vector<float> d_o;
};

// fp64 on the CPU, from the inputs alone: P recomputed exactly (not from a given LSE), D = Σ P∘dP.
// A row with no key to attend (causal, seqlen_q > seqlen_k) has P = 0: dQ = 0 and nothing in dK, dV.
// rounded = true: the same computation done in the dtype, where a FlashAttention-2 kernel rounds:
//   O = P·V rounded to the dtype (the forward's output), D = rowsum(dO ∘ O);
//   P rounded to the dtype before dV = Pᵀ·dO (the operand of that matrix product);
//   dS = P ∘ (dP − D) formed from the unrounded P, then rounded before dQ = scale·dS·K and
//   dK = scale·dSᵀ·Q (scale applied after the products, as the kernels apply it to the fp32 sums);
//   dP, D and every product accumulated in fp64.
// A variable-length batch: each sequence's dense gradients (one_sequence, on its rows), in the packed
// layout; GQA sums over the group within each sequence, and keys that no row of theirs sees get 0.
BackwardReference reference_cpu(const BackwardProblem& p, const BackwardHostInputs& in, bool rounded);
// Multiply-adds of the CPU backward reference (to decide when it is too slow; at the bounds for a
// variable-length batch).
double reference_cpu_cost(const BackwardProblem& p);

// x rounded to the nearest fp16 or bf16 value (ties to even), ±inf beyond the largest finite one.
double round_to_dtype(double x, int32_t dtype);


// One gradient tensor against the exact reference, by backward_bound with ref_err from the rounded
// reference and `scale` the largest |exact| over the three gradients (compare_gradients computes it).
// `out` is the tensor's storage (strides `s`), `exact` and `lowp` contiguous.
struct GradComparison {
  std::string name;        // "dQ", "dK", "dV"
  double max_abs_err = 0;  // of the step, against exact
  double ref_err = 0;      // of the rounded reference, against exact
  double bound = 0;        // backward_bound(dtype, ref_err, the largest |exact| of the three gradients)
  int64_t nonfinite = 0;
  bool pass() const { return nonfinite == 0 && max_abs_err <= bound; }
  std::string summary() const;  // one line
};
GradComparison compare_gradient(const char* name, int32_t dtype, const Strides& s, int64_t batch, int64_t rows,
                                int64_t heads, int64_t head_dim, const std::vector<float>& out,
                                const std::vector<double>& exact, const std::vector<double>& lowp, double scale);

// dQ, dK, dV (their storage, as downloaded) against the exact and the rounded references, in that order;
// a variable-length batch as its dense_view: its packed rows.
std::vector<GradComparison> compare_gradients(const BackwardProblem& p, const std::vector<float>& dq,
                                              const std::vector<float>& dk, const std::vector<float>& dv,
                                              const BackwardReferences& ref);

// The inputs and outputs of one backward problem on the device: random Q, K, V and dO (the forward
// Workload's generator), O and LSE from the GPU forward reference (O rounded to the dtype, as a forward
// step would give it), and dQ, dK, dV buffers poisoned with NaN before every checked launch.
class BackwardWorkload {
 public:
  // `shape` gives the sizes, dtype, causal flag, scale and every stride. Layout::packed_qkv replaces
  // the strides of Q, K and V by views into one packed buffer (needs seqlen_q == seqlen_k). A
  // variable-length batch (backward_of(varlen_problem(...))) comes with the host copies of its offsets, as
  // Workload takes them: problem() points at the workload's device copies.
  BackwardWorkload(const BackwardProblem& shape, uint64_t seed, Layout layout = Layout::separate,
                   Offsets offsets = {});

  const BackwardProblem& problem() const { return p_; }
  BackwardTensors tensors() const;
  void poison(cudaStream_t stream = nullptr);  // dQ, dK, dV := NaN (all bits set)

  BackwardHostInputs download_inputs() const;
  // The gradients' storage as floats (index with p.dq / p.dk / p.dv strides).
  std::vector<float> download_dq() const { return dq_.download(); }
  std::vector<float> download_dk() const { return dk_.download(); }
  std::vector<float> download_dv() const { return dv_.download(); }
  std::vector<GradComparison> compare(const BackwardReferences& ref) const {
    return compare_gradients(p_, download_dq(), download_dk(), download_dv(), ref);
  }

 private:
  Workload forward_;  // Q, K, V, O, LSE (first: the problem takes its strides)
  BackwardProblem p_;
  DeviceTensor d_o_, dq_, dk_, dv_;
};

// The fp32 cuBLAS reference's gradients for the workload (rounded: the same computation done in the
// dtype), downloaded as contiguous arrays (a variable-length batch: per sequence, packed).
BackwardReference gpu_reference(const BackwardWorkload& w, GpuReference& gpu, bool rounded);
// Both references: fp64 on the CPU when that costs at most kCpuReferenceMaxCost, else fp32 cuBLAS.
BackwardReferences make_reference(const BackwardWorkload& w, GpuReference& gpu);

}  // namespace fs
