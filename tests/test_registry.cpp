// The registry itself, and every step's supports() on made-up devices (no GPU needed).
#include <cctype>
#include <set>
#include <string>

#include "catch.h"
#include "common/registry.h"

namespace {
fs::DeviceInfo fake_device(int cc, size_t free_bytes) {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = cc;
  d.sm_count = 132;
  d.smem_per_block_optin = 227 * 1024;
  d.l2_bytes = 50 << 20;
  d.free_bytes = free_bytes;
  d.total_bytes = free_bytes;
  return d;
}
}  // namespace

TEST_CASE("registry: ids are unique, sorted and described", "[registry]") {
  const auto& steps = fs::steps();
  REQUIRE(!steps.empty());
  std::set<std::string> ids;
  for (size_t i = 0; i < steps.size(); ++i) {
    const fs::Step& s = steps[i];
    CAPTURE(s.id);
    CHECK(ids.insert(s.id).second);
    CHECK(s.id.size() > 3);
    CHECK(std::isdigit(static_cast<unsigned char>(s.id[0])));
    CHECK(!s.lesson.empty());
    CHECK(s.min_compute_capability >= 80);
    if (i > 0) CHECK(steps[i - 1].id < s.id);
    CHECK(fs::find_step(s.id) == &s);
  }
  CHECK(fs::find_step("99_nothing") == nullptr);
}

TEST_CASE("registry: adding a broken or duplicate step is refused", "[registry]") {
  fs::Registry r;
  fs::Step s{"90_test", "test", "a test step", 80, [](const fs::Problem&, const fs::DeviceInfo&) { return std::string(); },
             [](const fs::Problem&, const fs::Tensors&, cudaStream_t) {}};
  r.add(s);
  CHECK_THROWS_AS(r.add(s), fs::Error);
  fs::Step no_launch = s;
  no_launch.id = "91_test";
  no_launch.launch = nullptr;
  CHECK_THROWS_AS(r.add(no_launch), fs::Error);
}

TEST_CASE("registry: check() applies the harness, the compute capability, then the step", "[registry]") {
  const fs::Problem p = fs::make_problem(1, 64, 64, 2, 2, 64, fs::DType::fp16, false);
  for (const fs::Step& s : fs::steps()) {
    CAPTURE(s.id);
    fs::Problem bad = p;
    bad.batch = 0;
    CHECK(fs::check(s, bad, fake_device(90, size_t(1) << 34)) == "batch is 0; it must be at least 1");
    const std::string old_gpu = fs::check(s, p, fake_device(s.min_compute_capability - 10, size_t(1) << 34));
    CHECK(old_gpu.find("needs compute capability") != std::string::npos);
  }
}

TEST_CASE("step 01 refuses a score matrix larger than free memory", "[registry]") {
  const fs::Step* s = fs::find_step("01_naive");
  REQUIRE(s != nullptr);
  const fs::Problem p = fs::make_problem(8, 16384, 16384, 16, 16, 128, fs::DType::fp16, false);  // S = 128 GiB
  const std::string why = fs::check(*s, p, fake_device(90, size_t(80) << 30));
  CHECK(why == "the score matrix S needs 131072 MiB (batch·heads·seqlen_q·seqlen_k·4 bytes) but only 73728 MiB "
               "(90 % of free device memory) is available");
  CHECK(fs::check(*s, p, fake_device(90, size_t(200) << 30)).empty());
}
