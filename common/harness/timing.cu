#include "harness/timing.h"

#include <algorithm>

#include "harness/gpu.h"

namespace fs {

namespace {

// Owns a pair of events.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

DeviceBuffer& l2_flush_buffer() {
  static DeviceBuffer buf = [] {
    int dev = 0, l2 = 0;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    return DeviceBuffer(size_t(std::max(l2, 1 << 20)) * 2);
  }();
  return buf;
}

}  // namespace

Timing time_launches(const std::function<void(cudaStream_t)>& launch, const TimingOptions& opt,
                     cudaStream_t stream) {
  for (int i = 0; i < opt.warmup; ++i) launch(stream);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  Timing t;
  EventPair ev;
  for (int i = 0; i < std::max(opt.iters, 1); ++i) {
    if (opt.flush_l2) {
      DeviceBuffer& flush = l2_flush_buffer();
      CHECK_CUDA(cudaMemsetAsync(flush.get(), i & 0xFF, flush.bytes(), stream));
    }
    CHECK_CUDA(cudaEventRecord(ev.start, stream));
    launch(stream);
    CHECK_CUDA(cudaEventRecord(ev.stop, stream));
    CHECK_CUDA(cudaEventSynchronize(ev.stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    t.samples_ms.push_back(ms);
  }
  std::vector<float> s = t.samples_ms;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  t.median_ms = n % 2 ? s[n / 2] : 0.5 * (double(s[n / 2 - 1]) + s[n / 2]);
  t.min_ms = s.front();
  t.max_ms = s.back();
  return t;
}

}  // namespace fs
