#include "forward/check.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
        const KeyRange keys = reference_keys(p, i);  // causal, window
        if (keys.end <= keys.first) continue;        // no key: O = 0, LSE = -inf
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* k = at(in.k_ptr(), p.k, b, j, hk);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
          s[j] = capped_logit(scale * dot, p.softcap);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = keys.first; j < keys.end; ++j) sum += (s[j] = std::exp(s[j] - m));
        double* o = &r.o[size_t(((b * Sq + i) * H + h) * D)];
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* v = at(in.v_ptr(), p.v, b, j, hk);
          const double w = s[j] / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += w * double(v[d]);
        }
        r.lse[size_t((b * H + h) * Sq + i)] = m + std::log(sum);
      }
    }
  return r;
}

}  // namespace fs
