// The fp64 CPU reference against direct formulas and known properties of attention.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "common/forward/check.h"
#include "mask_definition.h"

namespace {

using fs::HostInputs;
using fs::Problem;

// Inputs with the problem's (contiguous) strides, filled by `fill(tensor, b, s, h, d)`.
template <typename F>
HostInputs make_inputs(const Problem& p, F fill) {
  HostInputs in;
  const int64_t nq = fs::view_extent(p.q, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
  const int64_t nk = fs::view_extent(p.k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  const int64_t nv = fs::view_extent(p.v, p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
  in.data.assign(size_t(nq + nk + nv), std::numeric_limits<float>::quiet_NaN());  // padding stays NaN
  in.q = 0;
  in.k = nq;
  in.v = nq + nk;
  for (int t = 0; t < 3; ++t) {
    const fs::Strides& st = t == 0 ? p.q : t == 1 ? p.k : p.v;
    const int64_t seq = t == 0 ? p.seqlen_q : p.seqlen_k, heads = t == 0 ? p.heads_q : p.heads_kv;
    const int64_t base = t == 0 ? in.q : t == 1 ? in.k : in.v;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t s = 0; s < seq; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < p.head_dim; ++d)
            in.data[size_t(base + b * st.batch + s * st.row + h * st.head + d)] = fill(t, b, s, h, d);
  }
  return in;
}

double o_at(const Problem& p, const fs::Reference& r, int64_t b, int64_t s, int64_t h, int64_t d) {
  return r.o[size_t(((b * p.seqlen_q + s) * p.heads_q + h) * p.head_dim + d)];
}
double lse_at(const Problem& p, const fs::Reference& r, int64_t b, int64_t h, int64_t s) {
  return r.lse[size_t((b * p.heads_q + h) * p.seqlen_q + s)];
}

}  // namespace

TEST_CASE("reference matches softmax(scale·QKᵀ)·V written out for one row", "[reference]") {
  // One query, three keys, head_dim 8: compute the formula by hand.
  Problem p = fs::make_problem(1, 1, 3, 1, 1, 8, fs::DType::fp16, false);
  p.softmax_scale = 0.5f;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 2.0f);
  const HostInputs in = make_inputs(p, [&](int, int64_t, int64_t, int64_t, int64_t) { return u(rng); });
  const fs::Reference r = fs::reference_cpu(p, in);

  double s[3], z = 0;
  for (int j = 0; j < 3; ++j) {
    double dot = 0;
    for (int d = 0; d < 8; ++d) dot += double(in.q_ptr()[d]) * in.k_ptr()[j * 8 + d];
    s[j] = 0.5 * dot;
    z += std::exp(s[j]);
  }
  for (int d = 0; d < 8; ++d) {
    double o = 0;
    for (int j = 0; j < 3; ++j) o += std::exp(s[j]) / z * in.v_ptr()[j * 8 + d];
    CHECK(std::fabs(o_at(p, r, 0, 0, 0, d) - o) < 1e-12);
  }
  CHECK(std::fabs(lse_at(p, r, 0, 0, 0) - std::log(z)) < 1e-12);
}

TEST_CASE("reference: probabilities sum to 1 (V = 1 gives O = 1)", "[reference]") {
  for (bool causal : {false, true}) {
    const Problem p = fs::make_problem(2, 9, 13, 4, 2, 16, fs::DType::bf16, causal);
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.3f, 2.0f);
    const HostInputs in = make_inputs(p, [&](int t, int64_t, int64_t, int64_t, int64_t) { return t == 2 ? 1.0f : n(rng); });
    const fs::Reference r = fs::reference_cpu(p, in);
    for (double o : r.o) CHECK(std::fabs(o - 1.0) < 1e-12);
  }
}

TEST_CASE("reference: causal mask is bottom-right aligned", "[reference]") {
  // Q = 0 makes every allowed score equal, so with V[j] = j the output is the mean of the allowed
  // key indices: row i sees keys 0 … i + Sk - Sq, so O = (i + Sk - Sq) / 2, and LSE = log(count).
  struct Case { int64_t sq, sk; };
  for (const Case c : {Case{4, 10}, Case{10, 4}, Case{7, 7}, Case{1, 5}}) {
    const Problem p = fs::make_problem(1, c.sq, c.sk, 1, 1, 8, fs::DType::fp16, true);
    const HostInputs in = make_inputs(p, [](int t, int64_t, int64_t s, int64_t, int64_t) {
      return t == 0 ? 0.0f : t == 1 ? 1.0f : float(s);
    });
    const fs::Reference r = fs::reference_cpu(p, in);
    for (int64_t i = 0; i < c.sq; ++i) {
      CAPTURE(c.sq, c.sk, i);
      const int64_t last = i + c.sk - c.sq;  // the last key row i may attend
      if (last < 0) {
        CHECK(o_at(p, r, 0, i, 0, 0) == 0.0);
        CHECK(lse_at(p, r, 0, 0, i) == -std::numeric_limits<double>::infinity());
      } else {
        const int64_t count = std::min(last, c.sk - 1) + 1;
        CHECK(std::fabs(o_at(p, r, 0, i, 0, 0) - (count - 1) / 2.0) < 1e-12);
        CHECK(std::fabs(lse_at(p, r, 0, 0, i) - std::log(double(count))) < 1e-12);
      }
    }
  }
}

TEST_CASE("reference: rows with no key give O = 0 and LSE = -inf, never NaN", "[reference]") {
  // seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k rows see no key.
  const Problem p = fs::make_problem(1, 6, 2, 2, 1, 8, fs::DType::fp16, true);
  const HostInputs in = make_inputs(p, [](int, int64_t b, int64_t s, int64_t h, int64_t d) {
    return 0.1f * float(b + s + h + d) + 0.2f;
  });
  const fs::Reference r = fs::reference_cpu(p, in);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      const bool empty = i < 4;
      for (int64_t d = 0; d < 8; ++d) {
        CHECK(std::isfinite(o_at(p, r, 0, i, h, d)));
        if (empty) CHECK(o_at(p, r, 0, i, h, d) == 0.0);
      }
      if (empty) CHECK(lse_at(p, r, 0, h, i) == -std::numeric_limits<double>::infinity());
      else CHECK(std::isfinite(lse_at(p, r, 0, h, i)));
    }
}

TEST_CASE("reference: GQA maps query head h to K/V head h / (heads_q / heads_kv)", "[reference]") {
  // Each K/V head has a constant V equal to 10 + its index, so O of query head h names its K/V head.
  for (int64_t heads_kv : {1, 2, 4, 8}) {
    const Problem p = fs::make_problem(2, 3, 5, 8, heads_kv, 8, fs::DType::fp16, false);
    const HostInputs in = make_inputs(p, [](int t, int64_t, int64_t s, int64_t h, int64_t d) {
      return t == 2 ? 10.0f + float(h) : 0.05f * float(s + d + 1);
    });
    const fs::Reference r = fs::reference_cpu(p, in);
    for (int64_t h = 0; h < 8; ++h) {
      CAPTURE(heads_kv, h);
      CHECK(std::fabs(o_at(p, r, 1, 2, h, 3) - (10.0 + double(h / (8 / heads_kv)))) < 1e-12);
    }
  }
}

TEST_CASE("reference: strided views read the same values as contiguous tensors", "[reference]") {
  Problem dense = fs::make_problem(2, 5, 6, 4, 2, 16, fs::DType::fp16, true);
  Problem padded = dense;
  padded.q = {5 * 4 * 32, 4 * 32, 32, 1};  // every head padded from 16 to 32 elements
  padded.k = padded.v = {6 * 2 * 24, 2 * 24, 24, 1};
  auto value = [](int t, int64_t b, int64_t s, int64_t h, int64_t d) {
    return std::sin(float(t * 1000 + b * 100 + s * 10 + h) + 0.37f * float(d));
  };
  const fs::Reference a = fs::reference_cpu(dense, make_inputs(dense, value));
  const fs::Reference b = fs::reference_cpu(padded, make_inputs(padded, value));
  CHECK(a.o == b.o);
  CHECK(a.lse == b.lse);
}

TEST_CASE("reference with softcapping: softcap·tanh(scale·q·k / softcap) written out for one row", "[reference][softcap]") {
  Problem p = fs::make_problem(1, 1, 3, 1, 1, 8, fs::DType::fp16, false);
  p.softmax_scale = 0.5f;
  p.softcap = 1.5f;  // about the size of the logits: tanh bends
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1.0f, 2.0f);
  const HostInputs in = make_inputs(p, [&](int, int64_t, int64_t, int64_t, int64_t) { return u(rng); });
  const fs::Reference r = fs::reference_cpu(p, in);
  double c[3], z = 0;
  for (int j = 0; j < 3; ++j) {
    double dot = 0;
    for (int d = 0; d < 8; ++d) dot += double(in.q_ptr()[d]) * in.k_ptr()[j * 8 + d];
    c[j] = 1.5 * std::tanh(0.5 * dot / 1.5);
    z += std::exp(c[j]);
  }
  CHECK(std::fabs(lse_at(p, r, 0, 0, 0) - std::log(z)) < 1e-12);
  for (int d = 0; d < 8; ++d) {
    double o = 0;
    for (int j = 0; j < 3; ++j) o += std::exp(c[j]) / z * in.v_ptr()[j * 8 + d];
    CHECK(std::fabs(o_at(p, r, 0, 0, 0, d) - o) < 1e-12);
  }
}

TEST_CASE("reference with softcapping: a tiny cap averages V, a huge one changes nothing", "[reference][softcap]") {
  Problem p = fs::make_problem(1, 4, 6, 2, 1, 16, fs::DType::fp16, true);
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 2.0f);
  const HostInputs in = make_inputs(p, [&](int, int64_t, int64_t, int64_t, int64_t) { return n(rng); });
  const fs::Reference plain = fs::reference_cpu(p, in);
  p.softcap = 1e-6f;  // every logit is within 1e-6 of 0: O is the mean of the visible V rows
  const fs::Reference tiny = fs::reference_cpu(p, in);
  p.softcap = 1e30f;  // tanh(x) = x to fp64's precision
  const fs::Reference huge = fs::reference_cpu(p, in);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 4; ++s) {
      const int64_t keys = s + 1 + 6 - 4;  // bottom-right causal
      for (int64_t d = 0; d < 16; ++d) {
        double mean = 0;
        for (int64_t j = 0; j < keys; ++j) mean += in.v_ptr()[j * 16 + d] / double(keys);
        CHECK(std::fabs(o_at(p, tiny, 0, s, h, d) - mean) < 1e-5);
        CHECK(std::fabs(o_at(p, huge, 0, s, h, d) - o_at(p, plain, 0, s, h, d)) < 1e-12);
      }
      CHECK(std::fabs(lse_at(p, tiny, 0, h, s) - std::log(double(keys))) < 1e-5);
    }
}

namespace {

// O and LSE from the definition, written out apart from reference_cpu: the full score matrix of each
// (batch, query head), masked pair by pair (tests/mask_definition.h), softcapped, then the softmax of
// each row; a row whose scores are all masked has O = 0 and LSE = -inf.
fs::Reference naive_attention(const Problem& p, const HostInputs& in) {
  const int64_t Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, D = p.head_dim;
  const double none = -std::numeric_limits<double>::infinity();
  fs::Reference r;
  r.o.assign(size_t(p.batch * Sq * H * D), 0.0);
  r.lse.assign(size_t(p.batch * H * Sq), none);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / p.heads_kv);
      std::vector<double> s(size_t(Sq * Sk), none);
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Sk; ++j) {
          if (!fs::test::sees(p, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += double(in.q_ptr()[b * p.q.batch + i * p.q.row + h * p.q.head + d]) *
                   double(in.k_ptr()[b * p.k.batch + j * p.k.row + hk * p.k.head + d]);
          const double c = p.softmax_scale * dot;
          s[size_t(i * Sk + j)] = p.softcap > 0 ? p.softcap * std::tanh(c / p.softcap) : c;
        }
      for (int64_t i = 0; i < Sq; ++i) {
        const double* row = &s[size_t(i * Sk)];
        const double top = Sk ? *std::max_element(row, row + Sk) : none;
        if (top == none) continue;
        double z = 0;
        for (int64_t j = 0; j < Sk; ++j) z += std::exp(row[j] - top);
        r.lse[size_t((b * H + h) * Sq + i)] = top + std::log(z);
        for (int64_t j = 0; j < Sk; ++j)
          for (int64_t d = 0; d < D; ++d)
            r.o[size_t(((b * Sq + i) * H + h) * D + d)] +=
                std::exp(row[j] - top) / z * double(in.v_ptr()[b * p.v.batch + j * p.v.row + hk * p.v.head + d]);
      }
    }
  return r;
}

}  // namespace

TEST_CASE("reference with a window: the masked softmax written out pair by pair, on random problems",
          "[reference][window]") {
  // Bounds from 0 to past the sequence, causal or not, softcapped or not, GQA, seqlen_q above and below
  // seqlen_k: rows with no key among them (O = 0, LSE = -inf on both sides).
  std::mt19937 rng(13);
  auto below = [&](int n) { return int(rng() % unsigned(n)); };
  std::normal_distribution<float> n(0.2f, 1.5f);
  const int32_t bounds[] = {-1, 0, 1, 2, 3, 30};
  const float caps[] = {0.0f, 0.0f, 0.7f, 5.0f};
  int empty_rows = 0;
  for (int k = 0; k < 200; ++k) {
    const int64_t hkv = 1 + below(2), hq = hkv * (1 + below(3));
    Problem p = fs::make_problem(1 + below(2), 1 + below(12), 1 + below(12), hq, hkv, 8 * (1 + below(2)),
                                 fs::DType::fp16, below(3) == 0);
    p.window = 1, p.window_left = bounds[below(6)], p.window_right = bounds[below(6)];
    p.softcap = caps[below(4)];
    CAPTURE(fs::describe(p));
    const HostInputs in = make_inputs(p, [&](int, int64_t, int64_t, int64_t, int64_t) { return n(rng); });
    const fs::Reference got = fs::reference_cpu(p, in), want = naive_attention(p, in);
    auto close = [](double a, double b) { return a == b || std::fabs(a - b) < 1e-12 * (1 + std::fabs(b)); };
    for (size_t e = 0; e < want.o.size(); ++e) CHECK(close(got.o[e], want.o[e]));
    for (size_t e = 0; e < want.lse.size(); ++e) {
      empty_rows += std::isinf(want.lse[e]);
      CHECK(close(got.lse[e], want.lse[e]));  // -inf where there is no key
    }
  }
  CHECK(empty_rows > 20);  // the draw does reach rows with no key
}

TEST_CASE("reference with a window: rows with no key, and windows that are causal or no window at all",
          "[reference][window]") {
  // seqlen_q 6, seqlen_k 3, window (1, 0): row i sees keys i - 4 … i - 3, so rows 0 … 2 see none.
  Problem p = fs::make_problem(1, 6, 3, 2, 1, 8, fs::DType::bf16, false);
  p.window = 1, p.window_left = 1, p.window_right = 0;
  std::mt19937 rng(21);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const HostInputs in = make_inputs(p, [&](int, int64_t, int64_t, int64_t, int64_t) { return n(rng); });
  const fs::Reference r = fs::reference_cpu(p, in);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      CAPTURE(h, i);
      for (int64_t d = 0; d < 8; ++d)
        if (i < 3) CHECK(o_at(p, r, 0, i, h, d) == 0.0);
        else CHECK(std::isfinite(o_at(p, r, 0, i, h, d)));
      if (i < 3) CHECK(lse_at(p, r, 0, h, i) == -std::numeric_limits<double>::infinity());
      else CHECK(std::isfinite(lse_at(p, r, 0, h, i)));
    }
  // Row 3 sees key 0 alone: O is that key's V row, LSE its logit.
  double dot = 0;
  for (int64_t d = 0; d < 8; ++d) dot += double(in.q_ptr()[p.q.row * 3 + d]) * in.k_ptr()[d];
  CHECK(std::fabs(lse_at(p, r, 0, 0, 3) - p.softmax_scale * dot) < 1e-12 * (1 + std::fabs(dot)));
  for (int64_t d = 0; d < 8; ++d) CHECK(o_at(p, r, 0, 3, 0, d) == double(in.v_ptr()[d]));

  // A window as wide as the keys changes nothing; (-1, 0) is causal; causal on top of (2, 5) is (2, 0).
  Problem q = fs::make_problem(2, 9, 13, 4, 2, 16, fs::DType::fp16, false);
  const HostInputs qin = make_inputs(q, [&](int, int64_t, int64_t, int64_t, int64_t) { return n(rng); });
  auto with = [&](bool causal, int32_t window, int32_t left, int32_t right) {
    Problem w = q;
    w.causal = causal, w.window = window, w.window_left = left, w.window_right = right;
    return fs::reference_cpu(w, qin);
  };
  const fs::Reference full = with(false, 0, 0, 0), wide = with(false, 1, 13, 9);
  CHECK(wide.o == full.o);
  CHECK(wide.lse == full.lse);
  const fs::Reference causal = with(true, 0, 0, 0), banded = with(false, 1, -1, 0);
  CHECK(banded.o == causal.o);
  CHECK(banded.lse == causal.lse);
  const fs::Reference causal_band = with(true, 1, 2, 5), left = with(false, 1, 2, 0);
  CHECK(causal_band.o == left.o);
  CHECK(causal_band.lse == left.lse);
  CHECK(left.o != causal.o);  // and a window does change O
}
