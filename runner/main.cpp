// flash-steps (`--help`): every step checked against the reference and timed, for one pass. A run is
// written once (run_pass); Session<Problem> holds what is a pass's own. The reports are runner/report.h's.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "decode/check.h"
#include "harness/timing.h"
#include "runner/report.h"  // the row model and the reports; the forward and backward checks, cli.h, resources.h
#include "version.h"

namespace {

using fs::boolean, fs::Cell, fs::fixed, fs::id_width, fs::num, fs::problem_json, fs::quoted, fs::Row;
using Launch = std::function<void(cudaStream_t)>;

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
std::string timing_note(const fs::RunnerOptions& o) {
  return "median of " + std::to_string(o.iters) + " launches" + (o.flush_l2 ? ", L2 flushed" : "");
}
std::string reference_name(double cost) { return cost <= fs::kCpuReferenceMaxCost ? "fp64 CPU" : "fp32 GPU (cuBLAS)"; }

const char* const kBaselineLesson =
    "unfused baseline: cuBLAS S = QKᵀ (fp32 out), softmax kernel, fp32 P·V; the GPU reference";

// ---- what each pass does its own way ---------------------------------------------------------------

template <typename Problem>
struct Session;

// What a pass's session does the chain's way (the decoding session hides both with its own): the
// refusals that need no device, then the plan on the device.
template <typename Problem>
struct ChainSession {
  static std::string static_refusal(const fs::Step& s, const Problem& p, const fs::RunnerOptions&) {
    return fs::static_refusal(s, p);
  }
  static fs::Plan plan(const fs::Step& s, const Problem& p, const fs::DeviceInfo& dev) {
    return fs::plan_on_device(s, p, dev);
  }
};

// A row's verdict: O and LSE (forward, decoding), or each gradient (backward).
void judge(Row& r, const fs::Comparison& cmp) {
  r.cmp = cmp;
  r.status = cmp.pass() ? "PASS" : "FAIL";
  if (!cmp.pass()) r.reason = cmp.summary();
}
void judge(Row& r, const std::vector<fs::GradComparison>& grads) {
  r.grads = grads;
  r.status = "PASS";
  for (const fs::GradComparison& g : grads)
    if (!g.pass()) r.status = "FAIL", r.reason += (r.reason.empty() ? "" : "; ") + g.summary();
}

// Every pass: the check against the reference (outputs poisoned first), then the timing and the rate.
template <typename S>
void check_and_time(S& session, Row& r, const Launch& launch) {
  const fs::RunnerOptions& o = session.o;
  judge(r, fs::launch_and_compare(launch, session.w, session.ref));
  r.ms = fs::time_launches(launch, {o.warmup, o.iters, o.flush_l2}).median_ms;
  session.rate(r);
}

// The same for a step's plan on the pass's tensors.
template <typename S, typename Problem, typename Tensors>
void check_and_time(S& session, Row& r, const fs::Step& s, const Problem& p, const fs::Plan& plan, const Tensors& t) {
  const fs::Prepared prepared(s, p, plan);
  check_and_time(session, r, [&](cudaStream_t st) { prepared.launch(t, st); });
}

std::vector<Cell> error_cells(const Row& r) {
  const double e = r.cmp.max_abs_err;
  return {{"max_abs_err", num(e), "max err", num(e, std::scientific, std::setprecision(2)), 11},
          {"rel_fro_err", num(r.cmp.rel_fro_err)},
          {"max_lse_err", num(r.cmp.max_lse_err)}};
}

// A variable-length batch (--varlen): ", 4 sequences of 0 to 4096 query rows (keys: the same)" after the
// shape; "" for a dense one.
std::string varlen_lengths(const fs::RunnerOptions& o) {
  if (o.varlen.empty()) return "";
  const auto [lo, hi] = std::minmax_element(o.varlen.begin(), o.varlen.end());
  return ", " + std::to_string(o.varlen.size()) + " sequences of " + std::to_string(*lo) + " to " +
         std::to_string(*hi) + " query rows" + (o.varlen_k.empty() ? " (keys: the same)" : " (keys: --varlen-k)");
}
// Its lengths in the JSON's problem: ", \"varlen\": [...], \"varlen_k\": [...]"; "" for a dense batch.
std::string varlen_json(const fs::RunnerOptions& o) {
  if (o.varlen.empty()) return "";
  auto list = [](const std::vector<int32_t>& v) {
    std::string s;
    for (const int32_t n : v) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return "[" + s + "]";
  };
  return ", \"varlen\": " + list(o.varlen) + ", \"varlen_k\": " + list(o.varlen_k.empty() ? o.varlen : o.varlen_k);
}

template <>
struct Session<fs::Problem> : ChainSession<fs::Problem> {
  static constexpr const char* mode = "";
  static fs::Problem problem(const fs::RunnerOptions& o) { return fs::problem_from(o); }
  static bool runs(const fs::Step& s) { return s.forward.present(); }

  const fs::Problem p;  // a variable-length batch's cu_seqlens are host copies (o.cu); w.problem() launches
  const fs::RunnerOptions& o;
  fs::Workload w{p, o.seed, fs::Layout::separate, o.cu};
  fs::GpuReference gpu = {};
  fs::Reference ref = {};
  // A variable-length batch: the real pairs of its sequences (fs_varlen_flops).
  const double flops = fs::is_varlen(p) ? fs::varlen_flops(p, o.cu.q, o.cu.k) : fs::attention_flops(p);

  std::string shape() const {
    return fs::describe(p) + varlen_lengths(o) + ", " + fixed(flops / 1e9, 1) + " GFLOP";
  }
  std::string reference() const { return reference_name(fs::reference_cpu_cost(p)); }
  void rate(Row& r) const { r.rate = fs::tflops(flops, r.ms); }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    check_and_time(*this, r, s, w.problem(), plan, w.tensors());
  }
  void add_baseline(std::vector<Row>& rows) {
    Row r{.id = "cublas", .lesson = kBaselineLesson};
    const fs::Tensors t = w.tensors();
    check_and_time(*this, r, [&](cudaStream_t st) { gpu.run(w.problem(), t, nullptr, st); });
    rows.push_back(r);
  }
  std::string title() const { return shape() + " | " + timing_note(o) + " | x = speed-up (time ratio)"; }
  std::string json() const {
    return ",\n  \"problem\": " + problem_json(p, ", \"softmax_scale\": " + num(p.softmax_scale) + varlen_json(o) +
                                                  ", \"flops\": " + num(flops));
  }
  static std::vector<Cell> tags(const Row&) { return {}; }
  static std::vector<Cell> cells(const Row& r) {
    std::vector<Cell> c{{"ms", num(r.ms), "ms", fixed(r.ms, 3), 10},
                        {"tflops", num(r.rate), "TFLOP/s", fixed(r.rate, 2), 10},
                        {"x_step01", num(r.x_step01), "x 01", r.x_step01 > 0 ? fixed(r.x_step01, 2) : "-", 10},
                        {"x_prev", num(r.x_prev), "x prev", r.x_prev > 0 ? fixed(r.x_prev, 2) : "-", 10}};
    for (const Cell& e : error_cells(r)) c.push_back(e);
    return c;
  }
};

// Why a step without a decoding entry cannot run this decoding problem ("" when it is a forward one).
std::string forward_refusal(const fs::DecodeProblem& p, bool ragged) {
  if (!fs::is_paged(p) && !ragged) return "";
  return std::string("this step has no decoding entry, and with ") +
         (fs::is_paged(p) ? (ragged ? "a paged cache and per-sequence lengths" : "a paged cache")
                          : "per-sequence lengths") +
         " the problem is no forward one (that needs a contiguous cache with every sequence at seqlen_k keys)";
}

// Decoding: steps with a decoding entry run it; the others their forward entry where the problem is a
// forward one (a contiguous cache, no --ragged), on the same tensors.
template <>
struct Session<fs::DecodeProblem> : ChainSession<fs::DecodeProblem> {  // its own static_refusal and plan
  static constexpr const char* mode = "decode";
  static fs::DecodeProblem problem(const fs::RunnerOptions& o) { return fs::decode_problem_from(o); }
  static bool runs(const fs::Step& s) { return s.forward.present(); }
  static std::string static_refusal(const fs::Step& s, const fs::DecodeProblem& p, const fs::RunnerOptions& o) {
    if (s.decode.present()) return fs::static_refusal(s, p);
    const std::string why = forward_refusal(p, o.ragged);
    return why.empty() ? fs::static_refusal(s, p.attention) : why;
  }
  static fs::Plan plan(const fs::Step& s, const fs::DecodeProblem& p, const fs::DeviceInfo& dev) {
    return s.decode.present() ? fs::plan_on_device(s, p, dev) : fs::plan_on_device(s, p.attention, dev);
  }

  const fs::DecodeProblem p;
  const fs::RunnerOptions& o;
  fs::DecodeWorkload w{p, fs::decode_lengths_from(o), o.seed};
  fs::GpuReference gpu = {};
  fs::Reference ref = {};
  const double gb = w.kv_bytes() / 1e9;

  std::string shape() const {
    return fs::describe(p) + (o.ragged ? ", ragged lengths" : "") + ", " + fixed(gb, 3) + " GB of K and V";
  }
  std::string reference() const { return reference_name(fs::reference_cpu_cost(p, w.lengths())); }
  void rate(Row& r) const {
    r.rate = r.ms > 0 ? gb / (r.ms * 1e-3) : 0;
    r.hbm_pct = o.hbm_tbs > 0 ? 100 * r.rate / (o.hbm_tbs * 1e3) : 0;
  }
  // The forward entry's view of the decoding tensors.
  fs::Tensors forward_tensors() const {
    const fs::DecodeTensors t = w.tensors();
    return {t.q, t.k_cache, t.v_cache, t.o, t.lse};
  }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    r.splits = plan.splits;
    if (s.decode.present()) check_and_time(*this, r, s, p, plan, w.tensors());
    else check_and_time(*this, r, s, p.attention, plan, forward_tensors());
  }
  void add_baseline(std::vector<Row>& rows) {
    if (!forward_refusal(p, o.ragged).empty()) return;
    Row r{.id = "cublas", .lesson = kBaselineLesson, .entry = "forward"};
    const fs::Tensors t = forward_tensors();
    check_and_time(*this, r, [&](cudaStream_t st) { gpu.run(p.attention, t, nullptr, st); });
    rows.push_back(r);
  }
  std::string title() const {
    return shape() + " | " + timing_note(o) + " | GB/s = bytes of K and V read / time" +
           (o.hbm_tbs > 0 ? " | % HBM of " + fixed(o.hbm_tbs, 2) + " TB/s (--hbm-tbs)" : "");
  }
  std::string json() const {
    return ",\n  \"problem\": " +
           problem_json(p.attention, ", \"page_size\": " + num(p.page_size) + ", \"ragged\": " + boolean(o.ragged) +
                                             ", \"num_splits\": " + num(p.num_splits) + ", \"checked\": " +
                                             boolean(p.checked) + ", \"kv_bytes\": " + num(w.kv_bytes())) +
           ",\n  \"hbm_tbs\": " + num(o.hbm_tbs);
  }
  static std::vector<Cell> tags(const Row& r) { return {{"entry", r.entry}}; }
  static std::vector<Cell> cells(const Row& r) {
    std::vector<Cell> c{{"ms", num(r.ms), "ms", fixed(r.ms, 4), 10},
                        {"gbs", num(r.rate), "GB/s", fixed(r.rate, 0), 10},
                        {"hbm_pct", num(r.hbm_pct), "% HBM", r.hbm_pct > 0 ? fixed(r.hbm_pct, 0) : "-", 8},
                        {"splits", num(r.splits), "splits", r.splits > 0 ? std::to_string(r.splits) : "-", 8}};
    for (const Cell& e : error_cells(r)) c.push_back(e);
    return c;
  }
};

template <>
struct Session<fs::BackwardProblem> : ChainSession<fs::BackwardProblem> {
  static constexpr const char* mode = "backward";
  static fs::BackwardProblem problem(const fs::RunnerOptions& o) { return fs::backward_problem_from(o); }
  static bool runs(const fs::Step& s) { return s.backward.present(); }

  const fs::BackwardProblem p;  // a variable-length batch's cu_seqlens are host copies (o.cu); w.problem() launches
  const fs::RunnerOptions& o;
  fs::BackwardWorkload w{p, o.seed, fs::Layout::separate, o.cu};
  fs::GpuReference gpu = {};
  fs::BackwardReferences ref = {};
  // 2.5 x the forward's; a variable-length batch: of the real pairs of its sequences (fs_varlen_flops).
  const double flops =
      fs::is_varlen(p.attention) ? fs::backward_varlen_flops(p, o.cu.q, o.cu.k) : fs::backward_flops(p);
  const std::string reference_kind = reference_name(fs::reference_cpu_cost(p));

  std::string shape() const { return fs::describe(p) + varlen_lengths(o) + ", " + fixed(flops / 1e9, 1) + " GFLOP"; }
  std::string reference() const {
    return reference_kind + ", exact and with O, P and dS rounded to " + fs::dtype_name(p.attention.dtype);
  }
  void rate(Row& r) const { r.rate = fs::tflops(flops, r.ms); }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    check_and_time(*this, r, s, w.problem(), plan, w.tensors());
  }
  void add_baseline(std::vector<Row>&) {}
  std::string title() const {
    return fs::describe(p) + varlen_lengths(o) + " | " + fixed(flops / 1e9, 1) + " GFLOP (2.5 x forward) | " +
           timing_note(o) +
           " | dQ dK dV = max |err| / bound (" + reference_kind + " reference; <= 1 passes)";
  }
  std::string json() const {
    return ",\n  \"problem\": " +
           problem_json(p.attention, ", \"softmax_scale\": " + num(p.attention.softmax_scale) +
                                             ", \"deterministic\": " + boolean(p.deterministic) +
                                             varlen_json(o) + ", \"flops\": " + num(flops)) +
           ",\n  \"reference\": " + quoted(reference_kind);
  }
  static std::vector<Cell> tags(const Row&) { return {}; }
  static std::vector<Cell> cells(const Row& r) {
    std::vector<Cell> c{{"ms", num(r.ms), "ms", fixed(r.ms, 3), 10},
                        {"tflops", num(r.rate), "TFLOP/s", fixed(r.rate, 2), 10}};
    for (const fs::GradComparison& g : r.grads) {
      // max |err| / bound: at most 1 passes.
      const std::string ratio = g.nonfinite > 0 ? "nonfinite"
                                : g.bound > 0   ? fixed(g.max_abs_err / g.bound, 3)
                                                : (g.max_abs_err == 0 ? "0" : "inf");
      std::string key = g.name;  // "dQ" -> "dq_..."
      for (char& ch : key) ch = char(std::tolower(ch));
      c.push_back({key + "_max_abs_err", num(g.max_abs_err), g.name, ratio, 11});
      c.push_back({key + "_ref_err", num(g.ref_err)});
      c.push_back({key + "_bound", num(g.bound)});
      c.push_back({key + "_nonfinite", num(double(g.nonfinite))});
    }
    return c;
  }
};

// ---- the run, written once -------------------------------------------------------------------------

// 2 after naming the first --step that is no step's id, else 0.
int unknown_step(const fs::RunnerOptions& o) {
  for (const std::string& id : o.steps)
    if (!fs::find_step(id)) return std::cerr << "flash-steps: no step has id '" << id << "' (see flash-steps --list)\n", 2;
  return 0;
}

// The problem validated, then the steps --step names, else every step the pass's run takes. Returns 0,
// or 2 after naming what is wrong.
template <typename Problem>
int select_steps(const fs::RunnerOptions& o, const Problem& p, std::vector<const fs::Step*>& selected) {
  if (const std::string why = fs::validate(p); !why.empty()) return std::cerr << "flash-steps: " << why << "\n", 2;
  if (const int status = unknown_step(o)) return status;
  for (const std::string& id : o.steps) selected.push_back(fs::find_step(id));
  if (o.steps.empty())
    for (const fs::Step& s : fs::steps())
      if (Session<Problem>::runs(s)) selected.push_back(&s);
  return 0;
}

// 0 when a GPU can be used, else 1 after saying why not.
int need_gpu() {
  const std::string why = fs::cuda_unavailable_reason();
  if (why.empty()) return 0;
  std::cerr << "flash-steps: " << why << "; the kernels need an NVIDIA GPU (sm_80 or newer). "
            << "`flash-steps --list` works without one.\n";
  return 1;
}

// The problem the flags describe, in the pass of Problem: validated; the steps selected and their
// refusals that need no device, before any GPU is looked at (a run that would check nothing fails);
// then the workload, the references, each step checked and timed, and the table. Exit status: 0 when
// every row passed or was refused, 1 when one failed or errored, nothing was checked or there is no
// GPU, 2 for bad input.
template <typename Problem>
int run_pass(const fs::RunnerOptions& o) {
  using S = Session<Problem>;
  const Problem p = S::problem(o);
  std::vector<const fs::Step*> selected;
  if (const int status = select_steps(o, p, selected)) return status;
  if (selected.empty()) {
    std::cerr << "flash-steps: no registered step has a " << S::mode << " pass; nothing was checked\n";
    return 1;
  }
  std::vector<std::string> refusals;
  for (const fs::Step* s : selected) refusals.push_back(S::static_refusal(*s, p, o));
  if (std::none_of(refusals.begin(), refusals.end(), [](const std::string& r) { return r.empty(); })) {
    for (size_t k = 0; k < selected.size(); ++k) std::cerr << "  " << selected[k]->id << ": " << refusals[k] << "\n";
    std::cerr << "flash-steps: every selected step refuses " << fs::describe(p) << "; nothing was checked\n";
    return 1;
  }
  if (const int status = need_gpu()) return status;
  const fs::DeviceInfo dev = fs::current_device();
  const std::string date = utc_now();
  std::cerr << "flash-steps " << FLASH_STEPS_COMMIT << " on " << fs::describe(dev) << ", " << date << "\n";
  S session{{}, p, o};  // {}: the ChainSession base
  std::cerr << (*S::mode == 'd' ? "decoding problem: " : "problem: ") << session.shape() << "; timing: median of "
            << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed before each" : "") << "\nreference: "
            << session.reference() << "...\n";
  session.ref = fs::make_reference(session.w, session.gpu);

  std::vector<Row> rows;
  for (size_t k = 0; k < selected.size(); ++k) {
    const fs::Step& s = *selected[k];
    Row r{.id = s.id, .lesson = s.lesson, .entry = *S::mode != 'd' ? "" : s.decode.present() ? "decode" : "forward"};
    std::cerr << "[" << k + 1 << "/" << selected.size() << "] " << s.id << ": ";
    try {
      const fs::Plan plan = refusals[k].empty() ? S::plan(s, p, dev) : fs::Plan{.refusal = refusals[k]};
      if (!plan.accepted()) {
        r.status = "REFUSED", r.reason = plan.refusal;
        std::cerr << "refused\n";
      } else {
        std::cerr << "checking against the reference, then timing\n";
        session.measure(r, s, plan);
      }
    } catch (const fs::Error& e) {
      r.status = "ERROR", r.reason = e.what();
    }
    rows.push_back(r);
  }
  try {
    if (o.baseline) session.add_baseline(rows);
  } catch (const fs::Error& e) {
    rows.push_back(Row{.id = "cublas", .lesson = kBaselineLesson, .status = "ERROR", .reason = e.what()});
  }
  // "x 01" and "x prev" by the ladder's one rule (fs::speedups); the forward table shows them.
  std::vector<std::string> ids;
  std::vector<double> ms;
  for (const Row& r : rows) ids.push_back(r.id), ms.push_back(r.timed() ? r.ms : 0.0);
  const std::vector<fs::Speedup> x = fs::speedups(ids, ms);
  for (size_t i = 0; i < rows.size(); ++i) rows[i].x_step01 = x[i].x_step01, rows[i].x_prev = x[i].x_prev;
  fs::print_run<S>(std::cout, rows, o, fs::describe(dev), date, session.title(), session.json());
  if (std::all_of(rows.begin(), rows.begin() + std::ptrdiff_t(selected.size()),
                  [](const Row& r) { return r.status == "REFUSED"; })) {
    std::cerr << "flash-steps: every selected step refused " << fs::describe(p) << " on this GPU; nothing was checked\n";
    return 1;
  }
  return std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.status == "PASS" || r.status == "REFUSED"; })
             ? 0
             : 1;
}

// ---- list, explain, resources ----------------------------------------------------------------------

int list_steps() {
  std::cout << std::left << std::setw(id_width()) << "id" << std::setw(8) << "min sm" << std::setw(17) << "runs"
            << "lesson\n";
  for (const fs::Step& s : fs::steps()) {
    std::string passes;  // "forward", "forward+decode", "backward", ...
    for (const auto& [has, name] : {std::pair{s.forward.present(), "forward"}, std::pair{s.decode.present(), "decode"},
                                    std::pair{s.backward.present(), "backward"}})
      if (has) passes += (passes.empty() ? "" : "+") + std::string(name);
    std::cout << std::setw(id_width()) << s.id << std::setw(8) << s.min_compute_capability << std::setw(17) << passes
              << s.lesson << "\n";
  }
  return 0;
}

// `flash-steps explain` (or `banks`): every selected step's explanation (Step::explain), no GPU needed;
// the selected steps without one are named at the end. An id that is no step's: exit 2.
int explain_steps(const fs::RunnerOptions& o) {
  if (const int status = unknown_step(o)) return status;
  std::string without;  // the selected steps with no model to explain
  for (const fs::Step& s : fs::steps()) {
    if (!o.steps.empty() && std::find(o.steps.begin(), o.steps.end(), s.id) == o.steps.end()) continue;
    if (!s.explain) {
      without += (without.empty() ? "" : ", ") + s.id;
      continue;
    }
    std::cout << "== " << s.id << ": " << s.lesson << "\n\n";
    s.explain(std::cout);
    std::cout << "\n";
  }
  if (!without.empty())
    std::cout << "no model to explain: " << without << " (these steps register no explain)\n";
  return 0;
}

// `flash-steps resources [--backward]`: for every selected step, each kernel its plan launches
// (Plan::kernels) with what the CUDA runtime says of it: registers, shared and local memory, and how
// many blocks an SM holds at the plan's block size and dynamic shared memory.
template <typename Problem>
int resources(const fs::RunnerOptions& o, const Problem& p, const fs::Problem& shape) {
  std::vector<const fs::Step*> selected;
  if (const int status = select_steps(o, p, selected)) return status;
  if (const int status = need_gpu()) return status;
  const fs::DeviceInfo dev = fs::current_device();
  const std::string date = utc_now();
  std::vector<fs::StepResources> steps;
  for (const fs::Step* s : selected) {
    fs::StepResources& r = steps.emplace_back(fs::StepResources{.step = s});
    try {
      const fs::Plan plan = fs::plan(*s, p, dev);
      if (!plan.accepted()) r.status = "refused", r.reason = plan.refusal;
      for (const fs::KernelLaunch& k : plan.kernels) r.kernels.push_back(fs::kernel_resources(k));
    } catch (const fs::Error& e) {
      r.status = "error", r.reason = e.what(), r.kernels.clear();
    }
  }
  const std::string pass = *Session<Problem>::mode ? Session<Problem>::mode : "forward";
  fs::print_resources(std::cout, steps, o.format, dev, date, shape, pass);
  const auto error = [](const fs::StepResources& r) { return r.status == "error"; };
  return std::none_of(steps.begin(), steps.end(), error) ? 0 : 1;
}

// The command the options name, its exit status.
int command(const fs::RunnerOptions& o) {
  try {
    if (o.command == "help") {
      std::cout << fs::runner_usage();
      return 0;
    }
    if (o.command == "list") return list_steps();
    if (o.command == "explain" || o.command == "banks") return explain_steps(o);
    if (o.command == "resources") {
      const fs::BackwardProblem b = fs::backward_problem_from(o);
      return o.backward ? resources(o, b, b.attention) : resources(o, b.attention, b.attention);
    }
    if (o.backward) return run_pass<fs::BackwardProblem>(o);
    return o.decode ? run_pass<fs::DecodeProblem>(o) : run_pass<fs::Problem>(o);
  } catch (const std::exception& e) {
    std::cerr << "flash-steps: " << e.what() << "\n";
    return 1;
  }
}

// The command's status once its output reached stdout; 1 after saying why when it did not (a full
// disk, a closed stdout): a report that was lost is no success.
int written(int status) {
  if (std::cout.flush() && std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  std::cerr << "flash-steps: the output could not be written to stdout (" << std::strerror(errno) << ")\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::ParsedArgs a = fs::parse_runner_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!a.error.empty()) {
    std::cerr << "flash-steps: " << a.error << "\n";
    return 2;
  }
  return written(command(a.options));
}
