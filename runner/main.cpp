// flash-steps: checks every registered step against the reference on one problem, times it, and
// prints the ladder; with --decode (or --page-size, --ragged, ...) a decoding problem, in GB/s of K
// and V read; with --backward the backward pass of the steps that have one. `flash-steps --help`
// lists the flags.
//
// A run is written once (run_pass) for every pass; Session<Problem> holds what is a pass's own: the
// problem from the flags, its workload and references, how a step is checked and timed, its columns.
#include <algorithm>
#include <ctime>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backward/check.h"
#include "decode/check.h"
#include "forward/check.h"
#include "harness/timing.h"
#include "runner/cli.h"
#include "runner/resources.h"
#include "version.h"

namespace {

using Launch = std::function<void(cudaStream_t)>;

// One row of a table: a step (or the baseline), its status and what its pass measured.
struct Row {
  std::string id = "", lesson = "";
  std::string status = "";  // PASS, FAIL, REFUSED, ERROR
  std::string reason = "";  // why it was refused, or the error
  std::string entry = "";   // decoding: "decode" (the step's decoding entry) or "forward"
  double ms = 0, rate = 0;  // rate: TFLOP/s, or GB/s of K and V read when decoding
  double x_step01 = 0, x_prev = 0, hbm_pct = 0;
  int splits = 0;
  fs::Comparison cmp = {};                     // forward, decoding: O and LSE
  std::vector<fs::GradComparison> grads = {};  // backward: dQ, dK, dV
  bool timed() const { return status == "PASS" || status == "FAIL"; }
};

// One value of a timed row: its key and value in JSON and CSV and, where the table shows it, its
// column's header, width and text.
struct Cell {
  std::string key, value, header = "", text = "";
  int width = 0;
};

std::string fixed(double x, int digits) {
  std::ostringstream m;
  m << std::fixed << std::setprecision(digits) << x;
  return m.str();
}
std::string num(double x) {
  std::ostringstream m;
  m << x;
  return m.str();
}
std::string sci(double x) {
  std::ostringstream m;
  m << std::scientific << std::setprecision(2) << x;
  return m.str();
}
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '\n' ? std::string("\\n") : c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}
const char* boolean(bool b) { return b ? "true" : "false"; }
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}
std::string timing_note(const fs::RunnerOptions& o) {
  return "median of " + std::to_string(o.iters) + " launches" + (o.flush_l2 ? ", L2 flushed" : "");
}

// The attention problem's fields in JSON, then the pass's own.
std::string problem_json(const fs::Problem& p, const std::string& more) {
  return "{\"batch\": " + num(p.batch) + ", \"seqlen_q\": " + num(p.seqlen_q) + ", \"seqlen_k\": " + num(p.seqlen_k) +
         ", \"heads_q\": " + num(p.heads_q) + ", \"heads_kv\": " + num(p.heads_kv) + ", \"head_dim\": " +
         num(p.head_dim) + ", \"dtype\": \"" + fs::dtype_name(p.dtype) + "\", \"causal\": " + boolean(p.causal) + more +
         "}";
}

// Width of the id column: the longest step id plus two spaces.
int id_width() {
  size_t w = std::string("cublas").size();
  for (const fs::Step& s : fs::steps()) w = std::max(w, s.id.size());
  return int(w) + 2;
}

std::string reference_name(double cost) { return cost <= fs::kCpuReferenceMaxCost ? "fp64 CPU" : "fp32 GPU (cuBLAS)"; }

const char* const kBaselineLesson =
    "unfused baseline: cuBLAS S = QKᵀ (fp32 out), softmax kernel, fp32 P·V; the GPU reference";

// ---- what each pass does its own way ---------------------------------------------------------------

template <typename Problem>
struct Session;

// Forward and decoding: the check of O and LSE (outputs poisoned first), then the timing.
template <typename Workload>
void check_and_time(Row& r, const Launch& launch, Workload& w, const fs::Reference& ref, const fs::RunnerOptions& o) {
  r.cmp = fs::launch_and_compare(launch, w, ref);
  r.status = r.cmp.pass() ? "PASS" : "FAIL";
  if (!r.cmp.pass()) r.reason = r.cmp.summary();
  r.ms = fs::time_launches(launch, {o.warmup, o.iters, o.flush_l2}).median_ms;
}

std::vector<Cell> error_cells(const Row& r) {
  return {{"max_abs_err", num(r.cmp.max_abs_err), "max err", sci(r.cmp.max_abs_err), 11},
          {"rel_fro_err", num(r.cmp.rel_fro_err)},
          {"max_lse_err", num(r.cmp.max_lse_err)}};
}

template <>
struct Session<fs::Problem> {
  static constexpr const char* mode = "";
  static fs::Problem problem(const fs::RunnerOptions& o) { return fs::problem_from(o); }
  static bool runs(const fs::Step& s) { return s.forward.present(); }
  static std::string static_refusal(const fs::Step& s, const fs::Problem& p, const fs::RunnerOptions&) {
    return fs::static_refusal(s, p);
  }
  static fs::Plan plan(const fs::Step& s, const fs::Problem& p, const fs::DeviceInfo& dev) {
    return fs::plan_on_device(s, p, dev);
  }

  const fs::Problem p;
  const fs::RunnerOptions& o;
  fs::Workload w{p, o.seed};
  fs::GpuReference gpu = {};
  fs::Reference ref = {};
  const double flops = fs::attention_flops(p);

  std::string shape() const { return fs::describe(p) + ", " + fixed(flops / 1e9, 1) + " GFLOP"; }
  double reference_cost() const { return fs::reference_cpu_cost(p); }
  void make_reference() { ref = fs::make_reference(w, gpu); }
  void measure(Row& r, const Launch& launch) {
    check_and_time(r, launch, w, ref, o);
    r.rate = fs::tflops(flops, r.ms);
  }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    const fs::Prepared prepared(s, p, plan);
    const fs::Tensors t = w.tensors();
    measure(r, [&](cudaStream_t st) { prepared.launch(t, st); });
  }
  void add_baseline(std::vector<Row>& rows) {
    Row r{.id = "cublas", .lesson = kBaselineLesson};
    const fs::Tensors t = w.tensors();
    measure(r, [&](cudaStream_t st) { gpu.run(p, t, nullptr, st); });
    rows.push_back(r);
  }
  static void finish(std::vector<Row>& rows) {  // "x 01" and "x prev" by the ladder's one rule (fs::speedups)
    std::vector<std::string> ids;
    std::vector<double> ms;
    for (const Row& r : rows) ids.push_back(r.id), ms.push_back(r.timed() ? r.ms : 0.0);
    const std::vector<fs::Speedup> x = fs::speedups(ids, ms);
    for (size_t i = 0; i < rows.size(); ++i) rows[i].x_step01 = x[i].x_step01, rows[i].x_prev = x[i].x_prev;
  }
  std::string title() const { return shape() + " | " + timing_note(o) + " | x = speed-up (time ratio)"; }
  std::string json() const {
    return ",\n  \"problem\": " + problem_json(p, ", \"softmax_scale\": " + num(p.softmax_scale) + ", \"flops\": " + num(flops));
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
struct Session<fs::DecodeProblem> {
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
  double reference_cost() const { return fs::reference_cpu_cost(p, w.lengths()); }
  void make_reference() { ref = fs::make_reference(w, gpu); }
  void measure(Row& r, const Launch& launch) {
    check_and_time(r, launch, w, ref, o);
    r.rate = r.ms > 0 ? gb / (r.ms * 1e-3) : 0;
    r.hbm_pct = o.hbm_tbs > 0 ? 100 * r.rate / (o.hbm_tbs * 1e3) : 0;
  }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    const fs::DecodeTensors t = w.tensors();
    const fs::Tensors ft{t.q, t.k_cache, t.v_cache, t.o, t.lse};  // the forward entry's view of them
    r.splits = plan.splits;
    if (s.decode.present()) {
      const fs::Prepared prepared(s, p, plan);
      measure(r, [&](cudaStream_t st) { prepared.launch(t, st); });
    } else {
      const fs::Prepared prepared(s, p.attention, plan);
      measure(r, [&](cudaStream_t st) { prepared.launch(ft, st); });
    }
  }
  void add_baseline(std::vector<Row>& rows) {
    if (!forward_refusal(p, o.ragged).empty()) return;
    Row r{.id = "cublas", .lesson = kBaselineLesson, .entry = "forward"};
    const fs::DecodeTensors t = w.tensors();
    const fs::Tensors ft{t.q, t.k_cache, t.v_cache, t.o, t.lse};
    measure(r, [&](cudaStream_t st) { gpu.run(p.attention, ft, nullptr, st); });
    rows.push_back(r);
  }
  static void finish(std::vector<Row>&) {}
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
struct Session<fs::BackwardProblem> {
  static constexpr const char* mode = "backward";
  static fs::BackwardProblem problem(const fs::RunnerOptions& o) { return fs::backward_problem_from(o); }
  static bool runs(const fs::Step& s) { return s.backward.present(); }
  static std::string static_refusal(const fs::Step& s, const fs::BackwardProblem& p, const fs::RunnerOptions&) {
    return fs::static_refusal(s, p);
  }
  static fs::Plan plan(const fs::Step& s, const fs::BackwardProblem& p, const fs::DeviceInfo& dev) {
    return fs::plan_on_device(s, p, dev);
  }

  const fs::BackwardProblem p;
  const fs::RunnerOptions& o;
  fs::BackwardWorkload w{p, o.seed};
  fs::GpuReference gpu = {};
  fs::BackwardReferences ref = {};
  const double flops = fs::backward_flops(p);

  std::string shape() const { return fs::describe(p) + ", " + fixed(flops / 1e9, 1) + " GFLOP"; }
  double reference_cost() const { return fs::reference_cpu_cost(p); }
  void make_reference() {
    std::cerr << "exact and with O, P and dS rounded to " << fs::dtype_name(p.attention.dtype) << "...\n";
    ref = fs::make_reference(w, gpu);
  }
  void measure(Row& r, const fs::Step& s, const fs::Plan& plan) {
    const fs::Prepared prepared(s, p, plan);
    const fs::BackwardTensors t = w.tensors();
    const Launch launch = [&](cudaStream_t st) { prepared.launch(t, st); };
    r.grads = fs::launch_and_compare(launch, w, ref);
    r.status = "PASS";
    for (const fs::GradComparison& g : r.grads)
      if (!g.pass()) r.status = "FAIL", r.reason += (r.reason.empty() ? "" : "; ") + g.summary();
    r.ms = fs::time_launches(launch, {o.warmup, o.iters, o.flush_l2}).median_ms;
    r.rate = fs::tflops(flops, r.ms);
  }
  void add_baseline(std::vector<Row>&) {}
  static void finish(std::vector<Row>&) {}
  std::string title() const {
    return fs::describe(p) + " | " + fixed(flops / 1e9, 1) + " GFLOP (2.5 x forward) | " + timing_note(o) +
           " | dQ dK dV = max |err| / bound (" + reference_name(reference_cost()) + " reference; <= 1 passes)";
  }
  std::string json() const {
    return ",\n  \"problem\": " +
           problem_json(p.attention, ", \"softmax_scale\": " + num(p.attention.softmax_scale) + ", \"deterministic\": " +
                                         boolean(p.deterministic) + ", \"flops\": " + num(flops)) +
           ",\n  \"reference\": " + quoted(reference_name(reference_cost()));
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

// The steps --step names, else every step the pass's run takes. Returns 0, or 2 after naming an unknown id.
int select_steps(const fs::RunnerOptions& o, std::vector<const fs::Step*>& selected,
                 const std::function<bool(const fs::Step&)>& by_default) {
  for (const std::string& id : o.steps) {
    const fs::Step* s = fs::find_step(id);
    if (!s) {
      std::cerr << "flash-steps: no step has id '" << id << "' (see flash-steps --list)\n";
      return 2;
    }
    selected.push_back(s);
  }
  if (o.steps.empty())
    for (const fs::Step& s : fs::steps())
      if (by_default(s)) selected.push_back(&s);
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

template <typename Problem>
void print(const Session<Problem>& session, const std::vector<Row>& rows, const fs::RunnerOptions& o,
           const fs::DeviceInfo& dev, const std::string& date) {
  using S = Session<Problem>;
  Row blank;  // its cells name the columns
  for (const char* name : {"dQ", "dK", "dV"}) blank.grads.push_back(fs::GradComparison{.name = name});
  const std::vector<Cell> columns = S::cells(blank);
  if (o.format == fs::OutputFormat::json) {
    std::cout << "{\n  \"tool\": \"flash-steps\",\n" << (*S::mode ? "  \"mode\": " + quoted(S::mode) + ",\n" : "")
              << "  \"commit\": \"" << FLASH_STEPS_COMMIT << "\",\n  \"date\": \"" << date << "\",\n  \"device\": "
              << quoted(fs::describe(dev)) << session.json() << ",\n  \"timing\": {\"iters\": " << o.iters
              << ", \"warmup\": " << o.warmup << ", \"l2_flush\": " << boolean(o.flush_l2)
              << ", \"statistic\": \"median\"},\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::cout << "    {\"id\": " << quoted(r.id) << ", \"status\": " << quoted(r.status);
      for (const Cell& c : S::tags(r)) std::cout << ", \"" << c.key << "\": " << quoted(c.value);
      std::cout << ", \"lesson\": " << quoted(r.lesson) << ", \"reason\": " << quoted(r.reason);
      if (r.timed())
        for (const Cell& c : S::cells(r)) std::cout << ", \"" << c.key << "\": " << c.value;
      std::cout << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    std::cout << "  ]\n}\n";
  } else if (o.format == fs::OutputFormat::csv) {
    std::cout << "id,status";
    for (const Cell& c : S::tags(blank)) std::cout << "," << c.key;
    for (const Cell& c : columns) std::cout << "," << c.key;
    std::cout << ",reason\n";
    for (const Row& r : rows) {
      std::cout << r.id << "," << r.status;
      for (const Cell& c : S::tags(r)) std::cout << "," << c.value;
      if (r.timed())
        for (const Cell& c : S::cells(r)) std::cout << "," << c.value;
      else
        std::cout << std::string(columns.size(), ',');
      std::string reason = r.reason;
      std::replace_if(reason.begin(), reason.end(), [](char c) { return c == ',' || c == '\n'; }, ';');
      std::cout << "," << reason << "\n";
    }
  } else {
    std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
              << session.title() << "\n\n"
              << std::left << std::setw(id_width()) << "step" << std::setw(10) << "result" << std::right;
    for (const Cell& c : columns)
      if (c.width) std::cout << std::setw(c.width) << c.header;
    std::cout << "  " << std::left << "lesson\n";
    for (const Row& r : rows) {
      std::cout << std::left << std::setw(id_width()) << r.id << std::setw(10) << r.status << std::right;
      const std::vector<Cell> cells = S::cells(r);
      for (size_t i = 0; i < columns.size(); ++i)
        if (columns[i].width) std::cout << std::setw(columns[i].width) << (r.timed() ? cells[i].text : "-");
      std::cout << "  " << (r.entry == "forward" ? "[forward entry] " : "") << r.lesson << "\n";
      if (!r.reason.empty()) std::cout << std::string(size_t(id_width()), ' ') << r.reason << "\n";
    }
  }
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
  if (const std::string why = fs::validate(p); !why.empty()) {
    std::cerr << "flash-steps: " << why << "\n";
    return 2;
  }
  std::vector<const fs::Step*> selected;
  if (const int status = select_steps(o, selected, S::runs)) return status;
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
  S session{p, o};
  std::cerr << (*S::mode == 'd' ? "decoding problem: " : "problem: ") << session.shape() << "; timing: median of "
            << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed before each" : "") << "\nreference: "
            << reference_name(session.reference_cost()) << (*S::mode == 'b' ? ", " : "...\n");
  session.make_reference();

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
    session.add_baseline(rows);
  } catch (const fs::Error& e) {
    rows.push_back(Row{.id = "cublas", .lesson = kBaselineLesson, .status = "ERROR", .reason = e.what()});
  }
  S::finish(rows);
  print(session, rows, o, dev, date);
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

// `flash-steps explain` (or `banks`): every selected step's explanation (Step::explain), no GPU needed.
int explain_steps(const fs::RunnerOptions& o) {
  for (const fs::Step& s : fs::steps()) {
    if (!o.steps.empty() && std::find(o.steps.begin(), o.steps.end(), s.id) == o.steps.end()) continue;
    if (!s.explain) continue;
    std::cout << "== " << s.id << ": " << s.lesson << "\n\n";
    s.explain(std::cout);
    std::cout << "\n";
  }
  return 0;
}

// `flash-steps resources [--backward]`: for every selected step, each kernel its plan launches
// (Plan::kernels) with what the CUDA runtime says of it: registers, shared and local memory, and how
// many blocks an SM holds at the plan's block size and dynamic shared memory.
template <typename Problem>
int resources(const fs::RunnerOptions& o, const Problem& p, const fs::Problem& shape) {
  if (const std::string why = fs::validate(p); !why.empty()) {
    std::cerr << "flash-steps: " << why << "\n";
    return 2;
  }
  std::vector<const fs::Step*> selected;
  if (const int status = select_steps(o, selected, Session<Problem>::runs)) return status;
  if (const int status = need_gpu()) return status;
  const fs::DeviceInfo dev = fs::current_device();
  const std::string pass = *Session<Problem>::mode ? Session<Problem>::mode : "forward", date = utc_now();
  const bool json = o.format == fs::OutputFormat::json;
  if (json)
    std::cout << "{\n  \"tool\": \"flash-steps resources\",\n  \"commit\": \"" << FLASH_STEPS_COMMIT
              << "\",\n  \"date\": \"" << date << "\",\n  \"device\": " << quoted(fs::describe(dev))
              << ",\n  \"compute_capability\": " << dev.compute_capability << ",\n  \"problem\": "
              << problem_json(shape, "") << ",\n  \"pass\": " << quoted(pass) << ",\n  \"steps\": [\n";
  else
    std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
              << fs::describe(shape) << (pass == "forward" ? "" : ", " + pass + " pass")
              << " | per kernel each step launches: registers and local memory per thread, "
              << "shared memory per block, occupancy = resident warps per SM / the SM's limit\n";
  bool ok = true;
  for (size_t i = 0; i < selected.size(); ++i) {
    const fs::Step& s = *selected[i];
    std::string status = "ok", reason;
    std::vector<fs::KernelResources> kernels;
    try {
      const fs::Plan plan = fs::plan(s, p, dev);
      if (!plan.accepted()) status = "refused", reason = plan.refusal;
      for (const fs::KernelLaunch& k : plan.kernels) kernels.push_back(fs::kernel_resources(k));
    } catch (const fs::Error& e) {
      status = "error", reason = e.what(), kernels.clear(), ok = false;
    }
    if (json) {
      std::cout << "    {\"id\": " << quoted(s.id) << ", \"dir\": " << quoted(s.dir) << ", \"status\": "
                << quoted(status) << ", \"reason\": " << quoted(reason) << ", \"kernels\": [";
      for (size_t j = 0; j < kernels.size(); ++j) {
        const fs::KernelResources& k = kernels[j];
        std::cout << (j ? ",\n" : "\n") << "      {\"name\": " << quoted(k.name) << ", \"mangled\": "
                  << quoted(k.mangled) << ", \"registers\": " << k.registers << ", \"static_smem\": " << k.static_smem
                  << ", \"local_bytes\": " << k.local_bytes << ", \"dynamic_smem\": " << k.dynamic_smem
                  << ", \"threads\": " << k.threads << ", \"blocks\": " << k.blocks << ", \"blocks_per_sm\": "
                  << k.blocks_per_sm << ", \"warps_per_sm\": " << k.warps_per_sm << ", \"max_warps_per_sm\": "
                  << k.max_warps_per_sm << ", \"occupancy\": " << k.occupancy() << "}";
      }
      std::cout << (kernels.empty() ? "]}" : "\n    ]}") << (i + 1 < selected.size() ? "," : "") << "\n";
      continue;
    }
    std::cout << "\n== " << s.id << ": " << s.lesson << "\n";
    if (status != "ok" || kernels.empty()) {
      std::cout << "   " << (status != "ok" ? status + ": " + reason : "this step lists no kernels (Plan::kernels is empty)")
                << "\n";
      continue;
    }
    std::cout << std::right << std::setw(8) << "regs" << std::setw(8) << "local" << std::setw(12) << "static smem"
              << std::setw(12) << "dyn smem" << std::setw(9) << "threads" << std::setw(10) << "blocks" << std::setw(11)
              << "blocks/SM" << std::setw(11) << "occupancy" << "  kernel\n";
    for (const fs::KernelResources& k : kernels)
      std::cout << std::setw(8) << k.registers << std::setw(8) << k.local_bytes << std::setw(12) << k.static_smem
                << std::setw(12) << k.dynamic_smem << std::setw(9) << k.threads << std::setw(10) << k.blocks
                << std::setw(11) << k.blocks_per_sm << std::setw(11) << fixed(100 * k.occupancy(), 0) + " %" << "  "
                << fs::short_kernel_name(k.name) << "\n";
  }
  if (json) std::cout << "  ]\n}\n";
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::ParsedArgs a = fs::parse_runner_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!a.error.empty()) {
    std::cerr << "flash-steps: " << a.error << "\n";
    return 2;
  }
  const fs::RunnerOptions& o = a.options;
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
