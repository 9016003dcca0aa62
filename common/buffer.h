// RAII device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "device.h"

namespace fs {

// Owns `bytes` of device memory from cudaMalloc; freed in the destructor. Move-only. Throws
// fs::OutOfMemory (naming the bytes) when the device has not enough, fs::CudaError on other failures.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, bytes_);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it, so that the next CHECK_LAUNCH does not report it
      ptr_ = nullptr;
      throw OutOfMemory("out of device memory: cudaMalloc of " + std::to_string(bytes) + " bytes failed", bytes);
    }
    if (err != cudaSuccess) throw_cuda_error(err, "cudaMalloc(&ptr_, bytes_)", __FILE__, __LINE__);
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // cannot throw from a destructor; a failure here is reported by the next call
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fs
