// Device tensors of fp16/bf16 elements, as the harness fills and reads them: random inputs, zeros,
// the maximum, a download as floats. The kernels are in tensors.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "forward/problem.h"
#include "harness/gpu.h"

namespace fs {

// Inputs are offset + sigma · N(0, 1), rounded to the dtype: non-zero mean, so a kernel that drops a term
// or reads the wrong row cannot hide behind symmetric cancellation.
inline constexpr float kInputOffset = 0.25f;
inline constexpr float kInputSigma = 1.0f;

// n elements of device memory drawn so; element i depends on (seed, i) only, not on the launch.
void fill_random(void* x, int64_t n, int32_t dtype, uint64_t seed);

// max |x| over n elements of device memory, or over a (batch, seqlen, heads, head_dim) view.
float max_abs(const void* x, int64_t n, int32_t dtype);
float max_abs(const void* x, const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
              int32_t dtype);

// n elements from device memory, as floats on the host.
std::vector<float> download_as_float(const void* src, int64_t n, int32_t dtype);
// n floats from device memory, as floats or as doubles (the references' element type).
std::vector<float> download_floats(const float* src, int64_t n);
std::vector<double> download_doubles(const float* src, int64_t n);

// Writes 0 to every element of a (batch, rows, heads, head_dim) view with strides `s`, and, where `lse`
// is not null, -inf to its (batch, heads, rows) entries.
void fill_zero(void* x, const Strides& s, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, int32_t dtype,
               cudaStream_t stream, float* lse = nullptr);

// fp16/bf16 elements on the device, as many as a (dim0, rows, heads, head_dim) view with strides `s`
// spans: the inputs a workload draws, the outputs it poisons and reads back.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(const Strides& s, int64_t dim0, int64_t rows, int64_t heads, int64_t head_dim, int32_t dtype);
  void* get() const { return mem_.get(); }
  int64_t elems() const { return elems_; }
  void randomize(uint64_t seed) { fill_random(get(), elems_, dtype_, seed); }
  void poison(cudaStream_t stream = nullptr);  // every bit set: NaN in fp16 and bf16
  std::vector<float> download() const { return download_as_float(get(), elems_, dtype_); }  // the storage

 private:
  int64_t elems_ = 0;
  int32_t dtype_ = 0;
  DeviceBuffer mem_;
};

}  // namespace fs
