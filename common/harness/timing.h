// Timing launches with CUDA events: warm-up, then the median of N timed launches, each bracketed by
// its own pair of events, optionally with the L2 cache flushed before each one.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace fs {

struct TimingOptions {
  int warmup = 2;
  int iters = 20;
  bool flush_l2 = true;  // write a buffer twice the L2's size before each launch (outside the events)
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::vector<float> samples_ms;
};

Timing time_launches(const std::function<void(cudaStream_t)>& launch, const TimingOptions& opt,
                     cudaStream_t stream = nullptr);

// TFLOP/s for `flops` done in `ms` milliseconds.
inline double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

}  // namespace fs
