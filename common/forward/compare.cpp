#include "forward/check.h"

#include <cmath>

namespace fs {

Tolerance tolerance_for(int32_t dtype, double max_abs_v) {
  const double u = unit_roundoff(dtype);
  return Tolerance{2 * u * max_abs_v, 2 * u, 1e-4};
}

std::string Comparison::summary() const {
  std::string s = sentence(pass() ? "PASS" : "FAIL", ": max |err| ", max_abs_err, ", rel Frobenius ", rel_fro_err,
                           ", max LSE err ", max_lse_err, ", non-finite ", nonfinite, ", mismatches ", mismatches);
  for (const std::string& m : first_mismatches) s += "\n    " + m;
  return s;
}

Comparison compare(const Problem& given, const std::vector<float>& o, const std::vector<float>& lse,
                   const Reference& ref, double max_abs_v) {
  const Problem p = dense_view(given);  // a variable-length batch: its packed rows
  const Tolerance tol = tolerance_for(p.dtype, max_abs_v);
  const int64_t B = p.batch, Sq = p.seqlen_q, H = p.heads_q, D = p.head_dim;
  Comparison c;
  double err2 = 0, ref2 = 0;
  auto note = [&](const std::string& s) {
    if (c.first_mismatches.size() < 8) c.first_mismatches.push_back(s);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < Sq; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const double got = o[size_t(b * p.o.batch + s * p.o.row + h * p.o.head + d)];
          const double want = ref.o[size_t(((b * Sq + s) * H + h) * D + d)];
          const double err = std::fabs(got - want), bound = tol.atol + tol.rtol * std::fabs(want);
          const bool finite = std::isfinite(got);
          if (!finite) ++c.nonfinite;
          else c.max_abs_err = std::max(c.max_abs_err, err), err2 += err * err;
          ref2 += want * want;
          if (!finite || err > bound) {
            ++c.mismatches;
            note(sentence("O(b=", b, ", s=", s, ", h=", h, ", d=", d, ") = ", got, ", reference ", want, " (tolerance ",
                          bound, ")"));
          }
        }
  c.rel_fro_err = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (!lse.empty())
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < Sq; ++s) {
          const size_t i = size_t((b * H + h) * Sq + s);
          const double got = lse[i], want = ref.lse[i], err = std::fabs(got - want);
          const bool finite = std::isfinite(got), same_inf = std::isinf(want) && got == want;
          if (finite && !std::isinf(want)) c.max_lse_err = std::max(c.max_lse_err, err);
          if (!finite && !same_inf) ++c.nonfinite;
          if (!same_inf && !(finite && !std::isinf(want) && err <= tol.lse_rtol * (1 + std::fabs(want)))) {
            ++c.mismatches;
            note(sentence("LSE(b=", b, ", h=", h, ", s=", s, ") = ", got, ", reference ", want));
          }
        }
  return c;
}

}  // namespace fs
