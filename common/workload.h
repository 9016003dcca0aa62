// The inputs and outputs of one problem on the device: random Q, K, V (seeded, not zero-mean),
// O and LSE buffers that are poisoned with NaN before every checked launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "buffer.h"
#include "problem.h"

namespace fs {

enum class Layout {
  separate,    // Q, K, V each in its own region, with the problem's strides
  packed_qkv,  // one (batch, seqlen, heads_q + 2*heads_kv, head_dim) buffer; Q, K, V are strided views
};

// Inputs are offset + sigma * N(0, 1), rounded to the dtype: non-zero mean, so a kernel that drops
// a term or reads the wrong row cannot hide behind symmetric cancellation.
inline constexpr float kInputOffset = 0.25f;
inline constexpr float kInputSigma = 1.0f;

// Host copies of the inputs as the exact float values of the fp16/bf16 elements; q/k/v index the
// problem's strides from these base offsets into `data`.
struct HostInputs {
  std::vector<float> data;
  int64_t q = 0, k = 0, v = 0;
  const float* q_ptr() const { return data.data() + q; }
  const float* k_ptr() const { return data.data() + k; }
  const float* v_ptr() const { return data.data() + v; }
};

class Workload {
 public:
  // `shape` gives the sizes, dtype, causal flag and scale. With Layout::separate its strides are
  // kept; with Layout::packed_qkv they are replaced (needs seqlen_q == seqlen_k).
  Workload(const Problem& shape, uint64_t seed, Layout layout = Layout::separate);

  const Problem& problem() const { return p_; }
  Tensors tensors() const;

  void randomize(uint64_t seed);  // a fresh draw of Q, K, V
  void poison(cudaStream_t stream = nullptr);  // O and LSE := NaN (all bits set)

  HostInputs download_inputs() const;
  std::vector<float> download_o() const;    // the O view's storage, as floats (index with p.o strides)
  std::vector<float> download_lse() const;  // (batch, heads_q, seqlen_q)
  float max_abs_v() const { return max_abs_v_; }

 private:
  Problem p_;
  DeviceBuffer inputs_;  // Q, K, V
  DeviceBuffer out_;     // O
  DeviceBuffer lse_;
  int64_t q_off_ = 0, k_off_ = 0, v_off_ = 0, input_elems_ = 0;
  float max_abs_v_ = 0;
};

// n fp16/bf16 elements of device memory := kInputOffset + kInputSigma · N(0, 1), rounded: Workload's
// generator (element i depends on (seed, i) only).
void fill_random(void* x, int64_t n, int32_t dtype, uint64_t seed);

// max |x| over n fp16/bf16 elements of device memory.
float max_abs(const void* x, int64_t n, int32_t dtype);

// n fp16/bf16 elements from device memory, as floats on the host.
std::vector<float> download_as_float(const void* src, int64_t n, int32_t dtype);

// Writes O = 0 and LSE = -inf for every query row: the answer when seqlen_k == 0.
void fill_empty_output(const Problem& p, const Tensors& t, cudaStream_t stream);

// Writes 0 to every element of a (batch, rows, heads, head_dim) fp16/bf16 view with strides `s`.
void fill_zero(void* x, const Strides& s, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, int32_t dtype,
               cudaStream_t stream);

// Bottom-right causal alignment: may query row i attend to key j?
FS_HD inline bool causal_allows(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k) {
  return j <= i + seqlen_k - seqlen_q;
}

}  // namespace fs
