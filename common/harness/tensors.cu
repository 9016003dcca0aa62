#include "harness/tensors.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "forward/rules.h"
#include "harness/gpu.h"
#include "step/dispatch.h"
#include "step/dtype.cuh"
#include "step/overflow.h"

namespace fs {

namespace {

// A counter-based generator: element i of a draw depends on (seed, i) only.
__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ inline float random_normal(uint64_t seed, uint64_t i) {
  const uint64_t r = splitmix64(seed * 0x2545F4914F6CDD1Dull + i);
  const float u1 = (float((r >> 40) & 0xFFFFFF) + 1.0f) / 16777217.0f;  // (0, 1]
  const float u2 = float((r >> 16) & 0xFFFFFF) / 16777216.0f;            // [0, 1)
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);                   // Box-Muller
}

template <typename T>
__global__ void fill_random_kernel(T* x, int64_t n, uint64_t seed, float offset, float sigma) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(offset + sigma * random_normal(seed, uint64_t(i)));
}

template <typename T>
__global__ void to_float_kernel(const T* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = to_float(x[i]);
}

// max |x| over a strided view. Non-negative floats order like their bit patterns, so an integer
// atomicMax on the bits is a float max.
template <typename T>
__global__ void max_abs_kernel(const T* x, Strides st, int64_t batch, int64_t seqlen, int64_t heads,
                               int64_t head_dim, unsigned* result) {
  const int64_t n = batch * seqlen * heads * head_dim;
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim, h = (i / head_dim) % heads, s = (i / (head_dim * heads)) % seqlen,
                  b = i / (head_dim * heads * seqlen);
    m = fmaxf(m, fabsf(to_float(x[offset_of(st, b, s, h) + d])));
  }
  atomicMax(result, __float_as_uint(m));
}

// Zeros in every row of a (batch, rows, heads, head_dim) view, and -inf in LSE (when not null).
template <typename T>
__global__ void fill_zero_kernel(T* x, Strides st, float* lse, int64_t batch, int64_t rows, int64_t heads,
                                 int64_t head_dim) {
  const int64_t n = batch * rows * heads;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < n; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = r % heads, s = (r / heads) % rows, b = r / (heads * rows);
    if (x) {
      T* row = x + offset_of(st, b, s, h);
      for (int64_t d = 0; d < head_dim; ++d) row[d] = from_float<T>(0.0f);
    }
    if (lse) lse[(b * heads + h) * rows + s] = -INFINITY;
  }
}

constexpr int kThreads = 256;
int grid_for(int64_t n) { return grid_stride_blocks(n, kThreads); }

}  // namespace

void fill_random(void* x, int64_t n, int32_t dtype, uint64_t seed) {
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_random_kernel<T><<<grid_for(n), kThreads>>>(static_cast<T*>(x), n, seed, kInputOffset, kInputSigma);
    CHECK_LAUNCH();
  });
}

float max_abs(const void* x, const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
              int32_t dtype) {
  const int64_t n = batch * seqlen * heads * head_dim;
  if (n == 0) return 0.0f;
  DeviceBuffer result(sizeof(unsigned));
  CHECK_CUDA(cudaMemset(result.get(), 0, sizeof(unsigned)));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_abs_kernel<T><<<grid_for(n), kThreads>>>(static_cast<const T*>(x), s, batch, seqlen, heads, head_dim,
                                                 result.as<unsigned>());
    CHECK_LAUNCH();
  });
  unsigned bits = 0;
  CHECK_CUDA(cudaMemcpy(&bits, result.get(), sizeof bits, cudaMemcpyDeviceToHost));
  float m = 0;
  std::memcpy(&m, &bits, sizeof bits);
  return m;
}

float max_abs(const void* x, int64_t n, int32_t dtype) { return max_abs(x, Strides{0, 0, 0, 1}, 1, 1, 1, n, dtype); }

std::vector<float> download_as_float(const void* src, int64_t n, int32_t dtype) {
  std::vector<float> host(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n <= 0) return host;
  DeviceBuffer tmp(size_t(n) * sizeof(float));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    to_float_kernel<T><<<grid_for(n), kThreads>>>(static_cast<const T*>(src), tmp.as<float>(), n);
    CHECK_LAUNCH();
  });
  CHECK_CUDA(cudaMemcpy(host.data(), tmp.get(), size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<float> download_floats(const float* src, int64_t n) {
  std::vector<float> host(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n > 0) CHECK_CUDA(cudaMemcpy(host.data(), src, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<double> download_doubles(const float* src, int64_t n) {
  const std::vector<float> host = download_floats(src, n);
  return {host.begin(), host.end()};
}

void fill_zero(void* x, const Strides& s, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, int32_t dtype,
               cudaStream_t stream, float* lse) {
  const int64_t n = batch * rows * heads;
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_zero_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(x), s, lse, batch, rows, heads, head_dim);
    CHECK_LAUNCH();
  });
}

DeviceTensor::DeviceTensor(const Strides& s, int64_t dim0, int64_t rows, int64_t heads, int64_t head_dim,
                           int32_t dtype)
    : elems_(view_extent(s, dim0, rows, heads, head_dim)), dtype_(dtype) {
  const std::optional<int64_t> bytes = checked_mul(elems_, 2);
  if (!bytes) throw Error("a tensor of " + std::to_string(elems_) + " elements does not fit in 64-bit byte counts");
  mem_ = DeviceBuffer(size_t(*bytes));
}

void DeviceTensor::poison(cudaStream_t stream) {
  if (mem_.bytes()) CHECK_CUDA(cudaMemsetAsync(mem_.get(), 0xFF, mem_.bytes(), stream));
}

void fill_empty_output(const Problem& p, const Tensors& t, cudaStream_t stream) {
  fill_zero(t.o, p.o, p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.dtype, stream, t.lse);
}

}  // namespace fs
