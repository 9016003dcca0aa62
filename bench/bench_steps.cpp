// One benchmark per registered step × shape, timed with CUDA events (manual time), the L2 flushed
// before every launch, with TFLOP/s as a counter. Without a GPU every benchmark reports an error.
//
//   flash_steps_bench --benchmark_out=bench/results/steps.json --benchmark_out_format=json
//   FLASH_STEPS_BENCH_FILTER=07 flash_steps_bench      only the steps whose id starts with 07
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "common/check.h"
#include "common/timing.h"

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

// Steps whose naive cost would make one launch take seconds at large shapes are left to the runner.
constexpr double kMaxGflopForNaive = 200;

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
    const std::string refused = fs::check(*step, p, dev);
    if (!refused.empty()) throw fs::Error("refused: " + refused);
    if (step->id.rfind("01", 0) == 0 && fs::attention_flops(p) / 1e9 > kMaxGflopForNaive)
      throw fs::Error("skipped: step 01 would take too long at this shape");
    fs::Workload w(p, 1);
    const fs::Tensors t = w.tensors();
    const auto launch = [&](cudaStream_t s) { fs::run(*step, p, t, s, dev); };
    launch(nullptr);  // warm-up
    CHECK_CUDA(cudaDeviceSynchronize());
    double total_ms = 0;
    for (auto _ : state) {
      const fs::Timing tm = fs::time_launches(launch, fs::TimingOptions{0, 1, true});
      state.SetIterationTime(tm.median_ms * 1e-3);
      total_ms += tm.median_ms;
    }
    state.counters["TFLOP/s"] = fs::tflops(fs::attention_flops(p), total_ms / double(state.iterations()));
  } catch (const fs::Error& e) {
    state.SkipWithError(e.what());
    for (auto _ : state) {
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* filter = std::getenv("FLASH_STEPS_BENCH_FILTER");
  for (const fs::Step& s : fs::steps()) {
    if (filter && s.id.rfind(filter, 0) != 0) continue;
    for (const Shape& sh : kShapes)
      for (fs::DType dt : {fs::DType::fp16, fs::DType::bf16}) {
        const fs::Problem p = fs::make_problem(sh.batch, sh.seqlen, sh.seqlen, sh.heads, sh.heads, sh.head_dim, dt, sh.causal);
        benchmark::RegisterBenchmark(("step" + s.id + "/" + fs::describe(p)).c_str(), bench_step, &s, p)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.2);
      }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
