// The backward pass's rules, FLOPs, acceptance bound and description, and its traits for the chain.
//
// The gradients (per batch and query head; P = softmax(scale·Q·Kᵀ) over the keys a row may see):
//   dV = Pᵀ·dO        dP = dO·Vᵀ        D_i = Σ_j P_ij·dP_ij = rowsum(dO ∘ O)_i
//   dS = P ∘ (dP - D) dQ = scale·dS·K    dK = scale·dSᵀ·Q
// With GQA, dK and dV of a K/V head are the sums over the query heads of its group.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backward/problem.h"
#include "forward/rules.h"

namespace fs {

// fs_backward_problem_init.
BackwardProblem make_backward_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, DType dtype, bool causal,
                                      bool deterministic);

// The backward problem of a forward problem: its strides for dO (O's), dQ (Q's), dK (K's), dV (V's).
BackwardProblem backward_of(const Problem& forward, bool deterministic);

// "" when the problem follows every rule: validate(p.attention), deterministic 0 or 1, then dO, dQ,
// dK, dV as views (validate_view), none of dQ, dK, dV overlapping itself. One sentence otherwise.
std::string validate(const BackwardProblem& p);

// "" when the pointers are usable: all non-null when there is work (lse too), 16-byte aligned
// (lse 4-byte); dQ is written when seqlen_k == 0 too (zeros), dK and dV when seqlen_q == 0.
std::string validate_tensors(const BackwardProblem& p, const BackwardTensors& t);

double backward_flops(const BackwardProblem& p);  // 2.5 × attention_flops(p.attention)
// fs_backward_bound: 2·ref_err + u·max_abs_exact (common/backward/check.h explains the rule).
double backward_bound(int32_t dtype, double ref_err, double max_abs_exact);

// A short description, e.g. "backward b2 h16/16 sq2048 sk2048 d128 fp16 causal deterministic".
std::string describe(const BackwardProblem& p);

// dQ = 0 (seqlen_k == 0) or dK = dV = 0 (seqlen_q == 0): the answer when one side is empty.
void fill_empty_gradients(const BackwardProblem& p, const BackwardTensors& t, cudaStream_t stream);

template <>
struct Pass<BackwardProblem> {
  using Tensors = BackwardTensors;
  static constexpr const char* workspace_function = "fs_backward_workspace_size";
  static const Entry<BackwardProblem, Tensors>& entry(const Step& s) { return s.backward; }
  static std::string missing(const Step& s);  // names the steps that have a backward pass
  static size_t harness_workspace(const BackwardProblem&) { return 0; }
  // The gradients of empty problems; `done` then: nothing else is launched.
  static std::string harness_launch(const BackwardProblem& p, const Tensors& t, void*, cudaStream_t stream,
                                    bool& done) {
    done = p.attention.seqlen_q == 0 || p.attention.seqlen_k == 0;
    if (done) fill_empty_gradients(p, t, stream);
    return "";
  }
};

}  // namespace fs
