// flash_steps_ceilings: the ceilings the notes and plots compare the steps with, measured on this GPU
// by the project's own small kernels (kernels.cu, wgmma.cu) rather than quoted from a datasheet:
//
//   mma_sync_f16, mma_sync_bf16   mma.sync.aligned.m16n8k16, fp32 accumulate, registers only  TFLOP/s
//   wgmma_f16, wgmma_bf16         wgmma.mma_async m64n256k16, A and B in shared memory (sm_90a) TFLOP/s
//   fma_f32                       FP32 FMA on the CUDA cores                                     TFLOP/s
//   ex2_approx                    ex2.approx.ftz.f32 on the MUFU unit (the softmax's exp2)       Tex2/s
//   hbm_read                      a buffer many times the L2, read with 16-byte loads            TB/s
//   d2d_copy                      cudaMemcpyAsync device to device (bytes read + written)         TB/s
//
// Every launch is timed with CUDA events. For each ceiling the loop count is first scaled so that one
// launch takes a few milliseconds or more; then come warm-up launches and the timed repetitions. The
// value is the best repetition (the peak); the median is reported beside it. `--help` for the flags.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/harness/gpu.h"
#include "common/harness/gpu.h"
#include "common/harness/timing.h"
#include "kernels.h"
#include "report.h"
#include "tests/gpu_test_config.h"  // kSkipCode: ctest reports exit 77 as skipped
#include "version.h"

namespace {

using fs::ceilings::Ceiling;
using fs::ceilings::LoopKernel;

struct Settings {
  double target_ms;  // one launch takes about this long
  int warmup;
  int repetitions;
};
Settings settings_for(bool quick) { return quick ? Settings{10, 1, 5} : Settings{50, 2, 20}; }

std::string str(double x, int digits = 0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string version_of(int compute_capability) {
  return std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// "" when this binary holds code for `function` that the current GPU can run, else why not.
std::string missing_code(const void* function, const fs::DeviceInfo& dev) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, function);
  if (err == cudaSuccess) return "";
  cudaGetLastError();  // this error is not sticky: clear it so that no later check reports it
  return "not available: this build has no code for this GPU (sm_" + std::to_string(dev.compute_capability) +
         ": " + cudaGetErrorName(err) + "); rebuild with -DCMAKE_CUDA_ARCHITECTURES=" +
         std::to_string(dev.compute_capability);
}

// Blocks of `threads` threads that fit on one SM at once: the grid is this times the SM count, one
// full wave, so every SM does the same work and no tail of the grid runs on a few SMs.
int blocks_per_sm(const void* function, int threads) {
  int n = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, function, threads, 0));
  if (n < 1) throw fs::Error("the occupancy query fits no block of " + std::to_string(threads) + " threads on an SM");
  return n;
}

// launch(n, stream) does n units of work (loop iterations, passes). Picks n so that one launch takes
// about s.target_ms (growing it tenfold while a launch is under a tenth of that), then times
// s.repetitions launches after s.warmup.
struct Scaled {
  int n = 0;
  fs::Timing timing;
};
Scaled time_scaled(const std::function<void(int n, cudaStream_t stream)>& launch, const Settings& s) {
  constexpr int kMaxN = 1 << 30;
  const auto time_once = [&](int n) {
    return fs::time_launches([&](cudaStream_t st) { launch(n, st); }, fs::TimingOptions{1, 1, false}).median_ms;
  };
  int n = 1;
  double ms = time_once(n);
  while (ms < s.target_ms / 10 && n <= kMaxN / 10) {
    n *= 10;
    ms = time_once(n);
  }
  n = int(std::clamp(std::ceil(n * s.target_ms / std::max(ms, 1e-3)), 1.0, double(kMaxN)));
  Scaled r;
  r.n = n;
  r.timing = fs::time_launches([&](cudaStream_t st) { launch(n, st); },
                               fs::TimingOptions{s.warmup, s.repetitions, false});
  return r;
}

// Fills best, median, launch_ms and repetitions from `work` units per launch (FLOPs, exponentials
// or bytes) and the launches' times; every unit here is 10^12 of something per second.
void set_rates(Ceiling& c, double work, const Scaled& t) {
  c.best = work / (t.timing.min_ms * 1e-3) / 1e12;
  c.median = work / (t.timing.median_ms * 1e-3) / 1e12;
  c.launch_ms = t.timing.median_ms;
  c.repetitions = int(t.timing.samples_ms.size());
  c.available = true;
}

void measure_loop(Ceiling& c, const LoopKernel& k, const fs::DeviceInfo& dev, const Settings& s, float* sink) {
  const int per_sm = blocks_per_sm(k.function, k.threads);
  const int blocks = dev.sm_count * per_sm;
  const Scaled t = time_scaled([&](int n, cudaStream_t st) { k.launch(blocks, n, sink, st); }, s);
  set_rates(c, k.work_per_block_iteration * blocks * double(t.n), t);
  c.method = std::string(k.shape) + "; " + std::to_string(blocks) + " blocks (" + std::to_string(dev.sm_count) +
             " SMs × " + std::to_string(per_sm) + ") of " + std::to_string(k.threads) + " threads, " +
             std::to_string(t.n) + " iterations per launch";
}

// The buffer of the memory ceilings: at most 4 GiB and a quarter of the free memory.
size_t memory_buffer_bytes(const fs::DeviceInfo& dev) {
  return std::min<size_t>(size_t(4) << 30, dev.free_bytes / 4);
}

std::string mib(double bytes) { return str(bytes / double(1 << 20)) + " MiB"; }

void measure_hbm_read(Ceiling& c, const fs::DeviceInfo& dev, const Settings& s, uint32_t* sink) {
  using fs::ceilings::kHbmReadThreads;
  using fs::ceilings::kHbmReadUnroll;
  const int per_sm = blocks_per_sm(fs::ceilings::hbm_read_function(), kHbmReadThreads);
  const int blocks = dev.sm_count * per_sm;
  // Whole groups of kHbmReadUnroll vectors per thread: no load out of bounds, none skipped.
  const int64_t group = int64_t(kHbmReadUnroll) * blocks * kHbmReadThreads;
  const int64_t vectors = int64_t(memory_buffer_bytes(dev) / 16) / group * group;
  if (vectors == 0) {
    c.reason = "not available: " + mib(double(dev.free_bytes)) + " free is too little for the buffer";
    return;
  }
  const size_t bytes = size_t(vectors) * 16;
  fs::DeviceBuffer buffer(bytes);
  fs::ceilings::launch_fill(buffer.get(), bytes, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const Scaled t = time_scaled(
      [&](int n, cudaStream_t st) { fs::ceilings::launch_hbm_read(blocks, buffer.get(), vectors, n, sink, st); }, s);
  set_rates(c, double(bytes) * t.n, t);
  c.method = "reads a " + mib(double(bytes)) + " buffer (" + str(double(bytes) / double(std::max<size_t>(dev.l2_bytes, 1)), 0) +
             "× the L2) with 16-byte loads, 4 in flight per thread, " + std::to_string(blocks) + " blocks of " +
             std::to_string(kHbmReadThreads) + " threads, " + std::to_string(t.n) +
             " passes per launch; bytes read / time";
}

void measure_d2d_copy(Ceiling& c, const fs::DeviceInfo& dev, const Settings& s) {
  const size_t half = memory_buffer_bytes(dev) / 2 / 16 * 16;
  if (half == 0) {
    c.reason = "not available: " + mib(double(dev.free_bytes)) + " free is too little for the buffer";
    return;
  }
  fs::DeviceBuffer buffer(2 * half);
  fs::ceilings::launch_fill(buffer.get(), 2 * half, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  char* const base = buffer.as<char>();
  const Scaled t = time_scaled(
      [&](int n, cudaStream_t st) {
        for (int i = 0; i < n; ++i) CHECK_CUDA(cudaMemcpyAsync(base + half, base, half, cudaMemcpyDeviceToDevice, st));
      },
      s);
  set_rates(c, 2.0 * double(half) * t.n, t);
  c.method = "cudaMemcpyAsync of " + mib(double(half)) + " from one half of a buffer to the other, " +
             std::to_string(t.n) + " copies per launch; (bytes read + bytes written) / time";
}

Ceiling make(const char* id, const char* what, const char* unit) {
  Ceiling c;
  c.id = id;
  c.what = what;
  c.unit = unit;
  return c;
}

// Runs `measure` unless `reason` says the ceiling cannot run here. A thrown error or a value that is
// not a positive number marks the ceiling failed.
Ceiling attempt(Ceiling c, const std::string& reason, const std::function<void(Ceiling&)>& measure, bool& failed) {
  if (!reason.empty()) {
    c.reason = reason;
    return c;
  }
  try {
    measure(c);
  } catch (const std::exception& e) {
    c.available = false;
    c.reason = std::string("failed: ") + e.what();
    failed = true;
    return c;
  }
  if (c.available && !(std::isfinite(c.best) && c.best > 0 && std::isfinite(c.median) && c.median > 0)) {
    c.available = false;
    c.reason = "failed: the measured value is not a positive number";
    failed = true;
  }
  return c;
}

std::vector<Ceiling> measure_all(const fs::DeviceInfo& dev, const Settings& s, bool& failed) {
  fs::DeviceBuffer sink(64);  // written only by a kernel whose result is NaN
  CHECK_CUDA(cudaMemset(sink.get(), 0, sink.bytes()));
  float* const fsink = sink.as<float>();
  const std::string here = version_of(dev.compute_capability);
  std::vector<Ceiling> out;

  for (const bool bf16 : {false, true}) {
    const LoopKernel k = fs::ceilings::mma_sync_kernel(bf16);
    const std::string reason =
        dev.compute_capability < 80
            ? "not available: mma.sync.m16n8k16 with " + std::string(bf16 ? "bf16" : "fp16") +
                  " needs compute capability 8.0 or newer (this GPU is " + here + ")"
            : missing_code(k.function, dev);
    out.push_back(attempt(
        make(bf16 ? "mma_sync_bf16" : "mma_sync_f16",
             bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, registers only"
                  : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, registers only",
             "TFLOP/s"),
        reason, [&](Ceiling& c) { measure_loop(c, k, dev, s, fsink); }, failed));
  }
  for (const bool bf16 : {false, true}) {
    const LoopKernel k = fs::ceilings::wgmma_kernel(bf16);
    const std::string reason = dev.compute_capability != 90
                                   ? "not available: wgmma needs sm_90a (this GPU is " + here + ")"
                                   : missing_code(k.function, dev);
    out.push_back(attempt(
        make(bf16 ? "wgmma_bf16" : "wgmma_f16",
             bf16 ? "wgmma.mma_async.m64n256k16.f32.bf16.bf16, dense, A and B in shared memory"
                  : "wgmma.mma_async.m64n256k16.f32.f16.f16, dense, A and B in shared memory",
             "TFLOP/s"),
        reason, [&](Ceiling& c) { measure_loop(c, k, dev, s, fsink); }, failed));
  }
  {
    const LoopKernel k = fs::ceilings::fma_kernel();
    out.push_back(attempt(make("fma_f32", "fma.rn.f32 on the CUDA cores (2 FLOPs each)", "TFLOP/s"),
                          missing_code(k.function, dev), [&](Ceiling& c) { measure_loop(c, k, dev, s, fsink); },
                          failed));
  }
  {
    const LoopKernel k = fs::ceilings::ex2_kernel();
    out.push_back(attempt(make("ex2_approx", "ex2.approx.ftz.f32 on the MUFU unit, 10^12 per second", "Tex2/s"),
                          missing_code(k.function, dev), [&](Ceiling& c) { measure_loop(c, k, dev, s, fsink); },
                          failed));
  }
  out.push_back(attempt(make("hbm_read", "device memory read, 16-byte loads", "TB/s"),
                        missing_code(fs::ceilings::hbm_read_function(), dev),
                        [&](Ceiling& c) { measure_hbm_read(c, dev, s, sink.as<uint32_t>()); }, failed));
  out.push_back(attempt(make("d2d_copy", "cudaMemcpyAsync device to device", "TB/s"), "",
                        [&](Ceiling& c) { measure_d2d_copy(c, dev, s); }, failed));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::ceilings::ParsedArgs parsed = fs::ceilings::parse_args(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.error.empty()) {
    std::cerr << "flash_steps_ceilings: " << parsed.error << "\n";
    return 2;
  }
  const fs::ceilings::Options& o = parsed.options;
  if (o.help) {
    std::cout << fs::ceilings::usage();
    return 0;
  }
  const std::string why = fs::cuda_unavailable_reason();
  if (!why.empty()) {
    std::cerr << "flash_steps_ceilings: " << why << "; the ceilings need a CUDA device, nothing was measured or written\n";
    return fs::test::kSkipCode;
  }
  try {
    const fs::DeviceInfo dev = fs::current_device();
    fs::ceilings::Header h;
    h.commit = FLASH_STEPS_COMMIT;
    h.date = utc_now();
    h.device = fs::describe(dev);
    h.compute_capability = dev.compute_capability;
    h.sm_count = dev.sm_count;
    int clock_khz = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev.ordinal));
    h.max_sm_clock_mhz = clock_khz / 1000;
    h.quick = o.quick;

    bool failed = false;
    const std::vector<Ceiling> ceilings = measure_all(dev, settings_for(o.quick), failed);

    std::ostream& table = o.json && o.json_path.empty() ? std::cerr : std::cout;
    fs::ceilings::print_table(table, h, ceilings);
    if (o.json && o.json_path.empty()) {
      fs::ceilings::write_json(std::cout, h, ceilings);
    } else if (o.json) {
      std::ofstream file(o.json_path);
      fs::ceilings::write_json(file, h, ceilings);
      file.close();
      if (!file) {
        std::cerr << "flash_steps_ceilings: could not write " << o.json_path << "\n";
        return 1;
      }
      table << "\nwrote " << o.json_path << "\n";
    }
    if (failed) std::cerr << "flash_steps_ceilings: a measurement failed (see the table)\n";
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::cerr << "flash_steps_ceilings: " << e.what() << "\n";
    return 1;
  }
}
