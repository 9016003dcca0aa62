// A hostile caller's reproducers (issue 21), one test each, all without a GPU: the C ABI's helpers,
// the sentences, broadcasting, the workspace rule and the command line's decoding flags. The runner's
// own reproducers (a huge ragged batch, explain's unknown steps, output that cannot be written) are
// the `runner.*` entries of tests/CMakeLists.txt; the Python package's are in
// tests/python/test_flash_steps.py. CI runs this file in the sanitizer build too, where an
// out-of-bounds read or a signed overflow stops it.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch.h"
#include "common/decode/rules.h"
#include "common/flash_steps.h"
#include "common/forward/rules.h"
#include "common/harness/chain.h"
#include "runner/cli.h"

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The text between `before` and the next `end` in s ("" when absent).
std::string between(const std::string& s, const std::string& before, const std::string& end) {
  const size_t a = s.find(before);
  if (a == std::string::npos) return "";
  const size_t b = s.find(end, a + before.size());
  return s.substr(a + before.size(), b == std::string::npos ? std::string::npos : b - a - before.size());
}

}  // namespace

TEST_CASE("hostile 2: fs_decode_kv_bytes validates the problem and counts the lengths it is given", "[hostile]") {
  fs_decode_problem p;
  fs_decode_problem_init(&p, int64_t(1) << 26, 1, 64, 1, 1, 64, FS_FP16, 0, 0);
  REQUIRE(fs::validate(p).empty());
  const int32_t four[4] = {1, 2, 3, 4};  // a 4-entry array for batch 2^26: read past its end before
  double bytes = -1;
  CHECK(fs_decode_kv_bytes(&p, four, 4, &bytes) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "num_lengths is 4; it must be batch (67108864)");
  CHECK(fs_decode_kv_bytes(&p, nullptr, 4, &bytes) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "num_lengths is 4 with no lengths (NULL); it must be 0");
  CHECK(bytes == -1);  // nothing written on a refusal
  p.attention.batch = int64_t(1) << 62;  // lengths + batch wrapped: the lengths were ignored, 3.78e22 returned
  CHECK(fs_decode_kv_bytes(&p, four, 4, &bytes) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "batch * heads_q is 4611686018427387904 * 1"));
  fs_decode_problem_init(&p, 4, 1, 64, 1, 1, 64, FS_FP16, 0, 0);
  CHECK(fs_decode_kv_bytes(&p, four, 4, &bytes) == FS_OK);
  CHECK(bytes == 2.0 * (1 + 2 + 3 + 4) * 64 * 2);
  const int32_t too_long[4] = {1, 65, 3, 4};
  CHECK(fs_decode_kv_bytes(&p, too_long, 4, &bytes) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "cache_seqlens[1] is 65; it must be between 0 and seqlen_k (64)"));
  CHECK(fs_decode_kv_bytes(&p, four, 4, nullptr) == FS_ERR_INVALID);
}

TEST_CASE("hostile 3: fs_decode_problem_init with seqlen_k INT64_MAX computes its pages without overflow", "[hostile]") {
  // (seqlen_k + page_size - 1) / page_size overflowed (undefined behaviour; the sanitizer build stops on it).
  fs_decode_problem p;
  fs_decode_problem_init(&p, 1, 1, INT64_MAX, 1, 1, 8, FS_FP16, 0, 16);
  CHECK(p.max_pages_per_seq == INT64_MAX / 16 + 1);
  CHECK(fs_decode_check("10_decoding", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "seqlen_k is 9223372036854775807; it must be between 0 and 2147483647");
  fs_decode_problem_init(&p, 1, 1, INT64_MAX, 1, 1, 8, FS_FP16, 0, INT64_MAX);  // one page of INT64_MAX keys
  CHECK(p.max_pages_per_seq == 1);
  fs_decode_problem_init(&p, 1, 1, INT64_MAX - 1, 1, 1, 8, FS_FP16, 0, INT64_MAX);
  CHECK(p.max_pages_per_seq == 1);
}

TEST_CASE("hostile 6: the command line takes every positive float scale the C ABI takes, and says the limit", "[hostile]") {
  // --scale 1e-38 (and 1e-40, 1e-45) were refused as not "greater than 0"; fs_check takes 1e-45.
  for (const char* text : {"1e-38", "1e-40", "1e-45"}) {
    const fs::ParsedArgs a = fs::parse_runner_args({"--scale", text});
    CAPTURE(text);
    REQUIRE(a.error.empty());
    CHECK(a.options.scale > 0);
    CHECK(fs::validate(fs::problem_from(a.options)).empty());
  }
  fs_problem p;
  fs_problem_init(&p, 1, 1, 1, 1, 1, 8, FS_FP16, 0);
  p.softmax_scale = std::numeric_limits<float>::denorm_min();
  CHECK(fs::validate(p).empty());
  for (const char* text : {"1e-50", "1e39", "0"})
    CHECK(fs::parse_runner_args({"--scale", text}).error ==
          std::string("--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a "
                      "float), got '") + text + "'");
}

TEST_CASE("hostile 7: a value and its limit never print alike, and small negatives are not -0.000000", "[hostile]") {
  fs::Problem p = fs::make_problem(1, 16, 16, 1, 1, 64, fs::DType::fp16, false);
  p.softmax_scale = std::nextafter(float(fs::max_softmax_scale(FS_FP16, 64)), INFINITY);  // one float past the bound
  const std::string why = fs::validate(p);
  const std::string value = between(why, "softmax_scale is ", ";"), limit = between(why, "at most ", ",");
  CAPTURE(why);
  REQUIRE(!value.empty());
  REQUIRE(!limit.empty());
  CHECK(value != limit);  // "2.14728e+26 ... at most 2.14728e+26" before
  CHECK(std::stod(value) > std::stod(limit));
  double a = 0, r = 0, l = 0, bound = 0;
  CHECK(fs_tolerance(FS_FP16, -1e-9, &a, &r, &l) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "max_abs_v is -1e-09; it must be finite and >= 0");
  CHECK(fs_backward_bound(FS_BF16, -1e-9, 1.0, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "ref_err is -1e-09; it must be finite and >= 0");
  // The command line has no num_pages flag: a page count past int32 is said with its flags.
  const fs::ParsedArgs cli =
      fs::parse_runner_args({"--page-size", "16", "--batch", "17", "--seqlen-k", "2147483647", "--heads", "1"});
  CHECK(cli.error == "--batch 17 sequences of --seqlen-k 2147483647 keys in pages of --page-size 16 make 2281701376 "
                     "pages; the cache may hold at most 2147483647 (block table entries are int32)");
}

TEST_CASE("hostile 8: a batch stride of 0 broadcasts; a head stride of 0 is refused as the header says", "[hostile]") {
  fs::Problem p = fs::make_problem(2, 16, 16, 4, 4, 64, fs::DType::fp16, false);
  fs::Problem broadcast = p;  // expand() over the batch: one K and one V for both sequences
  broadcast.k.batch = broadcast.v.batch = 0;
  CHECK(fs::validate(broadcast).empty());
  fs::Problem heads = p;  // expand() over the heads: MQA given another way
  heads.k.head = 0;
  CHECK(fs::validate(heads) == "K's head stride 0 is smaller than head_dim 64; heads would overlap (the last dimension "
                               "must be contiguous). Only a batch stride of 0 broadcasts: pass the one K/V head as MQA "
                               "(heads_kv 1)");
  heads = p;
  heads.o.head = 0;  // an output never broadcasts
  CHECK(fs::validate(heads) == "O's head stride 0 is smaller than head_dim 64; heads would overlap (the last dimension "
                               "must be contiguous)");
}

TEST_CASE("hostile 12: --json and --csv together are refused, not the last one taken", "[hostile]") {
  CHECK(fs::parse_runner_args({"--json", "--csv"}).error == "--json and --csv ask for two output formats; give one");
  CHECK(fs::parse_runner_args({"--csv", "--step", "01_naive", "--json"}).error ==
        "--json and --csv ask for two output formats; give one");
  CHECK(fs::parse_runner_args({"--json", "--json"}).error.empty());
}

TEST_CASE("hostile 13: the workspace pointer is judged before the plan, even when the plan needs none", "[hostile]") {
  // A misaligned workspace was accepted when the plan needed 0 bytes, and no workspace refusal could be
  // seen without a GPU: the pointer's rule needs no device, so fs_run applies it before planning.
  fs_problem p;
  fs_problem_init(&p, 1, 16, 16, 1, 1, 64, FS_FP16, 0);
  alignas(16) static unsigned char mem[4096];
  CHECK(fs_run("01_naive", &p, mem, mem, mem, mem, nullptr, mem + 8, 64, nullptr) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "the workspace pointer"));
  CHECK(contains(fs_last_error(), "is not 16-byte aligned (address mod 16 = 8)"));
  CHECK(fs_run("01_naive", &p, mem, mem, mem, mem, nullptr, nullptr, 64, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "the workspace is a null pointer with workspace_bytes 64; pass a buffer of that many bytes, or NULL with 0");
  fs_backward_problem b;
  fs_backward_problem_init(&b, 1, 16, 16, 1, 1, 64, FS_FP16, 0, 0);
  CHECK(fs_run_backward("11_backward", &b, mem, mem, mem, mem, reinterpret_cast<float*>(mem), mem, mem + 1024,
                        mem + 2048, mem + 3072, mem + 4, 4096, nullptr) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "(address mod 16 = 4)"));
}
