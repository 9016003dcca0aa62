// Errors, CUDA error checking, and what a plan needs to know about the device.
#pragma once

#include <cuda_runtime.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// One piece of a sentence as an ostream prints it, except a float or double: the shortest digits
// that read back as the same value (0.1f is "0.1", not "0.100000001"; 2.1472796e+26f and a bound of
// 2.147279...e+26 print apart), where an ostream's 6 significant digits may print two values alike.
template <typename T>
void put(std::ostream& m, const T& x) {
  if constexpr (std::is_floating_point_v<T>) {
    char digits[32];
    m.write(digits, std::to_chars(digits, digits + sizeof digits, x).ptr - digits);
  } else {
    m << x;
  }
}

// A refusal or an error message from its pieces (put):
//   sentence("batch is ", p.batch, "; it must be at least 1")
template <typename... Parts>
std::string sentence(const Parts&... parts) {
  std::ostringstream m;
  (put(m, parts), ...);
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
  size_t free_bytes = 0;            // at the time of the query (0 unless asked: Step::reads_free_memory)
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
