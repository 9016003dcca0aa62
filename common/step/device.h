// Errors, CUDA error checking, and what a plan needs to know about the device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fs {

// Every failure the harness reports: a refused problem, a bad pointer, a failed CUDA call.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A CUDA (or cuBLAS) call failed, or there is no usable device: the C ABI's FS_ERR_CUDA.
struct CudaError : Error {
  using Error::Error;
};

// Device memory could not be allocated: the C ABI's FS_ERR_OUT_OF_MEMORY. `bytes` is what was asked.
struct OutOfMemory : Error {
  OutOfMemory(const std::string& message, size_t bytes_asked) : Error(message), bytes(bytes_asked) {}
  size_t bytes;
};

// A refusal or an error message from its pieces, each printed as an ostream prints it:
//   sentence("batch is ", p.batch, "; it must be at least 1")
template <typename... Parts>
std::string sentence(const Parts&... parts) {
  std::ostringstream m;
  (m << ... << parts);
  return m.str();
}

// Throws fs::CudaError("file:line: expr failed: cudaErrorName (message)").
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace fs

// Wrap every CUDA runtime call: CHECK_CUDA(cudaMalloc(&p, n));
#define CHECK_CUDA(expr)                                                                    \
  do {                                                                                      \
    cudaError_t fs_err_ = (expr);                                                           \
    if (fs_err_ != cudaSuccess) ::fs::throw_cuda_error(fs_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: catches bad configurations (and, in debug, asynchronous faults).
#define CHECK_LAUNCH() CHECK_CUDA(cudaGetLastError())

namespace fs {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_capability = 0;       // 90 for sm_90
  int sm_count = 0;
  size_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
  size_t l2_bytes = 0;
  size_t free_bytes = 0;            // at the time of the query
  size_t total_bytes = 0;
  int driver_version = 0;           // e.g. 13000
  int runtime_version = 0;
};

// Blocks for a grid-stride loop over n items, `threads` per block; at most 65535, the loop covers
// the rest.
inline int grid_stride_blocks(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

}  // namespace fs
