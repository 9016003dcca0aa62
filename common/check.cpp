#include "check.h"

namespace fs {

Reference make_reference(const Workload& w, GpuReference& gpu) {
  if (reference_cpu_cost(w.problem()) <= kCpuReferenceMaxCost) return reference_cpu(w.problem(), w.download_inputs());
  return gpu.compute(w);
}

Comparison run_and_compare(const Step& step, Workload& w, const Reference& ref, const DeviceInfo& dev) {
  w.poison();
  run(step, w.problem(), w.tensors(), nullptr, dev);
  CHECK_CUDA(cudaDeviceSynchronize());
  return compare(w.problem(), w.download_o(), w.download_lse(), ref, w.max_abs_v());
}

}  // namespace fs
