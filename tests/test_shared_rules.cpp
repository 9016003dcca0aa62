// The rules the benchmarks and the Python tools share, through the C ABI (common/flash_steps.h):
// FLOPs, tolerance, speed-ups and the sweep. No GPU needed.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.h"
#include "common/flash_steps.h"
#include "runner/resources.h"

TEST_CASE("fs_problem_flops counts as FlashAttention does", "[c_api][rules]") {
  fs_problem p;
  fs_problem_init(&p, 8, 2048, 1024, 16, 4, 128, FS_FP16, 0);
  CHECK(fs_problem_flops(&p) == 4.0 * 8 * 16 * 2048 * 1024 * 128);
  p.causal = 1;
  CHECK(fs_problem_flops(&p) == 2.0 * 8 * 16 * 2048 * 1024 * 128);
  CHECK(fs_problem_flops(nullptr) == 0.0);
}

TEST_CASE("fs_tolerance is common/forward/check.h's tolerance", "[c_api][rules]") {
  double atol = 0, rtol = 0, lse_tol = 0;
  REQUIRE(fs_tolerance(FS_FP16, 4.0, &atol, &rtol, &lse_tol) == FS_OK);
  CHECK(rtol == std::ldexp(1.0, -10));       // 2u, u = 2^-11
  CHECK(atol == 4.0 * std::ldexp(1.0, -10));  // 2u · max|V|
  CHECK(lse_tol == 1e-4);
  REQUIRE(fs_tolerance(FS_BF16, 1.0, &atol, &rtol, &lse_tol) == FS_OK);
  CHECK(rtol == std::ldexp(1.0, -7));
  CHECK(fs_tolerance(7, 1.0, &atol, &rtol, &lse_tol) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "dtype is 7; it must be FS_FP16 (0) or FS_BF16 (1)");
  CHECK(fs_tolerance(FS_FP16, NAN, &atol, &rtol, &lse_tol) == FS_ERR_INVALID);
  CHECK(fs_tolerance(FS_FP16, -1.0, &atol, &rtol, &lse_tol) == FS_ERR_INVALID);
  CHECK(fs_tolerance(FS_FP16, 1.0, nullptr, &rtol, &lse_tol) == FS_ERR_INVALID);
}

TEST_CASE("fs_speedups is fs::speedups", "[c_api][rules]") {
  const char* ids[] = {"01_naive", "03_tiled", "04_pad", "04_swizzle", "05_async", "cublas", "06_mma"};
  const double ms[] = {20.0, 10.0, 5.0, 8.0, 4.0, 4.0, 0.0};
  double x01[7], xprev[7];
  REQUIRE(fs_speedups(7, ids, ms, x01, xprev) == FS_OK);
  CHECK(x01[0] == 1.0);
  CHECK(xprev[0] == 0.0);
  CHECK(xprev[2] == 2.0);   // 04_pad against 03
  CHECK(xprev[3] == 1.25);  // 04_swizzle against 03 too
  CHECK(xprev[4] == 1.25);  // 05 against the faster 04
  CHECK(x01[5] == 5.0);     // a baseline: x 01 only
  CHECK(xprev[5] == 0.0);
  CHECK(x01[6] == 0.0);     // not timed
  CHECK(fs_speedups(0, nullptr, nullptr, nullptr, nullptr) == FS_OK);
  CHECK(fs_speedups(-1, ids, ms, x01, xprev) == FS_ERR_INVALID);
  const char* holes[] = {"01_naive", nullptr};
  CHECK(fs_speedups(2, holes, ms, x01, xprev) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "ids[1] is a null pointer");
}

TEST_CASE("the sweep: same tokens and width in every shape", "[c_api][rules]") {
  CHECK(fs_sweep_tokens() == 16384);
  int64_t seqlens[16];
  const int n = fs_sweep_seqlens(0, seqlens, 16);
  CHECK(std::vector<int64_t>(seqlens, seqlens + n) == std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384});
  CHECK(fs_sweep_seqlens(1, nullptr, 0) == 3);
  int64_t two[2] = {0, 0};
  CHECK(fs_sweep_seqlens(1, two, 2) == 3);  // the count, and only as many as fit
  CHECK((two[0] == 1024 && two[1] == 2048));
  int64_t dims[4];
  CHECK(fs_sweep_head_dims(0, dims, 4) == 2);
  CHECK((dims[0] == 128 && dims[1] == 64));
  int32_t dtypes[4];
  CHECK(fs_sweep_dtypes(0, dtypes, 4) == 2);
  CHECK(fs_sweep_dtypes(1, dtypes, 4) == 1);
  CHECK(dtypes[0] == FS_FP16);

  int64_t batch = 0, heads = 0;
  REQUIRE(fs_sweep_shape(fs_sweep_tokens(), 2048, 128, &batch, &heads) == FS_OK);
  CHECK((batch == 8 && heads == 16));
  REQUIRE(fs_sweep_shape(fs_sweep_tokens(), 512, 64, &batch, &heads) == FS_OK);
  CHECK((batch == 32 && heads == 32));
  CHECK(fs_sweep_shape(fs_sweep_tokens(), 3000, 128, &batch, &heads) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "seqlen is 3000; it must divide the 16384 tokens (batch · seqlen) of every sweep shape");
  CHECK(fs_sweep_shape(fs_sweep_tokens(), 2048, 96, &batch, &heads) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "head_dim is 96; it must divide the sweep's width of 2048 (heads · head_dim)");
  CHECK(fs_sweep_shape(fs_sweep_tokens(), 2048, 128, nullptr, &heads) == FS_ERR_INVALID);
}

TEST_CASE("kernel names for tables", "[rules]") {
  CHECK(fs::short_kernel_name("void fs::step06::attention_kernel<__half, 128>(fs_problem, __half const*)") ==
        "attention_kernel<__half, 128>");
  CHECK(fs::short_kernel_name("void fs::(anonymous namespace)::softmax_kernel(float*, fs_problem)") == "softmax_kernel");
  CHECK(fs::short_kernel_name("void fs::k<fs::Swizzled128Layout<64>, 128>(fs::P)") ==
        "k<fs::Swizzled128Layout<64>, 128>");
  CHECK(fs::short_kernel_name("_Z3fooPf") == "_Z3fooPf");
}
