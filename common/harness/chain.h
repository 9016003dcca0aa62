// The chain from a problem to a kernel, written once for every pass:
//
//     static_refusal(step, p)      the pass's rules (validate), then the step's limits     no device
//     plan(step, p, dev)           the above, the compute capability, then the step's plan
//     run(step, p, plan, t, ...)   the pointers and the workspace, then the launch (empty work handled)
//     Prepared(step, p, dev)       a plan and its own workspace: what the runner, tests and benchmarks launch
//
// A pass is a problem type with its traits, Pass<Problem> (common/<pass>/rules.h): its tensors, the
// Step entry it reads, the refusal of a step without that entry, the C function that sizes its
// workspace, and what the harness itself does around the step's launch (empty work; the decoding
// checked mode). Each path validates a problem once, plans it once and launches it.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>
#include <vector>

#include "harness/gpu.h"
#include "step/step.h"

namespace fs {

template <typename Problem>
struct Pass;  // specialized by each pass's rules.h

template <typename Problem>
using PassTensors = typename Pass<Problem>::Tensors;

// All registered steps, sorted by id; the step with this id, or nullptr.
const std::vector<Step>& steps();
const Step* find_step(std::string_view id);

// "" when `dev` can run the step's code: its minimum compute capability and, for an
// architecture-specific step, exactly its architecture.
std::string check_architecture(const Step& step, const DeviceInfo& dev);

// The workspace rule in two parts. Without a plan (no device): "" when the pointer and its size
// agree (null only with 0 bytes) and a pointer is 16-byte aligned, whatever the plan will need.
std::string validate_workspace_pointer(const void* workspace, size_t workspace_bytes);
// With the plan: "" when the workspace holds plan.workspace_bytes (null only when that is 0).
// `size_function` is the C function the sentence points to.
std::string validate_workspace(const Plan& plan, const void* workspace, size_t workspace_bytes,
                               const char* size_function);

// What can be said without a device: "" when the step has the pass, the problem follows the pass's
// rules, the step has the features it asks for and the step's limits accept it.
template <typename Problem>
std::string static_refusal(const Step& step, const Problem& p);

// For a problem that passed static_refusal: the compute capability, then the step's plan.
template <typename Problem>
Plan plan_on_device(const Step& step, const Problem& p, const DeviceInfo& dev);

// Both: the plan of `step` for `p` on `dev`; a refusal at any stage is in plan.refusal.
template <typename Problem>
Plan plan(const Step& step, const Problem& p, const DeviceInfo& dev) {
  std::string why = static_refusal(step, p);
  return why.empty() ? plan_on_device(step, p, dev) : Plan{.refusal = why};
}

// Enqueues the plan on `stream` for pointers and a workspace that passed their rules: the pass's own
// part (empty work, the checked mode), then the step's launch.
template <typename Problem>
void launch(const Step& step, const Problem& p, const Plan& plan, const PassTensors<Problem>& t, void* workspace,
            cudaStream_t stream);

// Checks the plan, the pointers and the workspace (both parts), then launch(). Throws fs::Error naming the step and
// the problem when one is refused.
template <typename Problem>
void run(const Step& step, const Problem& p, const Plan& plan, const PassTensors<Problem>& t, void* workspace,
         size_t workspace_bytes, cudaStream_t stream);

// A step ready to launch on one problem: its plan, and a workspace of the size the plan asks, owned.
// Throws fs::Error when the step refuses.
template <typename Problem>
class Prepared {
 public:
  Prepared(const Step& step, const Problem& p, const DeviceInfo& dev) : Prepared(step, p, fs::plan(step, p, dev)) {}
  Prepared(const Step& step, const Problem& p, Plan plan);  // a plan already made for this step and problem
  void launch(const PassTensors<Problem>& t, cudaStream_t stream) const {
    run(*step_, problem_, plan_, t, workspace_.get(), workspace_.bytes(), stream);
  }
  const Plan& plan() const { return plan_; }

 private:
  const Step* step_;
  Problem problem_;
  Plan plan_;
  DeviceBuffer workspace_;
};

// The ladder's speed-up rule, written once for the runner and the C ABI (fs_speedups in flash_steps.h
// defines it). A step's key is its id up to the first '_': "04" for 04_pad and 04_swizzle, "07b".
std::string step_key(std::string_view id);
struct Speedup {
  double x_step01 = 0, x_prev = 0;
};
std::vector<Speedup> speedups(const std::vector<std::string>& ids, const std::vector<double>& ms);

}  // namespace fs
