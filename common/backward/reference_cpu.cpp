// The fp64 CPU reference of the backward pass (common/backward/check.h): one query row at a time, P
// recomputed from Q and K, then the five products of the backward written as sums.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backward/check.h"

namespace fs {

double round_to_dtype(double x, int32_t dtype) {
  if (!std::isfinite(x) || x == 0) return x;
  // Significand bits (with the implicit one), smallest normal exponent, largest finite value.
  const int precision = dtype == FS_BF16 ? 8 : 11;
  const int min_exponent = dtype == FS_BF16 ? -126 : -14;
  const double largest = dtype == FS_BF16 ? std::ldexp(255.0, 120) : 65504.0;
  int e = 0;
  std::frexp(x, &e);  // |x| = f · 2^e, f in [0.5, 1): the leading bit is 2^(e-1)
  // The spacing of the dtype's values near x (subnormals below 2^min_exponent share the smallest one).
  const double ulp = std::ldexp(1.0, std::max(e - 1, min_exponent) - (precision - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // x / ulp is exact; nearbyint rounds ties to even
  return std::fabs(r) > largest ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

double reference_cpu_cost(const BackwardProblem& p) {
  // Five products of length head_dim per (query row, key) pair: S, dP, dQ, dK, dV.
  return 5 * reference_cpu_cost(p.attention);
}

BackwardReference reference_cpu(const BackwardProblem& bp, const BackwardHostInputs& in, bool rounded) {
  const Problem& p = bp.attention;
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, Hkv = p.heads_kv, D = p.head_dim;
  BackwardReference r;
  r.dq.assign(size_t(B * Sq * H * D), 0.0);
  r.dk.assign(size_t(B * Sk * Hkv * D), 0.0);
  r.dv.assign(size_t(B * Sk * Hkv * D), 0.0);
  const double scale = p.softmax_scale;
  auto round = [&](double x) { return rounded ? round_to_dtype(x, p.dtype) : x; };
  auto at = [](const float* base, const Strides& st, int64_t b, int64_t row, int64_t h) {
    return base + b * st.batch + row * st.row + h * st.head;
  };
  std::vector<double> prob(static_cast<size_t>(Sk)), dp(static_cast<size_t>(Sk)), slope(static_cast<size_t>(Sk)),
      o(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = kv_head_of(p, h);
      for (int64_t i = 0; i < Sq; ++i) {
        const KeyRange keys = reference_keys(p, i);  // causal, window
        if (keys.end <= keys.first) continue;  // no key: P = 0, so dQ = 0 and nothing reaches dK, dV
        const float* q = at(in.qkv.q_ptr(), p.q, b, i, h);
        const float* d_o = in.d_o.data() + ((b * Sq + i) * H + h) * D;
        // P = softmax(scale · q·k) over the visible keys (softcapped: of softcap·tanh(scale · q·k / softcap),
        // whose slope dS takes); dP = dO·vᵀ.
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* k = at(in.qkv.k_ptr(), p.k, b, j, hk);
          const float* v = at(in.qkv.v_ptr(), p.v, b, j, hk);
          double dot = 0, dpj = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += double(q[d]) * double(k[d]);
            dpj += double(d_o[d]) * double(v[d]);
          }
          prob[j] = capped_logit(scale * dot, p.softcap);
          slope[j] = capped_slope(prob[j], p.softcap);
          dp[j] = dpj;
          m = std::max(m, prob[j]);
        }
        double sum = 0;
        for (int64_t j = keys.first; j < keys.end; ++j) sum += (prob[j] = std::exp(prob[j] - m));
        for (int64_t j = keys.first; j < keys.end; ++j) prob[j] /= sum;
        // D = Σ_j P_ij·dP_ij, or (rounded) rowsum(dO ∘ O) with O = P·V rounded to the dtype.
        double row_d = 0;
        if (rounded) {
          std::fill(o.begin(), o.end(), 0.0);
          for (int64_t j = keys.first; j < keys.end; ++j) {
            const float* v = at(in.qkv.v_ptr(), p.v, b, j, hk);
            for (int64_t d = 0; d < D; ++d) o[d] += prob[j] * double(v[d]);
          }
          for (int64_t d = 0; d < D; ++d) row_d += double(d_o[d]) * round_to_dtype(o[d], p.dtype);
        } else {
          for (int64_t j = keys.first; j < keys.end; ++j) row_d += prob[j] * dp[j];
        }
        double* dq = &r.dq[size_t(((b * Sq + i) * H + h) * D)];
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const double ds = round(prob[j] * (dp[j] - row_d) * slope[j]);  // from the unrounded P
          const double pj = round(prob[j]);                    // the operand of dV = Pᵀ·dO
          const float* k = at(in.qkv.k_ptr(), p.k, b, j, hk);
          double* dk = &r.dk[size_t(((b * Sk + j) * Hkv + hk) * D)];
          double* dv = &r.dv[size_t(((b * Sk + j) * Hkv + hk) * D)];
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += scale * ds * double(k[d]);
            dk[d] += scale * ds * double(q[d]);
            dv[d] += pj * double(d_o[d]);
          }
        }
      }
    }
  return r;
}

}  // namespace fs
