// The backward pass's rules, FLOPs, acceptance bound and description, and its traits for the chain
// (the gradients: backward/reference_gpu.cu; the acceptance rule: backward/check.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>

#include "backward/problem.h"
#include "forward/rules.h"

namespace fs {

// fs_backward_problem_init.
BackwardProblem make_backward_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, DType dtype, int32_t causal,
                                      int32_t deterministic);

// The backward problem of a forward problem: its strides for dO (O's), dQ (Q's), dK (K's), dV (V's).
BackwardProblem backward_of(const Problem& forward, int32_t deterministic);

// "" or a sentence: validate(p.attention), deterministic 0 or 1, dO dQ dK dV as views, dQ dK dV not overlapping.
std::string validate(const BackwardProblem& p);

// "" when the pointers are usable (flash_steps.h): dQ is written when seqlen_k == 0, dK and dV when seqlen_q == 0.
std::string validate_tensors(const BackwardProblem& p, const BackwardTensors& t);

double backward_flops(const BackwardProblem& p);  // 2.5 × attention_flops(p.attention)
// A variable-length batch's, from host copies of its offsets (validate_offsets passed): 2.5 × varlen_flops,
// every sequence's real pairs.
double backward_varlen_flops(const BackwardProblem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k);
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
  static const Problem& attention(const BackwardProblem& p) { return p.attention; }
  static std::string missing(const Step& s);  // names the steps that have a backward pass
  static size_t harness_workspace(const BackwardProblem&) { return 0; }
  // The gradients of empty problems; `done` then: nothing else is launched.
  static std::string harness_launch(const BackwardProblem& p, const Tensors& t, void*, cudaStream_t stream,
                                    bool& done) {
    const Problem f = dense_view(p.attention);  // a variable-length batch: by its totals
    done = f.seqlen_q == 0 || f.seqlen_k == 0;
    if (done) fill_empty_gradients(p, t, stream);
    return "";
  }
};

}  // namespace fs
