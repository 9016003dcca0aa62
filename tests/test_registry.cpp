// The registry itself, and every step's supports() on made-up devices (no GPU needed).
#include <cctype>
#include <set>
#include <string>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/rules.h"
#include "stub_step.h"

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
  fs::Step s{.id = "90_test",
             .name = "test",
             .lesson = "a test step",
             .forward = accept_everything_entry()};
  r.add(s);
  CHECK_THROWS_AS(r.add(s), fs::Error);
  fs::Step no_launch = s;
  no_launch.id = "91_test";
  no_launch.forward.launch = nullptr;
  CHECK_THROWS_AS(r.add(no_launch), fs::Error);
}

TEST_CASE("registry: check() applies the harness, the compute capability, then the step", "[registry]") {
  // seqlen_q 16: a problem every step's static limits accept (the decoding step runs up to 16 new tokens).
  const fs::Problem p = fs::make_problem(1, 16, 64, 2, 2, 64, fs::DType::fp16, false);
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present()) continue;  // refused whole (test_backward_harness.cpp)
    CAPTURE(s.id);
    REQUIRE(fs::static_refusal(s, p).empty());
    fs::Problem bad = p;
    bad.batch = 0;
    CHECK(fs::plan(s, bad, fake_device(90, size_t(1) << 34)).refusal == "batch is 0; it must be at least 1");
    const std::string old_gpu = fs::plan(s, p, fake_device(s.min_compute_capability - 10, size_t(1) << 34)).refusal;
    CHECK(old_gpu.find("needs compute capability") != std::string::npos);
  }
}

TEST_CASE("step 01 refuses a score matrix larger than free memory", "[registry]") {
  const fs::Step* s = fs::find_step("01_naive");
  REQUIRE(s != nullptr);
  const fs::Problem p = fs::make_problem(8, 16384, 16384, 16, 16, 128, fs::DType::fp16, false);  // S = 128 GiB
  const std::string why = fs::plan(*s, p, fake_device(90, size_t(80) << 30)).refusal;
  CHECK(why == "the score matrix S needs 131072 MiB (batch·heads·seqlen_q·seqlen_k·4 bytes) but only 73728 MiB "
               "(90 % of free device memory) is available");
  const fs::Plan ok = fs::plan(*s, p, fake_device(90, size_t(200) << 30));
  CHECK(ok.accepted());
  CHECK(ok.workspace_bytes == size_t(1) << 37);  // S is the workspace: 8·16·16384²·4 bytes
}

TEST_CASE("step 01 refuses a score matrix whose size overflows, without a device", "[registry]") {
  const fs::Step* s = fs::find_step("01_naive");
  REQUIRE(s != nullptr);
  // b4 h1 sq = sk = 2^30: S = 2^64 bytes wrapped to 0, and the step accepted the problem.
  const fs::Problem p = fs::make_problem(4, int64_t(1) << 30, int64_t(1) << 30, 1, 1, 64, fs::DType::fp16, false);
  REQUIRE(fs::validate(p).empty());
  const std::string why = fs::static_refusal(*s, p);
  CHECK(why == "the score matrix S would need batch·heads·seqlen_q·seqlen_k·4 = 4·1·1073741824·1073741824·4 bytes, "
               "which overflows 64 bits");
  CHECK(fs::plan(*s, p, fake_device(90, size_t(1) << 62)).refusal == why);
  CHECK_FALSE(s->forward.claims(p, fake_device(90, size_t(1) << 62)));
}

// What each step documents it runs (Step::claims), it accepts: on every kind of GPU the project
// supports, for a spread of shapes. The GPU tests then fail on any refusal of a claimed problem.
TEST_CASE("registry: every step plans every problem it claims", "[registry]") {
  struct Gpu {
    int cc;
    size_t smem_optin;
  };
  const Gpu gpus[] = {{80, 163 * 1024}, {86, 99 * 1024}, {89, 99 * 1024}, {90, 227 * 1024}, {100, 227 * 1024}};
  int claimed = 0;
  for (const Gpu& g : gpus) {
    fs::DeviceInfo dev = fake_device(g.cc, size_t(80) << 30);
    dev.smem_per_block_optin = g.smem_optin;
    for (int64_t sq : {0, 1, 65, 1000})
      for (int64_t sk : {0, 1, 65, 1000})
        for (int64_t d = 8; d <= 256; d += 8)
          for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{1, 1}, {8, 2}, {32, 1}})
            for (bool causal : {false, true})
              for (fs::DType dt : {fs::DType::fp16, fs::DType::bf16}) {
                const fs::Problem p = fs::make_problem(2, sq, sk, hq, hkv, d, dt, causal);
                for (const fs::Step& s : fs::steps()) {
                  if (!s.forward.present()) continue;
                  if (s.min_compute_capability > g.cc || (s.arch_specific && s.arch_specific != g.cc)) continue;
                  if (!s.forward.claims(p, dev)) continue;
                  ++claimed;
                  const fs::Plan plan = fs::plan(s, p, dev);
                  if (!plan.accepted()) {
                    INFO(s.id << " on sm_" << g.cc << " with " << g.smem_optin << " bytes of shared memory, "
                              << fs::describe(p) << ": " << plan.refusal);
                    CHECK(plan.accepted());
                  }
                }
              }
  }
  CHECK(claimed > 0);
}

TEST_CASE("registry: every step knows its directory", "[registry]") {
  for (const fs::Step& s : fs::steps()) {
    CAPTURE(s.id);
    REQUIRE(s.dir.size() > 3);
    CHECK(s.dir.substr(0, 2) == s.id.substr(0, 2));  // 04_pad and 04_swizzle live in 04_bank_conflicts
  }
}

TEST_CASE("speed-ups: x prev is over the fastest row of the previous step key", "[registry]") {
  CHECK(fs::step_key("04_pad") == "04");
  CHECK(fs::step_key("07b_work_order") == "07b");
  CHECK(fs::step_key("cublas") == "cublas");
  const std::vector<std::string> ids = {"01_naive", "03_smem", "04_pad", "04_swizzle", "05_cp", "07a_x", "07b_y",
                                        "cublas", "06_refused"};
  const std::vector<double> ms = {100, 10, 5, 8, 4, 2, 1, 20, 0};
  const std::vector<fs::Speedup> x = fs::speedups(ids, ms);
  CHECK(x[0].x_step01 == 1.0);
  CHECK(x[0].x_prev == 0.0);                // nothing before 01
  CHECK(x[2].x_prev == 2.0);                // 04_pad against 03: 10 / 5
  CHECK(x[3].x_prev == 1.25);               // 04_swizzle against 03 too: 10 / 8
  CHECK(x[4].x_prev == 1.25);               // 05 against the faster 04: 5 / 4
  CHECK(x[5].x_prev == 2.0);                // 07a against 05 (06 was not timed): 4 / 2
  CHECK(x[6].x_prev == 2.0);                // 07b against 07a: 2 / 1
  CHECK(x[7].x_step01 == 5.0);              // a baseline gets x 01 only
  CHECK(x[7].x_prev == 0.0);
  CHECK(x[8].x_step01 == 0.0);              // not timed: nothing
}

TEST_CASE("workspace: a plan's workspace is refused, in a sentence, when it is missing, short or misaligned", "[registry]") {
  fs::Plan none;
  CHECK(fs::validate_workspace(none, nullptr, 0, "fs_workspace_size").empty());  // no workspace needed: NULL is fine
  fs::Plan plan;
  plan.workspace_bytes = 4096;
  alignas(16) static unsigned char mem[4096 + 16];
  CHECK(fs::validate_workspace(plan, mem, 4096, "fs_workspace_size").empty());
  CHECK(fs::validate_workspace(plan, mem, 8192, "fs_workspace_size").empty());
  CHECK(fs::validate_workspace(plan, nullptr, 4096, "fs_workspace_size") ==
        "the workspace is a null pointer; this problem needs 4096 bytes of workspace (see fs_workspace_size)");
  CHECK(fs::validate_workspace(plan, mem, 4095, "fs_workspace_size") == "the workspace is 4095 bytes; this problem needs 4096 (see fs_workspace_size)");
  // The part that needs no plan: the pointer against its size, and its alignment, whatever the plan needs.
  CHECK(fs::validate_workspace_pointer(mem, 4096).empty());
  CHECK(fs::validate_workspace_pointer(nullptr, 0).empty());
  CHECK(fs::validate_workspace_pointer(nullptr, 4096) ==
        "the workspace is a null pointer with workspace_bytes 4096; pass a buffer of that many bytes, or NULL with 0");
  CHECK(fs::validate_workspace_pointer(mem + 8, 4096).find("is not 16-byte aligned (address mod 16 = 8)") != std::string::npos);
  CHECK(fs::validate_workspace_pointer(mem + 8, 0).find("is not 16-byte aligned (address mod 16 = 8)") != std::string::npos);
  // fs::run refuses before anything is launched (no GPU needed to see it).
  const fs::Step* s = fs::find_step("01_naive");
  REQUIRE(s != nullptr);
  const fs::Problem p = fs::make_problem(1, 8, 8, 1, 1, 64, fs::DType::fp16, false);
  fs::Tensors t{mem, mem, mem, mem, nullptr};
  CHECK_THROWS_AS(fs::run(*s, p, plan, t, nullptr, 0, nullptr), fs::Error);
}

TEST_CASE("softcap: a step without it refuses with a sentence naming one that has it, for each pass", "[registry][softcap]") {
  const fs::Step* capped = nullptr;
  for (const fs::Step& s : fs::steps())
    if (s.softcap) capped = &s;
  REQUIRE(capped != nullptr);
  CHECK(capped->id == "13c_varlen");  // the newest: 13a_softcap has it, and 13b and 13c keep it
  REQUIRE(capped->forward.present());
  REQUIRE(capped->backward.present());

  fs::Problem p = fs::make_problem(1, 16, 64, 2, 2, 64, fs::DType::fp16, false);
  p.softcap = 30.0f;
  fs::BackwardProblem bp = fs::make_backward_problem(1, 16, 64, 2, 2, 64, fs::DType::fp16, false, 0);
  bp.attention.softcap = 30.0f;
  fs::DecodeProblem dp = fs::make_decode_problem(1, 1, 64, 2, 2, 64, fs::DType::fp16, false);
  dp.attention.softcap = 30.0f;
  CHECK(fs::static_refusal(*capped, p).empty());
  CHECK(fs::static_refusal(*capped, bp).empty());
  for (const fs::Step& s : fs::steps()) {
    if (s.softcap) continue;
    CAPTURE(s.id);
    if (s.forward.present())
      CHECK(fs::static_refusal(s, p) == "softcap is 30; step " + s.id +
                                            " has no softcapping (0 turns it off); step 13c_varlen has it");
    if (s.backward.present())
      CHECK(fs::static_refusal(s, bp) == "softcap is 30; step " + s.id +
                                             " has no softcapping (0 turns it off); step 13c_varlen has it");
    if (s.decode.present())  // no step decodes with a softcap: the sentence names none
      CHECK(fs::static_refusal(s, dp) == "softcap is 30; step " + s.id + " has no softcapping (0 turns it off)");
  }
}

TEST_CASE("window: a step without it refuses with a sentence naming one that has it, for each pass",
          "[registry][window]") {
  const fs::Step* windowed = nullptr;
  for (const fs::Step& s : fs::steps())
    if (s.window) windowed = &s;
  REQUIRE(windowed != nullptr);
  CHECK(windowed->id == "13c_varlen");  // 13b_window has it, and 13c keeps it
  REQUIRE(windowed->forward.present());
  REQUIRE(windowed->backward.present());
  CHECK(windowed->softcap);  // 13b and 13c keep 13a's softcapping

  auto banded = [](fs::Problem& p) { p.window = 1, p.window_left = 128, p.window_right = 0; };
  fs::Problem p = fs::make_problem(1, 16, 64, 2, 2, 64, fs::DType::fp16, false);
  banded(p);
  fs::BackwardProblem bp = fs::make_backward_problem(1, 16, 64, 2, 2, 64, fs::DType::fp16, false, 0);
  banded(bp.attention);
  fs::DecodeProblem dp = fs::make_decode_problem(1, 1, 64, 2, 2, 64, fs::DType::fp16, false);
  banded(dp.attention);
  CHECK(fs::static_refusal(*windowed, p).empty());
  CHECK(fs::static_refusal(*windowed, bp).empty());
  for (const fs::Step& s : fs::steps()) {
    if (s.window) {  // a step with windows accepts this one on each pass it has
      if (s.forward.present()) CHECK(fs::static_refusal(s, p).empty());
      if (s.backward.present()) CHECK(fs::static_refusal(s, bp).empty());
      continue;
    }
    CAPTURE(s.id);
    const std::string sentence = "window is 1 (128, 0); step " + s.id + " has no sliding window (0 turns it off)";
    if (s.forward.present()) CHECK(fs::static_refusal(s, p) == sentence + "; step 13c_varlen has it");
    if (s.backward.present()) CHECK(fs::static_refusal(s, bp) == sentence + "; step 13c_varlen has it");
    if (s.decode.present()) CHECK(fs::static_refusal(s, dp) == sentence);  // no step decodes with a window
  }
  // Softcapping is asked of a step first: a step with neither names softcapping; 13a has softcapping alone.
  p.softcap = 30.0f;
  const fs::Step *plain = fs::find_step("09f_persistent"), *capped = fs::find_step("13a_softcap");
  REQUIRE((plain && capped));
  CHECK(fs::static_refusal(*plain, p) ==
        "softcap is 30; step 09f_persistent has no softcapping (0 turns it off); step 13c_varlen has it");
  CHECK(fs::static_refusal(*capped, p) ==
        "window is 1 (128, 0); step 13a_softcap has no sliding window (0 turns it off); step 13c_varlen has it");
}
