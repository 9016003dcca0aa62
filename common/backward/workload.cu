// The inputs and outputs of one backward problem on the device (backward/check.h).
#include <string>
#include <utility>

#include "backward/check.h"
#include "harness/tensors.h"
#include "step/overflow.h"

namespace fs {

namespace {

// The problem with the strides of Q, K and V as the forward workload laid them out, validated.
BackwardProblem checked(BackwardProblem p, const Workload& forward) {
  p.attention = forward.problem();  // Layout::packed_qkv replaced the strides of Q, K, V
  if (const std::string why = validate(p); !why.empty()) throw Error("backward workload: " + why);
  return p;
}

// A tensor with Q's rows (keys: K's) and these strides; a variable-length batch's packed ones.
DeviceTensor like(const Strides& s, const Problem& given, bool keys) {
  const Problem f = dense_view(given);
  return DeviceTensor(s, f.batch, keys ? f.seqlen_k : f.seqlen_q, keys ? f.heads_kv : f.heads_q, f.head_dim, f.dtype);
}

}  // namespace

BackwardWorkload::BackwardWorkload(const BackwardProblem& shape, uint64_t seed, Layout layout, Offsets offsets)
    : forward_(shape.attention, seed, layout, std::move(offsets)),
      p_(checked(shape, forward_)),
      d_o_(like(p_.d_o, p_.attention, false)),
      dq_(like(p_.dq, p_.attention, false)),
      dk_(like(p_.dk, p_.attention, true)),
      dv_(like(p_.dv, p_.attention, true)) {
  d_o_.randomize(~seed);  // the inputs' generator with a seed of its own: dO is not a copy of Q
  // O (in the dtype, as a forward step writes it) and LSE from the forward reference (a variable-length
  // batch: per sequence, in the packed layout).
  GpuReference forward_reference;
  forward_reference.run(p_.attention, forward_.tensors(), nullptr, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  poison();
}

BackwardTensors BackwardWorkload::tensors() const {
  const Tensors f = forward_.tensors();
  return BackwardTensors{f.q, f.k, f.v, f.o, f.lse, d_o_.get(), dq_.get(), dk_.get(), dv_.get()};
}

void BackwardWorkload::poison(cudaStream_t stream) {
  for (DeviceTensor* g : {&dq_, &dk_, &dv_}) g->poison(stream);
}

BackwardHostInputs BackwardWorkload::download_inputs() const {
  const Problem f = dense_view(p_.attention);  // a variable-length batch: (1, total_q, ...), batch stride 0
  BackwardHostInputs in;
  in.qkv = forward_.download_inputs();
  const std::vector<float> storage = d_o_.download();
  in.d_o.resize(size_t(f.batch * f.seqlen_q * f.heads_q * f.head_dim));
  size_t e = 0;
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t i = 0; i < f.seqlen_q; ++i)
      for (int64_t h = 0; h < f.heads_q; ++h)
        for (int64_t d = 0; d < f.head_dim; ++d)
          in.d_o[e++] = storage[size_t(b * p_.d_o.batch + i * p_.d_o.row + h * p_.d_o.head + d)];
  return in;
}

BackwardReference gpu_reference(const BackwardWorkload& w, GpuReference& gpu, bool rounded) {
  const Problem f = dense_view(w.problem().attention);  // the sizes: a variable-length batch's packed tensors
  const int64_t q_elems = f.batch * f.seqlen_q * f.heads_q * f.head_dim, kv_elems = f.batch * f.seqlen_k * f.heads_kv * f.head_dim;
  DeviceBuffer dq(size_t(q_elems) * sizeof(float)), dk(size_t(kv_elems) * sizeof(float)), dv(size_t(kv_elems) * sizeof(float));
  gpu.run(w.problem(), w.tensors(), rounded, dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  return {download_doubles(dq.as<float>(), q_elems), download_doubles(dk.as<float>(), kv_elems),
          download_doubles(dv.as<float>(), kv_elems)};
}

BackwardReferences make_reference(const BackwardWorkload& w, GpuReference& gpu) {
  const BackwardProblem& p = w.problem();
  if (reference_cpu_cost(p) <= kCpuReferenceMaxCost) {
    const BackwardHostInputs in = w.download_inputs();
    return {reference_cpu(p, in, false), reference_cpu(p, in, true)};
  }
  return {gpu_reference(w, gpu, false), gpu_reference(w, gpu, true)};
}

}  // namespace fs
