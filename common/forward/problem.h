/* The forward problem: the struct of the C ABI (common/flash_steps.h has its contract) and, for C++,
 * what a kernel needs to read it. A step of the forward pass includes this file, common/step/step.h
 * and common/step/dtype.cuh, and nothing else of the harness. */
#ifndef FLASH_STEPS_FORWARD_PROBLEM_H
#define FLASH_STEPS_FORWARD_PROBLEM_H

#include <stdint.h>

typedef enum fs_dtype { FS_FP16 = 0, FS_BF16 = 1 } fs_dtype;

/* Element strides of one (batch, seqlen, heads, head_dim) tensor. `dim` must be 1; it is there so that
 * a framework tensor's four strides can be passed as they are and refused clearly when it is not. */
typedef struct fs_strides {
  int64_t batch;
  int64_t row;
  int64_t head;
  int64_t dim;
} fs_strides;

typedef struct fs_problem {
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim;
  int32_t dtype;  /* fs_dtype */
  int32_t causal; /* 0 or 1; bottom-right aligned */
  float softmax_scale;
  float softcap; /* 0: off; else every logit s becomes softcap·tanh(s / softcap) before the softmax */
  fs_strides q, k, v, o;
  /* Sliding window (0, as fs_problem_init and a zeroed struct leave it: off). window = 1: row i sees the
   * keys j with  i + d - window_left <= j <= i + d + window_right,  d = seqlen_k - seqlen_q (bottom-right,
   * as causal), a bound of -1 unbounded on its side; with causal too, the right bound is 0. */
  int32_t window;
  int32_t window_left;
  int32_t window_right;
  /* Variable-length batch (NULL, as fs_problem_init and a zeroed struct leave them: off; both or neither).
   * Q and O are packed (total_q, heads_q, head_dim), K and V (total_k, heads_kv, head_dim), with row and
   * head strides (the batch strides are not used and must be 0). Sequence b is rows cu_seqlens_q[b] …
   * cu_seqlens_q[b + 1] - 1 of Q and O and rows cu_seqlens_k[b] … cu_seqlens_k[b + 1] - 1 of K and V;
   * batch counts the sequences, and seqlen_q, seqlen_k bound their lengths (FlashAttention's max_seqlen_q
   * and max_seqlen_k). Device arrays of batch + 1 int32 offsets. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q; /* rows of the packed Q and O (0 without cu_seqlens) */
  int64_t total_k; /* rows of the packed K and V */
} fs_problem;

#ifdef __cplusplus

#include "step/hd.h"

namespace fs {

using Problem = fs_problem;
using Strides = fs_strides;

enum class DType : int32_t { fp16 = FS_FP16, bf16 = FS_BF16 };

// Device pointers of one launch. `lse` may be null.
struct Tensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

// The K/V head that query head `h` reads (GQA: every heads_q / heads_kv query heads share one; MQA: one).
FS_HD inline int64_t kv_head_of(const Problem& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

// Bottom-right causal alignment: may query row i attend to key j?
FS_HD inline bool causal_allows(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k) {
  return j <= i + seqlen_k - seqlen_q;
}

// Element offset of (b, s, h, 0) in a (batch, seqlen, heads, head_dim) view. 64-bit throughout.
FS_HD inline int64_t offset_of(const Strides& st, int64_t b, int64_t s, int64_t h) {
  return b * st.batch + s * st.row + h * st.head;
}

}  // namespace fs

#endif  // __cplusplus
#endif  // FLASH_STEPS_FORWARD_PROBLEM_H
