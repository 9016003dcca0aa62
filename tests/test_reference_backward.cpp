// The fp64 CPU reference of the backward pass against central finite differences of a forward pass
// written here again (loss = Σ dO ∘ O), and the properties of its rounded variant.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "common/backward/check.h"
#include "mask_definition.h"
#include "max_error.h"

namespace {

using fs::test::max_abs;
using fs::test::max_diff;

// A tiny problem with contiguous fp64 tensors: q (B, Sq, H, D), k and v (B, Sk, Hkv, D), d_o like q.
struct Tiny {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  bool causal;
  double scale;
  std::vector<double> q, k, v, d_o;
  double softcap = 0;  // > 0: every logit c becomes softcap·tanh(c / softcap)
  int32_t window = 0, window_left = 0, window_right = 0;  // fs_problem's sliding window
};

Tiny make_tiny(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, bool causal, unsigned seed) {
  Tiny t{b, sq, sk, hq, hkv, d, causal, 1.0 / std::sqrt(double(d)), {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.25, 1.0);
  // Values a fp16 holds exactly, so that the float inputs of the reference are these values.
  auto draw = [&](int64_t count) {
    std::vector<double> x(static_cast<size_t>(count));
    for (double& e : x) e = fs::round_to_dtype(n(rng), FS_FP16);
    return x;
  };
  t.q = draw(b * sq * hq * d);
  t.k = draw(b * sk * hkv * d);
  t.v = draw(b * sk * hkv * d);
  t.d_o = draw(b * sq * hq * d);
  return t;
}

// The backward problem of a tiny one, with contiguous tensors (fp16).
fs::BackwardProblem problem_of(const Tiny& t) {
  fs::BackwardProblem p{};
  p.attention = fs::make_problem(t.batch, t.seqlen_q, t.seqlen_k, t.heads_q, t.heads_kv, t.head_dim, fs::DType::fp16,
                               t.causal);
  p.attention.softmax_scale = float(t.scale);
  p.attention.softcap = float(t.softcap);
  p.attention.window = t.window, p.attention.window_left = t.window_left, p.attention.window_right = t.window_right;
  p.d_o = p.dq = p.attention.q;
  p.dk = p.dv = p.attention.k;
  return p;
}

// loss = Σ dO ∘ O with O = softmax(scale·Q·Kᵀ, masked, softcapped)·V, in fp64, written from the definition:
// query head h reads K/V head h / (Hq / Hkv); row i sees key j as tests/mask_definition.h says (causal:
// when j - i <= Sk - Sq; a window: within its bounds of the diagonal).
double loss(const Tiny& t) {
  const int64_t Sq = t.seqlen_q, Sk = t.seqlen_k, H = t.heads_q, Hkv = t.heads_kv, D = t.head_dim;
  const fs::Problem mask = problem_of(t).attention;
  double total = 0;
  for (int64_t b = 0; b < t.batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t hk = h * Hkv / H;
        std::vector<std::pair<int64_t, double>> w;  // (key, logit) of each key the row sees
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Sk; ++j) {
          if (!fs::test::sees(mask, i, j)) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += t.q[size_t(((b * Sq + i) * H + h) * D + d)] * t.k[size_t(((b * Sk + j) * Hkv + hk) * D + d)];
          w.push_back({j, t.softcap > 0 ? t.softcap * std::tanh(t.scale * s / t.softcap) : t.scale * s});
          top = std::max(top, w.back().second);
        }
        double z = 0;
        for (auto& [j, x] : w) z += (x = std::exp(x - top));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (const auto& [j, x] : w) o += x / z * t.v[size_t(((b * Sk + j) * Hkv + hk) * D + d)];
          total += t.d_o[size_t(((b * Sq + i) * H + h) * D + d)] * o;
        }
      }
  return total;
}

// The reference's inputs: Q, K, V one after the other with the problem's (contiguous) strides.
fs::BackwardHostInputs inputs_of(const Tiny& t) {
  fs::BackwardHostInputs in;
  in.qkv.data.insert(in.qkv.data.end(), t.q.begin(), t.q.end());
  in.qkv.k = int64_t(in.qkv.data.size());
  in.qkv.data.insert(in.qkv.data.end(), t.k.begin(), t.k.end());
  in.qkv.v = int64_t(in.qkv.data.size());
  in.qkv.data.insert(in.qkv.data.end(), t.v.begin(), t.v.end());
  in.d_o.assign(t.d_o.begin(), t.d_o.end());
  return in;
}

// Central differences of loss() in every element of one tensor of `t`, against `grad`.
double max_fd_error(Tiny t, std::vector<double> Tiny::*tensor, const std::vector<double>& grad) {
  const double step = 1e-5;
  double worst = 0;
  std::vector<double>& x = t.*tensor;
  REQUIRE(grad.size() == x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    const double keep = x[e];
    x[e] = keep + step;
    const double up = loss(t);
    x[e] = keep - step;
    const double down = loss(t);
    x[e] = keep;
    worst = std::max(worst, std::fabs((up - down) / (2 * step) - grad[e]));
  }
  return worst;
}

// dQ, dK, dV of the reference against central differences of the loss. They err by O(step²) (third
// derivatives of size 1) plus O(1e-16 · |loss| / step).
void check_finite_differences(const Tiny& t, const fs::BackwardReference& r) {
  const double tol = 1e-7;
  CHECK(max_fd_error(t, &Tiny::q, r.dq) < tol * (1 + max_abs(r.dq)));
  CHECK(max_fd_error(t, &Tiny::k, r.dk) < tol * (1 + max_abs(r.dk)));
  CHECK(max_fd_error(t, &Tiny::v, r.dv) < tol * (1 + max_abs(r.dv)));
}

}  // namespace

TEST_CASE("round_to_dtype: nearest fp16 / bf16, ties to even, overflow to infinity", "[reference][backward]") {
  CHECK(fs::round_to_dtype(1.0 + std::ldexp(1.0, -11), FS_FP16) == 1.0);  // a tie: to the even 1.0
  CHECK(fs::round_to_dtype(1.0 + 3 * std::ldexp(1.0, -11), FS_FP16) == 1.0 + std::ldexp(1.0, -9));  // tie, up to even
  CHECK(fs::round_to_dtype(1.0 + std::ldexp(1.0, -11) + 1e-9, FS_FP16) == 1.0 + std::ldexp(1.0, -10));
  CHECK(fs::round_to_dtype(-0.1, FS_FP16) == -0.0999755859375);  // the fp16 nearest -0.1
  CHECK(fs::round_to_dtype(65519.0, FS_FP16) == 65504.0);
  CHECK(std::isinf(fs::round_to_dtype(65520.0, FS_FP16)));  // the midpoint to 2^16 rounds to even: overflow
  CHECK(fs::round_to_dtype(std::ldexp(1.0, -24), FS_FP16) == std::ldexp(1.0, -24));  // smallest subnormal
  CHECK(fs::round_to_dtype(std::ldexp(1.0, -25), FS_FP16) == 0.0);                 // half of it: to even (0)
  CHECK(fs::round_to_dtype(std::ldexp(3.0, -26), FS_FP16) == std::ldexp(1.0, -24));
  CHECK(fs::round_to_dtype(1.0 + std::ldexp(1.0, -8), FS_BF16) == 1.0);
  CHECK(fs::round_to_dtype(1.0 + 3 * std::ldexp(1.0, -8), FS_BF16) == 1.0 + std::ldexp(1.0, -6));
  CHECK(fs::round_to_dtype(0.1, FS_BF16) == 0.10009765625);  // the bf16 nearest 0.1
  CHECK(fs::round_to_dtype(3.0e38, FS_BF16) == std::ldexp(113.0, 121));
  CHECK(std::isinf(fs::round_to_dtype(3.4e38, FS_BF16)));
  CHECK(fs::round_to_dtype(0.0, FS_BF16) == 0.0);
}

TEST_CASE("backward reference: dQ, dK, dV are the derivatives of Σ dO∘O (finite differences)",
          "[reference][backward]") {
  struct Shape {
    int64_t b, sq, sk, hq, hkv, d;
    bool causal;
  };
  // Causal with seqlen_q > seqlen_k leaves rows with no key (rows 0 and 1 of the 5 × 3 case).
  const Shape shapes[] = {
      {1, 3, 4, 1, 1, 8, false}, {2, 4, 4, 2, 2, 8, true}, {1, 3, 5, 4, 2, 8, true}, {1, 5, 3, 4, 1, 16, true},
      {1, 5, 3, 2, 1, 8, false}, {2, 1, 6, 4, 2, 8, true},
  };
  unsigned seed = 1;
  for (const Shape& s : shapes) {
    CAPTURE(s.b, s.sq, s.sk, s.hq, s.hkv, s.d, s.causal);
    const Tiny t = make_tiny(s.b, s.sq, s.sk, s.hq, s.hkv, s.d, s.causal, seed++);
    const fs::BackwardReference r = fs::reference_cpu(problem_of(t), inputs_of(t), false);
    check_finite_differences(t, r);
    CHECK(max_abs(r.dq) > 0.01);  // a derivative that is not trivially zero
    CHECK(max_abs(r.dv) > 0.01);
  }
}

TEST_CASE("backward reference with softcapping: the derivatives of the capped logits (finite differences)",
          "[reference][backward][softcap]") {
  // Softcaps of the size of the logits (|scale·q·k| reaches about 3 here), where tanh bends: the slope
  // 1 - tanh² is far from 1 and a missing or misplaced factor fails by far more than the tolerance.
  unsigned seed = 40;
  for (const double softcap : {0.5, 2.0, 30.0})
    for (const bool causal : {false, true}) {
      CAPTURE(softcap, causal);
      Tiny t = make_tiny(1, 4, 5, 2, 1, 8, causal, seed++);
      t.softcap = softcap;
      const fs::BackwardReference r = fs::reference_cpu(problem_of(t), inputs_of(t), false);
      check_finite_differences(t, r);
      CHECK(max_abs(r.dq) > 0.001);
      // The same inputs without the cap give other gradients (by more than the tolerance above).
      Tiny plain = t;
      plain.softcap = 0;
      const fs::BackwardReference u = fs::reference_cpu(problem_of(plain), inputs_of(plain), false);
      if (softcap < 10) CHECK(max_diff(u.dq, r.dq) > 1e-3);
    }
}

TEST_CASE("backward reference with a window: the derivatives of the banded softmax (finite differences)",
          "[reference][backward][window]") {
  struct Band {
    int32_t left, right;
    bool causal;
    double softcap;
  };
  // Left-only, right-only, both, causal on top of a window, softcapped; on 5 × 7 and on 8 × 5, where the
  // first rows see no key with a right bound of 0 or 1 (each band changes the mask of both shapes).
  const Band bands[] = {{2, -1, false, 0}, {-1, 1, false, 0}, {1, 2, false, 0},
                        {2, 3, true, 0},   {1, 0, false, 2.0},  {3, 1, true, 0.5}};
  unsigned seed = 60;
  for (const Band& band : bands)
    for (const auto& [sq, sk, hq, hkv] : {std::array<int64_t, 4>{5, 7, 4, 2}, {8, 5, 2, 1}}) {
      CAPTURE(band.left, band.right, band.causal, band.softcap, sq, sk);
      Tiny t = make_tiny(1, sq, sk, hq, hkv, 8, band.causal, seed++);
      t.softcap = band.softcap;
      t.window = 1, t.window_left = band.left, t.window_right = band.right;
      const fs::BackwardReference r = fs::reference_cpu(problem_of(t), inputs_of(t), false);
      check_finite_differences(t, r);
      CHECK(max_abs(r.dq) > 0.001);
      // The same inputs without the window give other gradients (by more than the tolerance above).
      Tiny open = t;
      open.window = 0, open.window_left = open.window_right = 0;
      CHECK(max_diff(fs::reference_cpu(problem_of(open), inputs_of(open), false).dq, r.dq) > 1e-3);
    }
}

TEST_CASE("backward reference with window (0, 0): one key per row, so dQ = dK = 0, and dV = dO moved to its key",
          "[reference][backward][window]") {
  // seqlen_q 5, seqlen_k 3: row i sees key i - 2 alone (rows 0 and 1 none). P = 1 whatever the score, so
  // nothing flows to Q or K; dV of key j is the dO of row j + 2, summed over the query heads of its group.
  Tiny t = make_tiny(1, 5, 3, 4, 2, 8, false, 70);
  t.window = 1, t.window_left = 0, t.window_right = 0;
  for (bool rounded : {false, true}) {
    CAPTURE(rounded);
    const fs::BackwardReference r = fs::reference_cpu(problem_of(t), inputs_of(t), rounded);
    CHECK(max_abs(r.dq) == 0.0);
    CHECK(max_abs(r.dk) == 0.0);
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t hk = 0; hk < 2; ++hk)
        for (int64_t d = 0; d < 8; ++d) {
          const auto d_o = [&](int64_t h) { return t.d_o[size_t(((j + 2) * 4 + h) * 8 + d)]; };  // row j + 2
          CHECK(r.dv[size_t((j * 2 + hk) * 8 + d)] == d_o(2 * hk) + d_o(2 * hk + 1));
        }
  }
}

TEST_CASE("backward reference: a row with no key has dQ = 0 and adds nothing to dK, dV", "[reference][backward]") {
  // Causal, seqlen_q 6 > seqlen_k 2: rows 0 … 3 see no key. Their dO is huge: if it leaked into dK
  // or dV the result would show it.
  Tiny t = make_tiny(1, 6, 2, 2, 1, 8, true, 42);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t hd = 0; hd < 2 * 8; ++hd) t.d_o[size_t(i * 16 + hd)] = 1e6;
  for (bool rounded : {false, true}) {
    CAPTURE(rounded);
    const fs::BackwardReference r = fs::reference_cpu(problem_of(t), inputs_of(t), rounded);
    for (double x : r.dq) CHECK(std::isfinite(x));
    for (double x : r.dk) CHECK(std::isfinite(x));
    for (double x : r.dv) CHECK(std::isfinite(x));
    for (size_t e = 0; e < size_t(4 * 2 * 8); ++e) CHECK(r.dq[e] == 0.0);
    CHECK(max_abs(r.dv) < 100);  // the visible rows' dO is N(0.25, 1)
    CHECK(max_abs(r.dk) < 100);
  }
}

TEST_CASE("backward reference: Q, K, V read through their strides", "[reference][backward]") {
  // The same tensors, contiguous and as views into one packed (B, S, Hq + 2·Hkv, D) QKV buffer, give
  // the same gradients bit for bit.
  const Tiny t = make_tiny(2, 7, 7, 4, 2, 8, true, 9);
  const fs::BackwardProblem dense = problem_of(t);
  const fs::BackwardReference want = fs::reference_cpu(dense, inputs_of(t), false);
  fs::BackwardProblem packed = dense;
  const int64_t heads = 4 + 2 * 2, D = 8, S = 7;
  packed.attention.q = packed.attention.k = packed.attention.v = fs::contiguous_strides(S, heads, D);
  fs::BackwardHostInputs in;
  in.qkv.data.assign(size_t(2 * S * heads * D), std::numeric_limits<float>::quiet_NaN());
  in.qkv.q = 0;
  in.qkv.k = 4 * D;
  in.qkv.v = (4 + 2) * D;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < S; ++s) {
      float* row = in.qkv.data.data() + (b * S + s) * heads * D;
      for (int64_t e = 0; e < 4 * D; ++e) row[e] = float(t.q[size_t((b * S + s) * 4 * D + e)]);
      for (int64_t e = 0; e < 2 * D; ++e) {
        row[4 * D + e] = float(t.k[size_t((b * S + s) * 2 * D + e)]);
        row[6 * D + e] = float(t.v[size_t((b * S + s) * 2 * D + e)]);
      }
    }
  in.d_o.assign(t.d_o.begin(), t.d_o.end());
  const fs::BackwardReference got = fs::reference_cpu(packed, in, false);
  CHECK(got.dq == want.dq);
  CHECK(got.dk == want.dk);
  CHECK(got.dv == want.dv);
}

TEST_CASE("backward reference: rounded to the dtype differs from exact by about the dtype's unit roundoff",
          "[reference][backward]") {
  for (int32_t dtype : {FS_FP16, FS_BF16}) {
    CAPTURE(dtype);
    const Tiny t = make_tiny(1, 33, 40, 2, 1, 32, true, 5);
    fs::BackwardProblem p = problem_of(t);
    p.attention.dtype = dtype;
    const fs::BackwardHostInputs in = inputs_of(t);
    const fs::BackwardReference exact = fs::reference_cpu(p, in, false);
    const fs::BackwardReference low = fs::reference_cpu(p, in, true);
    const double u = dtype == FS_BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (auto [e, l] : {std::pair{&exact.dq, &low.dq}, {&exact.dk, &low.dk}, {&exact.dv, &low.dv}}) {
      // P, dS and O are each within u (relative) of their exact values, so the gradients move by
      // about u times their size: 0.29 to 0.65 u·max |exact| on this problem. Between u/10 and 4u:
      // the rounding is done, and at the dtype's precision.
      const double err = max_diff(*e, *l);
      CHECK(err > 0.1 * u * max_abs(*e));
      CHECK(err < 4 * u * max_abs(*e));
    }
    // dV alone has a simple bound: P rounded is within u·P of P (plus 2^-25 where fp16 P is
    // subnormal), and Σ_i P_ij ≤ Sq, so dV_jd moves by at most (u + 2^-25) · Sq · max |dO|.
    const double worst = max_diff(exact.dv, low.dv);
    CHECK(worst <= (u + std::ldexp(1.0, -25)) * 33 * max_abs(t.d_o));
  }
}
