// fp16 / bf16 on the device: conversions and a dispatch from the run-time dtype to a template.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "device.h"
#include "problem.h"

namespace fs {

__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// dispatch_dtype(p.dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <typename T>
struct TypeTag { using type = T; };

template <typename F>
decltype(auto) dispatch_dtype(int32_t dtype, F&& f) {
  if (dtype == FS_FP16) return f(TypeTag<__half>{});
  if (dtype == FS_BF16) return f(TypeTag<__nv_bfloat16>{});
  throw Error(std::string("unknown dtype ") + std::to_string(dtype));
}

// Element offset of (b, s, h, 0) in a (batch, seqlen, heads, head_dim) view. 64-bit throughout.
__host__ __device__ inline int64_t offset_of(const Strides& st, int64_t b, int64_t s, int64_t h) {
  return b * st.batch + s * st.row + h * st.head;
}

}  // namespace fs
