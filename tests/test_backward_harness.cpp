// The backward pass's harness, without a GPU: validate and validate_tensors (each
// refusal a sentence naming the value and the limit), the FLOPs and the acceptance bound, the chain
// plan / run on made-up steps and devices, backward-only steps in the forward
// chain, and the C ABI's fs_*backward* entry points.
#include <cmath>
#include <limits>
#include <string>

#include "catch.h"
#include "common/backward/check.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "common/harness/gpu.h"

namespace {

fs::DeviceInfo fake_device(int cc) {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = cc;
  d.sm_count = 132;
  d.smem_per_block_optin = 227 * 1024;
  d.l2_bytes = 50 << 20;
  d.free_bytes = d.total_bytes = size_t(80) << 30;
  return d;
}

// b2 h4/2 sq64 sk48 d64 fp16 causal: every tensor contiguous, gradients with the inputs' strides.
fs::BackwardProblem small_problem() {
  return fs::make_backward_problem(2, 64, 48, 4, 2, 64, fs::DType::fp16, true, false);
}

// A backward-only step (no forward pass) that runs head_dim 64 only and asks 4096 bytes of workspace;
// launch() counts its calls instead of touching a GPU.
struct FakeBackward {
  int launches = 0;
  fs::Step step() {
    fs::Step s;
    s.id = "95_fake_backward";
    s.name = "fake backward";
    s.lesson = "a backward pass that launches nothing";
    s.backward.limits = [](const fs::BackwardProblem& p) {
      return p.attention.head_dim == 64 ? std::string()
                                      : "head_dim is " + std::to_string(p.attention.head_dim) + "; this step runs 64";
    };
    s.backward.plan = [](const fs::BackwardProblem&, const fs::DeviceInfo&) {
      fs::Plan plan;
      plan.workspace_bytes = 4096;
      return plan;
    };
    s.backward.launch = [this](const fs::BackwardProblem&, const fs::BackwardTensors&, const fs::Plan&, void* ws,
                               cudaStream_t) {
      CHECK(ws != nullptr);
      ++launches;
    };
    s.backward.claims = [](const fs::BackwardProblem& p, const fs::DeviceInfo&) { return p.attention.head_dim == 64; };
    return s;
  }
};

// The message of the fs::Error `f` throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fs::Error& e) {
    return e.what();
  }
  return "";
}

// The first registered step with a backward pass, or nullptr.
const fs::Step* first_backward_step() {
  for (const fs::Step& s : fs::steps())
    if (s.backward.present()) return &s;
  return nullptr;
}

alignas(16) unsigned char mem[8192];

// Every pointer aligned and non-null (host memory: nothing here dereferences it).
fs::BackwardTensors good_tensors() {
  return fs::BackwardTensors{mem, mem, mem, mem, reinterpret_cast<const float*>(mem), mem, mem, mem, mem};
}

}  // namespace

TEST_CASE("backward: a problem and its forward share sizes, and the gradients take the inputs' strides", "[backward]") {
  const fs::BackwardProblem p = small_problem();
  const fs::Problem f = fs::make_problem(2, 64, 48, 4, 2, 64, fs::DType::fp16, true);
  CHECK(fs::describe(p.attention) == fs::describe(f));
  CHECK(p.deterministic == 0);
  CHECK(p.d_o.row == f.o.row);
  CHECK(p.dq.batch == f.q.batch);
  CHECK(p.dk.row == f.k.row);
  CHECK(p.dv.head == f.v.head);
  fs::Problem strided = f;
  strided.q.row = 2 * f.q.row;  // rows padded to twice their width
  strided.q.batch = 2 * f.q.batch;
  const fs::BackwardProblem b = fs::backward_of(strided, true);
  CHECK(b.deterministic == 1);
  CHECK(b.dq.row == 2 * f.q.row);
  CHECK(fs::validate(p).empty());
  CHECK(fs::validate(b).empty());
  CHECK(fs::describe(b) == "backward b2 h4/2 sq64 sk48 d64 fp16 causal deterministic");
}

TEST_CASE("backward: validate names the value and the limit", "[backward]") {
  const fs::BackwardProblem good = small_problem();
  fs::BackwardProblem p = good;
  // The forward problem's rules first, with their own sentences.
  p.attention.batch = 0;
  p.deterministic = 7;
  CHECK(fs::validate(p) == "batch is 0; it must be at least 1");
  p = good;
  p.attention.o.dim = 2;
  CHECK(fs::validate(p) == "O's head_dim stride is 2; the last dimension must be contiguous (stride 1)");

  for (int32_t bad : {-1, 2, INT32_MAX}) {
    p = good;
    p.deterministic = bad;
    CHECK(fs::validate(p) == "deterministic is " + std::to_string(bad) + "; it must be 0 or 1");
  }

  // dO, dQ, dK, dV as views: validate_view's sentences, with the gradient's name.
  p = good;
  p.d_o.dim = 2;
  CHECK(fs::validate(p) == "dO's head_dim stride is 2; the last dimension must be contiguous (stride 1)");
  p = good;
  p.dq.row = 12;
  CHECK(fs::validate(p) ==
        "dQ's row stride is 12 elements; it must be a multiple of 8 so that every row starts 16-byte aligned");
  p = good;
  p.dk.row = 8;
  CHECK(fs::validate(p) ==
        "dK's row stride 8 is smaller than head_dim 64; rows would overlap (the last dimension must be contiguous)");
  p = good;
  p.dv.batch = -8;
  CHECK(fs::validate(p) == "dV's batch stride is -8; strides must be >= 0");
  p = good;
  p.dv.head = 32;
  CHECK(fs::validate(p) ==
        "dV's head stride 32 is smaller than head_dim 64; heads would overlap (the last dimension must be contiguous)");
  p = good;
  p.dq.batch = int64_t(1) << 58;
  CHECK(fs::validate(p) == "dQ's strides (batch 288230376151711744, row 256, head 64) over batch 2, "
                                    "seqlen_q 64, heads_q 4 span 288230376151728128 elements; a tensor may span at "
                                    "most 2^58 (288230376151711744)");
  p = good;
  p.dk.row = INT64_MAX - 7;
  CHECK(fs::validate(p) == "dK's strides (batch 6144, row 9223372036854775800, head 64) over batch 2, "
                                    "seqlen_k 48, heads_kv 2 span more than 2^63 elements; a tensor may span at most "
                                    "2^58 (288230376151711744)");
}

TEST_CASE("backward: no gradient may overlap itself; dO may", "[backward]") {
  const fs::BackwardProblem good = small_problem();
  fs::BackwardProblem p = good;
  p.dq.batch = 0;
  CHECK(fs::validate(p) == "dQ's batch stride is 0 with batch 2: two elements of dQ would share one address "
                                    "(dQ must not overlap itself; Q, K, V, O and dO may)");
  // dK's heads and rows interleaved: head stride 64 and row stride 64 put row 1 of head 0 on head 1's row 0.
  p = good;
  p.dk.row = 64;
  CHECK(fs::validate(p) == "dK's row stride is 64 with seqlen_k 48, less than the 128 elements spanned by its "
                                    "head_dim and head dimensions: two elements of dK would share one address (dK must "
                                    "not overlap itself; Q, K, V, O and dO may)");
  p = good;
  p.dv.batch = p.dv.row;
  CHECK(fs::validate(p).rfind("dV's batch stride is 128 with batch 2, less than the 6144 elements", 0) == 0);
  // The same rule the forward applies to O: one function, two callers.
  fs::Problem f = good.attention;
  f.o.batch = 0;
  CHECK(fs::validate(f) ==
        fs::validate_no_overlap({"O", "Q and O", f.o, f.batch, f.seqlen_q, f.heads_q, f.head_dim, "seqlen_q", "heads_q"},
                                "Q, K and V"));
  // dO is read, like Q: a broadcast dO (batch stride 0) is fine, and so is a view with one batch.
  p = good;
  p.d_o.batch = 0;
  CHECK(fs::validate(p).empty());
  p = good;
  p.attention.batch = 1;
  p.dq.batch = 0;
  CHECK(fs::validate(p).empty());
  // Empty gradients overlap nothing.
  p = good;
  p.attention.seqlen_k = 0;
  p.attention.k = p.attention.v = fs::contiguous_strides(0, 2, 64);
  p.dk = p.dv = fs::Strides{0, 0, 64, 1};
  CHECK(fs::validate(p).empty());
}

TEST_CASE("backward: pointers must be there when used, and aligned", "[backward]") {
  const fs::BackwardProblem p = small_problem();
  CHECK(fs::validate_tensors(p, good_tensors()).empty());
  struct Case {
    const char* name;
    void (*clear)(fs::BackwardTensors&);
  };
  const Case cases[] = {{"Q", [](fs::BackwardTensors& t) { t.q = nullptr; }},
                        {"K", [](fs::BackwardTensors& t) { t.k = nullptr; }},
                        {"V", [](fs::BackwardTensors& t) { t.v = nullptr; }},
                        {"O", [](fs::BackwardTensors& t) { t.o = nullptr; }},
                        {"LSE", [](fs::BackwardTensors& t) { t.lse = nullptr; }},
                        {"dO", [](fs::BackwardTensors& t) { t.d_o = nullptr; }},
                        {"dQ", [](fs::BackwardTensors& t) { t.dq = nullptr; }},
                        {"dK", [](fs::BackwardTensors& t) { t.dk = nullptr; }},
                        {"dV", [](fs::BackwardTensors& t) { t.dv = nullptr; }}};
  for (const Case& c : cases) {
    fs::BackwardTensors t = good_tensors();
    c.clear(t);
    CHECK(fs::validate_tensors(p, t) == std::string(c.name) + " is a null pointer");
  }
  fs::BackwardTensors t = good_tensors();
  t.dk = mem + 8;
  CHECK(fs::validate_tensors(p, t).find("dK pointer") == 0);
  CHECK(fs::validate_tensors(p, t).find("is not 16-byte aligned (address mod 16 = 8)") != std::string::npos);
  t = good_tensors();
  t.lse = reinterpret_cast<const float*>(mem + 2);
  CHECK(fs::validate_tensors(p, t).find("is not 4-byte aligned (address mod 4 = 2)") != std::string::npos);
  t.lse = reinterpret_cast<const float*>(mem + 4);  // 4-byte aligned is enough for LSE
  CHECK(fs::validate_tensors(p, t).empty());

  // seqlen_k == 0: only dQ is written (zeros); seqlen_q == 0: only dK and dV.
  fs::BackwardProblem no_keys = p;
  no_keys.attention.seqlen_k = 0;
  fs::BackwardTensors only_dq{};
  only_dq.dq = mem;
  CHECK(fs::validate_tensors(no_keys, only_dq).empty());
  CHECK(fs::validate_tensors(no_keys, fs::BackwardTensors{}) == "dQ is a null pointer");
  fs::BackwardProblem no_queries = p;
  no_queries.attention.seqlen_q = 0;
  fs::BackwardTensors only_dkv{};
  only_dkv.dk = only_dkv.dv = mem;
  CHECK(fs::validate_tensors(no_queries, only_dkv).empty());
  only_dkv.dv = nullptr;
  CHECK(fs::validate_tensors(no_queries, only_dkv) == "dV is a null pointer");
}

TEST_CASE("backward: FLOPs are 2.5 times the forward's, and the bound is 2 ref_err + u max|exact|", "[backward]") {
  for (bool causal : {false, true}) {
    const fs::BackwardProblem p = fs::make_backward_problem(2, 1000, 777, 8, 2, 128, fs::DType::bf16, causal, true);
    CHECK(fs::backward_flops(p) == 2.5 * fs::attention_flops(p.attention));
    CHECK(fs_backward_flops(&p) == fs::backward_flops(p));
  }
  CHECK(fs::backward_flops(small_problem()) == 2.5 * 4 * 2 * 4 * 64 * 48 * 64 / 2);
  CHECK(fs_backward_flops(nullptr) == 0.0);

  // u = 2^-11 (fp16), 2^-8 (bf16): exact in binary, so the sums are too.
  CHECK(fs::backward_bound(FS_FP16, 0.25, 8.0) == 0.5 + 8.0 / 2048);
  CHECK(fs::backward_bound(FS_BF16, 0.25, 8.0) == 0.5 + 8.0 / 256);
  CHECK(fs::backward_bound(FS_BF16, 0.0, 3.0) == 3.0 * fs::unit_roundoff(FS_BF16));
  double bound = -1;
  CHECK(fs_backward_bound(FS_FP16, 0.125, 4.0, &bound) == FS_OK);
  CHECK(bound == 0.25 + 4.0 / 2048);
  CHECK(fs_backward_bound(FS_BF16, 0.0, 0.0, &bound) == FS_OK);
  CHECK(bound == 0.0);

  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  bound = 7;
  CHECK(fs_backward_bound(2, 0.1, 1.0, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "dtype is 2; it must be FS_FP16 (0) or FS_BF16 (1)");
  CHECK(fs_backward_bound(FS_FP16, -0.5, 1.0, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "ref_err is -0.5; it must be finite and >= 0");
  CHECK(fs_backward_bound(FS_FP16, nan, 1.0, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).rfind("ref_err is ", 0) == 0);
  CHECK(fs_backward_bound(FS_FP16, 0.1, inf, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "max_abs_exact is inf; it must be finite and >= 0");
  CHECK(fs_backward_bound(FS_FP16, 0.1, -1.0, &bound) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "max_abs_exact is -1; it must be finite and >= 0");
  CHECK(bound == 7);  // nothing written on a refusal
  CHECK(fs_backward_bound(FS_FP16, 0.1, 1.0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "bound is a null pointer");
}

TEST_CASE("registry: a step has a forward pass, a backward pass or both, each whole", "[backward][registry]") {
  FakeBackward fake;
  fs::Registry r;
  r.add(fake.step());  // backward only
  CHECK_FALSE(r.steps().back().forward.present());
  CHECK(r.steps().back().backward.present());

  fs::Step partial = fake.step();
  partial.id = "96_partial";
  partial.backward.claims = nullptr;
  CHECK(error_of([&] { r.add(partial); }) ==
        "step 96_partial's backward entry must have all of limits(), plan(), launch() and claims()");
  fs::Step half_forward = fake.step();
  half_forward.id = "97_half_forward";
  half_forward.forward.limits = [](const fs::Problem&) { return std::string(); };
  CHECK(error_of([&] { r.add(half_forward); }) ==
        "step 97_half_forward's forward pass must have all of limits(), plan(), launch() and claims()");
  fs::Step nothing;
  nothing.id = "98_nothing";
  CHECK(error_of([&] { r.add(nothing); }) ==
        "step 98_nothing has neither a forward pass (limits(), plan(), launch(), claims()) nor a backward entry");
  CHECK(error_of([&] { r.add(fs::Step{}); }) == "a step must have an id");
  CHECK(r.steps().size() == 1);

  // Every registered step runs one pass at least; the forward steps are whole (Registry::add).
  for (const fs::Step& s : fs::steps()) {
    CAPTURE(s.id);
    CHECK((s.forward.present() || s.backward.present()));
  }
}

TEST_CASE("registry: the forward chain refuses a backward-only step with a sentence", "[backward][registry]") {
  FakeBackward fake;
  const fs::Step s = fake.step();
  const fs::Problem p = small_problem().attention;
  const std::string why = "step 95_fake_backward has no forward pass (it is a backward step: fs_run_backward)";
  CHECK(fs::static_refusal(s, p) == why);
  CHECK(fs::plan(s, p, fake_device(90)).refusal == why);
  // Even a plan made elsewhere is refused before anything is called.
  alignas(16) static unsigned char o[64];
  CHECK(error_of([&] { fs::run(s, p, fs::Plan{}, fs::Tensors{o, o, o, o, nullptr}, nullptr, 0, nullptr); }) ==
        "step 95_fake_backward refused " + fs::describe(p) + ": " + why);
  CHECK(fake.launches == 0);
}

TEST_CASE("registry: the backward chain is validate, limits, compute capability, plan", "[backward][registry]") {
  FakeBackward fake;
  fs::Step s = fake.step();
  const fs::BackwardProblem p = small_problem();
  CHECK(fs::static_refusal(s, p).empty());
  const fs::Plan plan = fs::plan(s, p, fake_device(90));
  REQUIRE(plan.accepted());
  CHECK(plan.workspace_bytes == 4096);

  fs::BackwardProblem bad = p;
  bad.deterministic = 2;
  CHECK(fs::plan(s, bad, fake_device(90)).refusal == "deterministic is 2; it must be 0 or 1");
  bad = fs::make_backward_problem(2, 64, 48, 4, 2, 128, fs::DType::fp16, true, false);
  CHECK(fs::static_refusal(s, bad) == "head_dim is 128; this step runs 64");
  CHECK(fs::plan(s, p, fake_device(75)).refusal ==
        "step 95_fake_backward needs compute capability 8.0 or newer; this GPU is 7.5");
  s.arch_specific = 90;
  CHECK(fs::plan(s, p, fake_device(100)).refusal ==
        "step 95_fake_backward is built for sm_90a only (architecture-specific instructions), which runs on compute "
        "capability 9.0 alone; this GPU is 10.0");
  CHECK(fs::plan(s, p, fake_device(90)).accepted());
}

TEST_CASE("registry: a step without a backward pass is refused by the backward chain", "[backward][registry]") {
  const fs::Step* naive = fs::find_step("01_naive");
  REQUIRE(naive != nullptr);
  const fs::BackwardProblem p = small_problem();
  const std::string why = fs::static_refusal(*naive, p);
  const fs::Step* with = first_backward_step();
  CHECK(why.rfind("step 01_naive has no backward pass; ", 0) == 0);
  if (with)
    CHECK(why.find("the steps with one are: " + with->id) != std::string::npos);
  else
    CHECK(why == "step 01_naive has no backward pass; no registered step has one");
  CHECK(fs::plan(*naive, p, fake_device(90)).refusal == why);
  // Before the problem's own rules: a step without a backward pass refuses any problem the same way.
  fs::BackwardProblem bad = p;
  bad.deterministic = 5;
  CHECK(fs::static_refusal(*naive, bad) == why);
  CHECK(error_of([&] { fs::run(*naive, p, fs::Plan{}, good_tensors(), nullptr, 0, nullptr); }) ==
        "step 01_naive refused " + fs::describe(p) + ": " + why);
  CHECK(error_of([&] { const fs::Prepared prepared(*naive, p, fake_device(90)); }) ==
        "step 01_naive refused " + fs::describe(p) + ": " + why);
}

TEST_CASE("registry: run_backward checks pointers and the workspace before it launches", "[backward][registry]") {
  FakeBackward fake;
  const fs::Step s = fake.step();
  const fs::BackwardProblem p = small_problem();
  const fs::Plan plan = fs::plan(s, p, fake_device(90));
  REQUIRE(plan.accepted());
  const std::string refused = "step 95_fake_backward refused " + fs::describe(p) + ": ";
  alignas(16) static unsigned char ws[4096 + 16];

  fs::BackwardTensors no_lse = good_tensors();
  no_lse.lse = nullptr;
  CHECK(error_of([&] { fs::run(s, p, plan, no_lse, ws, 4096, nullptr); }) == refused + "LSE is a null pointer");
  CHECK(error_of([&] { fs::run(s, p, plan, good_tensors(), nullptr, 0, nullptr); }) ==
        refused + "the workspace is a null pointer; this problem needs 4096 bytes of workspace (see "
                  "fs_backward_workspace_size)");
  CHECK(error_of([&] { fs::run(s, p, plan, good_tensors(), ws, 4095, nullptr); }) ==
        refused + "the workspace is 4095 bytes; this problem needs 4096 (see fs_backward_workspace_size)");
  CHECK(error_of([&] { fs::run(s, p, plan, good_tensors(), ws + 8, 4096, nullptr); })
            .find("the workspace pointer") != std::string::npos);
  fs::Plan refusal = plan;
  refusal.refusal = "the step says no";
  CHECK(error_of([&] { fs::run(s, p, refusal, good_tensors(), ws, 4096, nullptr); }) ==
        refused + "the step says no");
  CHECK(fake.launches == 0);
  // Everything in order: the step's launch is called, with the workspace.
  CHECK(error_of([&] { fs::run(s, p, plan, good_tensors(), ws, 4096, nullptr); }).empty());
  CHECK(fake.launches == 1);
}

TEST_CASE("C ABI: the backward entry points refuse bad arguments before touching the GPU", "[backward][c_api]") {
  const int n = fs_step_count();
  int with_backward = 0;
  for (int i = 0; i < n; ++i) {
    const fs::Step* s = fs::find_step(fs_step_id(i));
    REQUIRE(s != nullptr);
    CHECK(fs_step_runs(i, FS_BACKWARD) == int(s->backward.present()));
    CHECK(fs_step_runs(i, FS_FORWARD) == int(s->forward.present()));
    with_backward += fs_step_runs(i, FS_BACKWARD);
  }
  CHECK(fs_step_runs(-1, FS_BACKWARD) == -1);
  CHECK(fs_step_runs(0, 3) == -1);  // no such pass
  CHECK(fs_step_runs(n, FS_BACKWARD) == -1);
  CHECK(fs_step_runs(n, FS_FORWARD) == -1);
  CHECK(fs_step_runs(0, FS_FORWARD) == 1);  // 01_naive

  fs_backward_problem p;
  fs_backward_problem_init(&p, 2, 64, 48, 4, 2, 64, FS_FP16, 1, 0);
  CHECK(p.attention.softmax_scale == 0.125f);
  CHECK(p.dq.row == 4 * 64);
  CHECK(p.dk.row == 2 * 64);
  CHECK(p.deterministic == 0);
  fs_backward_problem_init(nullptr, 1, 1, 1, 1, 1, 8, FS_FP16, 0, 0);  // nothing to fill

  CHECK(fs_backward_check("01_naive", &p) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).rfind("step 01_naive has no backward pass; ", 0) == 0);
  CHECK(fs_backward_check("no_such_step", &p) == FS_ERR_UNKNOWN_STEP);
  CHECK(std::string(fs_last_error()) == "no step has id 'no_such_step' (see fs_step_id)");
  CHECK(fs_backward_check(nullptr, &p) == FS_ERR_UNKNOWN_STEP);
  CHECK(fs_backward_check("01_naive", nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "problem is a null pointer");
  uint64_t bytes = 7;
  CHECK(fs_backward_workspace_size("01_naive", &p, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "bytes is a null pointer");
  CHECK(fs_backward_workspace_size("01_naive", nullptr, &bytes) == FS_ERR_INVALID);
  CHECK(fs_backward_workspace_size("01_naive", &p, &bytes) == FS_ERR_INVALID);
  CHECK(bytes == 7);
  CHECK(fs_run_backward("01_naive", nullptr, mem, mem, mem, mem, nullptr, mem, mem, mem, mem, nullptr, 0, nullptr) ==
        FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "problem is a null pointer");
  CHECK(fs_run_backward("01_naive", &p, mem, mem, mem, mem, nullptr, mem, mem, mem, mem, nullptr, 0, nullptr) ==
        FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).rfind("step 01_naive has no backward pass; ", 0) == 0);

  // A step with a backward pass (when one is registered): the problem's rules and the pointers are
  // checked before the device is looked at.
  const fs::Step* with = first_backward_step();
  CHECK((with != nullptr) == (with_backward > 0));
  if (!with) return;
  const char* id = with->id.c_str();
  fs_backward_problem bad = p;
  bad.deterministic = 3;
  CHECK(fs_backward_check(id, &bad) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "deterministic is 3; it must be 0 or 1");
  fs_backward_problem_init(&bad, 2, 64, 48, 4, 2, 64, FS_FP16, 7, 1);  // causal kept as given
  CHECK(fs_backward_check(id, &bad) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "causal is 7; it must be 0 or 1");
  bad = p;
  bad.dv.batch = 0;
  CHECK(fs_backward_workspace_size(id, &bad, &bytes) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).rfind("dV's batch stride is 0 with batch 2", 0) == 0);
  CHECK(fs_run_backward(id, &p, mem, mem, mem, mem, nullptr, mem, mem, mem, mem, nullptr, 0, nullptr) ==
        FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "LSE is a null pointer");
  CHECK(fs_run_backward(id, &p, mem, mem, mem, mem, reinterpret_cast<const float*>(mem), mem, mem + 4, mem, mem,
                        nullptr, 0, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()).find("dQ pointer") == 0);
  // A backward-only step refuses the forward entry points, with its sentence.
  if (!with->forward.present()) {
    fs_problem f = p.attention;
    CHECK(fs_check(id, &f) == FS_ERR_INVALID);
    CHECK(std::string(fs_last_error()) ==
          "step " + with->id + " has no forward pass (it is a backward step: fs_run_backward)");
  }
  // Without a GPU the device is the last thing looked at.
  const std::string no_gpu = fs::cuda_unavailable_reason();
  if (!no_gpu.empty()) {
    CHECK(fs_backward_check(id, &p) == FS_ERR_CUDA);
    CHECK(std::string(fs_last_error()) == no_gpu);
  }
}
