/* The decoding problem: a few new query tokens per sequence against a KV cache, contiguous or paged,
 * with per-sequence lengths (common/flash_steps.h has the contract). The struct of the C ABI and, for
 * C++, what a decoding kernel needs to read it. */
#ifndef FLASH_STEPS_DECODE_PROBLEM_H
#define FLASH_STEPS_DECODE_PROBLEM_H

#include "forward/problem.h"

typedef struct fs_decode_problem {
  /* Sizes, dtype, causal, softmax_scale and the strides of Q and O. seqlen_k is the capacity (the most
   * keys a sequence may have); k and v are the cache's strides (batch or page, row, head, dim). */
  fs_problem attention;
  int32_t num_splits;         /* 0: the step's heuristic; 1 ... 128: that many */
  int32_t checked;            /* 1: check cache_seqlens and block_table on the device first (synchronizes) */
  int64_t page_size;          /* 0: contiguous cache; else keys per page, a multiple of 16 */
  int64_t num_pages;          /* paged: pages in the cache (first dimension of K and V) */
  int64_t max_pages_per_seq;  /* paged: columns of the block table */
  int64_t block_table_stride; /* paged: elements from one row of the block table to the next */
} fs_decode_problem;

#ifdef __cplusplus

namespace fs {

using DecodeProblem = fs_decode_problem;

// Device pointers of one decoding launch. block_table: NULL for a contiguous cache; cache_seqlens: NULL
// when every sequence has seqlen_k keys; lse may be NULL.
struct DecodeTensors {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* cache_seqlens = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

inline constexpr int64_t kPageMultiple = 16;  // a page holds whole groups of 16 keys
inline constexpr int64_t kMaxSplits = 128;    // num_splits 1 ... 128 (0: the step's heuristic)

FS_HD inline bool is_paged(const DecodeProblem& p) { return p.page_size != 0; }

// The decoding problem of a forward problem: a contiguous cache holding K and V, every sequence at
// seqlen_k keys. A decoding problem with a contiguous cache and no lengths is its `attention` problem.
inline DecodeProblem decode_of(const Problem& forward) {
  DecodeProblem p{};
  p.attention = forward;
  return p;
}

// The key of sequence b at position j: where it is in the cache, as (page or batch entry, row).
struct CacheRow {
  int64_t slot;  // the batch entry (contiguous) or the page (paged)
  int64_t row;   // the row in it
};
FS_HD inline CacheRow cache_row(const DecodeProblem& p, const int32_t* block_table, int64_t b, int64_t j) {
  if (!is_paged(p)) return {b, j};
  return {block_table[b * p.block_table_stride + j / p.page_size], j % p.page_size};
}

}  // namespace fs

#endif  // __cplusplus
#endif  // FLASH_STEPS_DECODE_PROBLEM_H
