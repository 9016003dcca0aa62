// The host side of the TMA for the Hopper steps (08, 09, 12, 13): the stride rule a tensor must meet
// and one 4-D tensor map (head_dim, seqlen, heads, batch) per operand, encoded by the driver that the
// CUDA runtime has loaded (nothing links libcuda). Encoding computes a descriptor on the host; no GPU
// work is involved. Step 08's traits.h has the shape (tensor_map_shape) and the stride limit.
#pragma once

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>
#include <sstream>
#include <string>

#include "forward/problem.h"
#include "step/device.h"

namespace fs {

// The TMA addresses byte strides below max_stride_bytes (2^40; the harness already makes them
// multiples of 16 bytes); a dimension of extent 1 is never stepped, so its stride does not count.
inline std::string check_tma_strides(const char* name, const Strides& s, int64_t seqlen, int64_t heads,
                                     int64_t batch, int64_t max_stride_bytes) {
  const struct { const char* what; int64_t stride, extent; } dims[] = {
      {"row", s.row, seqlen}, {"head", s.head, heads}, {"batch", s.batch, batch}};
  for (const auto& d : dims)
    if (d.extent > 1 && d.stride * 2 >= max_stride_bytes) {
      std::ostringstream m;
      m << name << "'s " << d.what << " stride is " << d.stride << " elements (" << d.stride * 2
        << " bytes); the TMA addresses strides below 2^40 bytes";
      return m.str();
    }
  return "";
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw Error("the CUDA driver does not provide cuTensorMapEncodeTiled (CUDA 12.0 or newer is needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A 4-D tensor map of `shape` (dims, strides, box: step 08's TensorMapShape), 128-byte swizzle, zeros
// for the elements of a box that lie outside the tensor. L2 promotion 256 B: the boxes of one tile's
// column blocks are issued back to back and cover consecutive bytes of each row.
// The driver encodes only with a context current on the calling thread, which a thread that has made no
// runtime call yet lacks (PyTorch's autograd runs the backward on such a thread): cudaSetDevice to the
// thread's device makes its primary context current (CUDA 12 and newer), at the cost of a call.
template <class Shape>
CUtensorMap make_tensor_map(const char* name, const void* data, CUtensorMapDataType type, const Shape& shape) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaSetDevice(device));
  CUtensorMap map;
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(&map, type, 4, const_cast<void*>(data), shape.dims, shape.strides,
                                          shape.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(std::string("cuTensorMapEncodeTiled refused the tensor map of ") + name + " (CUresult " +
                std::to_string(int(r)) + ")");
  return map;
}

}  // namespace fs
