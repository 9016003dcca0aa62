// One benchmark per registered step × shape, timed with CUDA events (manual time), the L2 flushed
// before every launch, with TFLOP/s and the percentage of the mma.sync ceiling as counters, and
// repetitions whose spread (stddev, min, max) is reported. Without a GPU every benchmark reports an
// error.
//
//   flash_steps_bench                 a few shapes (B·N = 16384 as in ANCHORS.md), fp16 and bf16
//   flash_steps_bench --sweep         seqlen 512 … 16k × head_dim 64, 128 × causal off, on × fp16, bf16
//   flash_steps_bench --quick         a one-minute look: seqlen 1k and 4k, head_dim 128, fp16
//   --max-launch-ms X                 skip a (step, shape) whose one launch takes, or would take, more
//                                     than X ms (default 100): the slow early steps at long sequences
//   FLASH_STEPS_BENCH_FILTER=07 ...   only the steps whose id starts with 07
//
// The JSON goes to bench/results/bench_steps-<UTC date>.json unless --benchmark_out is given. Every
// Google Benchmark flag still works (--benchmark_filter, --benchmark_repetitions=1, ...).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/timing.h"
#include "version.h"

namespace {

struct Shape {
  int64_t batch, seqlen, heads, head_dim;
  bool causal;
};

// B·N = 16384 as in ../shared/ANCHORS.md; heads 16 at d = 128 and 32 at d = 64.
const Shape kShapes[] = {
    {8, 2048, 16, 128, false}, {8, 2048, 16, 128, true}, {4, 4096, 16, 128, false},
    {16, 1024, 32, 64, false}, {2, 2048, 16, 128, false},
};

// The ANCHORS sweep: B·N = 16384 at every seqlen, so each shape moves the same Q/K/V bytes.
Shape anchor_shape(int64_t seqlen, int64_t head_dim, bool causal) {
  return Shape{16384 / seqlen, seqlen, head_dim == 128 ? 16 : 32, head_dim, causal};
}

// mma.sync.m16n8k16 (f16 in, f32 accumulate) from registers only, measured on the H200
// (ANCHORS.md): the ceiling of every step built on mma.sync.
constexpr double kMmaSyncCeilingTflops = 645;

struct Mode {
  std::vector<Shape> shapes;
  std::vector<fs::DType> dtypes;
  int repetitions;
  double min_time_s;
};

Mode make_mode(const std::string& name) {
  Mode m;
  if (name == "sweep") {
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384}) m.shapes.push_back(anchor_shape(n, d, causal));
    m.dtypes = {fs::DType::fp16, fs::DType::bf16};
    m.repetitions = 3;
    m.min_time_s = 0.1;
  } else if (name == "quick") {
    for (bool causal : {false, true})
      for (int64_t n : {1024, 4096}) m.shapes.push_back(anchor_shape(n, 128, causal));
    m.dtypes = {fs::DType::fp16};
    m.repetitions = 1;
    m.min_time_s = 0.05;
  } else {
    m.shapes.assign(std::begin(kShapes), std::end(kShapes));
    m.dtypes = {fs::DType::fp16, fs::DType::bf16};
    m.repetitions = 3;
    m.min_time_s = 0.2;
  }
  // Cheapest first: a step's later, larger shapes are then judged from its measured speed.
  std::stable_sort(m.shapes.begin(), m.shapes.end(), [](const Shape& a, const Shape& b) {
    const auto cost = [](const Shape& s) {
      return double(s.batch) * s.heads * s.seqlen * s.seqlen * s.head_dim / (s.causal ? 2 : 1);
    };
    return cost(a) < cost(b);
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
  const std::string why = fs::cuda_unavailable_reason();
  if (!why.empty()) {
    state.SkipWithError(why.c_str());
    for (auto _ : state) {
    }
    return;
  }
  try {
    const fs::DeviceInfo dev = fs::current_device();
    const fs::Plan plan = fs::plan_for(*step, p, dev);
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
    const fs::PreparedStep prepared(*step, p, plan);
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
    state.counters["%mma.sync"] = 100 * tflops / kMmaSyncCeilingTflops;
  } catch (const fs::Error& e) {
    state.SkipWithError(e.what());
    for (auto _ : state) {
    }
  }
}

double statistic_min(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double statistic_max(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

std::string utc_stamp() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::gmtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // Our own flags first; the rest goes to Google Benchmark, after the defaults of the mode.
  std::string mode_name = "default";
  std::vector<std::string> ours;  // the Google Benchmark flags we add, kept alive for argv
  bool out_given = false, reps_given = false, display_given = false;
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
      out_given = out_given || a.rfind("--benchmark_out=", 0) == 0;
      reps_given = reps_given || a.rfind("--benchmark_repetitions=", 0) == 0;
      display_given = display_given || a.rfind("--benchmark_display_aggregates_only", 0) == 0;
      args.push_back(argv[i]);
    }
  }
  const Mode mode = make_mode(mode_name);
  if (!reps_given) ours.push_back("--benchmark_repetitions=" + std::to_string(mode.repetitions));
  if (!display_given && mode.repetitions > 1) ours.push_back("--benchmark_display_aggregates_only=true");
#ifdef FLASH_STEPS_RESULTS_DIR
  if (!out_given) {
    ours.push_back(std::string("--benchmark_out=") + FLASH_STEPS_RESULTS_DIR + "/bench_steps-" + utc_stamp() + ".json");
    ours.push_back("--benchmark_out_format=json");
    std::cerr << "flash_steps_bench: writing " << ours[ours.size() - 2].substr(16) << "\n";
  }
#endif
  for (std::string& f : ours) args.push_back(f.data());

  const char* filter = std::getenv("FLASH_STEPS_BENCH_FILTER");
  for (const fs::Step& s : fs::steps()) {
    if (filter && s.id.rfind(filter, 0) != 0) continue;
    for (const Shape& sh : mode.shapes)
      for (fs::DType dt : mode.dtypes) {
        const fs::Problem p = fs::make_problem(sh.batch, sh.seqlen, sh.seqlen, sh.heads, sh.heads, sh.head_dim, dt, sh.causal);
        benchmark::RegisterBenchmark(("step" + s.id + "/" + fs::describe(p)).c_str(), bench_step, &s, p)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(mode.min_time_s)
            ->ComputeStatistics("min", statistic_min)
            ->ComputeStatistics("max", statistic_max);
      }
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
