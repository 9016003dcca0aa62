// What one kernel of a plan uses, and how many of its blocks an SM holds, asked of the CUDA runtime
// for the launch the plan makes (`flash-steps resources`). The compiler's view of every kernel in
// the object files, without a launch, is bench/resource_report.py over cuobjdump.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "step/step.h"

namespace fs {

struct KernelResources {
  std::string name;          // demangled, e.g. "void fs::step07::attention_kernel<__half, 128>(fs_problem, ...)"
  std::string mangled;       // as cuobjdump and Nsight Compute name it
  int registers = 0;         // per thread                        (cudaFuncGetAttributes)
  size_t static_smem = 0;    // bytes per block                   (cudaFuncGetAttributes)
  size_t local_bytes = 0;    // per thread: spills, local arrays  (cudaFuncGetAttributes)
  size_t dynamic_smem = 0;   // bytes per block, as the plan launches it
  int threads = 0;           // per block, as the plan launches it
  int64_t blocks = 0;        // in the grid
  int blocks_per_sm = 0;     // resident at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor)
  int warps_per_sm = 0;      // blocks_per_sm · warps per block
  int max_warps_per_sm = 0;  // the device's limit (64 on sm_80 and sm_90)
  double occupancy() const { return max_warps_per_sm ? double(warps_per_sm) / max_warps_per_sm : 0.0; }
};

// The resources of `k` on the current device. Raises the kernel's dynamic shared memory limit first
// when it asks for more than the default 48 KiB, as its launch does. Throws fs::Error.
KernelResources kernel_resources(const KernelLaunch& k);

// "attention_kernel<__half, 128>" from "void fs::step06::attention_kernel<__half, 128>(fs_problem, ...)":
// the name without its return type, namespaces and parameter list, for tables.
std::string short_kernel_name(const std::string& demangled);

}  // namespace fs
