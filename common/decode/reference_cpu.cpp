#include <algorithm>
#include <limits>

#include "decode/check.h"

namespace fs {

std::vector<float> gather_sequence(const DecodeProblem& p, const std::vector<float>& cache, const Strides& st,
                                   const std::vector<int32_t>& block_table, int64_t b, int64_t len) {
  const int64_t H = p.attention.heads_kv, D = p.attention.head_dim;
  std::vector<float> out(size_t(len * H * D));
  for (int64_t j = 0; j < len; ++j) {
    const CacheRow at = cache_row(p, block_table.data(), b, j);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        out[size_t((j * H + h) * D + d)] = cache[size_t(at.slot * st.batch + at.row * st.row + h * st.head + d)];
  }
  return out;
}

Problem sequence_problem(const DecodeProblem& p, int64_t len) {
  const Problem& f = p.attention;
  Problem one = make_problem(1, f.seqlen_q, len, f.heads_q, f.heads_kv, f.head_dim, dtype_of(f), f.causal != 0);
  one.softmax_scale = f.softmax_scale;
  one.softcap = f.softcap;
  one.window = f.window, one.window_left = f.window_left, one.window_right = f.window_right;
  return one;
}

double reference_cpu_cost(const DecodeProblem& p, const std::vector<int32_t>& lengths) {
  const Problem& f = p.attention;
  double keys = 0;
  for (int64_t b = 0; b < f.batch; ++b) keys += lengths.empty() ? double(f.seqlen_k) : double(lengths[size_t(b)]);
  return double(f.heads_q) * double(f.seqlen_q) * keys * double(f.head_dim);
}

Reference reference_cpu(const DecodeProblem& dp, const DecodeHostInputs& in) {
  const Problem& p = dp.attention;
  const int64_t B = p.batch, Sq = p.seqlen_q, H = p.heads_q, D = p.head_dim;
  Reference r;
  r.o.assign(size_t(B * Sq * H * D), 0.0);
  r.lse.assign(size_t(B * H * Sq), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = in.lengths.empty() ? p.seqlen_k : in.lengths[size_t(b)];
    // Sequence b as a forward problem of batch 1: Q's rows of b, contiguous; its keys and values gathered.
    const Problem one = sequence_problem(dp, len);
    HostInputs seq;
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float* row = in.q.data() + b * p.q.batch + i * p.q.row + h * p.q.head;
        seq.data.insert(seq.data.end(), row, row + D);
      }
    seq.k = int64_t(seq.data.size());
    const std::vector<float> k = gather_sequence(dp, in.k_cache, p.k, in.block_table, b, len);
    seq.data.insert(seq.data.end(), k.begin(), k.end());
    seq.v = int64_t(seq.data.size());
    const std::vector<float> v = gather_sequence(dp, in.v_cache, p.v, in.block_table, b, len);
    seq.data.insert(seq.data.end(), v.begin(), v.end());
    const Reference one_ref = reference_cpu(one, seq);
    std::copy(one_ref.o.begin(), one_ref.o.end(), r.o.begin() + b * Sq * H * D);
    std::copy(one_ref.lse.begin(), one_ref.lse.end(), r.lse.begin() + b * H * Sq);
  }
  return r;
}

}  // namespace fs
