// The step registry: every step registers itself once; the runner, the tests, the benchmarks and the
// C ABI iterate over it, so no list of steps is written twice.
//
// A step directory steps/NN_name/ defines
//     void register_step_NN_name(fs::Registry& r) { r.add({...}); }
// and steps/CMakeLists.txt names it once with flash_steps_add_step(NN_name).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "device.h"
#include "problem.h"

namespace fs {

struct Step {
  std::string id;      // "01_naive", "04_pad": sorts in teaching order
  std::string name;    // "naive attention"
  std::string lesson;  // one line: the idea this step adds
  int min_compute_capability = 80;
  // "" if this step can run `p` on `dev`, else a sentence naming the value and the limit. Only
  // called on problems that already pass fs::validate().
  std::function<std::string(const Problem& p, const DeviceInfo& dev)> supports;
  // Enqueues the computation on `stream`. Only called on checked problems and pointers, with
  // seqlen_q > 0 and seqlen_k > 0 (the harness handles empty work itself).
  std::function<void(const Problem& p, const Tensors& t, cudaStream_t stream)> launch;
};

class Registry {
 public:
  void add(Step step);
  const std::vector<Step>& steps() const { return steps_; }

 private:
  std::vector<Step> steps_;
};

// All registered steps, sorted by id.
const std::vector<Step>& steps();

// The step with this id, or nullptr.
const Step* find_step(std::string_view id);

// "" when `step` can run `p` on `dev`: the harness's rules, the compute capability, then the step's
// own supports().
std::string check(const Step& step, const Problem& p, const DeviceInfo& dev);

// Checks the problem and the pointers, then enqueues the step. Empty work is handled here: with
// seqlen_q == 0 nothing happens; with seqlen_k == 0, O = 0 and LSE = -inf. Throws fs::Error.
void run(const Step& step, const Problem& p, const Tensors& t, cudaStream_t stream,
         const DeviceInfo& dev);

}  // namespace fs
