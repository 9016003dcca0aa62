// The forward pass's rules, FLOPs and description, and its traits for the chain (common/harness/chain.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "forward/problem.h"
#include "step/window.h"
#include "harness/chain.h"
#include "harness/views.h"

namespace fs {

// The harness's limits on a forward problem (common/flash_steps.h). Steps add their own.
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kMaxSeqlen = INT32_MAX;  // row indices are 32-bit inside kernels
inline constexpr int64_t kMaxBatchHeads = INT32_MAX;
// The largest logit the kernels may form, |q·k|·softmax_scale·log2(e) in fp32: 2^126, so that every
// logit and the difference of any two are finite (FLT_MAX is about 2^128). See flash_steps.h.
inline constexpr double kMaxLogit = 85070591730234615865843651857942052864.0;  // 2^126
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kMaxAbsFp16 = 65504.0;
inline constexpr double kMaxFloat = 3.4028234663852886e38;  // FLT_MAX

inline DType dtype_of(const Problem& p) { return static_cast<DType>(p.dtype); }
const char* dtype_name(int32_t dtype);  // "fp16", "bf16" or "dtype?"

// fs_problem_init. Any sizes may be given: validate() judges them by the dimensions (contiguous_strides).
Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                     int64_t head_dim, DType dtype, int32_t causal);

// The largest softmax_scale validate() accepts (the rule and its reasons: flash_steps.h, Semantics).
double max_softmax_scale(int32_t dtype, int64_t head_dim);

// "" or one sentence naming the value and the limit it breaks; pointers are validate_tensors'.
std::string validate(const Problem& p);

// "" when the pointers are usable: Q, K, V, O non-null where there is work, 16-byte aligned; LSE 4-byte.
std::string validate_tensors(const Problem& p, const Tensors& t);

// fs_problem_flops: 4·B·Hq·Sq·Sk·d, halved when causal; with a window 4·B·Hq·d per visible pair.
double attention_flops(const Problem& p);

// A short description, e.g. "b2 h16/16 sq2048 sk2048 d128 fp16 causal".
std::string describe(const Problem& p);

// Writes O = 0 and LSE = -inf for every query row: the answer when seqlen_k == 0 (common/harness/tensors.cu).
void fill_empty_output(const Problem& p, const Tensors& t, cudaStream_t stream);

template <>
struct Pass<Problem> {
  using Tensors = fs::Tensors;
  static constexpr const char* workspace_function = "fs_workspace_size";
  static const Entry<Problem, Tensors>& entry(const Step& s) { return s.forward; }
  static const Problem& attention(const Problem& p) { return p; }
  static std::string missing(const Step& s) {
    return "step " + s.id + " has no forward pass (it is a backward step: fs_run_backward)";
  }
  static size_t harness_workspace(const Problem&) { return 0; }
  // The harness's own part of a launch: seqlen_q == 0, nothing; seqlen_k == 0, O = 0 and LSE = -inf.
  // `done` when that was the whole answer; a refusal ("" here) stops the launch.
  static std::string harness_launch(const Problem& p, const Tensors& t, void*, cudaStream_t stream, bool& done) {
    if (p.seqlen_q > 0 && p.seqlen_k == 0) fill_empty_output(p, t, stream);
    done = p.seqlen_q == 0 || p.seqlen_k == 0;
    return "";
  }
};

}  // namespace fs
