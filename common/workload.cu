#include "workload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "checked.h"
#include "dtype.cuh"
#include "registry.h"

namespace fs {

namespace {

// A counter-based generator: element i of a draw depends on (seed, i) only, so the values do not
// depend on the launch configuration.
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

// O = 0 and LSE = -inf for every query row: the answer when no row has a key to attend. With lse
// null, only the zeros: fill_zero's kernel for any (batch, rows, heads, head_dim) view.
template <typename T>
__global__ void fill_empty_kernel(T* o, Strides os, float* lse, int64_t batch, int64_t seqlen_q,
                                  int64_t heads, int64_t head_dim) {
  const int64_t rows = batch * seqlen_q * heads;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = r % heads, s = (r / heads) % seqlen_q, b = r / (heads * seqlen_q);
    if (o) {
      T* row = o + offset_of(os, b, s, h);
      for (int64_t d = 0; d < head_dim; ++d) row[d] = from_float<T>(0.0f);
    }
    if (lse) lse[(b * heads + h) * seqlen_q + s] = -INFINITY;
  }
}

constexpr int kThreads = 256;
int grid_for(int64_t n) { return grid_stride_blocks(n, kThreads); }

int64_t align16(int64_t elems) { return (elems + 7) / 8 * 8; }  // 8 fp16/bf16 = 16 bytes

// A size the workload computed, or fs::Error when it did not fit in 64 bits (validate() keeps every
// tensor within 2^58 elements, so a validated problem never gets here).
int64_t size_or_throw(std::optional<int64_t> n, const char* what) {
  if (!n) throw Error(std::string("the workload's ") + what + " does not fit in 64 bits");
  return *n;
}

}  // namespace

void fill_empty_output(const Problem& p, const Tensors& t, cudaStream_t stream) {
  const int64_t rows = p.batch * p.seqlen_q * p.heads_q;
  if (rows == 0) return;
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_empty_kernel<T><<<grid_for(rows), kThreads, 0, stream>>>(static_cast<T*>(t.o), p.o, t.lse, p.batch,
                                                                  p.seqlen_q, p.heads_q, p.head_dim);
    CHECK_LAUNCH();
  });
}

void fill_zero(void* x, const Strides& s, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim, int32_t dtype,
               cudaStream_t stream) {
  const int64_t n = batch * rows * heads;
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_empty_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(x), s, nullptr, batch, rows, heads,
                                                               head_dim);
    CHECK_LAUNCH();
  });
}

Workload::Workload(const Problem& shape, uint64_t seed, Layout layout) : p_(shape) {
  if (layout == Layout::packed_qkv) {
    if (p_.seqlen_q != p_.seqlen_k) throw Error("Layout::packed_qkv needs seqlen_q == seqlen_k");
    const int64_t heads = p_.heads_q + 2 * p_.heads_kv;
    const Strides s = contiguous_strides(p_.seqlen_q, heads, p_.head_dim);
    p_.q = p_.k = p_.v = s;
    q_off_ = 0;
    k_off_ = p_.heads_q * p_.head_dim;
    v_off_ = (p_.heads_q + p_.heads_kv) * p_.head_dim;
    input_elems_ = view_extent(s, p_.batch, p_.seqlen_q, heads, p_.head_dim);
  } else {
    q_off_ = 0;
    k_off_ = align16(view_extent(p_.q, p_.batch, p_.seqlen_q, p_.heads_q, p_.head_dim));
    v_off_ = size_or_throw(checked_add(k_off_, align16(view_extent(p_.k, p_.batch, p_.seqlen_k, p_.heads_kv, p_.head_dim))),
                           "offset of V");
    input_elems_ = size_or_throw(checked_add(v_off_, view_extent(p_.v, p_.batch, p_.seqlen_k, p_.heads_kv, p_.head_dim)),
                                 "Q, K and V element count");
  }
  const int64_t o_elems = view_extent(p_.o, p_.batch, p_.seqlen_q, p_.heads_q, p_.head_dim);
  inputs_ = DeviceBuffer(size_t(size_or_throw(checked_mul(input_elems_, 2), "Q, K and V size in bytes")));
  out_ = DeviceBuffer(size_t(size_or_throw(checked_mul(o_elems, 2), "O size in bytes")));
  lse_ = DeviceBuffer(size_t(size_or_throw(checked_product({p_.batch, p_.heads_q, p_.seqlen_q, int64_t(sizeof(float))}),
                                           "LSE size in bytes")));
  randomize(seed);
}

Tensors Workload::tensors() const {
  auto* base = inputs_.as<uint16_t>();
  return Tensors{base + q_off_, base + k_off_, base + v_off_, out_.get(), lse_.as<float>()};
}

void fill_random(void* x, int64_t n, int32_t dtype, uint64_t seed) {
  if (n == 0) return;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fill_random_kernel<T><<<grid_for(n), kThreads>>>(static_cast<T*>(x), n, seed, kInputOffset, kInputSigma);
    CHECK_LAUNCH();
  });
}

float max_abs(const void* x, int64_t n, int32_t dtype) {
  if (n == 0) return 0.0f;
  DeviceBuffer result(sizeof(unsigned));
  CHECK_CUDA(cudaMemset(result.get(), 0, sizeof(unsigned)));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_abs_kernel<T><<<grid_for(n), kThreads>>>(static_cast<const T*>(x), Strides{0, 0, 0, 1}, 1, 1, 1, n,
                                                 result.as<unsigned>());
    CHECK_LAUNCH();
  });
  unsigned bits = 0;
  CHECK_CUDA(cudaMemcpy(&bits, result.get(), sizeof bits, cudaMemcpyDeviceToHost));
  float m = 0;
  std::memcpy(&m, &bits, sizeof bits);
  return m;
}

void Workload::randomize(uint64_t seed) {
  if (input_elems_ == 0) return;
  fill_random(inputs_.get(), input_elems_, p_.dtype, seed);
  // The largest |V| sets the absolute part of the tolerance (see compare.h).
  max_abs_v_ = 0;
  const int64_t v_elems = p_.batch * p_.seqlen_k * p_.heads_kv * p_.head_dim;
  if (v_elems == 0) return;
  DeviceBuffer result(sizeof(unsigned));
  CHECK_CUDA(cudaMemset(result.get(), 0, sizeof(unsigned)));
  dispatch_dtype(p_.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_abs_kernel<T><<<grid_for(v_elems), kThreads>>>(inputs_.as<T>() + v_off_, p_.v, p_.batch, p_.seqlen_k,
                                                       p_.heads_kv, p_.head_dim, result.as<unsigned>());
    CHECK_LAUNCH();
  });
  unsigned bits = 0;
  CHECK_CUDA(cudaMemcpy(&bits, result.get(), sizeof bits, cudaMemcpyDeviceToHost));
  std::memcpy(&max_abs_v_, &bits, sizeof bits);
}

void Workload::poison(cudaStream_t stream) {
  if (out_.bytes()) CHECK_CUDA(cudaMemsetAsync(out_.get(), 0xFF, out_.bytes(), stream));  // NaN in fp16 and bf16
  if (lse_.bytes()) CHECK_CUDA(cudaMemsetAsync(lse_.get(), 0xFF, lse_.bytes(), stream));  // NaN in fp32
}

std::vector<float> download_as_float(const void* src, int64_t n, int32_t dtype) {
  std::vector<float> host(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n == 0) return host;
  DeviceBuffer tmp(size_t(n) * sizeof(float));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    to_float_kernel<T><<<grid_for(n), kThreads>>>(static_cast<const T*>(src), tmp.as<float>(), n);
    CHECK_LAUNCH();
  });
  CHECK_CUDA(cudaMemcpy(host.data(), tmp.get(), size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

HostInputs Workload::download_inputs() const {
  HostInputs h;
  h.data = download_as_float(inputs_.get(), input_elems_, p_.dtype);
  h.q = q_off_;
  h.k = k_off_;
  h.v = v_off_;
  return h;
}

std::vector<float> Workload::download_o() const {
  return download_as_float(out_.get(), int64_t(out_.bytes() / 2), p_.dtype);
}

std::vector<float> Workload::download_lse() const {
  std::vector<float> host(lse_.bytes() / sizeof(float));
  if (!host.empty())
    CHECK_CUDA(cudaMemcpy(host.data(), lse_.get(), lse_.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace fs
