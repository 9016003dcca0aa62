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

namespace {

std::vector<double> download_doubles(const DeviceBuffer& b) {
  std::vector<float> host(b.bytes() / sizeof(float));
  if (!host.empty()) CHECK_CUDA(cudaMemcpy(host.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return std::vector<double>(host.begin(), host.end());
}

}  // namespace

BackwardReference gpu_backward_reference(const BackwardWorkload& w, GpuBackwardReference& gpu, bool rounded) {
  const Problem& f = w.problem().forward;
  const size_t q_bytes = size_t(f.batch * f.seqlen_q * f.heads_q * f.head_dim) * sizeof(float);
  const size_t kv_bytes = size_t(f.batch * f.seqlen_k * f.heads_kv * f.head_dim) * sizeof(float);
  DeviceBuffer dq(q_bytes), dk(kv_bytes), dv(kv_bytes);
  gpu.run(w.problem(), w.tensors(), rounded, dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return {download_doubles(dq), download_doubles(dk), download_doubles(dv)};
}

BackwardReferences make_backward_references(const BackwardWorkload& w, GpuBackwardReference& gpu) {
  const BackwardProblem& p = w.problem();
  if (reference_cpu_backward_cost(p) <= kCpuReferenceMaxCost) {
    const BackwardHostInputs in = w.download_inputs();
    return {reference_cpu_backward(p, in, false), reference_cpu_backward(p, in, true)};
  }
  return {gpu_backward_reference(w, gpu, false), gpu_backward_reference(w, gpu, true)};
}

std::vector<GradComparison> backward_launch_and_compare(const std::function<void(cudaStream_t)>& launch,
                                                        BackwardWorkload& w, const BackwardReferences& ref) {
  w.poison();
  launch(nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return compare_gradients(w.problem(), w.download_dq(), w.download_dk(), w.download_dv(), ref.exact, ref.lowp);
}

}  // namespace fs
