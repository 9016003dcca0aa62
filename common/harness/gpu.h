// The GPU as the harness sees it: is there one, what is it, and device memory it owns.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "step/device.h"

namespace fs {

// "" when a CUDA device can be used, else why not, in words: no device found, driver too old for
// this runtime, or the error CUDA gave.
std::string cuda_unavailable_reason();

// True when this machine has no CUDA device at all (no device, or no NVIDIA driver loaded): the GPU
// tests skip. False when a device is usable, and when one is present but unusable (driver too old for
// this runtime, a CUDA error): that is a failure, not a skip.
bool cuda_device_absent();

// The current device. Throws fs::CudaError with cuda_unavailable_reason() if there is none.
DeviceInfo current_device(bool with_free_memory = true);

// A description of a device for logs and results files.
std::string describe(const DeviceInfo& d);

// Owns `bytes` of device memory from cudaMalloc; freed in the destructor. Move-only. Throws
// fs::OutOfMemory (naming the bytes) when the device has not enough, fs::CudaError on other failures.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
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
