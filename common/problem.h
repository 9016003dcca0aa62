// The attention problem every step solves, with the harness's own rules.
// The struct itself is the C ABI's fs_problem (common/flash_steps.h), so the C++ API, the runner,
// the tests and ctypes callers all describe a problem the same way.
#pragma once

#include <cstdint>
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
Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, DType dtype, bool causal);

// Contiguous strides of a (batch, seqlen, heads, head_dim) tensor.
Strides contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim);

// Device pointers of one launch. `lse` may be null.
struct Tensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

// The harness's limits. Steps add their own through Step::supports.
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kHeadDimMultiple = 8;     // 16-byte rows for fp16/bf16
inline constexpr int64_t kMaxSeqlen = INT32_MAX;   // row indices are 32-bit inside kernels
inline constexpr int64_t kMaxBatchHeads = INT32_MAX;

// "" when the problem follows every rule of the harness, else one sentence naming the value and the
// limit it breaks. Pointers are not looked at (see validate_tensors).
std::string validate(const Problem& p);

// "" when the pointers are usable for `p`: Q, K, V, O non-null and 16-byte aligned; lse may be null
// and must be 4-byte aligned.
std::string validate_tensors(const Problem& p, const Tensors& t);

// Number of elements a tensor view spans from its base pointer (largest offset + 1); 0 if empty.
int64_t view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);

// FLOPs of the forward pass as FlashAttention counts them: 4·B·Hq·Sq·Sk·d (two GEMMs, multiply-add
// = 2 FLOPs), halved when causal. The softmax is not counted.
double attention_flops(const Problem& p);

// A short description, e.g. "b2 h16/16 sq2048 sk2048 d128 fp16 causal".
std::string describe(const Problem& p);

// The K/V head that query head `h` reads (GQA / MQA).
FS_HD inline int64_t kv_head_of(const Problem& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

}  // namespace fs
