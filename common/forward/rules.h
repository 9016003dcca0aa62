// The forward pass's rules, FLOPs and description, and its traits for the chain (common/harness/chain.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "forward/problem.h"
#include "step/varlen.h"
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

// fs_problem_flops: 4·B·Hq·Sq·Sk·d, halved when causal; with a window 4·B·Hq·d per visible pair. A
// variable-length batch is counted with every sequence at the bounds seqlen_q, seqlen_k: an upper bound
// (varlen_flops counts its sequences).
double attention_flops(const Problem& p);

// A short description, e.g. "b2 h16/16 sq2048 sk2048 d128 fp16 causal"; a variable-length batch
// "varlen b4 h16/16 sq<=4096 sk<=4096 tq4225 tk4225 d128 fp16" (the bounds, then the totals).
std::string describe(const Problem& p);

// Writes O = 0 and LSE = -inf for every query row: the answer when seqlen_k == 0 (common/harness/tensors.cu).
void fill_empty_output(const Problem& p, const Tensors& t, cudaStream_t stream);

// ---- variable-length batches (fs_problem::cu_seqlens_q, _k; common/step/varlen.h: dense_view) ------

// Host copies of a variable-length batch's offsets, batch + 1 each (the device arrays are the caller's).
struct Offsets {
  std::vector<int32_t> q, k;
};
// The offsets of sequences with these lengths (prefix sums from 0); `lengths_k` empty: the same as Q's.
Offsets offsets_of(std::span<const int32_t> lengths_q, std::span<const int32_t> lengths_k = {});

// A variable-length batch of these offsets, with `shape`'s heads, head_dim, dtype, masks and scale: batch
// the number of sequences, seqlen_q and seqlen_k the longest ones (the bounds), the totals, packed
// contiguous strides (batch strides 0). cu_seqlens_q and cu_seqlens_k point at `cu`'s host arrays: what
// the host's rules need (they read no offset); a launch needs device copies, which a Workload makes.
Problem varlen_problem(const Problem& shape, const Offsets& cu);

// "" when host copies of the offsets keep the contract (flash_steps.h): batch + 1 each, cu[0] = 0, never
// decreasing, the last one the total, every sequence within its bound; else a sentence naming the first
// offset that breaks it. p passed validate().
std::string validate_offsets(const Problem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k);
// The device arrays of p (a variable-length batch that passed validate()) copied to the host on `stream`,
// which is then synchronized.
Offsets download_offsets(const Problem& p, cudaStream_t stream);
// validate_offsets on them (fs_check_offsets); "" for a dense problem.
std::string validate_device_offsets(const Problem& p, cudaStream_t stream);

// A packed batch's tensors are (total, heads, head_dim): "" when each of these views has batch stride 0,
// else the sentence for the first that has not. Validation names their rows total_q and total_k.
std::string validate_packed_strides(std::initializer_list<std::pair<const char*, Strides>> views);
inline const char* rows_q_name(const Problem& p) { return is_varlen(p) ? "total_q" : "seqlen_q"; }
inline const char* rows_k_name(const Problem& p) { return is_varlen(p) ? "total_k" : "seqlen_k"; }

// Row `row` of a packed fp16/bf16 tensor at `base` (null stays null): where one sequence's rows begin, which
// the references then read as a dense (1, len, heads, head_dim) tensor with the same strides.
inline const char* packed_row(const void* base, const Strides& st, int64_t row) {
  return base ? static_cast<const char*>(base) + row * st.row * 2 : nullptr;
}

// f(b, sequence) for every sequence of a variable-length batch, from host copies of its offsets.
template <typename F>
void for_each_sequence(const Problem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k, F&& f) {
  for (int64_t b = 0; b < p.batch; ++b)
    f(b, sequence_from(p, cu_q[size_t(b)], cu_q[size_t(b) + 1], cu_k[size_t(b)], cu_k[size_t(b) + 1]));
}

// fs_varlen_flops: the sum over the sequences of attention_flops of each on its own (one_sequence), from
// host copies of the offsets that passed validate_offsets.
double varlen_flops(const Problem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k);

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
  // A variable-length batch by its totals: no query row, or no key for any sequence.
  static std::string harness_launch(const Problem& p, const Tensors& t, void*, cudaStream_t stream, bool& done) {
    const Problem d = dense_view(p);
    if (d.seqlen_q > 0 && d.seqlen_k == 0) fill_empty_output(d, t, stream);
    done = d.seqlen_q == 0 || d.seqlen_k == 0;
    return "";
  }
};

}  // namespace fs
