#include <optional>
#include <string>

#include "forward/check.h"
#include "harness/tensors.h"
#include "step/overflow.h"

namespace fs {

namespace {

int64_t align16(int64_t elems) { return (elems + 7) / 8 * 8; }  // 8 fp16/bf16 = 16 bytes

// A size the workload computed, or fs::Error when it did not fit in 64 bits (validate() keeps every
// tensor within 2^58 elements, so a validated problem never gets here).
int64_t size_or_throw(std::optional<int64_t> n, const char* what) {
  if (!n) throw Error(std::string("the workload's ") + what + " does not fit in 64 bits");
  return *n;
}

}  // namespace

Workload::Workload(const Problem& shape, uint64_t seed, Layout layout) : p_(shape) {
  if (layout == Layout::packed_qkv) {
    if (p_.seqlen_q != p_.seqlen_k) throw Error("Layout::packed_qkv needs seqlen_q == seqlen_k");
    const int64_t heads = p_.heads_q + 2 * p_.heads_kv;
    const Strides s = contiguous_strides(p_.seqlen_q, heads, p_.head_dim);
    p_.q = p_.k = p_.v = s;
    q_off_ = 0;
    k_off_ = p_.heads_q * p_.head_dim;
    v_off_ = (p_.heads_q + p_.heads_kv) * p_.head_dim;
    input_elems_ = view_extent(s, p_.batch, p_.seqlen_q, heads, p_.head_dim);
  } else {
    q_off_ = 0;
    k_off_ = align16(view_extent(p_.q, p_.batch, p_.seqlen_q, p_.heads_q, p_.head_dim));
    v_off_ = size_or_throw(checked_add(k_off_, align16(view_extent(p_.k, p_.batch, p_.seqlen_k, p_.heads_kv, p_.head_dim))),
                           "offset of V");
    input_elems_ = size_or_throw(checked_add(v_off_, view_extent(p_.v, p_.batch, p_.seqlen_k, p_.heads_kv, p_.head_dim)),
                                 "Q, K and V element count");
  }
  const int64_t o_elems = view_extent(p_.o, p_.batch, p_.seqlen_q, p_.heads_q, p_.head_dim);
  inputs_ = DeviceBuffer(size_t(size_or_throw(checked_mul(input_elems_, 2), "Q, K and V size in bytes")));
  out_ = DeviceBuffer(size_t(size_or_throw(checked_mul(o_elems, 2), "O size in bytes")));
  lse_ = DeviceBuffer(size_t(size_or_throw(checked_product({p_.batch, p_.heads_q, p_.seqlen_q, int64_t(sizeof(float))}),
                                           "LSE size in bytes")));
  randomize(seed);
}

Tensors Workload::tensors() const {
  auto* base = inputs_.as<uint16_t>();
  return Tensors{base + q_off_, base + k_off_, base + v_off_, out_.get(), lse_.as<float>()};
}

void Workload::randomize(uint64_t seed) {
  if (input_elems_ == 0) return;
  fill_random(inputs_.get(), input_elems_, p_.dtype, seed);
  // The largest |V| sets the absolute part of the tolerance (check.h).
  max_abs_v_ = max_abs(tensors().v, p_.v, p_.batch, p_.seqlen_k, p_.heads_kv, p_.head_dim, p_.dtype);
}

void Workload::poison(cudaStream_t stream) {
  if (out_.bytes()) CHECK_CUDA(cudaMemsetAsync(out_.get(), 0xFF, out_.bytes(), stream));  // NaN in fp16 and bf16
  if (lse_.bytes()) CHECK_CUDA(cudaMemsetAsync(lse_.get(), 0xFF, lse_.bytes(), stream));  // NaN in fp32
}

HostInputs Workload::download_inputs() const {
  HostInputs h;
  h.data = download_as_float(inputs_.get(), input_elems_, p_.dtype);
  h.q = q_off_;
  h.k = k_off_;
  h.v = v_off_;
  return h;
}

std::vector<float> Workload::download_o() const { return download_as_float(out_.get(), int64_t(out_.bytes() / 2), p_.dtype); }

std::vector<float> Workload::download_lse() const {
  return download_floats(lse_.as<float>(), int64_t(lse_.bytes() / sizeof(float)));
}

Reference make_reference(const Workload& w, GpuReference& gpu) {
  if (reference_cpu_cost(w.problem()) <= kCpuReferenceMaxCost) return reference_cpu(w.problem(), w.download_inputs());
  return gpu_reference(w, gpu);
}

}  // namespace fs
