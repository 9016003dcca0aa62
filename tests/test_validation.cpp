// Every rule of fs::validate / fs::validate_tensors, each with the sentence it must produce.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "catch.h"
#include "common/problem.h"

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
      {[](fs::Problem& p) { p.batch = int64_t(1) << 29; }, "batch * heads_q is 4294967296; it must be at most 2147483647"},
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
