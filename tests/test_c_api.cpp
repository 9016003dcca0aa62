// The C ABI: listing steps and refusing bad input work without a GPU, and never throw.
#include <cmath>
#include <cstring>
#include <string>

#include "catch.h"
#include "common/flash_steps.h"

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
