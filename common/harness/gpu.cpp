#include "harness/gpu.h"

#include <map>
#include <mutex>

namespace fs {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw CudaError(sentence(file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(err), " (",
                           cudaGetErrorString(err), ")"));
}

namespace {
// Why no CUDA device can be used ("" when one can); `absent` when the machine has none at all (no
// device, or no NVIDIA driver loaded; a loaded but old driver is a broken machine, not an absent one).
std::string probe_cuda(bool& absent) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  absent = err == cudaErrorNoDevice || (err == cudaSuccess && count == 0);
  if (absent) return "no CUDA device was found";
  if (err == cudaErrorInsufficientDriver) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    absent = driver == 0;
    if (absent) return "no CUDA device was found (no NVIDIA driver is loaded)";
    return sentence("the NVIDIA driver is too old for this CUDA runtime (driver supports CUDA ", driver / 1000, ".",
                    (driver % 1000) / 10, ", runtime is ", runtime / 1000, ".", (runtime % 1000) / 10, ")");
  }
  if (err != cudaSuccess)
    return sentence("CUDA is not usable: cudaGetDeviceCount failed with ", cudaGetErrorName(err), " (",
                    cudaGetErrorString(err), ")");
  return "";
}

DeviceInfo query_device(int ordinal) {
  DeviceInfo d;
  d.ordinal = ordinal;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, ordinal));
  d.name = prop.name;
  d.compute_capability = prop.major * 10 + prop.minor;
  d.sm_count = prop.multiProcessorCount;
  int optin = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal));
  d.smem_per_block_optin = static_cast<size_t>(optin);
  d.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  d.total_bytes = prop.totalGlobalMem;
  CHECK_CUDA(cudaDriverGetVersion(&d.driver_version));
  CHECK_CUDA(cudaRuntimeGetVersion(&d.runtime_version));
  return d;
}
}  // namespace

bool cuda_device_absent() {
  bool absent = false;
  probe_cuda(absent);
  return absent;
}

std::string cuda_unavailable_reason() {
  bool absent = false;
  return probe_cuda(absent);
}

DeviceInfo current_device(bool with_free_memory) {
  // The properties are read once per device (cudaGetDeviceProperties is slow); free memory each time
  // it is asked for (free_bytes is 0 otherwise).
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;
  static const std::string why = cuda_unavailable_reason();
  if (!why.empty()) throw CudaError(why);
  int ordinal = 0;
  CHECK_CUDA(cudaGetDevice(&ordinal));
  DeviceInfo d;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(ordinal);
    if (it == cache.end()) it = cache.emplace(ordinal, query_device(ordinal)).first;
    d = it->second;
  }
  if (with_free_memory) CHECK_CUDA(cudaMemGetInfo(&d.free_bytes, &d.total_bytes));
  return d;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ == 0) return;
  const cudaError_t err = cudaMalloc(&ptr_, bytes_);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it, so that the next CHECK_LAUNCH does not report it
    ptr_ = nullptr;
    throw OutOfMemory("out of device memory: cudaMalloc of " + std::to_string(bytes) + " bytes failed", bytes);
  }
  if (err != cudaSuccess) throw_cuda_error(err, "cudaMalloc(&ptr_, bytes_)", __FILE__, __LINE__);
}

std::string describe(const DeviceInfo& d) {
  return sentence(d.name, " (sm_", d.compute_capability, ", ", d.sm_count, " SMs, ", d.total_bytes / (1 << 20),
                  " MiB, CUDA driver ", d.driver_version / 1000, ".", (d.driver_version % 1000) / 10, ", runtime ",
                  d.runtime_version / 1000, ".", (d.runtime_version % 1000) / 10, ")");
}

}  // namespace fs
