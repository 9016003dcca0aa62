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

namespace {

// The gradients of the dense problem p (its strides for Q, K, V at q_base, k_base, v_base; dO contiguous
// (batch, seqlen_q, heads_q, head_dim) at d_o_base), added into dq_base (contiguous like dO) and
// dk_base, dv_base ((batch, seqlen_k, heads_kv, head_dim) contiguous, zeros): the whole problem, or one
// sequence of a variable-length batch on its rows.
void backprop(const Problem& p, const float* q_base, const float* k_base, const float* v_base, const float* d_o_base,
              double* dq_base, double* dk_base, double* dv_base, bool rounded) {
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, Hkv = p.heads_kv, D = p.head_dim;
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
        const float* q = at(q_base, p.q, b, i, h);
        const float* d_o = d_o_base + ((b * Sq + i) * H + h) * D;
        // P = softmax(scale · q·k) over the visible keys (softcapped: of softcap·tanh(scale · q·k / softcap),
        // whose slope dS takes); dP = dO·vᵀ.
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const float* k = at(k_base, p.k, b, j, hk);
          const float* v = at(v_base, p.v, b, j, hk);
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
            const float* v = at(v_base, p.v, b, j, hk);
            for (int64_t d = 0; d < D; ++d) o[d] += prob[j] * double(v[d]);
          }
          for (int64_t d = 0; d < D; ++d) row_d += double(d_o[d]) * round_to_dtype(o[d], p.dtype);
        } else {
          for (int64_t j = keys.first; j < keys.end; ++j) row_d += prob[j] * dp[j];
        }
        double* dq = dq_base + ((b * Sq + i) * H + h) * D;
        for (int64_t j = keys.first; j < keys.end; ++j) {
          const double ds = round(prob[j] * (dp[j] - row_d) * slope[j]);  // from the unrounded P
          const double pj = round(prob[j]);                    // the operand of dV = Pᵀ·dO
          const float* k = at(k_base, p.k, b, j, hk);
          double* dk = dk_base + ((b * Sk + j) * Hkv + hk) * D;
          double* dv = dv_base + ((b * Sk + j) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += scale * ds * double(k[d]);
            dk[d] += scale * ds * double(q[d]);
            dv[d] += pj * double(d_o[d]);
          }
        }
      }
    }
}

}  // namespace

BackwardReference reference_cpu(const BackwardProblem& bp, const BackwardHostInputs& in, bool rounded) {
  const Problem& p = bp.attention;
  const Problem f = dense_view(p);  // the sizes of the tensors: a variable-length batch's packed rows
  const int64_t H = p.heads_q, Hkv = p.heads_kv, D = p.head_dim;
  BackwardReference r;
  r.dq.assign(size_t(f.batch * f.seqlen_q * H * D), 0.0);
  r.dk.assign(size_t(f.batch * f.seqlen_k * Hkv * D), 0.0);
  r.dv.assign(size_t(f.batch * f.seqlen_k * Hkv * D), 0.0);
  const HostInputs& x = in.qkv;
  if (!is_varlen(p)) {
    backprop(p, x.q_ptr(), x.k_ptr(), x.v_ptr(), in.d_o.data(), r.dq.data(), r.dk.data(), r.dv.data(), rounded);
    return r;
  }
  // Each sequence on its own rows (one_sequence): its masks on its own lengths, GQA's sum within it; the
  // rows of dK and dV that no query of theirs sees stay 0.
  if (const std::string why = validate_offsets(p, x.cu.q, x.cu.k); !why.empty())
    throw Error("backward reference: " + why);
  for_each_sequence(p, x.cu.q, x.cu.k, [&](int64_t, const Sequence& s) {
    backprop(one_sequence(p, s), x.q_ptr() + s.q_start * p.q.row, x.k_ptr() + s.k_start * p.k.row,
             x.v_ptr() + s.k_start * p.v.row, in.d_o.data() + s.q_start * H * D, r.dq.data() + s.q_start * H * D,
             r.dk.data() + s.k_start * Hkv * D, r.dv.data() + s.k_start * Hkv * D, rounded);
  });
  return r;
}

}  // namespace fs
