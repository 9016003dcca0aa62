#include "decode/check.h"
#include "harness/tensors.h"
#include "step/dispatch.h"

namespace fs {

namespace {

// Rows 0 ... len - 1 of sequence b of a contiguous or paged cache (the block table on the device), as
// a contiguous (len, heads_kv, head_dim) array.
template <typename T>
__global__ void gather_sequence_kernel(const T* cache, Strides st, const int32_t* block_table, DecodeProblem p,
                                       int64_t b, int64_t len, T* out) {
  const int64_t heads = p.attention.heads_kv, head_dim = p.attention.head_dim, n = len * heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim, h = i / head_dim % heads, j = i / (head_dim * heads);
    const CacheRow at = cache_row(p, block_table, b, j);
    out[i] = cache[at.slot * st.batch + at.row * st.row + h * st.head + d];
  }
}

}  // namespace

Reference gpu_reference(const DecodeWorkload& w, GpuReference& gpu) {
  const DecodeProblem& p = w.problem();
  const Problem& f = p.attention;
  const DecodeTensors t = w.tensors();
  const int64_t B = f.batch, Sq = f.seqlen_q, H = f.heads_q, D = f.head_dim;
  DeviceBuffer o32(size_t(B * Sq * H * D) * sizeof(float)), lse(size_t(B * H * Sq) * sizeof(float));
  const size_t seq_bytes = size_t(f.seqlen_k * f.heads_kv * D) * 2;  // the longest sequence's keys (or values)
  DeviceBuffer k_seq(seq_bytes), v_seq(seq_bytes);
  for (int64_t b = 0; b < B && Sq > 0; ++b) {
    const int64_t len = w.lengths().empty() ? f.seqlen_k : w.lengths()[size_t(b)];
    // Sequence b as a forward problem of batch 1 (Q's strides, contiguous gathered K and V).
    Problem one = sequence_problem(p, len);
    one.q = f.q;
    if (len > 0)
      dispatch_dtype(f.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const int blocks = grid_stride_blocks(len * f.heads_kv * D, 256);
        gather_sequence_kernel<T><<<blocks, 256>>>(static_cast<const T*>(t.k_cache), f.k, t.block_table, p, b, len,
                                                   k_seq.as<T>());
        CHECK_LAUNCH();
        gather_sequence_kernel<T><<<blocks, 256>>>(static_cast<const T*>(t.v_cache), f.v, t.block_table, p, b, len,
                                                   v_seq.as<T>());
        CHECK_LAUNCH();
      });
    const Tensors seq{static_cast<const char*>(t.q) + b * f.q.batch * 2, k_seq.get(), v_seq.get(), nullptr,
                      lse.as<float>() + b * H * Sq};
    gpu.run(one, seq, o32.as<float>() + b * Sq * H * D, nullptr);
  }
  return Reference{download_doubles(o32.as<float>(), B * Sq * H * D), download_doubles(lse.as<float>(), B * H * Sq)};
}

}  // namespace fs
