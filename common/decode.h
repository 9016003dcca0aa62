// The decoding problem: a few new query tokens per sequence against a KV cache, with per-sequence
// lengths and a contiguous or paged cache (common/flash_steps.h, fs_decode_problem, has the
// contract). The struct is the C ABI's, as fs::Problem is fs_problem.
//
// A decoding problem with a contiguous cache and every sequence at seqlen_k keys is an ordinary
// forward problem (forward_view): every step can run it, which is how the runner shows the ladder's
// kernels beside the decoding one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flash_steps.h"
#include "problem.h"

namespace fs {

using DecodeProblem = fs_decode_problem;

// Device pointers of one decoding launch. block_table: NULL for a contiguous cache; cache_seqlens:
// NULL when every sequence has seqlen_k keys; lse may be NULL.
struct DecodeTensors {
  const void* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* cache_seqlens = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

// The harness's decoding limits.
inline constexpr int64_t kPageMultiple = 16;  // a page holds whole groups of 16 keys
inline constexpr int64_t kMaxSplits = 128;    // num_splits 1 ... 128 (0: the step's heuristic)
// Bytes at the start of a decoding workspace that the checked mode uses for its report.
inline constexpr size_t kDecodeCheckBytes = 256;

// A decoding problem with contiguous Q and O, scale 1/sqrt(head_dim); page_size 0 gives a contiguous
// (batch, seqlen_k, heads_kv, head_dim) cache, else a paged one with ceil(seqlen_k / page_size)
// pages per sequence, batch times as many pages, and a dense block table (fs_decode_problem_init).
DecodeProblem make_decode_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                  int64_t heads_kv, int64_t head_dim, DType dtype, bool causal,
                                  int64_t page_size = 0);

FS_HD inline bool is_paged(const DecodeProblem& p) { return p.page_size != 0; }

// "" when the problem follows every rule of the harness, else one sentence naming the value and the
// limit it breaks. The rules of validate() for Q, O and the shared sizes, then the cache, the block
// table's shape, num_splits and checked. Device data (lengths, table entries) is not looked at.
std::string validate_decode(const DecodeProblem& p);

// "" when the pointers are usable: Q, K, V, O non-null and 16-byte aligned when there is work; the
// block table non-null for a paged cache; block table, lengths and LSE 4-byte aligned.
std::string validate_decode_tensors(const DecodeProblem& p, const DecodeTensors& t);

// "" when host copies of the device data keep the contract: `lengths` (batch values, or empty for
// seqlen_k each) in [0, seqlen_k]; for a paged cache, `block_table` (batch rows of
// block_table_stride) names a page in [0, num_pages) for every page a sequence uses.
std::string validate_decode_data(const DecodeProblem& p, const std::vector<int32_t>& lengths,
                                 const std::vector<int32_t>& block_table);

// The forward problem of fs_run with the same Q, O and strides and the cache as K and V (batch,
// seqlen_k, heads_kv, head_dim): what the problem is when the cache is contiguous and every sequence
// has seqlen_k keys. For a paged cache the K/V strides are the page's (its view is only for the
// sizes, the dtype and O's strides: compare() and fill_empty_output use it).
Problem forward_view(const DecodeProblem& p);

// The decoding problem of a forward problem: a contiguous cache holding K and V, every sequence at
// seqlen_k keys (forward_view's inverse).
DecodeProblem decode_view(const Problem& p);

// The key of sequence b at position j: where it is in the cache, as (page or batch entry, row).
struct CacheRow {
  int64_t slot;  // the batch entry (contiguous) or the page (paged)
  int64_t row;   // the row in it
};
FS_HD inline CacheRow cache_row(const DecodeProblem& p, const int32_t* block_table, int64_t b, int64_t j) {
  if (!is_paged(p)) return {b, j};
  return {block_table[b * p.block_table_stride + j / p.page_size], j % p.page_size};
}

// Bytes of K and V the problem must read: sum of lengths[b]·heads_kv·head_dim·2 bytes, twice (empty
// `lengths`: seqlen_k each). What the decoding tables divide by the time.
double decode_kv_bytes(const DecodeProblem& p, const std::vector<int32_t>& lengths);

// The checked mode (common/decode_device.cu): a kernel checks every length and every block-table
// entry a sequence uses, writing the first bad ones to `record` (kDecodeCheckBytes of device memory,
// 16-byte aligned); `stream` is then synchronized. "" when all are good, else a sentence naming the
// first bad entry and its value.
std::string check_decode_device_data(const DecodeProblem& p, const DecodeTensors& t, void* record,
                                     cudaStream_t stream);

// "b8 h32/8 sq1 sk32768 d128 fp16 paged64 checked" (and "causal", "splits4" when set).
std::string describe(const DecodeProblem& p);

}  // namespace fs
