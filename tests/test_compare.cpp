// The comparison: tolerances, NaN detection, mismatch coordinates.
#include <cmath>
#include <limits>

#include "catch.h"
#include "common/forward/check.h"

namespace {
struct Fixture {
  fs::Problem p = fs::make_problem(1, 3, 4, 2, 1, 8, fs::DType::fp16, false);
  fs::Reference ref;
  std::vector<float> o, lse;
  Fixture() {
    const size_t n = size_t(p.seqlen_q * p.heads_q * p.head_dim);
    for (size_t i = 0; i < n; ++i) ref.o.push_back(0.5 + 0.01 * double(i));
    for (int i = 0; i < 6; ++i) ref.lse.push_back(1.5 + i);
    o.assign(ref.o.begin(), ref.o.end());
    lse.assign(ref.lse.begin(), ref.lse.end());
  }
};
}  // namespace

TEST_CASE("compare: tolerances follow the unit roundoff", "[compare]") {
  CHECK(fs::unit_roundoff(FS_FP16) == std::ldexp(1.0, -11));
  CHECK(fs::unit_roundoff(FS_BF16) == std::ldexp(1.0, -8));
  const fs::Tolerance t = fs::tolerance_for(FS_BF16, 4.0);
  CHECK(t.rtol == std::ldexp(1.0, -7));
  CHECK(t.atol == 4.0 * std::ldexp(1.0, -7));
}

TEST_CASE("compare: equal outputs pass, and a small error stays within tolerance", "[compare]") {
  Fixture f;
  CHECK(fs::compare(f.p, f.o, f.lse, f.ref, 1.0).pass());
  f.o[5] += 1e-4f;
  const fs::Comparison c = fs::compare(f.p, f.o, f.lse, f.ref, 1.0);
  CHECK(c.pass());
  CHECK(c.max_abs_err > 0.9e-4);
  CHECK(c.rel_fro_err > 0);
}

TEST_CASE("compare: a wrong element is reported with its coordinates", "[compare]") {
  Fixture f;
  // (b=0, s=2, h=1, d=3) in contiguous (b, s, h, d) order.
  const size_t i = size_t((2 * 2 + 1) * 8 + 3);
  f.o[i] += 0.1f;
  const fs::Comparison c = fs::compare(f.p, f.o, f.lse, f.ref, 1.0);
  CHECK_FALSE(c.pass());
  CHECK(c.mismatches == 1);
  REQUIRE(c.first_mismatches.size() == 1);
  CHECK(c.first_mismatches[0].rfind("O(b=0, s=2, h=1, d=3)", 0) == 0);
}

TEST_CASE("compare: NaN and unwritten (poisoned) outputs fail", "[compare]") {
  Fixture f;
  f.o[0] = std::numeric_limits<float>::quiet_NaN();
  fs::Comparison c = fs::compare(f.p, f.o, f.lse, f.ref, 1.0);
  CHECK_FALSE(c.pass());
  CHECK(c.nonfinite == 1);

  Fixture g;
  g.lse[3] = std::numeric_limits<float>::quiet_NaN();
  c = fs::compare(g.p, g.o, g.lse, g.ref, 1.0);
  CHECK_FALSE(c.pass());
  CHECK(c.first_mismatches.at(0).rfind("LSE(b=0, h=1, s=0)", 0) == 0);
}

TEST_CASE("compare: -inf LSE passes only where the reference has -inf", "[compare]") {
  Fixture f;
  f.ref.lse[2] = -std::numeric_limits<double>::infinity();
  f.lse[2] = -std::numeric_limits<float>::infinity();
  CHECK(fs::compare(f.p, f.o, f.lse, f.ref, 1.0).pass());
  f.lse[2] = 0.0f;
  CHECK_FALSE(fs::compare(f.p, f.o, f.lse, f.ref, 1.0).pass());
  Fixture g;
  g.lse[1] = -std::numeric_limits<float>::infinity();
  CHECK_FALSE(fs::compare(g.p, g.o, g.lse, g.ref, 1.0).pass());
}
