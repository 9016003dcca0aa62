#include "runner/resources.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace fs {

namespace {

constexpr size_t kDefaultDynamicSmemLimit = 48 * 1024;  // above this a kernel must opt in

// The function's mangled name (cudaFuncGetName, CUDA 12.3 and later).
std::string mangled_name(const void* function) {
#if CUDART_VERSION >= 12030
  const char* name = nullptr;
  CHECK_CUDA(cudaFuncGetName(&name, function));
  return name ? name : "";
#else
  (void)function;
  return "";
#endif
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                                   std::free);
  return status == 0 && out ? std::string(out.get()) : mangled;
}

}  // namespace

KernelResources kernel_resources(const KernelLaunch& k) {
  if (!k.function) throw Error("a plan lists a kernel whose function pointer is null");
  if (k.threads <= 0) throw Error("a plan lists a kernel with " + std::to_string(k.threads) + " threads per block");
  KernelResources r;
  r.mangled = mangled_name(k.function);
  r.name = r.mangled.empty() ? "(the kernel's name needs CUDA 12.3 or later)" : demangle(r.mangled);
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, k.function));
  r.registers = attr.numRegs;
  r.static_smem = attr.sharedSizeBytes;
  r.local_bytes = attr.localSizeBytes;
  r.dynamic_smem = k.smem_bytes;
  r.threads = k.threads;
  r.blocks = k.blocks;
  if (k.smem_bytes > kDefaultDynamicSmemLimit)
    CHECK_CUDA(cudaFuncSetAttribute(k.function, cudaFuncAttributeMaxDynamicSharedMemorySize, int(k.smem_bytes)));
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, k.function, k.threads, k.smem_bytes));
  int device = 0, threads_per_sm = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  r.warps_per_sm = r.blocks_per_sm * ((k.threads + 31) / 32);
  r.max_warps_per_sm = threads_per_sm / 32;
  return r;
}

std::string short_kernel_name(const std::string& demangled) {
  std::string s = demangled;
  if (!s.empty() && s.back() == ')') {  // the parameter list: the last parenthesised group at depth 0
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  size_t cut = 0;  // namespaces: everything up to the last "::" outside template arguments
  int depth = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    depth += s[i] == '<' ? 1 : s[i] == '>' ? -1 : 0;
    if (depth == 0 && s[i] == ':' && s[i + 1] == ':') cut = i + 2;
  }
  return s.substr(cut);
}

}  // namespace fs
