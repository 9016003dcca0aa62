// flash_steps_bench: every registered step over the benchmark sweep, as a Google Benchmark program,
// for a user who has a GPU and a C++ toolchain but not Python or PyTorch. One benchmark per step ×
// shape, timed with CUDA events (manual time), the L2 flushed before every launch, TFLOP/s as a
// counter, and repetitions whose spread (stddev, min, max) is reported. The shapes are the sweep of
// common/sweep.h: batch · seqlen = 16384 tokens and heads · head_dim = 2048 in every shape, so every
// shape moves the same Q/K/V bytes (16 heads at head_dim 128, 32 at 64).
//
//   flash_steps_bench                 the quick shapes (seqlen 1k, 2k, 4k; head_dim 128; fp16), causal
//                                     and not, 3 repetitions
//   flash_steps_bench --quick         the same shapes, one repetition: a one-minute look
//   flash_steps_bench --sweep         the full sweep: seqlen 512 … 16k × head_dim 128, 64 × causal off,
//                                     on × fp16, bf16
//   --max-launch-ms X                 skip a (step, shape) whose one launch takes, or would take, more
//                                     than X ms (default 100): the slow early steps at long sequences
//   FLASH_STEPS_BENCH_FILTER=07 ...   only the steps whose id starts with 07
//
// Nothing is written unless asked: --benchmark_out=FILE --benchmark_out_format=json saves the results.
// Every Google Benchmark flag works (--benchmark_filter, --benchmark_repetitions=1, ...). Without a
// usable GPU it says why and exits with status 77 before registering anything.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/forward/check.h"
#include "common/harness/sweep.h"
#include "common/harness/timing.h"
#include "version.h"

namespace {

constexpr int kNoGpuExitCode = 77;  // "skipped", as ctest and the GPU tests count it

struct Mode {
  std::vector<fs::Problem> problems;  // cheapest first
  int repetitions;
  double min_time_s;
};

Mode make_mode(const std::string& name) {
  const fs::Sweep sweep = fs::sweep(name != "sweep");
  Mode m{{}, name == "quick" ? 1 : 3, name == "quick" ? 0.05 : name == "sweep" ? 0.1 : 0.2};
  for (int64_t d : sweep.head_dims)
    for (bool causal : {false, true})
      for (fs::DType dt : sweep.dtypes)
        for (int64_t n : sweep.seqlens) {
          int64_t batch = 0, heads = 0;
          const std::string why = fs::sweep_shape(fs::kSweepTokens, n, d, batch, heads);
          if (!why.empty()) throw fs::Error("the sweep of common/sweep.h: " + why);
          m.problems.push_back(fs::make_problem(batch, n, n, heads, heads, d, dt, causal));
        }
  // Cheapest first: a step's later, larger shapes are then judged from its measured speed.
  std::stable_sort(m.problems.begin(), m.problems.end(), [](const fs::Problem& a, const fs::Problem& b) {
    return fs::attention_flops(a) < fs::attention_flops(b);
  });
  return m;
}

double g_max_launch_ms = 100;

// The last launch measured for each step: its FLOPs and milliseconds.
struct LastLaunch {
  double flops = 0, ms = 0;
};
std::map<std::string, LastLaunch>& last_launches() {
  static std::map<std::string, LastLaunch> m;
  return m;
}

std::string fixed1(double x) {
  std::ostringstream m;
  m.setf(std::ios::fixed);
  m.precision(1);
  m << x;
  return m.str();
}

void bench_step(benchmark::State& state, const fs::Step* step, fs::Problem p) {
  try {
    const fs::DeviceInfo dev = fs::current_device();
    const fs::Plan plan = fs::plan(*step, p, dev);
    if (!plan.accepted()) throw fs::Error("refused: " + plan.refusal);
    const double flops = fs::attention_flops(p);
    LastLaunch& last = last_launches()[step->id];
    // Launch time scales with the FLOPs for every step, so a shape whose launch would be too slow is
    // skipped before anything runs.
    if (last.ms > 0 && last.ms * flops / last.flops > g_max_launch_ms)
      throw fs::Error("skipped: a launch would take about " + fixed1(last.ms * flops / last.flops) +
                      " ms (scaled by FLOPs from the last shape measured), over --max-launch-ms " +
                      fixed1(g_max_launch_ms));
    fs::Workload w(p, 1);
    const fs::Tensors t = w.tensors();
    const fs::Prepared prepared(*step, p, plan);
    const auto launch = [&](cudaStream_t s) { prepared.launch(t, s); };
    launch(nullptr);  // warm-up: module load, first-touch of the buffers
    CHECK_CUDA(cudaDeviceSynchronize());
    const double probe_ms = fs::time_launches(launch, fs::TimingOptions{0, 1, true}).median_ms;
    last = LastLaunch{flops, probe_ms};
    if (probe_ms > g_max_launch_ms)
      throw fs::Error("skipped: one launch took " + fixed1(probe_ms) + " ms, over --max-launch-ms " +
                      fixed1(g_max_launch_ms));
    double total_ms = 0;
    for (auto _ : state) {
      const fs::Timing tm = fs::time_launches(launch, fs::TimingOptions{0, 1, true});
      state.SetIterationTime(tm.median_ms * 1e-3);
      total_ms += tm.median_ms;
    }
    const double tflops = fs::tflops(flops, total_ms / double(state.iterations()));
    state.counters["TFLOP/s"] = tflops;
  } catch (const fs::Error& e) {
    state.SkipWithError(e.what());
    for (auto _ : state) {
    }
  }
}

double statistic_min(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double statistic_max(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first; the rest goes to Google Benchmark, after the defaults of the mode.
  std::string mode_name = "default";
  std::vector<std::string> ours;  // the Google Benchmark flags we add, kept alive for argv
  bool reps_given = false, display_given = false, help = false;
  std::vector<char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sweep" || a == "--quick") {
      mode_name = a.substr(2);
    } else if (a == "--max-launch-ms" || a.rfind("--max-launch-ms=", 0) == 0) {
      const std::string value = a.size() > 15 ? a.substr(16) : (i + 1 < argc ? argv[++i] : "");
      char* end = nullptr;
      g_max_launch_ms = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(g_max_launch_ms > 0)) {
        std::cerr << "flash_steps_bench: --max-launch-ms expects a number of milliseconds greater than 0, got '"
                  << value << "'\n";
        return 2;
      }
    } else {
      help = help || a == "--help" || a == "-h";
      reps_given = reps_given || a.rfind("--benchmark_repetitions=", 0) == 0;
      display_given = display_given || a.rfind("--benchmark_display_aggregates_only", 0) == 0;
      args.push_back(argv[i]);
    }
  }
  if (help) {  // Google Benchmark prints its own flags after these
    std::cout << "flash_steps_bench [--quick | --sweep] [--max-launch-ms X] [Google Benchmark flags]\n"
                 "  (default) the quick shapes, causal and not, 3 repetitions\n"
                 "  --quick   the same shapes, one repetition\n"
                 "  --sweep   seqlen 512 ... 16k x head_dim 128, 64 x causal off, on x fp16, bf16\n"
                 "  --max-launch-ms X  skip a (step, shape) whose launch takes, or would take, more than X ms\n"
                 "  FLASH_STEPS_BENCH_FILTER=ID  only the steps whose id starts with ID\n"
                 "  nothing is written unless --benchmark_out=FILE is given\n\n";
  } else if (const std::string why = fs::cuda_unavailable_reason(); !why.empty()) {
    std::cerr << "flash_steps_bench: " << why << "; the benchmarks need an NVIDIA GPU (sm_80 or newer)\n";
    return kNoGpuExitCode;
  }
  const Mode mode = make_mode(mode_name);
  if (!reps_given) ours.push_back("--benchmark_repetitions=" + std::to_string(mode.repetitions));
  if (!display_given && mode.repetitions > 1) ours.push_back("--benchmark_display_aggregates_only=true");
  for (std::string& f : ours) args.push_back(f.data());

  const char* filter = std::getenv("FLASH_STEPS_BENCH_FILTER");
  for (const fs::Step& s : fs::steps()) {
    if (!s.forward.present() || (filter && s.id.rfind(filter, 0) != 0)) continue;  // the forward pass only
    for (const fs::Problem& p : mode.problems)
      benchmark::RegisterBenchmark(("step" + s.id + "/" + fs::describe(p)).c_str(), bench_step, &s, p)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond)
          ->MinTime(mode.min_time_s)
          ->ComputeStatistics("min", statistic_min)
          ->ComputeStatistics("max", statistic_max);
  }
  benchmark::AddCustomContext("flash_steps_commit", FLASH_STEPS_COMMIT);
  benchmark::AddCustomContext("flash_steps_mode", mode_name);
  benchmark::AddCustomContext("flash_steps_max_launch_ms", fixed1(g_max_launch_ms));
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
