// The attention problem every step solves, with the harness's own rules.
// The struct itself is the C ABI's fs_problem (common/flash_steps.h), so the C++ API, the runner,
// the tests and ctypes callers all describe a problem the same way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flash_steps.h"

// Marks the small index helpers that kernels and CPU code share.
#ifdef __CUDACC__
#define FS_HD __host__ __device__
#else
#define FS_HD
#endif

namespace fs {

using Problem = fs_problem;
using Strides = fs_strides;

enum class DType : int32_t { fp16 = FS_FP16, bf16 = FS_BF16 };

inline DType dtype_of(const Problem& p) { return static_cast<DType>(p.dtype); }
const char* dtype_name(int32_t dtype);  // "fp16", "bf16" or "dtype?"

// A problem with contiguous (batch, seqlen, heads, head_dim) tensors and scale 1/sqrt(head_dim).
// Any sizes may be given: validate() then judges them by the dimensions given (see contiguous_strides).
Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, DType dtype, bool causal);

// Contiguous strides of a (batch, seqlen, heads, head_dim) tensor. A stride that does not fit in
// int64_t is set to -1; validate() refuses the dimensions that cause it before it reads any stride.
Strides contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim);

// Device pointers of one launch. `lse` may be null.
struct Tensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

// The harness's limits. Steps add their own through Step::limits and Step::plan.
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kHeadDimMultiple = 8;     // 16-byte rows for fp16/bf16
inline constexpr int64_t kMaxSeqlen = INT32_MAX;   // row indices are 32-bit inside kernels
inline constexpr int64_t kMaxBatchHeads = INT32_MAX;
// Elements one tensor may span (its logical size and its view's extent): 2^58, far beyond any device,
// and small enough that every size derived from it (bytes as fp64 on the host, Q, K and V in one
// buffer) fits in int64_t.
inline constexpr int64_t kMaxTensorElements = int64_t(1) << 58;
// The largest logit the kernels may form, |q·k|·softmax_scale·log2(e) in fp32: 2^126, so that every
// logit and the difference of any two are finite (FLT_MAX is about 2^128). See flash_steps.h.
inline constexpr double kMaxLogit = 85070591730234615865843651857942052864.0;  // 2^126
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kMaxAbsFp16 = 65504.0;

// The largest softmax_scale validate() accepts. fp16: every input the dtype can hold gives logits
// within kMaxLogit (|q·k| <= head_dim·65504²). bf16: scale·log2(e) <= kMaxLogit (a bf16 q·k can
// itself exceed fp32's range, so no scale bounds every logit; see flash_steps.h).
double max_softmax_scale(int32_t dtype, int64_t head_dim);

// "" when the problem follows every rule of the harness, else one sentence naming the value and the
// limit it breaks. Pointers are not looked at (see validate_tensors).
std::string validate(const Problem& p);

// One (dim0, rows, heads, head_dim) tensor view by the rules validate() applies to each of Q, K, V
// and O: its logical size (at most 2^58 elements; `names` is the pair in the sentence, "K and V"),
// then its strides, then the extent of its view (`name`, "K"). dim0_name and dim0_stride name the
// first dimension and its stride: "batch" and "batch", or "num_pages" and "page" for a paged cache.
std::string validate_view(const char* names, const char* name, const Strides& s, const char* dim0_name,
                          const char* dim0_stride, int64_t dim0, const char* rows_name, int64_t rows,
                          const char* heads_name, int64_t heads, int64_t head_dim);

// "" when no two elements of a (batch, rows, heads, head_dim) view share an address, as validate()
// requires of O (and validate_backward of dQ, dK, dV). The rule: sorted by stride, every dimension of
// extent > 1 starts at or past the span of the dimensions below it (the largest offset they reach,
// plus 1); every dense or padded layout, in any dimension order, follows it. `may_overlap` names, in
// the sentence, the tensors that may overlap themselves ("Q, K and V"). Call after validate_view.
std::string validate_no_overlap(const char* name, const char* may_overlap, const Strides& s, int64_t batch,
                                const char* rows_name, int64_t rows, const char* heads_name, int64_t heads,
                                int64_t head_dim);

// "" when the pointers are usable for `p`: Q, K, V, O non-null and 16-byte aligned; lse may be null
// and must be 4-byte aligned.
std::string validate_tensors(const Problem& p, const Tensors& t);

// Number of elements a tensor view spans from its base pointer (largest offset + 1); 0 if empty.
// Nothing when it does not fit in int64_t (negative strides or sizes are not expected: validate first).
std::optional<int64_t> checked_view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads,
                                           int64_t head_dim);
// The same for a view validate() accepted; throws std::overflow_error when it does not fit.
int64_t view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);

// FLOPs of the forward pass as FlashAttention counts them: 4·B·Hq·Sq·Sk·d (two GEMMs, multiply-add
// = 2 FLOPs), halved when causal. The softmax is not counted.
double attention_flops(const Problem& p);

// A short description, e.g. "b2 h16/16 sq2048 sk2048 d128 fp16 causal".
std::string describe(const Problem& p);

// The K/V head that query head `h` reads (GQA / MQA).
FS_HD inline int64_t kv_head_of(const Problem& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

}  // namespace fs
