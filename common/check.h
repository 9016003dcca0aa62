// One checked launch: poison the outputs, run, compare with the reference.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backward.h"
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

// The backward's two references for the workload's inputs, the exact gradients and those of the same
// computation done in the dtype (the acceptance rule, common/backward.h): fp64 on the CPU when that
// costs at most kCpuReferenceMaxCost multiply-adds (reference_cpu_backward_cost), else fp32 cuBLAS.
struct BackwardReferences {
  BackwardReference exact, lowp;
};
BackwardReferences make_backward_references(const BackwardWorkload& w, GpuBackwardReference& gpu);

// The fp32 cuBLAS reference's gradients for the workload (rounded: the same computation done in the
// dtype), downloaded as contiguous arrays: what make_backward_references uses on large problems.
BackwardReference gpu_backward_reference(const BackwardWorkload& w, GpuBackwardReference& gpu, bool rounded);

// Poisons dQ, dK, dV with NaN, enqueues `launch` on the default stream, waits, and compares each
// gradient with the references: dQ, dK, dV in that order.
std::vector<GradComparison> backward_launch_and_compare(const std::function<void(cudaStream_t)>& launch,
                                                        BackwardWorkload& w, const BackwardReferences& ref);

}  // namespace fs
