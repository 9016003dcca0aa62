// What a step is to the harness: for each pass it runs, four functions, and one registration.
//
// A step directory steps/NN_name/ holds the same three files as every other step:
//     traits.h   compile-time choices and index math (constexpr, included by the CPU tests)
//     kernel.cuh the kernel, read top to bottom
//     step.cu    limits(), plan(), launch(), claims() and  void register_step_NN_name(fs::Registry& r)
// and steps/CMakeLists.txt names it once with flash_steps_add_step(NN_name [ARCH 90a]).
//
// A pass (forward, decode, backward) is a problem type and its tensors (common/<pass>/problem.h). For
// each pass it runs, a step gives an Entry:
//     limits(p)                  the step's own limits that need no device (head_dim, ...): "" or a sentence
//     plan(p, dev)               what this device allows (shared memory, grid): the Plan, or a refusal
//     launch(p, t, plan, ws, s)  enqueues exactly what the plan chose on stream s
//     claims(p, dev)             the problems it promises to run (the GPU tests fail if it refuses one)
// The harness (common/harness/chain.h) calls them in that order, after its own rules, and handles
// empty work: launch() only ever sees checked problems and pointers with work to do, and a workspace
// of plan.workspace_bytes (nullptr when that is 0). Each refusal is one sentence that names the value
// and the limit it breaks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "step/device.h"

// The problems of the passes (common/<pass>/problem.h); a step includes the one it runs.
struct fs_problem;
struct fs_decode_problem;
struct fs_backward_problem;

namespace fs {

struct Tensors;
struct DecodeTensors;
struct BackwardTensors;

// One kernel a plan will launch, for reports (`flash-steps resources`).
struct KernelLaunch {
  const void* function = nullptr;  // the __global__ function
  int threads = 0;                 // per block
  size_t smem_bytes = 0;           // dynamic shared memory per block
  int64_t blocks = 0;              // in the grid
};

// What a step chose for one problem on one device. launch() receives it and re-picks nothing.
struct Plan {
  std::string refusal = "";    // "" when the step runs the problem on this device, else why not
  int config = 0;              // step-private: which instantiation or tile configuration to launch
  size_t workspace_bytes = 0;  // device scratch the launch needs, provided by the caller
  int splits = 1;              // split-KV steps: how many parts the keys of one row are cut into
  std::vector<KernelLaunch> kernels = {};
  bool accepted() const { return refusal.empty(); }
};

// A step's four functions for one pass: all of them, or none (the step does not run the pass).
template <typename Problem, typename Tensors>
struct Entry {
  std::function<std::string(const Problem& p)> limits;
  std::function<Plan(const Problem& p, const DeviceInfo& dev)> plan;
  std::function<void(const Problem& p, const Tensors& t, const Plan& plan, void* workspace, cudaStream_t stream)>
      launch;
  std::function<bool(const Problem& p, const DeviceInfo& dev)> claims;
  bool present() const { return limits || plan || launch || claims; }
  bool complete() const { return limits && plan && launch && claims; }
};

struct Step {
  std::string id;      // "01_naive", "04_pad", "07a_rows32": sorts in teaching order
  std::string name;    // "naive attention"
  std::string lesson;  // one line: the idea this step adds
  Entry<fs_problem, Tensors> forward = {};
  Entry<fs_decode_problem, DecodeTensors> decode = {};
  Entry<fs_backward_problem, BackwardTensors> backward = {};
  // Optional: prints, without a GPU, what the step's index math predicts (`flash-steps explain`).
  std::function<void(std::ostream& out)> explain = {};
  // Its plan reads DeviceInfo::free_bytes. The C ABI asks the driver for free memory (cudaMemGetInfo,
  // microseconds) only for such a step; for the others free_bytes is 0.
  bool reads_free_memory = false;
  // Its kernels apply logit softcapping (fs_problem::softcap). Every other step refuses a problem with
  // softcap > 0, with a sentence naming a step that has it.
  bool softcap = false;
  // Its kernels apply a sliding window (fs_problem::window); every other step refuses one, as above.
  bool window = false;
  // Its kernels run variable-length batches (fs_problem::cu_seqlens_q, _k); every other step refuses one.
  bool varlen = false;
  // Set by the registry from steps/CMakeLists.txt: the directory under steps/, and for a step built
  // for one architecture only (ARCH 90a: 90) that architecture, which is then also its minimum.
  std::string dir = {};
  int arch_specific = 0;
  int min_compute_capability = 80;
};

// Where a step directory's register_step_<dir>() adds its steps (one or several sub-steps).
class Registry {
 public:
  void add(Step step);  // throws fs::Error for a step without a pass, a partial entry or a repeated id
  const std::vector<Step>& steps() const { return steps_; }
  void set_dir(std::string dir, int arch) { dir_ = std::move(dir), arch_ = arch; }

 private:
  std::vector<Step> steps_;
  std::string dir_;
  int arch_ = 0;
};

}  // namespace fs
