// The inputs and outputs of one backward problem on the device (backward/check.h).
#include <string>

#include "backward/check.h"
#include "harness/tensors.h"
#include "step/overflow.h"

namespace fs {

namespace {

// The bytes of a (batch, seqlen, heads, head_dim) fp16/bf16 view with strides `s`.
size_t view_bytes(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                  const char* what) {
  const std::optional<int64_t> bytes = checked_mul(view_extent(s, batch, seqlen, heads, head_dim), 2);
  if (!bytes) throw Error(std::string("the backward workload's ") + what + " size in bytes does not fit in 64 bits");
  return size_t(*bytes);
}

}  // namespace

BackwardWorkload::BackwardWorkload(const BackwardProblem& shape, uint64_t seed, Layout layout)
    : p_(shape), forward_(shape.attention, seed, layout) {
  p_.attention = forward_.problem();  // Layout::packed_qkv replaced the strides of Q, K, V
  const std::string why = validate(p_);
  if (!why.empty()) throw Error("backward workload: " + why);
  const Problem& f = p_.attention;
  d_o_ = DeviceBuffer(view_bytes(p_.d_o, f.batch, f.seqlen_q, f.heads_q, f.head_dim, "dO"));
  dq_ = DeviceBuffer(view_bytes(p_.dq, f.batch, f.seqlen_q, f.heads_q, f.head_dim, "dQ"));
  dk_ = DeviceBuffer(view_bytes(p_.dk, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, "dK"));
  dv_ = DeviceBuffer(view_bytes(p_.dv, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, "dV"));
  // dO from the inputs' generator with a seed of its own, so that it is not a copy of Q.
  fill_random(d_o_.get(), int64_t(d_o_.bytes() / 2), f.dtype, ~seed);
  // O (in the dtype, as a forward step writes it) and LSE from the forward reference.
  GpuReference forward_reference;
  forward_reference.run(f, forward_.tensors(), nullptr, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  poison();
}

BackwardTensors BackwardWorkload::tensors() const {
  const Tensors f = forward_.tensors();
  return BackwardTensors{f.q, f.k, f.v, f.o, f.lse, d_o_.get(), dq_.get(), dk_.get(), dv_.get()};
}

void BackwardWorkload::poison(cudaStream_t stream) {
  for (DeviceBuffer* b : {&dq_, &dk_, &dv_})  // all bits set: NaN in fp16 and bf16
    if (b->bytes()) CHECK_CUDA(cudaMemsetAsync(b->get(), 0xFF, b->bytes(), stream));
}

BackwardHostInputs BackwardWorkload::download_inputs() const {
  const Problem& f = p_.attention;
  BackwardHostInputs in;
  in.qkv = forward_.download_inputs();
  const std::vector<float> storage = download_as_float(d_o_.get(), int64_t(d_o_.bytes() / 2), f.dtype);
  in.d_o.resize(size_t(f.batch * f.seqlen_q * f.heads_q * f.head_dim));
  size_t e = 0;
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t i = 0; i < f.seqlen_q; ++i)
      for (int64_t h = 0; h < f.heads_q; ++h)
        for (int64_t d = 0; d < f.head_dim; ++d)
          in.d_o[e++] = storage[size_t(b * p_.d_o.batch + i * p_.d_o.row + h * p_.d_o.head + d)];
  return in;
}

std::vector<float> BackwardWorkload::download_dq() const {
  return download_as_float(dq_.get(), int64_t(dq_.bytes() / 2), p_.attention.dtype);
}
std::vector<float> BackwardWorkload::download_dk() const {
  return download_as_float(dk_.get(), int64_t(dk_.bytes() / 2), p_.attention.dtype);
}
std::vector<float> BackwardWorkload::download_dv() const {
  return download_as_float(dv_.get(), int64_t(dv_.bytes() / 2), p_.attention.dtype);
}

}  // namespace fs

namespace fs {

BackwardReference gpu_reference(const BackwardWorkload& w, GpuBackwardReference& gpu, bool rounded) {
  const Problem& f = w.problem().attention;
  const int64_t q_elems = f.batch * f.seqlen_q * f.heads_q * f.head_dim, kv_elems = f.batch * f.seqlen_k * f.heads_kv * f.head_dim;
  DeviceBuffer dq(size_t(q_elems) * sizeof(float)), dk(size_t(kv_elems) * sizeof(float)), dv(size_t(kv_elems) * sizeof(float));
  gpu.run(w.problem(), w.tensors(), rounded, dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  auto doubles = [](const DeviceBuffer& b, int64_t n) {
    const std::vector<float> host = download_floats(b.as<float>(), n);
    return std::vector<double>(host.begin(), host.end());
  };
  return {doubles(dq, q_elems), doubles(dk, kv_elems), doubles(dv, kv_elems)};
}

BackwardReferences make_reference(const BackwardWorkload& w, GpuBackwardReference& gpu) {
  const BackwardProblem& p = w.problem();
  if (reference_cpu_cost(p) <= kCpuReferenceMaxCost) {
    const BackwardHostInputs in = w.download_inputs();
    return {reference_cpu(p, in, false), reference_cpu(p, in, true)};
  }
  return {gpu_reference(w, gpu, false), gpu_reference(w, gpu, true)};
}

}  // namespace fs
