#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "workload.h"

namespace fs {

double reference_cpu_cost(const Problem& p) {
  return double(p.batch) * double(p.heads_q) * double(p.seqlen_q) * double(p.seqlen_k) * double(p.head_dim);
}

Reference reference_cpu(const Problem& p, const HostInputs& in) {
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, D = p.head_dim;
  Reference r;
  r.o.assign(size_t(B * Sq * H * D), 0.0);
  r.lse.assign(size_t(B * H * Sq), -std::numeric_limits<double>::infinity());
  std::vector<double> s(static_cast<size_t>(Sk));
  const double scale = p.softmax_scale;
  auto at = [](const float* base, const Strides& st, int64_t b, int64_t row, int64_t h) {
    return base + b * st.batch + row * st.row + h * st.head;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = kv_head_of(p, h);
      for (int64_t i = 0; i < Sq; ++i) {
        const float* q = at(in.q_ptr(), p.q, b, i, h);
        // The keys row i may attend: all of them, or j <= i + Sk - Sq when causal.
        const int64_t last = p.causal ? std::min<int64_t>(Sk - 1, i + Sk - Sq) : Sk - 1;
        if (last < 0) continue;  // no key: O = 0, LSE = -inf
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= last; ++j) {
          const float* k = at(in.k_ptr(), p.k, b, j, hk);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
          s[j] = scale * dot;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += (s[j] = std::exp(s[j] - m));
        double* o = &r.o[size_t(((b * Sq + i) * H + h) * D)];
        for (int64_t j = 0; j <= last; ++j) {
          const float* v = at(in.v_ptr(), p.v, b, j, hk);
          const double w = s[j] / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += w * double(v[d]);
        }
        r.lse[size_t((b * H + h) * Sq + i)] = m + std::log(sum);
      }
    }
  return r;
}

std::vector<float> gather_sequence(const DecodeProblem& p, const std::vector<float>& cache, const Strides& st,
                                   const std::vector<int32_t>& block_table, int64_t b, int64_t len) {
  const int64_t H = p.heads_kv, D = p.head_dim;
  std::vector<float> out(size_t(len * H * D));
  for (int64_t j = 0; j < len; ++j) {
    const CacheRow at = cache_row(p, block_table.data(), b, j);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        out[size_t((j * H + h) * D + d)] = cache[size_t(at.slot * st.batch + at.row * st.row + h * st.head + d)];
  }
  return out;
}

double reference_cpu_decode_cost(const DecodeProblem& p, const std::vector<int32_t>& lengths) {
  double keys = 0;
  for (int64_t b = 0; b < p.batch; ++b) keys += lengths.empty() ? double(p.seqlen_k) : double(lengths[size_t(b)]);
  return double(p.heads_q) * double(p.seqlen_q) * keys * double(p.head_dim);
}

Reference reference_cpu_decode(const DecodeProblem& p, const DecodeHostInputs& in) {
  const int64_t B = p.batch, Sq = p.seqlen_q, H = p.heads_q, D = p.head_dim;
  Reference r;
  r.o.assign(size_t(B * Sq * H * D), 0.0);
  r.lse.assign(size_t(B * H * Sq), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = in.lengths.empty() ? p.seqlen_k : in.lengths[size_t(b)];
    // Sequence b as a forward problem of batch 1: Q's rows of b, contiguous; its keys and values gathered.
    Problem one = make_problem(1, Sq, len, H, p.heads_kv, D, static_cast<DType>(p.dtype), p.causal != 0);
    one.softmax_scale = p.softmax_scale;
    HostInputs seq;
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float* row = in.q.data() + b * p.q.batch + i * p.q.row + h * p.q.head;
        seq.data.insert(seq.data.end(), row, row + D);
      }
    seq.k = int64_t(seq.data.size());
    const std::vector<float> k = gather_sequence(p, in.k_cache, p.k, in.block_table, b, len);
    seq.data.insert(seq.data.end(), k.begin(), k.end());
    seq.v = int64_t(seq.data.size());
    const std::vector<float> v = gather_sequence(p, in.v_cache, p.v, in.block_table, b, len);
    seq.data.insert(seq.data.end(), v.begin(), v.end());
    const Reference one_ref = reference_cpu(one, seq);
    std::copy(one_ref.o.begin(), one_ref.o.end(), r.o.begin() + b * Sq * H * D);
    std::copy(one_ref.lse.begin(), one_ref.lse.end(), r.lse.begin() + b * H * Sq);
  }
  return r;
}

}  // namespace fs
