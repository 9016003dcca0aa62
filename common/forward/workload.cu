#include "forward/check.h"
#include "step/overflow.h"

namespace fs {

namespace {
size_t lse_bytes(const Problem& given) {
  const Problem p = dense_view(given);
  const auto n = checked_product({p.batch, p.heads_q, p.seqlen_q, int64_t(sizeof(float))});
  if (!n) throw Error("the workload's LSE does not fit in 64-bit byte counts");
  return size_t(*n);
}
}  // namespace

Output::Output(const Problem& p)
    : o(p.o, dense_view(p).batch, dense_view(p).seqlen_q, p.heads_q, p.head_dim, p.dtype), lse(lse_bytes(p)) {}

void Output::poison(cudaStream_t stream) {
  o.poison(stream);
  if (lse.bytes()) CHECK_CUDA(cudaMemsetAsync(lse.get(), 0xFF, lse.bytes(), stream));  // NaN in fp32
}

std::vector<float> Output::download_lse() const { return download_floats(lse.as<float>(), int64_t(lse.bytes() / 4)); }

namespace {

int64_t align16(int64_t elems) { return (elems + 7) / 8 * 8; }  // 8 fp16/bf16 = 16 bytes

// Where Q, K and V start in one buffer and how many elements it holds: one view each, 16-byte aligned,
// or (packed) three views of one (batch, seqlen, heads_q + 2·heads_kv, head_dim) tensor. A variable-length
// batch by its dense_view: (1, total, ...), its batch strides 0.
Problem place_inputs(Problem p, Layout layout, int64_t& q, int64_t& k, int64_t& v, int64_t& elems) {
  const Problem d = dense_view(p);
  if (layout == Layout::packed_qkv) {
    if (d.seqlen_q != d.seqlen_k)
      throw Error("Layout::packed_qkv needs seqlen_q == seqlen_k (total_q == total_k for a variable-length batch)");
    const int64_t heads = p.heads_q + 2 * p.heads_kv;
    p.q = p.k = p.v = contiguous_strides(d.seqlen_q, heads, p.head_dim);
    if (is_varlen(p)) p.q.batch = p.k.batch = p.v.batch = 0;
    q = 0, k = p.heads_q * p.head_dim, v = (p.heads_q + p.heads_kv) * p.head_dim;
    elems = view_extent(p.q, d.batch, d.seqlen_q, heads, p.head_dim);
    return p;
  }
  const auto v_at = checked_add(align16(view_extent(p.q, d.batch, d.seqlen_q, p.heads_q, p.head_dim)),
                                align16(view_extent(p.k, d.batch, d.seqlen_k, p.heads_kv, p.head_dim)));
  const auto end = v_at ? checked_add(*v_at, view_extent(p.v, d.batch, d.seqlen_k, p.heads_kv, p.head_dim)) : v_at;
  if (!end || !checked_mul(*end, 2)) throw Error("the workload's Q, K and V do not fit in 64-bit byte counts");
  q = 0, k = align16(view_extent(p.q, d.batch, d.seqlen_q, p.heads_q, p.head_dim)), v = *v_at, elems = *end;
  return p;
}

// Device copies of a variable-length batch's offsets (cu_seqlens_q, then cu_seqlens_k), checked first;
// nothing for a dense problem.
DeviceBuffer device_offsets(const Problem& shape, const Offsets& cu) {
  if (is_varlen(shape) != !cu.q.empty())
    throw Error(is_varlen(shape) ? "a variable-length batch's workload needs the host copies of its offsets"
                                 : "offsets were given for a problem without cu_seqlens (varlen_problem makes one)");
  if (!is_varlen(shape)) return DeviceBuffer();
  if (const std::string why = validate_offsets(shape, cu.q, cu.k); !why.empty()) throw Error("the workload's " + why);
  DeviceBuffer buf((cu.q.size() + cu.k.size()) * sizeof(int32_t));
  CHECK_CUDA(cudaMemcpy(buf.get(), cu.q.data(), cu.q.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(buf.as<int32_t>() + cu.q.size(), cu.k.data(), cu.k.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice));
  return buf;
}

// The shape with its offsets on the device.
Problem on_device(Problem p, const DeviceBuffer& cu, size_t offsets_q) {
  if (is_varlen(p)) p.cu_seqlens_q = cu.as<int32_t>(), p.cu_seqlens_k = cu.as<int32_t>() + offsets_q;
  return p;
}

}  // namespace

Workload::Workload(const Problem& shape, uint64_t seed, Layout layout, Offsets offsets)
    : cu_(std::move(offsets)),
      cu_dev_(device_offsets(shape, cu_)),
      p_(place_inputs(on_device(shape, cu_dev_, cu_.q.size()), layout, q_off_, k_off_, v_off_, input_elems_)),
      inputs_(size_t(input_elems_) * 2),
      out_(p_) {
  randomize(seed);
}

Tensors Workload::tensors() const {
  auto* base = inputs_.as<uint16_t>();
  return Tensors{base + q_off_, base + k_off_, base + v_off_, out_.o.get(), out_.lse.as<float>()};
}

void Workload::randomize(uint64_t seed) {
  if (input_elems_ == 0) return;
  fill_random(inputs_.get(), input_elems_, p_.dtype, seed);
  // The largest |V| sets the absolute part of the tolerance (check.h).
  const Problem d = dense_view(p_);
  max_abs_v_ = max_abs(tensors().v, p_.v, d.batch, d.seqlen_k, p_.heads_kv, p_.head_dim, p_.dtype);
}

HostInputs Workload::download_inputs() const {
  return HostInputs{download_as_float(inputs_.get(), input_elems_, p_.dtype), q_off_, k_off_, v_off_, cu_};
}

Reference make_reference(const Workload& w, GpuReference& gpu) {
  if (reference_cpu_cost(w.problem()) <= kCpuReferenceMaxCost) return reference_cpu(w.problem(), w.download_inputs());
  return gpu_reference(w, gpu);
}

}  // namespace fs
