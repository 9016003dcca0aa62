// flash-steps: checks every registered step against the reference on one problem, times it, and
// prints the ladder; with --decode (or --page-size, --ragged, ...) a decoding problem, in GB/s of K
// and V read; with --backward the backward pass of the steps that have one. `flash-steps --help`
// lists the flags.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/cli.h"
#include "common/decode_workload.h"
#include "common/kernel_resources.h"
#include "common/timing.h"
#include "version.h"

namespace {

struct Row {
  std::string id, lesson;
  std::string status;  // PASS, FAIL, REFUSED, ERROR
  std::string reason;  // why it was refused, or the error
  double ms = 0, tflops = 0, x_step01 = 0, x_prev = 0;
  double gbs = 0, hbm_pct = 0;  // decoding: GB/s of K and V read, and % of --hbm-tbs
  int splits = 0;               // decoding: the plan's split of the keys (0: not planned)
  std::string entry;            // decoding: "decode" (the step's decoding entry) or "forward"
  fs::Comparison cmp;
  std::vector<fs::GradComparison> grads;  // backward: dQ, dK, dV
  bool timed() const { return status == "PASS" || status == "FAIL"; }
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

std::string fixed(double x, int digits) {
  std::ostringstream m;
  m << std::fixed << std::setprecision(digits) << x;
  return m.str();
}

// Width of the id column: the longest step id plus two spaces.
int id_width() {
  size_t w = std::string("cublas").size();
  for (const fs::Step& s : fs::steps()) w = std::max(w, s.id.size());
  return int(w) + 2;
}

// The problems a step runs: "forward", "forward+decode", "backward", ...
std::string passes(const fs::Step& s) {
  std::string out;
  for (const auto& [has, name] : {std::pair{s.has_forward(), "forward"}, std::pair{s.decode.present(), "decode"},
                                  std::pair{s.backward.present(), "backward"}})
    if (has) out += (out.empty() ? "" : "+") + std::string(name);
  return out;
}

int list_steps() {
  std::cout << std::left << std::setw(id_width()) << "id" << std::setw(8) << "min sm" << std::setw(17) << "runs"
            << "lesson\n";
  for (const fs::Step& s : fs::steps())
    std::cout << std::setw(id_width()) << s.id << std::setw(8) << s.min_compute_capability << std::setw(17)
              << passes(s) << s.lesson << "\n";
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

void print_table(const std::vector<Row>& rows) {
  std::cout << std::left << std::setw(id_width()) << "step" << std::setw(10) << "result" << std::right << std::setw(10)
            << "ms" << std::setw(10) << "TFLOP/s" << std::setw(10) << "x 01" << std::setw(10) << "x prev"
            << std::setw(11) << "max err" << "  " << std::left << "lesson\n";
  for (const Row& r : rows) {
    std::cout << std::left << std::setw(id_width()) << r.id << std::setw(10) << r.status << std::right;
    if (r.timed()) {
      std::cout << std::setw(10) << fixed(r.ms, 3) << std::setw(10) << fixed(r.tflops, 2) << std::setw(10)
                << (r.x_step01 > 0 ? fixed(r.x_step01, 2) : "-") << std::setw(10)
                << (r.x_prev > 0 ? fixed(r.x_prev, 2) : "-") << std::setw(11) << std::scientific
                << std::setprecision(2) << r.cmp.max_abs_err << std::defaultfloat;
    } else {
      std::cout << std::setw(10) << "-" << std::setw(10) << "-" << std::setw(10) << "-" << std::setw(10) << "-"
                << std::setw(11) << "-";
    }
    std::cout << "  " << r.lesson << "\n";
    if (!r.reason.empty()) std::cout << std::string(size_t(id_width()), ' ') << r.reason << "\n";
  }
}

void print_json(const std::vector<Row>& rows, const fs::Problem& p, const fs::DeviceInfo& dev,
                const std::string& date, const fs::RunnerOptions& o) {
  std::cout << "{\n  \"tool\": \"flash-steps\",\n  \"commit\": \"" << FLASH_STEPS_COMMIT << "\",\n  \"date\": \"" << date
            << "\",\n  \"device\": \"" << json_escape(fs::describe(dev)) << "\",\n  \"problem\": {\"batch\": " << p.batch
            << ", \"seqlen_q\": " << p.seqlen_q << ", \"seqlen_k\": " << p.seqlen_k << ", \"heads_q\": " << p.heads_q
            << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": " << p.head_dim << ", \"dtype\": \""
            << fs::dtype_name(p.dtype) << "\", \"causal\": " << (p.causal ? "true" : "false")
            << ", \"softmax_scale\": " << p.softmax_scale << ", \"flops\": " << fs::attention_flops(p)
            << "},\n  \"timing\": {\"iters\": " << o.iters << ", \"warmup\": " << o.warmup
            << ", \"l2_flush\": " << (o.flush_l2 ? "true" : "false") << ", \"statistic\": \"median\"},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::cout << "    {\"id\": \"" << r.id << "\", \"status\": \"" << r.status << "\", \"lesson\": \""
              << json_escape(r.lesson) << "\", \"reason\": \"" << json_escape(r.reason) << "\"";
    if (r.timed())
      std::cout << ", \"ms\": " << r.ms << ", \"tflops\": " << r.tflops << ", \"x_step01\": " << r.x_step01
                << ", \"x_prev\": " << r.x_prev << ", \"max_abs_err\": " << r.cmp.max_abs_err
                << ", \"rel_fro_err\": " << r.cmp.rel_fro_err << ", \"max_lse_err\": " << r.cmp.max_lse_err;
    std::cout << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  std::cout << "  ]\n}\n";
}

void print_csv(const std::vector<Row>& rows) {
  std::cout << "id,status,ms,tflops,x_step01,x_prev,max_abs_err,rel_fro_err,reason\n";
  for (const Row& r : rows) {
    std::cout << r.id << "," << r.status << ",";
    if (r.timed())
      std::cout << r.ms << "," << r.tflops << "," << r.x_step01 << "," << r.x_prev << "," << r.cmp.max_abs_err << ","
                << r.cmp.rel_fro_err;
    else
      std::cout << ",,,,,";
    std::string reason = r.reason;
    for (char& c : reason)
      if (c == ',' || c == '\n') c = ';';
    std::cout << "," << reason << "\n";
  }
}

// "x 01" and "x prev" by the ladder's one rule (fs::speedups, common/registry.h).
void set_speedups(std::vector<Row>& rows) {
  std::vector<std::string> ids;
  std::vector<double> ms;
  for (const Row& r : rows) {
    ids.push_back(r.id);
    ms.push_back(r.timed() ? r.ms : 0.0);
  }
  const std::vector<fs::Speedup> x = fs::speedups(ids, ms);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].x_step01 = x[i].x_step01;
    rows[i].x_prev = x[i].x_prev;
  }
}

bool runs_forward(const fs::Step& s) { return s.has_forward(); }
bool runs_backward(const fs::Step& s) { return s.backward.present(); }

// The steps the options select: those named by --step, else every step the run applies to
// (`by_default`: the forward run takes the steps with a forward pass, the backward run those with a
// backward pass). Returns 0, or 2 after naming an unknown id.
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

// The exit status of a run whose first `selected` rows are the steps' (a baseline row may follow): 0
// when every row passed or was refused, 1 when one failed or errored, or when every step refused the
// problem (said on stderr).
int exit_status(const std::vector<Row>& rows, size_t selected, const std::string& problem) {
  bool ok = true;
  for (const Row& r : rows) ok = ok && (r.status == "PASS" || r.status == "REFUSED");
  const bool any_step_ran = std::any_of(rows.begin(), rows.begin() + std::ptrdiff_t(selected),
                                        [](const Row& r) { return r.status != "REFUSED"; });
  if (!any_step_ran) {
    std::cerr << "flash-steps: every selected step refused " << problem << " on this GPU; nothing was checked\n";
    return 1;
  }
  return ok ? 0 : 1;
}

// A run that checks nothing is a failure, said before the GPU is looked at when no device is needed to
// know it: every selected step refuses `problem` by its static limits (`static_refusal`). Then a GPU
// must be there. Returns 0, or 1 after printing why not.
int check_runnable(const std::vector<const fs::Step*>& selected, const std::string& problem,
                   const std::function<std::string(const fs::Step&)>& static_refusal) {
  std::vector<std::string> static_refusals;
  for (const fs::Step* s : selected)
    if (const std::string r = static_refusal(*s); !r.empty()) static_refusals.push_back(s->id + ": " + r);
  if (static_refusals.size() == selected.size()) {
    for (const std::string& r : static_refusals) std::cerr << "  " << r << "\n";
    std::cerr << "flash-steps: every selected step refuses " << problem << "; nothing was checked\n";
    return 1;
  }
  if (const std::string why = fs::cuda_unavailable_reason(); !why.empty()) {
    std::cerr << "flash-steps: " << why << "; the kernels need an NVIDIA GPU (sm_80 or newer). "
              << "`flash-steps --list` works without one.\n";
    return 1;
  }
  return 0;
}

// The problem and the steps the options select, and a GPU to run them on. Returns 0, or the exit
// status after printing why not: 2 for bad input (refused before the GPU is looked at), 1 when nothing
// would be checked or there is no GPU.
int prepare(const fs::RunnerOptions& o, fs::Problem& p, std::vector<const fs::Step*>& selected) {
  p = fs::problem_from(o);
  const std::string invalid = fs::validate(p);
  if (!invalid.empty()) {
    std::cerr << "flash-steps: " << invalid << "\n";
    return 2;
  }
  if (const int status = select_steps(o, selected, runs_forward)) return status;
  return check_runnable(selected, fs::describe(p), [&](const fs::Step& s) { return fs::check_static(s, p); });
}

int run(const fs::RunnerOptions& o) {
  fs::Problem p;
  std::vector<const fs::Step*> selected;
  if (const int status = prepare(o, p, selected)) return status;

  const fs::DeviceInfo dev = fs::current_device();
  const std::string date = utc_now();
  const double flops = fs::attention_flops(p);
  std::cerr << "flash-steps " << FLASH_STEPS_COMMIT << " on " << fs::describe(dev) << ", " << date << "\n"
            << "problem: " << fs::describe(p) << ", " << fixed(flops / 1e9, 1) << " GFLOP; timing: median of "
            << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed before each" : "") << "\n";

  fs::Workload w(p, o.seed);
  fs::GpuReference gpu;
  std::cerr << "reference: " << (fs::reference_cpu_cost(p) <= fs::kCpuReferenceMaxCost ? "fp64 CPU" : "fp32 GPU (cuBLAS)")
            << "...\n";
  const fs::Reference ref = fs::make_reference(w, gpu);
  const fs::TimingOptions topt{o.warmup, o.iters, o.flush_l2};

  std::vector<Row> rows;
  const size_t total = selected.size() + (o.baseline ? 1 : 0);
  auto progress = [&](size_t k, const std::string& id, const char* what) {
    std::cerr << "[" << k << "/" << total << "] " << id << ": " << what << "\n";
  };
  // Checks one implementation against the reference (outputs poisoned first), then times it.
  auto check_and_time = [&](Row& r, const std::function<void(cudaStream_t)>& launch) {
    r.cmp = fs::launch_and_compare(launch, w, ref);
    r.status = r.cmp.pass() ? "PASS" : "FAIL";
    if (!r.cmp.pass()) r.reason = r.cmp.summary();
    r.ms = fs::time_launches(launch, topt).median_ms;
    r.tflops = fs::tflops(flops, r.ms);
  };
  const fs::Tensors t = w.tensors();
  for (size_t k = 0; k < selected.size(); ++k) {
    const fs::Step& s = *selected[k];
    Row r;
    r.id = s.id;
    r.lesson = s.lesson;
    const fs::Plan plan = fs::plan_for(s, p, dev);
    if (!plan.accepted()) {
      r.status = "REFUSED";
      r.reason = plan.refusal;
      progress(k + 1, s.id, "refused");
    } else {
      progress(k + 1, s.id, "checking against the reference, then timing");
      try {
        const fs::PreparedStep prepared(s, p, plan);
        check_and_time(r, [&](cudaStream_t st) { prepared.launch(t, st); });
      } catch (const fs::Error& e) {
        r.status = "ERROR";
        r.reason = e.what();
      }
    }
    rows.push_back(r);
  }
  if (o.baseline) {
    Row r;
    r.id = "cublas";
    r.lesson = "unfused baseline: cuBLAS S = QKᵀ (fp32 out), softmax kernel, fp32 P·V; the GPU reference";
    progress(total, r.id, "checking against the reference, then timing");
    try {
      check_and_time(r, [&](cudaStream_t st) { gpu.run(p, t, nullptr, st); });
    } catch (const fs::Error& e) {
      r.status = "ERROR";
      r.reason = e.what();
    }
    rows.push_back(r);
  }
  set_speedups(rows);

  switch (o.format) {
    case fs::OutputFormat::json: print_json(rows, p, dev, date, o); break;
    case fs::OutputFormat::csv: print_csv(rows); break;
    case fs::OutputFormat::table:
      std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
                << fs::describe(p) << " | " << fixed(flops / 1e9, 1) << " GFLOP | median of " << o.iters
                << " launches" << (o.flush_l2 ? ", L2 flushed" : "") << " | x = speed-up (time ratio)\n\n";
      print_table(rows);
      break;
  }
  return exit_status(rows, selected.size(), fs::describe(p));
}

// ---- decoding problems (--decode) ------------------------------------------------------------------

void print_decode_table(const std::vector<Row>& rows) {
  std::cout << std::left << std::setw(id_width()) << "step" << std::setw(10) << "result" << std::right << std::setw(10)
            << "ms" << std::setw(10) << "GB/s" << std::setw(8) << "% HBM" << std::setw(8) << "splits" << std::setw(11)
            << "max err" << "  " << std::left << "lesson\n";
  for (const Row& r : rows) {
    std::cout << std::left << std::setw(id_width()) << r.id << std::setw(10) << r.status << std::right;
    if (r.timed())
      std::cout << std::setw(10) << fixed(r.ms, 4) << std::setw(10) << fixed(r.gbs, 0) << std::setw(8)
                << (r.hbm_pct > 0 ? fixed(r.hbm_pct, 0) : "-") << std::setw(8) << (r.splits > 0 ? std::to_string(r.splits) : "-")
                << std::setw(11) << std::scientific << std::setprecision(2) << r.cmp.max_abs_err << std::defaultfloat;
    else
      std::cout << std::setw(10) << "-" << std::setw(10) << "-" << std::setw(8) << "-" << std::setw(8) << "-"
                << std::setw(11) << "-";
    std::cout << "  " << (r.entry == "forward" ? "[forward entry] " : "") << r.lesson << "\n";
    if (!r.reason.empty()) std::cout << std::string(size_t(id_width()), ' ') << r.reason << "\n";
  }
}

void print_decode_json(const std::vector<Row>& rows, const fs::DecodeProblem& p, const fs::DecodeWorkload& w,
                       const fs::DeviceInfo& dev, const std::string& date, const fs::RunnerOptions& o) {
  std::cout << "{\n  \"tool\": \"flash-steps\",\n  \"mode\": \"decode\",\n  \"commit\": \"" << FLASH_STEPS_COMMIT
            << "\",\n  \"date\": \"" << date << "\",\n  \"device\": \"" << json_escape(fs::describe(dev))
            << "\",\n  \"problem\": {\"batch\": " << p.batch << ", \"seqlen_q\": " << p.seqlen_q << ", \"seqlen_k\": "
            << p.seqlen_k << ", \"heads_q\": " << p.heads_q << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": "
            << p.head_dim << ", \"dtype\": \"" << fs::dtype_name(p.dtype) << "\", \"causal\": "
            << (p.causal ? "true" : "false") << ", \"page_size\": " << p.page_size << ", \"ragged\": "
            << (o.ragged ? "true" : "false") << ", \"num_splits\": " << p.num_splits << ", \"checked\": "
            << (p.checked ? "true" : "false") << ", \"kv_bytes\": " << w.kv_bytes() << "},\n  \"hbm_tbs\": " << o.hbm_tbs
            << ",\n  \"timing\": {\"iters\": " << o.iters << ", \"warmup\": " << o.warmup << ", \"l2_flush\": "
            << (o.flush_l2 ? "true" : "false") << ", \"statistic\": \"median\"},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::cout << "    {\"id\": \"" << r.id << "\", \"status\": \"" << r.status << "\", \"entry\": \"" << r.entry
              << "\", \"lesson\": \"" << json_escape(r.lesson) << "\", \"reason\": \"" << json_escape(r.reason) << "\"";
    if (r.timed())
      std::cout << ", \"ms\": " << r.ms << ", \"gbs\": " << r.gbs << ", \"hbm_pct\": " << r.hbm_pct
                << ", \"splits\": " << r.splits << ", \"max_abs_err\": " << r.cmp.max_abs_err
                << ", \"rel_fro_err\": " << r.cmp.rel_fro_err << ", \"max_lse_err\": " << r.cmp.max_lse_err;
    std::cout << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  std::cout << "  ]\n}\n";
}

void print_decode_csv(const std::vector<Row>& rows) {
  std::cout << "id,status,entry,ms,gbs,hbm_pct,splits,max_abs_err,rel_fro_err,reason\n";
  for (const Row& r : rows) {
    std::cout << r.id << "," << r.status << "," << r.entry << ",";
    if (r.timed())
      std::cout << r.ms << "," << r.gbs << "," << r.hbm_pct << "," << r.splits << "," << r.cmp.max_abs_err << ","
                << r.cmp.rel_fro_err;
    else
      std::cout << ",,,,,";
    std::string reason = r.reason;
    for (char& c : reason)
      if (c == ',' || c == '\n') c = ';';
    std::cout << "," << reason << "\n";
  }
}

// Why a step without a decoding entry cannot run this decoding problem ("" when it is a forward one).
std::string forward_refusal(const fs::DecodeProblem& p, bool ragged) {
  if (!fs::is_paged(p) && !ragged) return "";
  return std::string("this step has no decoding entry, and with ") +
         (fs::is_paged(p) ? (ragged ? "a paged cache and per-sequence lengths" : "a paged cache")
                          : "per-sequence lengths") +
         " the problem is no forward one (that needs a contiguous cache with every sequence at seqlen_k keys)";
}

// `flash-steps --decode ...`: every selected step on one decoding problem. Steps with a decoding entry
// run it through fs::run_decode; the others through their forward entry when the problem is a forward
// one (contiguous cache, uniform lengths), on the same tensors. Checked against the decoding reference,
// timed, reported in GB/s of K and V read.
int run_decoding(const fs::RunnerOptions& o) {
  const fs::DecodeProblem p = fs::decode_problem_from(o);
  const std::vector<int32_t> lengths = fs::decode_lengths_from(o);
  if (const std::string invalid = fs::validate_decode(p); !invalid.empty()) {
    std::cerr << "flash-steps: " << invalid << "\n";
    return 2;
  }
  const fs::Problem forward = fs::forward_view(p);
  std::vector<const fs::Step*> selected;
  if (const int status = select_steps(o, selected, runs_forward)) return status;
  auto static_refusal = [&](const fs::Step& s) {
    if (s.decode.present()) return fs::check_decode_static(s, p);
    const std::string why = forward_refusal(p, o.ragged);
    return why.empty() ? fs::check_static(s, forward) : why;
  };
  if (const int status = check_runnable(selected, fs::describe(p), static_refusal)) return status;

  const fs::DeviceInfo dev = fs::current_device();
  const std::string date = utc_now();
  fs::DecodeWorkload w(p, lengths, o.seed);
  const double gb = w.kv_bytes() / 1e9;
  const std::string shape = fs::describe(p) + (o.ragged ? ", ragged lengths" : "");
  std::cerr << "flash-steps " << FLASH_STEPS_COMMIT << " on " << fs::describe(dev) << ", " << date << "\n"
            << "decoding problem: " << shape << ", " << fixed(gb, 3) << " GB of K and V; timing: median of "
            << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed before each" : "") << "\n";
  fs::GpuReference gpu;
  std::cerr << "reference: "
            << (fs::reference_cpu_decode_cost(p, lengths) <= fs::kCpuReferenceMaxCost ? "fp64 CPU" : "fp32 GPU (cuBLAS)")
            << "...\n";
  const fs::Reference ref = fs::make_decode_reference(w, gpu);
  const fs::TimingOptions topt{o.warmup, o.iters, o.flush_l2};
  const bool baseline = o.baseline && forward_refusal(p, o.ragged).empty();

  std::vector<Row> rows;
  const size_t total = selected.size() + (baseline ? 1 : 0);
  auto check_and_time = [&](Row& r, const std::function<void(cudaStream_t)>& launch) {
    r.cmp = fs::decode_launch_and_compare(launch, w, ref);
    r.status = r.cmp.pass() ? "PASS" : "FAIL";
    if (!r.cmp.pass()) r.reason = r.cmp.summary();
    r.ms = fs::time_launches(launch, topt).median_ms;
    r.gbs = r.ms > 0 ? gb / (r.ms * 1e-3) : 0;
    r.hbm_pct = o.hbm_tbs > 0 ? 100 * r.gbs / (o.hbm_tbs * 1e3) : 0;
  };
  const fs::DecodeTensors t = w.tensors();
  for (size_t k = 0; k < selected.size(); ++k) {
    const fs::Step& s = *selected[k];
    Row r;
    r.id = s.id;
    r.lesson = s.lesson;
    r.entry = s.decode.present() ? "decode" : "forward";
    std::cerr << "[" << k + 1 << "/" << total << "] " << s.id << ": ";
    try {
      if (s.decode.present()) {
        const fs::Plan plan = fs::plan_decode_for(s, p, dev);
        r.reason = plan.refusal;
        if (plan.accepted()) {
          std::cerr << "checking against the reference, then timing\n";
          const fs::PreparedDecode prepared(s, p, dev);
          r.splits = prepared.plan().splits;
          check_and_time(r, [&](cudaStream_t st) { prepared.launch(t, st); });
        }
      } else {
        const std::string why = forward_refusal(p, o.ragged);
        const fs::Plan plan = why.empty() ? fs::plan_for(s, forward, dev) : fs::Plan{why, 0, 0, 1, {}};
        r.reason = plan.refusal;
        if (plan.accepted()) {
          std::cerr << "checking against the reference, then timing (forward entry)\n";
          const fs::PreparedStep prepared(s, forward, plan);
          r.splits = plan.splits;
          const fs::Tensors ft{t.q, t.k_cache, t.v_cache, t.o, t.lse};
          check_and_time(r, [&](cudaStream_t st) { prepared.launch(ft, st); });
        }
      }
      if (r.status.empty()) {
        r.status = "REFUSED";
        std::cerr << "refused\n";
      }
    } catch (const fs::Error& e) {
      r.status = "ERROR";
      r.reason = e.what();
    }
    rows.push_back(r);
  }
  if (baseline) {
    Row r;
    r.id = "cublas";
    r.entry = "forward";
    r.lesson = "unfused baseline: cuBLAS S = QKᵀ (fp32 out), softmax kernel, fp32 P·V; the GPU reference";
    std::cerr << "[" << total << "/" << total << "] cublas: checking against the reference, then timing\n";
    try {
      const fs::Tensors ft{t.q, t.k_cache, t.v_cache, t.o, t.lse};
      check_and_time(r, [&](cudaStream_t st) { gpu.run(forward, ft, nullptr, st); });
    } catch (const fs::Error& e) {
      r.status = "ERROR";
      r.reason = e.what();
    }
    rows.push_back(r);
  }

  switch (o.format) {
    case fs::OutputFormat::json: print_decode_json(rows, p, w, dev, date, o); break;
    case fs::OutputFormat::csv: print_decode_csv(rows); break;
    case fs::OutputFormat::table:
      std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
                << shape << " | K+V " << fixed(gb, 3) << " GB | median of " << o.iters << " launches"
                << (o.flush_l2 ? ", L2 flushed" : "") << " | GB/s = bytes of K and V read / time"
                << (o.hbm_tbs > 0 ? " | % HBM of " + fixed(o.hbm_tbs, 2) + " TB/s (--hbm-tbs)" : "") << "\n\n";
      print_decode_table(rows);
      break;
  }
  return exit_status(rows, selected.size(), fs::describe(p));
}

// ---- the backward pass (--backward) ----------------------------------------------------------------

// max |err| / bound of one gradient: at most 1 passes.
std::string bound_ratio(const fs::GradComparison& g) {
  if (g.nonfinite > 0) return "nonfinite";
  if (g.bound > 0) return fixed(g.max_abs_err / g.bound, 3);
  return g.max_abs_err == 0 ? "0" : "inf";
}

void print_backward_table(const std::vector<Row>& rows) {
  std::cout << std::left << std::setw(id_width()) << "step" << std::setw(10) << "result" << std::right << std::setw(10)
            << "ms" << std::setw(10) << "TFLOP/s" << std::setw(11) << "dQ" << std::setw(11) << "dK" << std::setw(11)
            << "dV" << "  " << std::left << "lesson\n";
  for (const Row& r : rows) {
    std::cout << std::left << std::setw(id_width()) << r.id << std::setw(10) << r.status << std::right;
    if (r.timed()) {
      std::cout << std::setw(10) << fixed(r.ms, 3) << std::setw(10) << fixed(r.tflops, 2);
      for (const fs::GradComparison& g : r.grads) std::cout << std::setw(11) << bound_ratio(g);
    } else {
      std::cout << std::setw(10) << "-" << std::setw(10) << "-" << std::setw(11) << "-" << std::setw(11) << "-"
                << std::setw(11) << "-";
    }
    std::cout << "  " << r.lesson << "\n";
    if (!r.reason.empty()) std::cout << std::string(size_t(id_width()), ' ') << r.reason << "\n";
  }
}

void print_backward_json(const std::vector<Row>& rows, const fs::BackwardProblem& bp, const fs::DeviceInfo& dev,
                         const std::string& date, const std::string& reference, const fs::RunnerOptions& o) {
  const fs::Problem& p = bp.forward;
  std::cout << "{\n  \"tool\": \"flash-steps\",\n  \"mode\": \"backward\",\n  \"commit\": \"" << FLASH_STEPS_COMMIT
            << "\",\n  \"date\": \"" << date << "\",\n  \"device\": \"" << json_escape(fs::describe(dev))
            << "\",\n  \"problem\": {\"batch\": " << p.batch << ", \"seqlen_q\": " << p.seqlen_q << ", \"seqlen_k\": "
            << p.seqlen_k << ", \"heads_q\": " << p.heads_q << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": "
            << p.head_dim << ", \"dtype\": \"" << fs::dtype_name(p.dtype) << "\", \"causal\": "
            << (p.causal ? "true" : "false") << ", \"softmax_scale\": " << p.softmax_scale << ", \"deterministic\": "
            << (bp.deterministic ? "true" : "false") << ", \"flops\": " << fs::backward_flops(bp)
            << "},\n  \"reference\": \"" << reference << "\",\n  \"timing\": {\"iters\": " << o.iters
            << ", \"warmup\": " << o.warmup << ", \"l2_flush\": " << (o.flush_l2 ? "true" : "false")
            << ", \"statistic\": \"median\"},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::cout << "    {\"id\": \"" << r.id << "\", \"status\": \"" << r.status << "\", \"lesson\": \""
              << json_escape(r.lesson) << "\", \"reason\": \"" << json_escape(r.reason) << "\"";
    if (r.timed()) {
      std::cout << ", \"ms\": " << r.ms << ", \"tflops\": " << r.tflops << ", \"gradients\": [";
      for (size_t j = 0; j < r.grads.size(); ++j) {
        const fs::GradComparison& g = r.grads[j];
        std::cout << (j ? ", " : "") << "{\"name\": \"" << g.name << "\", \"max_abs_err\": " << g.max_abs_err
                  << ", \"ref_err\": " << g.ref_err << ", \"bound\": " << g.bound << ", \"nonfinite\": " << g.nonfinite
                  << ", \"pass\": " << (g.pass() ? "true" : "false") << "}";
      }
      std::cout << "]";
    }
    std::cout << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  std::cout << "  ]\n}\n";
}

void print_backward_csv(const std::vector<Row>& rows) {
  std::cout << "id,status,ms,tflops,dq_err,dq_bound,dk_err,dk_bound,dv_err,dv_bound,reason\n";
  for (const Row& r : rows) {
    std::cout << r.id << "," << r.status << ",";
    if (r.timed()) {
      std::cout << r.ms << "," << r.tflops;
      for (const fs::GradComparison& g : r.grads) std::cout << "," << g.max_abs_err << "," << g.bound;
    } else {
      std::cout << ",,,,,,,";
    }
    std::string reason = r.reason;
    for (char& c : reason)
      if (c == ',' || c == '\n') c = ';';
    std::cout << "," << reason << "\n";
  }
}

// prepare() for the backward problem: the steps with a backward pass (or those --step names).
int prepare_backward(const fs::RunnerOptions& o, fs::BackwardProblem& p, std::vector<const fs::Step*>& selected) {
  p = fs::backward_problem_from(o);
  if (const std::string invalid = fs::validate_backward(p); !invalid.empty()) {
    std::cerr << "flash-steps: " << invalid << "\n";
    return 2;
  }
  if (const int status = select_steps(o, selected, runs_backward)) return status;
  if (selected.empty()) {
    std::cerr << "flash-steps: no registered step has a backward pass; nothing was checked\n";
    return 1;
  }
  return check_runnable(selected, fs::describe(p), [&](const fs::Step& s) { return fs::check_backward_static(s, p); });
}

// `flash-steps --backward ...`: the backward pass of every selected step that has one, on the problem
// the flags describe: dQ, dK, dV checked against the references by the acceptance rule, then timed
// (TFLOP/s by backward_flops).
int run_backward_pass(const fs::RunnerOptions& o) {
  fs::BackwardProblem p;
  std::vector<const fs::Step*> selected;
  if (const int status = prepare_backward(o, p, selected)) return status;

  const fs::DeviceInfo dev = fs::current_device();
  const std::string date = utc_now();
  const double flops = fs::backward_flops(p);
  std::cerr << "flash-steps " << FLASH_STEPS_COMMIT << " on " << fs::describe(dev) << ", " << date << "\n"
            << "problem: " << fs::describe(p) << ", " << fixed(flops / 1e9, 1) << " GFLOP; timing: median of "
            << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed before each" : "") << "\n";
  fs::BackwardWorkload w(p, o.seed);
  const std::string reference =
      fs::reference_cpu_backward_cost(p) <= fs::kCpuReferenceMaxCost ? "fp64 CPU" : "fp32 GPU (cuBLAS)";
  std::cerr << "reference: " << reference << ", exact and with O, P and dS rounded to "
            << fs::dtype_name(p.forward.dtype) << "...\n";
  fs::GpuBackwardReference gpu;
  const fs::BackwardReferences ref = fs::make_backward_references(w, gpu);
  const fs::TimingOptions topt{o.warmup, o.iters, o.flush_l2};

  std::vector<Row> rows;
  const fs::BackwardTensors t = w.tensors();
  for (size_t k = 0; k < selected.size(); ++k) {
    const fs::Step& s = *selected[k];
    Row r;
    r.id = s.id;
    r.lesson = s.lesson;
    std::cerr << "[" << k + 1 << "/" << selected.size() << "] " << s.id << ": ";
    try {
      const fs::Plan plan = fs::plan_backward_for(s, p, dev);
      if (!plan.accepted()) {
        r.status = "REFUSED";
        r.reason = plan.refusal;
        std::cerr << "refused\n";
      } else {
        std::cerr << "checking against the reference, then timing\n";
        const fs::PreparedBackward prepared(s, p, plan);
        const auto launch = [&](cudaStream_t st) { prepared.launch(t, st); };
        r.grads = fs::backward_launch_and_compare(launch, w, ref);
        const bool pass = std::all_of(r.grads.begin(), r.grads.end(), [](const fs::GradComparison& g) { return g.pass(); });
        r.status = pass ? "PASS" : "FAIL";
        for (const fs::GradComparison& g : r.grads)
          if (!g.pass()) r.reason += (r.reason.empty() ? "" : "; ") + g.summary();
        r.ms = fs::time_launches(launch, topt).median_ms;
        r.tflops = fs::tflops(flops, r.ms);
      }
    } catch (const fs::Error& e) {
      r.status = "ERROR";
      r.reason = e.what();
    }
    rows.push_back(r);
  }

  switch (o.format) {
    case fs::OutputFormat::json: print_backward_json(rows, p, dev, date, reference, o); break;
    case fs::OutputFormat::csv: print_backward_csv(rows); break;
    case fs::OutputFormat::table:
      std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
                << fs::describe(p) << " | " << fixed(flops / 1e9, 1) << " GFLOP (2.5 x forward) | median of "
                << o.iters << " launches" << (o.flush_l2 ? ", L2 flushed" : "") << " | dQ dK dV = max |err| / bound ("
                << reference << " reference; <= 1 passes)\n\n";
      print_backward_table(rows);
      break;
  }
  return exit_status(rows, selected.size(), fs::describe(p));
}

// `flash-steps resources [--backward]`: for every selected step that accepts the problem (its
// backward pass with --backward), each kernel its plan launches (Plan::kernels) with what the CUDA
// runtime says of it: registers, shared memory, local memory, and how many blocks an SM holds at the
// plan's block size and dynamic shared memory.
struct StepResources {
  const fs::Step* step;
  std::string status;  // "ok", "refused", "error"
  std::string reason;
  std::vector<fs::KernelResources> kernels;
};

void print_resources_json(const std::vector<StepResources>& all, const fs::Problem& p, bool backward,
                          const fs::DeviceInfo& dev, const std::string& date) {
  std::cout << "{\n  \"tool\": \"flash-steps resources\",\n  \"commit\": \"" << FLASH_STEPS_COMMIT
            << "\",\n  \"date\": \"" << date << "\",\n  \"device\": \"" << json_escape(fs::describe(dev))
            << "\",\n  \"compute_capability\": " << dev.compute_capability << ",\n  \"problem\": {\"batch\": "
            << p.batch << ", \"seqlen_q\": " << p.seqlen_q << ", \"seqlen_k\": " << p.seqlen_k
            << ", \"heads_q\": " << p.heads_q << ", \"heads_kv\": " << p.heads_kv << ", \"head_dim\": "
            << p.head_dim << ", \"dtype\": \"" << fs::dtype_name(p.dtype) << "\", \"causal\": "
            << (p.causal ? "true" : "false") << "},\n  \"pass\": \"" << (backward ? "backward" : "forward")
            << "\",\n  \"steps\": [\n";
  for (size_t i = 0; i < all.size(); ++i) {
    const StepResources& s = all[i];
    std::cout << "    {\"id\": \"" << s.step->id << "\", \"dir\": \"" << s.step->dir << "\", \"status\": \""
              << s.status << "\", \"reason\": \"" << json_escape(s.reason) << "\", \"kernels\": [";
    for (size_t j = 0; j < s.kernels.size(); ++j) {
      const fs::KernelResources& k = s.kernels[j];
      std::cout << (j ? ",\n" : "\n") << "      {\"name\": \"" << json_escape(k.name) << "\", \"mangled\": \""
                << json_escape(k.mangled) << "\", \"registers\": " << k.registers << ", \"static_smem\": "
                << k.static_smem << ", \"local_bytes\": " << k.local_bytes << ", \"dynamic_smem\": "
                << k.dynamic_smem << ", \"threads\": " << k.threads << ", \"blocks\": " << k.blocks
                << ", \"blocks_per_sm\": " << k.blocks_per_sm << ", \"warps_per_sm\": " << k.warps_per_sm
                << ", \"max_warps_per_sm\": " << k.max_warps_per_sm << ", \"occupancy\": " << k.occupancy()
                << "}";
    }
    std::cout << (s.kernels.empty() ? "]}" : "\n    ]}") << (i + 1 < all.size() ? "," : "") << "\n";
  }
  std::cout << "  ]\n}\n";
}

void print_resources_table(const std::vector<StepResources>& all, const fs::Problem& p, bool backward,
                           const fs::DeviceInfo& dev, const std::string& date) {
  std::cout << "flash-steps " << FLASH_STEPS_COMMIT << " | " << fs::describe(dev) << " | " << date << "\n"
            << fs::describe(p) << (backward ? ", backward pass" : "") << " | per kernel each step launches: registers and local memory per thread, "
            << "shared memory per block, occupancy = resident warps per SM / the SM's limit\n";
  for (const StepResources& s : all) {
    std::cout << "\n== " << s.step->id << ": " << s.step->lesson << "\n";
    if (s.status != "ok") {
      std::cout << "   " << s.status << ": " << s.reason << "\n";
      continue;
    }
    if (s.kernels.empty()) {
      std::cout << "   this step lists no kernels (Plan::kernels is empty)\n";
      continue;
    }
    std::cout << std::right << std::setw(8) << "regs" << std::setw(8) << "local" << std::setw(12) << "static smem"
              << std::setw(12) << "dyn smem" << std::setw(9) << "threads" << std::setw(10) << "blocks"
              << std::setw(11) << "blocks/SM" << std::setw(11) << "occupancy" << "  kernel\n";
    for (const fs::KernelResources& k : s.kernels)
      std::cout << std::setw(8) << k.registers << std::setw(8) << k.local_bytes << std::setw(12) << k.static_smem
                << std::setw(12) << k.dynamic_smem << std::setw(9) << k.threads << std::setw(10) << k.blocks
                << std::setw(11) << k.blocks_per_sm << std::setw(11)
                << fixed(100 * k.occupancy(), 0) + " %" << "  " << fs::short_kernel_name(k.name) << "\n";
  }
}

int resources(const fs::RunnerOptions& o) {
  fs::Problem p;
  fs::BackwardProblem bp;
  std::vector<const fs::Step*> selected;
  if (const int status = o.backward ? prepare_backward(o, bp, selected) : prepare(o, p, selected)) return status;
  if (o.backward) p = bp.forward;
  const fs::DeviceInfo dev = fs::current_device();
  std::vector<StepResources> all;
  bool ok = true;
  for (const fs::Step* step : selected) {
    StepResources s{step, "ok", "", {}};
    try {
      const fs::Plan plan = o.backward ? fs::plan_backward_for(*step, bp, dev) : fs::plan_for(*step, p, dev);
      if (!plan.accepted()) {
        s.status = "refused";
        s.reason = plan.refusal;
      } else {
        for (const fs::KernelLaunch& k : plan.kernels) s.kernels.push_back(fs::kernel_resources(k));
      }
    } catch (const fs::Error& e) {
      s.status = "error";
      s.reason = e.what();
      s.kernels.clear();
      ok = false;
    }
    all.push_back(std::move(s));
  }
  if (o.format == fs::OutputFormat::json)
    print_resources_json(all, p, o.backward, dev, utc_now());
  else
    print_resources_table(all, p, o.backward, dev, utc_now());
  return ok ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  const fs::ParsedArgs a = fs::parse_runner_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!a.error.empty()) {
    std::cerr << "flash-steps: " << a.error << "\n";
    return 2;
  }
  try {
    if (a.options.command == "help") {
      std::cout << fs::runner_usage();
      return 0;
    }
    if (a.options.command == "list") return list_steps();
    if (a.options.command == "explain" || a.options.command == "banks") return explain_steps(a.options);
    if (a.options.command == "resources") return resources(a.options);
    if (a.options.backward) return run_backward_pass(a.options);
    return a.options.decode ? run_decoding(a.options) : run(a.options);
  } catch (const std::exception& e) {
    std::cerr << "flash-steps: " << e.what() << "\n";
    return 1;
  }
}
