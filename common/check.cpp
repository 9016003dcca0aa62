#include "check.h"

namespace fs {

Reference make_reference(const Workload& w, GpuReference& gpu) {
  if (reference_cpu_cost(w.problem()) <= kCpuReferenceMaxCost) return reference_cpu(w.problem(), w.download_inputs());
  return gpu.compute(w);
}

Comparison launch_and_compare(const std::function<void(cudaStream_t)>& launch, Workload& w, const Reference& ref) {
  w.poison();
  launch(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return compare(w.problem(), w.download_o(), w.download_lse(), ref, w.max_abs_v());
}

Comparison run_and_compare(const Step& step, Workload& w, const Reference& ref, const DeviceInfo& dev) {
  const PreparedStep prepared(step, w.problem(), dev);
  const Tensors t = w.tensors();
  return launch_and_compare([&](cudaStream_t s) { prepared.launch(t, s); }, w, ref);
}

}  // namespace fs
