// The step registry: every step registers itself once; the runner, the tests, the benchmarks and the
// C ABI iterate over it, so no list of steps is written twice.
//
// A step directory steps/NN_name/ holds the same three files as every other step:
//     traits.h   compile-time choices and index math (constexpr, included by the CPU tests)
//     kernel.cuh the kernel, read top to bottom
//     step.cu    limits(), plan(), launch() and  void register_step_NN_name(fs::Registry& r)
// and steps/CMakeLists.txt names it once with flash_steps_add_step(NN_name [ARCH 90a]).
//
// How a problem reaches a kernel:
//     validate(p)                the harness's rules (problem.h), no device
//     step.limits(p)             the step's own static limits (head_dim, ...), no device
//     compute capability         min_compute_capability and arch_specific, against the device
//     step.plan(p, dev)          what this device allows (shared memory, grid): the Plan, or a refusal
//     step.launch(p, t, plan, workspace, stream)   runs exactly what the plan chose
// Each refusal is one sentence that names the value and the limit it breaks.
//
// A step may also run decoding problems (common/decode.h: per-sequence lengths, a contiguous or
// paged KV cache): its Step::decode holds the same four functions for a DecodeProblem, and
// plan_decode_for / run_decode / PreparedDecode follow the same chain (validate_decode first). Steps
// without one leave Step::decode empty; the runner then runs them on the decoding problem's
// forward_view where that is an ordinary forward problem (contiguous cache, uniform lengths).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "backward.h"
#include "buffer.h"
#include "decode.h"
#include "device.h"
#include "problem.h"

namespace fs {

// One kernel a plan will launch, for reports: occupancy (cudaOccupancyMaxActiveBlocksPerMultiprocessor),
// registers and name (cudaFuncGetAttributes, cudaFuncGetName).
struct KernelLaunch {
  const void* function = nullptr;  // the __global__ function
  int threads = 0;                 // per block
  size_t smem_bytes = 0;           // dynamic shared memory per block
  int64_t blocks = 0;              // in the grid
};

// What a step chose for one problem on one device. launch() receives it and re-picks nothing.
struct Plan {
  std::string refusal;            // "" when the step runs the problem on this device, else why not
  int config = 0;                 // step-private: which instantiation or tile configuration to launch
  size_t workspace_bytes = 0;     // device scratch the launch needs, provided by the caller
  int splits = 1;                 // split-KV steps: how many parts the keys of one row are cut into
  std::vector<KernelLaunch> kernels;
  bool accepted() const { return refusal.empty(); }
};

// A step's decoding entry (Step::decode): limits, plan, launch and claims of a DecodeProblem, with the
// contracts of Step's own four. launch is only called with seqlen_q > 0 and seqlen_k > 0, after the
// checked mode (if asked) found the device data good; `workspace` is the step's part of the caller's
// workspace (plan.workspace_bytes, without the checked mode's kDecodeCheckBytes).
struct DecodeEntry {
  std::function<std::string(const DecodeProblem& p)> limits;
  std::function<Plan(const DecodeProblem& p, const DeviceInfo& dev)> plan;
  std::function<void(const DecodeProblem& p, const DecodeTensors& t, const Plan& plan, void* workspace,
                     cudaStream_t stream)>
      launch;
  std::function<bool(const DecodeProblem& p, const DeviceInfo& dev)> claims;
  bool present() const { return limits || plan || launch || claims; }
};

// A step's backward entry (Step::backward): limits, plan, launch and claims of a BackwardProblem,
// with the contracts of Step's own four. launch is only called with seqlen_q > 0 and seqlen_k > 0
// (run_backward writes the gradients of empty problems), with a workspace of plan.workspace_bytes.
struct BackwardEntry {
  std::function<std::string(const BackwardProblem& p)> limits;
  std::function<Plan(const BackwardProblem& p, const DeviceInfo& dev)> plan;
  std::function<void(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, void* workspace,
                     cudaStream_t stream)>
      launch;
  std::function<bool(const BackwardProblem& p, const DeviceInfo& dev)> claims;
  bool present() const { return limits || plan || launch || claims; }
};

struct Step {
  std::string id;      // "01_naive", "04_pad", "07a_rows32": sorts in teaching order
  std::string name;    // "naive attention"
  std::string lesson;  // one line: the idea this step adds
  std::string dir;     // "01_naive": the directory under steps/ (set by the registry)
  int min_compute_capability = 80;
  // Nonzero for a step built for one architecture only (flash_steps_add_step(... ARCH 90a): 90): its
  // code runs on a GPU of exactly this compute capability and no other.
  int arch_specific = 0;
  // The step's limits that need no device (head_dim, ...): "" or a sentence. Only called on problems
  // that pass fs::validate().
  std::function<std::string(const Problem& p)> limits;
  // What this device allows. Only called on problems that pass validate() and limits().
  std::function<Plan(const Problem& p, const DeviceInfo& dev)> plan;
  // Enqueues the computation on `stream`, as `plan` says. Only called on checked problems and pointers,
  // with seqlen_q > 0 and seqlen_k > 0 (the harness handles empty work), and with a workspace of at least
  // plan.workspace_bytes (nullptr when that is 0).
  std::function<void(const Problem& p, const Tensors& t, const Plan& plan, void* workspace, cudaStream_t stream)>
      launch;
  // The step's documented support: problems it promises to run on every GPU it supports (no refusal).
  // The GPU tests fail when the step refuses one of them, so a step cannot pass its tests by refusing.
  std::function<bool(const Problem& p, const DeviceInfo& dev)> claims;
  // Optional: prints, without a GPU, what the step's index math predicts (bank maps, fragment maps, ...).
  // `flash-steps explain [--step ID]` prints it.
  std::function<void(std::ostream& out)> explain;
  // Optional: the decoding entry (all four functions, or none).
  DecodeEntry decode = {};
  // Optional: the backward pass (all four functions, or none).
  BackwardEntry backward = {};
  // A backward-only step (11_backward) leaves limits, plan, launch and claims empty: it has no forward
  // pass, and plan_for refuses it. Every step has a forward pass, a backward pass, or both.
  bool has_forward() const { return limits || plan || launch || claims; }
};

class Registry {
 public:
  void add(Step step);
  const std::vector<Step>& steps() const { return steps_; }
  void set_dir(std::string dir) { dir_ = std::move(dir); }  // the directory whose steps are added next

 private:
  std::vector<Step> steps_;
  std::string dir_;
};

// All registered steps, sorted by id.
const std::vector<Step>& steps();

// The step with this id, or nullptr.
const Step* find_step(std::string_view id);

// "" when the problem passes the harness's rules and the step's limits: what can be said without a device.
// A step without a forward pass refuses every forward problem.
std::string check_static(const Step& step, const Problem& p);

// The plan of `step` for `p` on `dev`: the static checks, the compute capability, then the step's plan().
// A refusal at any stage is in plan.refusal.
Plan plan_for(const Step& step, const Problem& p, const DeviceInfo& dev);

// "" when the workspace can serve `plan`: null only when none is needed, at least plan.workspace_bytes.
// `size_function` is the C ABI function the sentence points to.
std::string check_workspace(const Plan& plan, const void* workspace, size_t workspace_bytes,
                            const char* size_function = "fs_workspace_size");

// Checks the pointers and the workspace, then enqueues the step as `plan` says. Empty work is handled
// here: with seqlen_q == 0 nothing happens; with seqlen_k == 0, O = 0 and LSE = -inf. Throws fs::Error
// when the plan is a refusal or a pointer breaks a rule.
void run(const Step& step, const Problem& p, const Plan& plan, const Tensors& t, void* workspace,
         size_t workspace_bytes, cudaStream_t stream);

// The ladder's speed-up rule, written once (the runner, and through the C ABI the Python tools, use it).
// A step's key is its id up to the first '_': "04" for both 04_pad and 04_swizzle (alternatives),
// "07b" for 07b_work_order (a lettered sub-step). For each timed row, given its time in ms (<= 0: not timed):
//   x_step01 = time of 01_naive / its time
//   x_prev   = time of the fastest row whose key is the greatest step key below its own / its time
//              (04_pad and 04_swizzle both against 03, 05 against the faster 04, 07b against 07a).
// Rows whose id does not start with a digit (baselines) get x_step01 only. 0 where there is nothing to compare.
std::string step_key(std::string_view id);
struct Speedup {
  double x_step01 = 0, x_prev = 0;
};
std::vector<Speedup> speedups(const std::vector<std::string>& ids, const std::vector<double>& ms);

// The decoding chain, as for forward problems: validate_decode, the step's decode.limits, the compute
// capability, then decode.plan. A step without a decoding entry is refused with a sentence. With
// p.checked the plan's workspace_bytes include kDecodeCheckBytes for the checked mode's report.
std::string check_decode_static(const Step& step, const DecodeProblem& p);
Plan plan_decode_for(const Step& step, const DecodeProblem& p, const DeviceInfo& dev);

// Checks the pointers and the workspace, then: seqlen_q == 0, nothing; seqlen_k == 0, O = 0 and
// LSE = -inf; with p.checked, checks the lengths and the block table on the device and synchronizes
// `stream` (throws fs::Error naming the first bad entry, launching nothing else); then the step's
// decode.launch. Throws fs::Error when the plan is a refusal or a pointer breaks a rule.
void run_decode(const Step& step, const DecodeProblem& p, const Plan& plan, const DecodeTensors& t, void* workspace,
                size_t workspace_bytes, cudaStream_t stream);

// The backward chain, as for forward problems: validate_backward, the step's backward.limits, the
// compute capability, then backward.plan. A step without a backward entry is refused with a sentence.
std::string check_backward_static(const Step& step, const BackwardProblem& p);
Plan plan_backward_for(const Step& step, const BackwardProblem& p, const DeviceInfo& dev);

// Checks the pointers (validate_backward_tensors) and the workspace (check_workspace with
// "fs_backward_workspace_size"), writes the gradients of empty problems (fill_empty_gradients), else
// enqueues the step's backward.launch. Throws fs::Error when the plan is a refusal or a pointer breaks
// a rule.
void run_backward(const Step& step, const BackwardProblem& p, const Plan& plan, const BackwardTensors& t,
                  void* workspace, size_t workspace_bytes, cudaStream_t stream);

// A step ready to launch on one problem: its plan, and a workspace of the size the plan asks, owned.
// What the runner, the tests and the benchmarks launch. Throws fs::Error when the step refuses.
class PreparedStep {
 public:
  PreparedStep(const Step& step, const Problem& p, const DeviceInfo& dev);
  PreparedStep(const Step& step, const Problem& p, Plan plan);  // a plan already made by fs::plan
  void launch(const Tensors& t, cudaStream_t stream) const;
  const Step& step() const { return *step_; }
  const Plan& plan() const { return plan_; }

 private:
  const Step* step_;
  Problem problem_;
  Plan plan_;
  DeviceBuffer workspace_;
};

// The same for a decoding problem: its plan and an owned workspace. Throws fs::Error when the step
// refuses (or has no decoding entry).
class PreparedDecode {
 public:
  PreparedDecode(const Step& step, const DecodeProblem& p, const DeviceInfo& dev);
  void launch(const DecodeTensors& t, cudaStream_t stream) const;
  const Plan& plan() const { return plan_; }

 private:
  const Step* step_;
  DecodeProblem problem_;
  Plan plan_;
  DeviceBuffer workspace_;
};

// The same for a backward problem: its plan and an owned workspace. Throws fs::Error when the step
// refuses (or has no backward).
class PreparedBackward {
 public:
  PreparedBackward(const Step& step, const BackwardProblem& p, const DeviceInfo& dev);
  void launch(const BackwardTensors& t, cudaStream_t stream) const;
  const Plan& plan() const { return plan_; }

 private:
  const Step* step_;
  BackwardProblem problem_;
  Plan plan_;
  DeviceBuffer workspace_;
};

}  // namespace fs
