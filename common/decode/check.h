// Checking a decoding step: the workload and the references (the forward ones on each sequence's keys,
// gathered from the cache); the comparison is the forward one (forward/check.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "decode/rules.h"
#include "forward/check.h"

namespace fs {

// Host copies of a decoding problem's inputs: the Q view's storage and the caches' storage as floats
// (index with the problem's strides), the lengths (empty: seqlen_k each) and the block table.
struct DecodeHostInputs {
  std::vector<float> q, k_cache, v_cache;
  std::vector<int32_t> lengths, block_table;
};

// The keys (or values) of sequence b, its first `len` rows gathered from `cache` (a contiguous or
// paged cache with strides `st`): a contiguous (len, heads_kv, head_dim) array.
std::vector<float> gather_sequence(const DecodeProblem& p, const std::vector<float>& cache, const Strides& st,
                                   const std::vector<int32_t>& block_table, int64_t b, int64_t len);

// Sequence b as a forward problem of batch 1 with its `len` keys (contiguous strides): the problem's sizes,
// dtype, causal, scale and features (softcapping; the window, aligned as causal to the sequence's keys).
// Both references run it on the keys they gather.
Problem sequence_problem(const DecodeProblem& p, int64_t len);

Reference reference_cpu(const DecodeProblem& p, const DecodeHostInputs& in);
double reference_cpu_cost(const DecodeProblem& p, const std::vector<int32_t>& lengths);

class DecodeWorkload {
 public:
  // `shape`: sizes, dtype, causal, the cache (contiguous or paged) and strides, as given.
  // `lengths`: one per sequence, each in [0, seqlen_k]; empty for seqlen_k each, passed as a NULL
  // cache_seqlens. A paged cache's block table gives the pages a sequence uses from a seeded shuffle
  // of all num_pages pages (which must be enough: num_pages >= the pages all sequences use); the
  // entries past a sequence's pages are -1, which the kernels must never read.
  DecodeWorkload(const DecodeProblem& shape, std::vector<int32_t> lengths, uint64_t seed);

  const DecodeProblem& problem() const { return p_; }
  DecodeTensors tensors() const;
  const std::vector<int32_t>& lengths() const { return lengths_; }          // host copies

  // Overwrites one length or one block-table entry, on the device and in the host copy (the checked
  // mode's tests). A length needs a workload built with lengths.
  void set_length(int64_t b, int32_t length);
  void set_block_table_entry(int64_t b, int64_t i, int32_t page);

  void poison(cudaStream_t stream = nullptr) { out_.poison(stream); }
  DecodeHostInputs download_inputs() const;
  std::vector<float> download_o() const { return out_.o.download(); }  // the O view's storage (p.o strides)
  std::vector<float> download_lse() const { return out_.download_lse(); }
  float max_abs_v() const { return max_abs_v_; }
  // Bytes of K and V the problem reads (decode_kv_bytes with these lengths).
  double kv_bytes() const { return decode_kv_bytes(p_, lengths_); }
  Comparison compare(const Reference& ref) const {
    return fs::compare(p_.attention, download_o(), download_lse(), ref, max_abs_v_);
  }

 private:
  DecodeProblem p_;
  std::vector<int32_t> lengths_, block_table_;
  DeviceTensor q_, k_, v_;
  Output out_;
  DeviceBuffer lengths_dev_, table_dev_;
  float max_abs_v_ = 0;
};

// The GPU reference on the workload's device inputs: each sequence's keys gathered into a contiguous
// buffer (the device block table is read), then GpuReference::run per sequence; downloaded.
Reference gpu_reference(const DecodeWorkload& w, GpuReference& gpu);
// fp64 on the CPU when cheap (kCpuReferenceMaxCost), else gpu_reference.
Reference make_reference(const DecodeWorkload& w, GpuReference& gpu);

}  // namespace fs
