#include "forward/check.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fs {

double reference_cpu_cost(const Problem& p) {
  return double(p.batch) * double(p.heads_q) * double(p.seqlen_q) * double(p.seqlen_k) * double(p.head_dim);
}

namespace {

// The dense reference of p on inputs at q, k, v (p's strides), added into O at `o` ((batch, seqlen_q,
// heads_q, head_dim) contiguous, zeros) and LSE[(b·heads_q + h)·lse_stride + i] (-inf): both references
// write through it, a variable-length batch once per sequence.
void attend(const Problem& p, const float* q_base, const float* k_base, const float* v_base, double* o_base,
            double* lse, int64_t lse_stride) {
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, D = p.head_dim;
  std::vector<double> s(static_cast<size_t>(Sk));
  const double scale = p.softmax_scale;
  auto at = [](const float* base, const Strides& st, int64_t b, int64_t row, int64_t h) {
    return base + b * st.batch + row * st.row + h * st.head;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = kv_head_of(p, h);
      for (int64_t i = 0; i < Sq; ++i) {
        const float* q = at(q_base, p.q, b, i, h);
        const KeyRange keys = reference_keys(p, i);  // causal, window
        if (keys.end <= keys.first) continue;        // no key: O = 0, LSE = -inf
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* k = at(k_base, p.k, b, j, hk);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
          s[j] = capped_logit(scale * dot, p.softcap);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = keys.first; j < keys.end; ++j) sum += (s[j] = std::exp(s[j] - m));
        double* o = o_base + ((b * Sq + i) * H + h) * D;
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* v = at(v_base, p.v, b, j, hk);
          const double w = s[j] / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += w * double(v[d]);
        }
        lse[(b * H + h) * lse_stride + i] = m + std::log(sum);
      }
    }
}

}  // namespace

Reference reference_cpu(const Problem& p, const HostInputs& in) {
  const Problem d = dense_view(p);
  const int64_t H = p.heads_q, D = p.head_dim;
  Reference r;
  r.o.assign(size_t(d.batch * d.seqlen_q * H * D), 0.0);
  r.lse.assign(size_t(d.batch * H * d.seqlen_q), -std::numeric_limits<double>::infinity());
  if (!is_varlen(p)) {
    attend(p, in.q_ptr(), in.k_ptr(), in.v_ptr(), r.o.data(), r.lse.data(), p.seqlen_q);
    return r;
  }
  // Each sequence on its own rows; its LSE row h lies at h·total_q + q_start of the packed (heads_q, total_q).
  if (const std::string why = validate_offsets(p, in.cu.q, in.cu.k); !why.empty()) throw Error("reference: " + why);
  for_each_sequence(p, in.cu.q, in.cu.k, [&](int64_t, const Sequence& s) {
    attend(one_sequence(p, s), in.q_ptr() + s.q_start * p.q.row, in.k_ptr() + s.k_start * p.k.row,
           in.v_ptr() + s.k_start * p.v.row, r.o.data() + s.q_start * H * D, r.lse.data() + s.q_start, p.total_q);
  });
  return r;
}

}  // namespace fs
