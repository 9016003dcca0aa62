// One checked launch: poison the outputs, run the step, compare with the reference.
#pragma once

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

// Poisons O and LSE with NaN, runs `step`, and compares O and LSE with `ref`. Throws fs::Error when
// the step refuses the problem or a CUDA call fails.
Comparison run_and_compare(const Step& step, Workload& w, const Reference& ref, const DeviceInfo& dev);

}  // namespace fs
