// Every rule of fs::validate / fs::validate_tensors, each with the sentence it must produce.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "common/step/overflow.h"
#include "runner/cli.h"

namespace {

fs::Problem good() { return fs::make_problem(2, 128, 96, 8, 2, 64, fs::DType::bf16, true); }

// The message for `good()` changed by `edit`.
std::string message_after(const std::function<void(fs::Problem&)>& edit) {
  fs::Problem p = good();
  edit(p);
  return fs::validate(p);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("validate accepts a good problem and fills defaults", "[validation]") {
  const fs::Problem p = good();
  CHECK(fs::validate(p).empty());
  CHECK(p.softmax_scale == 0.125f);
  CHECK(p.q.row == 8 * 64);
  CHECK(p.k.batch == 96 * 2 * 64);
  CHECK(fs::validate(fs::make_problem(1, 0, 0, 1, 1, 8, fs::DType::fp16, false)).empty());  // empty work is valid
}

TEST_CASE("validate names the value and the limit", "[validation]") {
  struct Case {
    std::function<void(fs::Problem&)> edit;
    std::string expected;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {[](fs::Problem& p) { p.dtype = 7; }, "dtype is 7; it must be 0 (fp16) or 1 (bf16)"},
      {[](fs::Problem& p) { p.batch = 0; }, "batch is 0; it must be at least 1"},
      {[](fs::Problem& p) { p.batch = -3; }, "batch is -3; it must be at least 1"},
      {[](fs::Problem& p) { p.seqlen_q = -1; }, "seqlen_q is -1; it must be between 0 and 2147483647"},
      {[](fs::Problem& p) { p.seqlen_k = int64_t(1) << 31; }, "seqlen_k is 2147483648; it must be between 0 and 2147483647"},
      {[](fs::Problem& p) { p.heads_q = 0; }, "heads_q is 0; it must be at least 1"},
      {[](fs::Problem& p) { p.heads_kv = 0; }, "heads_kv is 0; it must be at least 1"},
      {[](fs::Problem& p) { p.heads_kv = 3; }, "heads_q (8) is not a multiple of heads_kv (3)"},
      {[](fs::Problem& p) { p.batch = int64_t(1) << 29; }, "batch * heads_q is 536870912 * 8 = 4294967296; it must be at most 2147483647"},
      {[](fs::Problem& p) { p.head_dim = 0; }, "head_dim is 0; it must be a multiple of 8 between 8 and 256"},
      {[](fs::Problem& p) { p.head_dim = 60; }, "head_dim is 60; it must be a multiple of 8 between 8 and 256"},
      {[](fs::Problem& p) { p.head_dim = 264; }, "head_dim is 264; it must be a multiple of 8 between 8 and 256"},
      {[](fs::Problem& p) { p.causal = 2; }, "causal is 2; it must be 0 or 1"},
      {[](fs::Problem& p) { p.softmax_scale = 0; }, "softmax_scale is 0; it must be finite and greater than 0"},
      {[](fs::Problem& p) { p.softmax_scale = -0.5f; }, "softmax_scale is -0.5; it must be finite and greater than 0"},
      {[=](fs::Problem& p) { p.softmax_scale = nan; }, "softmax_scale is nan; it must be finite and greater than 0"},
      {[=](fs::Problem& p) { p.softmax_scale = inf; }, "softmax_scale is inf; it must be finite and greater than 0"},
      {[](fs::Problem& p) { p.q.row = 100; }, "Q's row stride is 100 elements; it must be a multiple of 8"},
      {[](fs::Problem& p) { p.k.batch = 12; }, "K's batch stride is 12 elements; it must be a multiple of 8"},
      {[](fs::Problem& p) { p.v.head = -8; }, "V's head stride is -8; strides must be >= 0"},
      {[](fs::Problem& p) { p.o.row = 32; }, "O's row stride 32 is smaller than head_dim 64; rows would overlap"},
      {[](fs::Problem& p) { p.k.head = 8; }, "K's head stride 8 is smaller than head_dim 64; heads would overlap"},
      {[](fs::Problem& p) { p.q.dim = 2; }, "Q's head_dim stride is 2; the last dimension must be contiguous (stride 1)"},
      {[](fs::Problem& p) { p.v.dim = 0; }, "V's head_dim stride is 0; the last dimension must be contiguous (stride 1)"},
  };
  for (const Case& c : cases) {
    const std::string m = message_after(c.edit);
    CAPTURE(m, c.expected);
    CHECK(contains(m, c.expected));
  }
}

TEST_CASE("validate_tensors refuses null and misaligned pointers", "[validation]") {
  const fs::Problem p = good();
  alignas(16) static char mem[64];
  const fs::Tensors ok{mem, mem + 16, mem + 32, mem + 48, reinterpret_cast<float*>(mem)};
  CHECK(fs::validate_tensors(p, ok).empty());
  fs::Tensors t = ok;
  t.lse = nullptr;
  CHECK(fs::validate_tensors(p, t).empty());  // LSE is optional

  t = ok;
  t.k = nullptr;
  CHECK(fs::validate_tensors(p, t) == "K is a null pointer");
  t = ok;
  t.o = nullptr;
  CHECK(fs::validate_tensors(p, t) == "O is a null pointer");
  t = ok;
  t.q = mem + 8;
  CHECK(contains(fs::validate_tensors(p, t), "is not 16-byte aligned (address mod 16 = 8)"));
  t = ok;
  t.lse = reinterpret_cast<float*>(mem + 2);
  CHECK(contains(fs::validate_tensors(p, t), "LSE pointer"));
  CHECK(contains(fs::validate_tensors(p, t), "is not 4-byte aligned"));

  // With seqlen_k == 0 nothing reads K or V.
  const fs::Problem empty_k = fs::make_problem(1, 4, 0, 1, 1, 8, fs::DType::fp16, false);
  CHECK(fs::validate_tensors(empty_k, fs::Tensors{mem, nullptr, nullptr, mem + 16, nullptr}).empty());
}

TEST_CASE("FLOP count and view extents", "[validation]") {
  fs::Problem p = fs::make_problem(2, 2048, 2048, 16, 16, 128, fs::DType::fp16, false);
  CHECK(fs::attention_flops(p) == 4.0 * 2 * 16 * 2048.0 * 2048 * 128);
  p.causal = 1;
  CHECK(fs::attention_flops(p) == 2.0 * 2 * 16 * 2048.0 * 2048 * 128);
  CHECK(fs::view_extent(p.q, 2, 2048, 16, 128) == 2 * 2048 * 16 * 128);
  CHECK(fs::view_extent(fs::Strides{1000, 80, 16, 1}, 2, 3, 4, 8) == 1000 + 2 * 80 + 3 * 16 + 8);
  CHECK(fs::view_extent(p.q, 2, 0, 16, 128) == 0);
  CHECK(fs::describe(p) == "b2 h16/16 sq2048 sk2048 d128 fp16 causal");
}

TEST_CASE("checked arithmetic refuses what does not fit in 64 bits", "[validation]") {
  CHECK(fs::checked_mul(INT64_MAX, 1) == INT64_MAX);
  CHECK_FALSE(fs::checked_mul(INT64_MAX, 2));
  CHECK_FALSE(fs::checked_mul(int64_t(1) << 32, int64_t(1) << 31));
  CHECK(fs::checked_add(INT64_MAX - 1, 1) == INT64_MAX);
  CHECK_FALSE(fs::checked_add(INT64_MAX, 1));
  CHECK(fs::checked_product({2, 3, 7}) == 42);
  CHECK(fs::checked_product({INT64_MAX, INT64_MAX, 0}) == 0);  // a zero factor: 0, whatever the others
  CHECK_FALSE(fs::checked_product({int64_t(1) << 30, int64_t(1) << 30, int64_t(1) << 4}));
}

// Issue 11, as a new user found it: sizes whose products overflow were accepted or refused with a
// stride the user never gave.
TEST_CASE("the runner's sizes are judged by the dimensions given, not by wrapped strides", "[validation]") {
  auto refusal = [](std::vector<std::string> args) {
    const fs::ParsedArgs a = fs::parse_runner_args(args);
    REQUIRE(a.error.empty());
    return fs::validate(fs::problem_from(a.options));
  };
  // The contiguous batch stride seqlen·heads·head_dim = 2^64 wrapped to 0: accepted before.
  const std::string m1 = refusal({"--seqlen", "1073741824", "--heads", "67108864", "--head-dim", "256"});
  CHECK(m1 == "Q and O have batch * seqlen_q * heads_q * head_dim = 2 * 1073741824 * 67108864 * 256 elements, "
              "which overflows 64 bits; a tensor may hold at most 2^58 (288230376151711744)");
  // Refused before with "Q's batch stride is -824633720576", a stride the user never gave.
  const std::string m2 = refusal({"--seqlen", "2147483647", "--heads", "1073741823", "--head-dim", "256"});
  CHECK(contains(m2, "2 * 2147483647 * 1073741823 * 256 elements"));
  CHECK_FALSE(contains(m2, "stride"));
}

TEST_CASE("products of sizes from the C ABI never wrap", "[validation]") {
  fs::Problem p = good();
  p.batch = p.heads_q = p.heads_kv = INT64_MAX;  // batch·heads_q wrapped to 1: accepted before
  CHECK(fs::validate(p) == "batch * heads_q is 9223372036854775807 * 9223372036854775807, which overflows 64 bits; "
                           "it must be at most 2147483647");
  p = good();
  p.batch = (int64_t(1) << 32) + 1;  // batch·heads_q = 2^64 - 1 wrapped to -1: accepted before
  p.heads_q = p.heads_kv = (int64_t(1) << 32) - 1;
  CHECK(contains(fs::validate(p), "batch * heads_q is 4294967297 * 4294967295, which overflows 64 bits"));

  // A view whose extent overflows: the strides are named.
  p = good();
  p.k.batch = INT64_MAX - 7;  // a multiple of 8
  CHECK(fs::validate(p) == "K's strides (batch 9223372036854775800, row 128, head 64) over batch 2, seqlen_k 96, "
                           "heads_kv 2 span more than 2^63 elements; a tensor may span at most 2^58 (288230376151711744)");
  CHECK_FALSE(fs::checked_view_extent(p.k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim));
  CHECK_THROWS_AS(fs::view_extent(p.k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim), std::overflow_error);
  p.k.batch = int64_t(1) << 58;  // fits in 64 bits, but spans more than 2^58 elements
  CHECK(contains(fs::validate(p), "span 288230376151724032 elements; a tensor may span at most 2^58"));

  // make_problem marks strides that do not fit (-1) and validate names the sizes instead.
  const fs::Strides s = fs::contiguous_strides(INT64_MAX, 2, 8);
  CHECK(s.batch == -1);
  CHECK(s.row == 16);
  CHECK(contains(fs::validate(fs::make_problem(1, 0, 1, INT64_MAX / 4, 1, 8, fs::DType::fp16, false)),
                 "batch * heads_q is 1 * 2305843009213693951 = 2305843009213693951"));
}

TEST_CASE("O never overlaps itself; Q, K and V may alias", "[validation]") {
  fs::Problem p = fs::make_problem(2, 16, 16, 4, 4, 64, fs::DType::fp16, false);
  REQUIRE(fs::validate(p).empty());
  fs::Problem bad = p;
  bad.o.batch = 0;  // both batches write the same O: accepted before
  CHECK(fs::validate(bad) == "O's batch stride is 0 with batch 2: two elements of O would share one address "
                             "(O must not overlap itself; Q, K and V may)");
  bad = p;
  bad.o.row = bad.o.head = 64;  // row i+1 of head h is row i of head h+1: accepted before
  CHECK(fs::validate(bad) == "O's row stride is 64 with seqlen_q 16, less than the 256 elements spanned by its "
                             "head_dim and head dimensions: two elements of O would share one address "
                             "(O must not overlap itself; Q, K and V may)");
  bad = p;
  bad.o.head = 64 * 16, bad.o.row = 64 * 8;  // heads interleaved with rows, overlapping
  CHECK(contains(fs::validate(bad), "O's head stride is 1024 with heads_q 4, less than the 7744 elements"));

  // Layouts that do not overlap pass, in any order: (batch, heads, seqlen, head_dim), padded rows,
  // and a dimension of size 1, whose stride is never used.
  fs::Problem ok = p;
  ok.o = fs::Strides{4 * 16 * 64, 64, 16 * 64, 1};
  CHECK(fs::validate(ok).empty());
  ok.o = fs::Strides{4 * 16 * 72 + 8, 72, 16 * 72, 1};
  CHECK(fs::validate(ok).empty());
  ok = fs::make_problem(1, 1, 16, 1, 1, 64, fs::DType::fp16, false);
  ok.o = fs::Strides{0, 0, 0, 1};
  CHECK(fs::validate(ok).empty());

  // Inputs may alias: K and V are one tensor, broadcast over the batch.
  ok = p;
  ok.k.batch = ok.v.batch = 0;
  ok.v = ok.k;
  CHECK(fs::validate(ok).empty());
}

TEST_CASE("softmax_scale is bounded so that the kernels' logits are finite in fp32", "[validation]") {
  // 06/07 compute s·scale·log2(e) in fp32: scale = 3.4e38 made scale·log2(e) = inf, accepted before.
  fs::Problem p = fs::make_problem(1, 16, 16, 1, 1, 128, fs::DType::fp16, false);
  p.softmax_scale = 3.4e38f;
  CHECK(contains(fs::validate(p), "softmax_scale is 3.4e+38; with fp16 inputs and head_dim 128 it must be at most 1.07"));
  CHECK(contains(fs::validate(p), "the largest possible logit, head_dim * 65504^2 * scale * log2(e), is at most 2^126"));
  p.softmax_scale = 1e26f;  // the bound at head_dim 128 is about 1.07e26
  CHECK(fs::validate(p).empty());
  // fp16: the largest logit any input can give, at the bound, is finite in fp32.
  const double bound = fs::max_softmax_scale(FS_FP16, 256);
  const float logit = float(256.0 * 65504.0 * 65504.0) * (float(bound) * float(fs::kLog2e));
  CHECK(std::isfinite(logit));

  p.dtype = FS_BF16;
  p.softmax_scale = 3.4e38f;
  CHECK(contains(fs::validate(p), "softmax_scale is 3.4e+38; it must be at most 5.89"));
  CHECK(contains(fs::validate(p), "so that scale * log2(e) is at most 2^126 (finite in fp32)"));
  p.softmax_scale = 5.8e37f;
  CHECK(fs::validate(p).empty());
  CHECK(std::isfinite(p.softmax_scale * float(fs::kLog2e)));
}

TEST_CASE("softcap: finite and at least 0, and its factors finite in fp32", "[validation][softcap]") {
  fs::Problem p = fs::make_problem(1, 16, 16, 1, 1, 64, fs::DType::fp16, false);
  CHECK(p.softcap == 0.0f);  // off by default
  p.softcap = 30.0f;
  CHECK(fs::validate(p).empty());
  CHECK(contains(fs::describe(p), " softcap 30"));
  p.softcap = -1.0f;
  CHECK(fs::validate(p) == "softcap is -1; it must be finite and at least 0 (0: no softcapping)");
  p.softcap = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(fs::validate(p), "; it must be finite and at least 0 (0: no softcapping)"));
  p.softcap = std::numeric_limits<float>::infinity();
  CHECK(contains(fs::validate(p), "softcap is inf; it must be finite and at least 0"));
  p.softcap = 1e38f;  // softcap · log2(e), the largest logit, would pass 2^126
  CHECK(contains(fs::validate(p), "softcap is 1e+38; it must be at most 5.89"));
  p.softcap = 5.8e37f;
  CHECK(fs::validate(p).empty());
  // The kernels form scale / softcap in fp32 (common/step/softcap.h); softcap / scale is never formed.
  p.softmax_scale = 1e-30f;
  p.softcap = 1e10f;
  CHECK(fs::validate(p).empty());
  p.softmax_scale = 1e20f;
  p.softcap = 1e-20f;
  CHECK(contains(fs::validate(p), "softcap is 1e-20 and softmax_scale 1e+20; the kernels form softmax_scale / softcap = "));
  CHECK(contains(fs::validate(p), " in fp32, which must be at most 3.40282"));
  p.softcap = 1e-5f;
  CHECK(fs::validate(p).empty());
  p.softcap = 0.0f;  // off: no bound on the ratio
  CHECK(fs::validate(p).empty());
}

TEST_CASE("window: 0 or 1, and bounds of at least -1, which a window of 0 leaves unset", "[validation][window]") {
  fs::Problem p = fs::make_problem(1, 16, 16, 1, 1, 64, fs::DType::fp16, false);
  CHECK((p.window == 0 && p.window_left == 0 && p.window_right == 0));  // off by default
  CHECK(fs::describe(p) == "b1 h1/1 sq16 sk16 d64 fp16");
  p.window = 1;
  const std::pair<int32_t, int32_t> bands[] = {{128, 0}, {-1, -1}, {0, 0}, {-1, 5}, {5, -1}, {INT32_MAX, INT32_MAX}};
  for (const auto& [left, right] : bands) {
    p.window_left = left, p.window_right = right;
    CAPTURE(left, right);
    CHECK(fs::validate(p).empty());
  }
  p.window_left = 128, p.window_right = 0;
  CHECK(fs::describe(p) == "b1 h1/1 sq16 sk16 d64 fp16 window 128,0");
  p.causal = 1;
  p.softcap = 30.0f;
  CHECK(fs::describe(p) == "b1 h1/1 sq16 sk16 d64 fp16 causal window 128,0 softcap 30");
  p.causal = 0, p.softcap = 0.0f;

  struct Case {
    int32_t window, left, right;
    std::string expected;
  };
  const Case cases[] = {
      {2, 0, 0, "window is 2; it must be 0 (no sliding window) or 1 (window_left, window_right)"},
      {-1, 0, 0, "window is -1; it must be 0 (no sliding window) or 1 (window_left, window_right)"},
      {1, -2, 0, "window_left is -2; it must be at least -1 (-1: unbounded on that side)"},
      {1, 0, INT32_MIN, "window_right is -2147483648; it must be at least -1 (-1: unbounded on that side)"},
      {1, -3, -3, "window_left is -3; it must be at least -1 (-1: unbounded on that side)"},  // the left named first
      {0, 5, 0, "window_left is 5 but window is 0, which ignores it; set window to 1 for a sliding window"},
      {0, -1, 128, "window_right is 128 but window is 0, which ignores it; set window to 1 for a sliding window"},
      {0, 0, -2, "window_right is -2 but window is 0, which ignores it; set window to 1 for a sliding window"},
  };
  for (const Case& c : cases) {
    p.window = c.window, p.window_left = c.left, p.window_right = c.right;
    CHECK(fs::validate(p) == c.expected);
  }
  // Window 0 with bounds of 0 or -1 is off (a caller may leave -1, "unbounded", in both).
  const std::pair<int32_t, int32_t> unset[] = {{-1, -1}, {0, -1}, {-1, 0}};
  for (const auto& [left, right] : unset) {
    p.window = 0, p.window_left = left, p.window_right = right;
    CHECK(fs::validate(p).empty());
    CHECK(fs::describe(p) == "b1 h1/1 sq16 sk16 d64 fp16");
  }
}

TEST_CASE("window: the FLOP count is 4·B·Hq·d per visible pair, by brute force over the rows",
          "[validation][window]") {
  // The pairs row by row from the references' definition (reference_keys), against visible_pairs' closed form.
  auto brute_pairs = [](const fs::Problem& p) {
    double pairs = 0;
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      const fs::KeyRange k = fs::reference_keys(p, i);
      pairs += double(std::max<int64_t>(0, k.end - k.first));
    }
    return pairs;
  };
  fs::Problem p = fs::make_problem(2, 4, 4, 8, 2, 64, fs::DType::fp16, false);
  p.window = 1, p.window_left = 1, p.window_right = 0;  // rows see {0}, {0, 1}, {1, 2}, {2, 3}: 7 pairs
  CHECK(fs::attention_flops(p) == 4.0 * 2 * 8 * 64 * 7);
  CHECK(fs_problem_flops(&p) == 4.0 * 2 * 8 * 64 * 7);
  // (-1, -1) without causal is full attention: the formula without a window.
  p = fs::make_problem(2, 2048, 1000, 16, 16, 128, fs::DType::fp16, false);
  p.window = 1, p.window_left = -1, p.window_right = -1;
  CHECK(fs::attention_flops(p) == 4.0 * 2 * 16 * 2048 * 1000 * 128);

  std::mt19937_64 rng(77);
  auto below = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  // A bound: unbounded, 0, a few keys, up to the sequence, past it.
  auto bound = [&](int64_t seqlen) -> int32_t {
    const int64_t kinds[] = {-1, 0, 1 + below(5), 1 + below(seqlen + 1), seqlen + 1 + below(1000)};
    return int32_t(kinds[below(5)]);
  };
  for (int n = 0; n < 3000; ++n) {
    const int64_t sq = below(n % 2 ? 40 : 400), sk = below(n % 3 ? 40 : 400);  // seqlen_q < or > seqlen_k, 0 too
    p = fs::make_problem(1 + below(3), sq, sk, 4, 2, 8 * (1 + below(32)), fs::DType::bf16, below(2) == 1);
    p.window = 1;
    p.window_left = bound(std::max(sq, sk)), p.window_right = bound(std::max(sq, sk));
    CAPTURE(fs::describe(p));
    const double want = 4.0 * double(p.batch) * double(p.heads_q) * double(p.head_dim) * brute_pairs(p);
    CHECK(fs::attention_flops(p) == want);
    CHECK(fs_problem_flops(&p) == want);
  }
}
