// One gradient tensor against the references, by the backward's acceptance rule (backward/check.h).
#include <algorithm>
#include <cmath>

#include "backward/check.h"

namespace fs {

std::string GradComparison::summary() const {
  return sentence(name, " ", pass() ? "PASS" : "FAIL", ": max |err| ", max_abs_err, ", bound ", bound,
                  " (2 x the dtype reference's ", ref_err, " + u x max |exact dQ, dK, dV|), non-finite ", nonfinite);
}

GradComparison compare_gradient(const char* name, int32_t dtype, const Strides& s, int64_t batch, int64_t rows,
                                int64_t heads, int64_t head_dim, const std::vector<float>& out,
                                const std::vector<double>& exact, const std::vector<double>& lowp, double scale) {
  GradComparison c;
  c.name = name;
  for (size_t e = 0; e < exact.size(); ++e) c.ref_err = std::max(c.ref_err, std::fabs(lowp[e] - exact[e]));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < head_dim; ++d) {
          const double got = out[size_t(b * s.batch + i * s.row + h * s.head + d)];
          if (!std::isfinite(got)) {
            ++c.nonfinite;
            continue;
          }
          const double want = exact[size_t(((b * rows + i) * heads + h) * head_dim + d)];
          c.max_abs_err = std::max(c.max_abs_err, std::fabs(got - want));
        }
  c.bound = backward_bound(dtype, c.ref_err, scale);
  return c;
}

std::vector<GradComparison> compare_gradients(const BackwardProblem& p, const std::vector<float>& dq,
                                              const std::vector<float>& dk, const std::vector<float>& dv,
                                              const BackwardReferences& ref) {
  const BackwardReference &exact = ref.exact, &lowp = ref.lowp;
  double scale = 0;
  for (const std::vector<double>* g : {&exact.dq, &exact.dk, &exact.dv})
    for (double x : *g) scale = std::max(scale, std::fabs(x));
  const Problem f = dense_view(p.attention);  // a variable-length batch: its packed rows
  return {compare_gradient("dQ", f.dtype, p.dq, f.batch, f.seqlen_q, f.heads_q, f.head_dim, dq, exact.dq, lowp.dq, scale),
          compare_gradient("dK", f.dtype, p.dk, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, dk, exact.dk, lowp.dk, scale),
          compare_gradient("dV", f.dtype, p.dv, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, dv, exact.dv, lowp.dv,
                           scale)};
}

}  // namespace fs
