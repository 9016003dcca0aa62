// One checked launch: poison the outputs, run, compare with the reference.
#pragma once

#include <functional>
#include <string>

#include "compare.h"
#include "reference.h"
#include "registry.h"
#include "workload.h"

namespace fs {

// Problems whose fp64 CPU reference costs at most this many multiply-adds use it; larger ones use
// the GPU fp32 reference (itself tested against the CPU one).
inline constexpr double kCpuReferenceMaxCost = double(1 << 27);

// The reference for the workload's current inputs: fp64 on the CPU when it is cheap, else cuBLAS.
Reference make_reference(const Workload& w, GpuReference& gpu);

// Poisons O and LSE with NaN, enqueues `launch` on the default stream, waits, and compares O and LSE
// with `ref`. Throws fs::Error when a CUDA call fails.
Comparison launch_and_compare(const std::function<void(cudaStream_t)>& launch, Workload& w, const Reference& ref);

// The same for a step: plans it for the workload's problem (throws fs::Error when it refuses), gives it
// the workspace it asks for, then launch_and_compare.
Comparison run_and_compare(const Step& step, Workload& w, const Reference& ref, const DeviceInfo& dev);

}  // namespace fs
