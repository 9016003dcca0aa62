// The decoding pass's rules, its bytes and description, and its traits for the chain.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "decode/problem.h"
#include "forward/rules.h"

namespace fs {

// Bytes at the start of a decoding workspace that the checked mode uses for its report.
inline constexpr size_t kDecodeCheckBytes = 256;

// fs_decode_problem_init: contiguous Q and O, and a contiguous cache (page_size 0) or a paged one.
DecodeProblem make_decode_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                  int64_t heads_kv, int64_t head_dim, DType dtype, int32_t causal,
                                  int64_t page_size = 0);

// "" or one sentence: validate() for Q, O and the shared sizes, then the cache, the block table's shape,
// num_splits and checked. Device data (lengths, table entries) is not looked at.
std::string validate(const DecodeProblem& p);

// "" when the pointers are usable (flash_steps.h); the block table null for a contiguous cache.
std::string validate_tensors(const DecodeProblem& p, const DecodeTensors& t);

// "" when host copies of the device data keep the contract: `lengths` (batch values, or none for
// seqlen_k each) in [0, seqlen_k]; for a paged cache, `block_table` (batch rows of
// block_table_stride) names a page in [0, num_pages) for every page a sequence uses. The problem
// passed validate().
std::string validate_lengths(const DecodeProblem& p, std::span<const int32_t> lengths);
std::string validate_data(const DecodeProblem& p, const std::vector<int32_t>& lengths,
                          const std::vector<int32_t>& block_table);

// The same on the device, for the checked mode (decode/device_data.cu): a kernel checks every length
// and every block-table entry a sequence uses, writing the first bad ones to `record`
// (kDecodeCheckBytes of device memory); `stream` is then synchronized.
std::string validate_device_data(const DecodeProblem& p, const DecodeTensors& t, void* record, cudaStream_t stream);

// fs_decode_kv_bytes (no `lengths`: seqlen_k each): what the decoding tables divide by the time.
double decode_kv_bytes(const DecodeProblem& p, std::span<const int32_t> lengths);

// "b8 h32/8 sq1 sk32768 d128 fp16 paged64 checked" (and "causal", "splits4" when set).
std::string describe(const DecodeProblem& p);

template <>
struct Pass<DecodeProblem> {
  using Tensors = DecodeTensors;
  static constexpr const char* workspace_function = "fs_decode_workspace_size";
  static const Entry<DecodeProblem, Tensors>& entry(const Step& s) { return s.decode; }
  static const Problem& attention(const DecodeProblem& p) { return p.attention; }
  static std::string missing(const Step& s) {
    return "step " + s.id + " has no decoding entry (per-sequence lengths, a paged cache); it runs forward "
           "problems (fs_check, fs_run), which a decoding problem is when its cache is contiguous and every "
           "sequence has seqlen_k keys";
  }
  // The checked mode's report, before the step's part of the workspace.
  static size_t harness_workspace(const DecodeProblem& p) { return p.checked ? kDecodeCheckBytes : 0; }
  // Empty work as in the forward pass; then, in the checked mode, the device data: the refusal names
  // the first bad entry, and nothing else is launched.
  static std::string harness_launch(const DecodeProblem& p, const Tensors& t, void* workspace, cudaStream_t stream,
                                    bool& done);
};

}  // namespace fs
