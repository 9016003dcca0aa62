// The C ABI: listing steps and refusing bad input work without a GPU, and never throw.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "catch.h"
#include "common/flash_steps.h"
#include "common/harness/gpu.h"
#include "common/harness/status.h"

TEST_CASE("C ABI lists every registered step", "[c_api]") {
  const int n = fs_step_count();
  REQUIRE(n >= 1);
  CHECK(std::string(fs_step_id(0)) == "01_naive");
  for (int i = 0; i < n; ++i) {
    CHECK(fs_step_id(i) != nullptr);
    CHECK(std::strlen(fs_step_lesson(i)) > 10);
    CHECK(std::strlen(fs_step_name(i)) > 0);
    CHECK(fs_step_min_compute_capability(i) >= 80);
  }
  CHECK(fs_step_id(n) == nullptr);
  CHECK(fs_step_id(-1) == nullptr);
  CHECK(fs_step_min_compute_capability(n) == -1);
}

TEST_CASE("C ABI refuses bad problems before touching the GPU", "[c_api]") {
  fs_problem p;
  fs_problem_init(&p, 2, 64, 64, 4, 2, 64, FS_FP16, 1);
  CHECK(p.softmax_scale == 0.125f);
  CHECK(p.q.row == 4 * 64);

  fs_problem bad = p;
  bad.head_dim = 12;
  CHECK(fs_check("01_naive", &bad) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("head_dim is 12") != std::string::npos);

  bad = p;
  bad.softmax_scale = NAN;
  CHECK(fs_run("01_naive", &bad, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("softmax_scale is nan") != std::string::npos);

  CHECK(fs_check("no_such_step", &p) == FS_ERR_UNKNOWN_STEP);
  CHECK(std::string(fs_last_error()) == "no step has id 'no_such_step' (see fs_step_id)");
  CHECK(fs_check(nullptr, &p) == FS_ERR_UNKNOWN_STEP);
  CHECK(fs_check("01_naive", nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "problem is a null pointer");

  // Pointers are checked before the device is looked at.
  CHECK(fs_run("01_naive", &p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "Q is a null pointer");
  alignas(16) static char mem[64];
  CHECK(fs_run("01_naive", &p, mem + 4, mem, mem, mem, nullptr, nullptr, 0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("Q pointer") != std::string::npos);
}

TEST_CASE("C ABI: a step's static limit is FS_ERR_INVALID with or without a GPU", "[c_api]") {
  // Step 06 runs head_dim 64 and 128 only: that needs no device to know.
  fs_problem p;
  fs_problem_init(&p, 1, 64, 64, 2, 2, 40, FS_FP16, 0);
  CHECK(fs_check("06_ldmatrix_mma", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("head_dim is 40") != std::string::npos);
  uint64_t bytes = 7;
  CHECK(fs_workspace_size("06_ldmatrix_mma", &p, &bytes) == FS_ERR_INVALID);
  CHECK(bytes == 7);
  alignas(16) static char mem[64];
  CHECK(fs_run("06_ldmatrix_mma", &p, mem, mem, mem, mem, nullptr, nullptr, 0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("head_dim is 40") != std::string::npos);

  // Step 01's score matrix for b4 h1 sq = sk = 2^30 is 2^64 bytes: it wrapped to 0 and was accepted.
  fs_problem_init(&p, 4, int64_t(1) << 30, int64_t(1) << 30, 1, 1, 64, FS_FP16, 0);
  CHECK(fs_check("01_naive", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "the score matrix S would need batch·heads·seqlen_q·seqlen_k·4 = 4·1·1073741824·1073741824·4 bytes, which "
        "overflows 64 bits");

  // A problem every check without a device accepts: FS_OK on a GPU, FS_ERR_CUDA (with why) without one.
  fs_problem_init(&p, 1, 64, 64, 2, 2, 64, FS_FP16, 0);
  const std::string no_gpu = fs::cuda_unavailable_reason();
  if (no_gpu.empty()) {
    CHECK(fs_check("06_ldmatrix_mma", &p) == FS_OK);
  } else {
    CHECK(fs_check("06_ldmatrix_mma", &p) == FS_ERR_CUDA);
    CHECK(std::string(fs_last_error()) == no_gpu);
  }
}

TEST_CASE("C ABI: every exception has its status, out of memory its own", "[c_api]") {
  auto status_of = [](auto thrower, std::string& message) {
    try {
      thrower();
    } catch (...) {
      return fs::status_of_current_exception(message);
    }
    return FS_OK;
  };
  std::string m;
  CHECK(status_of([] { throw fs::OutOfMemory("out of device memory: cudaMalloc of 4096 bytes failed", 4096); }, m) ==
        FS_ERR_OUT_OF_MEMORY);
  CHECK(m == "out of device memory: cudaMalloc of 4096 bytes failed");
  CHECK(status_of([] { throw std::bad_alloc(); }, m) == FS_ERR_OUT_OF_MEMORY);  // was FS_ERR_CUDA
  CHECK(m == "out of host memory (std::bad_alloc)");
  CHECK(status_of([] { throw fs::CudaError("cudaMemcpy failed"); }, m) == FS_ERR_CUDA);
  CHECK(status_of([] { throw fs::Error("step 01_naive refused b1 ..."); }, m) == FS_ERR_INVALID);
  CHECK(status_of([] { throw std::logic_error("a bug"); }, m) == FS_ERR_INTERNAL);
  CHECK(m == "internal error: a bug");
  CHECK(status_of([] { throw 42; }, m) == FS_ERR_INTERNAL);
  CHECK(m == "internal error: an exception that is not a std::exception");
}

TEST_CASE("C ABI: every entry point answers out-of-range and null arguments without throwing", "[c_api]") {
  for (int index : {-1, fs_step_count(), 1 << 30}) {
    CHECK(fs_step_id(index) == nullptr);
    CHECK(fs_step_name(index) == nullptr);
    CHECK(fs_step_lesson(index) == nullptr);
    CHECK(fs_step_dir(index) == nullptr);
    CHECK(fs_step_min_compute_capability(index) == -1);
  }
  fs_problem_init(nullptr, 1, 1, 1, 1, 1, 8, FS_FP16, 0);  // nothing to fill
  fs_problem p;
  fs_problem_init(&p, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, 99, 7);
  CHECK(fs_check("01_naive", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "dtype is 99; it must be 0 (fp16) or 1 (bf16)");
  CHECK(fs_workspace_size("01_naive", &p, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "bytes is a null pointer");
}

TEST_CASE("C ABI: the structs' layout, the window's fields last in fs_problem", "[c_api][window]") {
  // The window's three int32 come after O's strides: every earlier field keeps its offset, and each
  // struct that holds an fs_problem first moves its own fields by the 16 bytes it grew (12, padded to 8).
  CHECK(offsetof(fs_problem, softcap) == 60);
  CHECK(offsetof(fs_problem, o) == 160);
  CHECK(offsetof(fs_problem, window) == 192);
  CHECK(offsetof(fs_problem, window_left) == 196);
  CHECK(offsetof(fs_problem, window_right) == 200);
  // The variable-length batch's fields follow (tests/test_varlen.cpp): 32 bytes more, which each struct
  // that holds an fs_problem first moves its own fields by.
  CHECK(sizeof(fs_problem) == 240);
  CHECK(offsetof(fs_backward_problem, deterministic) == 240);
  CHECK(offsetof(fs_backward_problem, d_o) == 248);
  CHECK(offsetof(fs_backward_problem, dv) == 344);
  CHECK(sizeof(fs_backward_problem) == 376);
  CHECK(offsetof(fs_decode_problem, num_splits) == 240);
  CHECK(offsetof(fs_decode_problem, page_size) == 248);
  CHECK(offsetof(fs_decode_problem, block_table_stride) == 272);
  CHECK(sizeof(fs_decode_problem) == 280);

  // Every init leaves the window off, whatever the struct held before.
  fs_problem p;
  std::memset(&p, 0x5a, sizeof p);
  fs_problem_init(&p, 1, 64, 64, 2, 2, 64, FS_FP16, 1);
  CHECK((p.window == 0 && p.window_left == 0 && p.window_right == 0));
  fs_backward_problem bp;
  std::memset(&bp, 0x5a, sizeof bp);
  fs_backward_problem_init(&bp, 1, 64, 64, 2, 2, 64, FS_FP16, 1, 0);
  CHECK((bp.attention.window == 0 && bp.attention.window_left == 0 && bp.attention.window_right == 0));
  fs_decode_problem dp;
  std::memset(&dp, 0x5a, sizeof dp);
  fs_decode_problem_init(&dp, 1, 1, 64, 2, 2, 64, FS_FP16, 0, 0);
  CHECK((dp.attention.window == 0 && dp.attention.window_left == 0 && dp.attention.window_right == 0));

  // Its rules and the refusal of a step without windows need no device.
  p.window = 3;
  CHECK(fs_check("01_naive", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "window is 3; it must be 0 (no sliding window) or 1 (window_left, window_right)");
  p.window = 1, p.window_left = 128, p.window_right = 0;
  CHECK(fs_check("01_naive", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "window is 1 (128, 0); step 01_naive has no sliding window (0 turns it off); step 13c_varlen has it");
  CHECK(fs_problem_flops(&p) == 4.0 * 2 * 64 * (64 * 65 / 2));  // causal: row i sees its i + 1 keys
}
