#include "registry.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "workload.h"

namespace fs {

// One declaration per registered step directory, generated from steps/CMakeLists.txt.
#define FS_STEP(dir) void register_step_##dir(Registry& r);
#include "steps_list.inc"
#undef FS_STEP

void Registry::add(Step step) {
  if (step.id.empty()) throw Error("a step must have an id");
  if (step.has_forward() && !(step.limits && step.plan && step.launch && step.claims))
    throw Error("step " + step.id + "'s forward pass must have all of limits(), plan(), launch() and claims()");
  const DecodeEntry& d = step.decode;
  if (d.present() && !(d.limits && d.plan && d.launch && d.claims))
    throw Error("step " + step.id + "'s decoding entry must have all of limits(), plan(), launch() and claims()");
  const BackwardEntry& b = step.backward;
  if (b.present() && !(b.limits && b.plan && b.launch && b.claims))
    throw Error("step " + step.id + "'s backward entry must have all of limits(), plan(), launch() and claims()");
  if (!step.has_forward() && !b.present())
    throw Error("step " + step.id + " has neither a forward pass (limits(), plan(), launch(), claims()) nor a "
                "backward entry");
  if (std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) { return s.id == step.id; }))
    throw Error("step id '" + step.id + "' is registered twice");
  step.dir = dir_;
  steps_.push_back(std::move(step));
}

const std::vector<Step>& steps() {
  static const std::vector<Step> all = [] {
    Registry r;
#define FS_STEP(dir)  \
  r.set_dir(#dir);    \
  register_step_##dir(r);
#include "steps_list.inc"
#undef FS_STEP
    std::vector<Step> v = r.steps();
    std::sort(v.begin(), v.end(), [](const Step& a, const Step& b) { return a.id < b.id; });
    return v;
  }();
  return all;
}

const Step* find_step(std::string_view id) {
  for (const Step& s : steps())
    if (s.id == id) return &s;
  return nullptr;
}

std::string check_static(const Step& step, const Problem& p) {
  if (!step.has_forward())
    return "step " + step.id + " has no forward pass (it is a backward step: fs_run_backward)";
  std::string why = validate(p);
  if (why.empty()) why = step.limits(p);
  return why;
}

namespace {

std::string compute_capability_name(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// "" when `dev` can run the step's code: its minimum compute capability and, for an
// architecture-specific step, exactly its architecture.
std::string check_architecture(const Step& step, const DeviceInfo& dev) {
  if (dev.compute_capability < step.min_compute_capability)
    return "step " + step.id + " needs compute capability " + compute_capability_name(step.min_compute_capability) +
           " or newer; this GPU is " + compute_capability_name(dev.compute_capability);
  if (step.arch_specific != 0 && dev.compute_capability != step.arch_specific)
    return "step " + step.id + " is built for sm_" + std::to_string(step.arch_specific) +
           "a only (architecture-specific instructions), which runs on compute capability " +
           compute_capability_name(step.arch_specific) + " alone; this GPU is " +
           compute_capability_name(dev.compute_capability);
  return "";
}

}  // namespace

Plan plan_for(const Step& step, const Problem& p, const DeviceInfo& dev) {
  Plan refused;
  refused.refusal = check_static(step, p);
  if (refused.accepted()) refused.refusal = check_architecture(step, dev);
  if (!refused.accepted()) return refused;
  return step.plan(p, dev);
}

std::string check_decode_static(const Step& step, const DecodeProblem& p) {
  if (!step.decode.present())
    return "step " + step.id + " has no decoding entry (per-sequence lengths, a paged cache); it runs forward "
           "problems (fs_check, fs_run), which a decoding problem is when its cache is contiguous and every "
           "sequence has seqlen_k keys";
  std::string why = validate_decode(p);
  if (why.empty()) why = step.decode.limits(p);
  return why;
}

Plan plan_decode_for(const Step& step, const DecodeProblem& p, const DeviceInfo& dev) {
  Plan refused;
  refused.refusal = check_decode_static(step, p);
  if (refused.accepted()) refused.refusal = check_architecture(step, dev);
  if (!refused.accepted()) return refused;
  Plan plan = step.decode.plan(p, dev);
  if (plan.accepted() && p.checked) plan.workspace_bytes += kDecodeCheckBytes;
  return plan;
}

std::string check_backward_static(const Step& step, const BackwardProblem& p) {
  if (!step.backward.present()) {
    std::string with;
    for (const Step& s : steps())
      if (s.backward.present()) with += (with.empty() ? "" : ", ") + s.id;
    return "step " + step.id + " has no backward pass; " +
           (with.empty() ? std::string("no registered step has one") : "the steps with one are: " + with);
  }
  std::string why = validate_backward(p);
  if (why.empty()) why = step.backward.limits(p);
  return why;
}

Plan plan_backward_for(const Step& step, const BackwardProblem& p, const DeviceInfo& dev) {
  Plan refused;
  refused.refusal = check_backward_static(step, p);
  if (refused.accepted()) refused.refusal = check_architecture(step, dev);
  if (!refused.accepted()) return refused;
  return step.backward.plan(p, dev);
}

std::string check_workspace(const Plan& plan, const void* workspace, size_t workspace_bytes, const char* size_function) {
  std::ostringstream m;
  if (plan.workspace_bytes == 0) return "";
  if (workspace == nullptr) {
    m << "the workspace is a null pointer; this problem needs " << plan.workspace_bytes
      << " bytes of workspace (see " << size_function << ")";
    return m.str();
  }
  if (workspace_bytes < plan.workspace_bytes) {
    m << "the workspace is " << workspace_bytes << " bytes; this problem needs " << plan.workspace_bytes
      << " (see " << size_function << ")";
    return m.str();
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    m << "the workspace pointer " << workspace << " is not 16-byte aligned";
    return m.str();
  }
  return "";
}

void run(const Step& step, const Problem& p, const Plan& plan, const Tensors& t, void* workspace,
         size_t workspace_bytes, cudaStream_t stream) {
  std::string why = plan.refusal;
  if (why.empty() && !step.has_forward()) why = check_static(step, p);  // a plan made for another step
  if (why.empty()) why = validate_tensors(p, t);
  if (why.empty()) why = check_workspace(plan, workspace, workspace_bytes);
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  if (p.seqlen_q == 0) return;
  if (p.seqlen_k == 0) {
    fill_empty_output(p, t, stream);
    return;
  }
  step.launch(p, t, plan, plan.workspace_bytes ? workspace : nullptr, stream);
}

void run_decode(const Step& step, const DecodeProblem& p, const Plan& plan, const DecodeTensors& t, void* workspace,
                size_t workspace_bytes, cudaStream_t stream) {
  std::string why = plan.refusal;
  if (why.empty()) why = validate_decode_tensors(p, t);
  if (why.empty()) why = check_workspace(plan, workspace, workspace_bytes, "fs_decode_workspace_size");
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  if (p.seqlen_q == 0) return;
  if (p.seqlen_k == 0) {
    fill_empty_output(forward_view(p), Tensors{nullptr, nullptr, nullptr, t.o, t.lse}, stream);
    return;
  }
  char* step_workspace = static_cast<char*>(workspace);
  if (p.checked) {
    why = check_decode_device_data(p, t, workspace, stream);
    if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why + " (checked mode)");
    step_workspace += kDecodeCheckBytes;
  }
  const bool step_needs_workspace = plan.workspace_bytes > (p.checked ? kDecodeCheckBytes : 0);
  step.decode.launch(p, t, plan, step_needs_workspace ? step_workspace : nullptr, stream);
}

void run_backward(const Step& step, const BackwardProblem& p, const Plan& plan, const BackwardTensors& t,
                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  std::string why = plan.refusal;
  if (why.empty() && !step.backward.present()) why = check_backward_static(step, p);  // a plan made for another step
  if (why.empty()) why = validate_backward_tensors(p, t);
  if (why.empty()) why = check_workspace(plan, workspace, workspace_bytes, "fs_backward_workspace_size");
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  if (p.forward.seqlen_q == 0 || p.forward.seqlen_k == 0) {
    fill_empty_gradients(p, t, stream);
    return;
  }
  step.backward.launch(p, t, plan, plan.workspace_bytes ? workspace : nullptr, stream);
}

std::string step_key(std::string_view id) { return std::string(id.substr(0, id.find('_'))); }

std::vector<Speedup> speedups(const std::vector<std::string>& ids, const std::vector<double>& ms) {
  auto is_step = [&](size_t i) { return !ids[i].empty() && std::isdigit(static_cast<unsigned char>(ids[i][0])); };
  std::vector<Speedup> out(ids.size());
  double t01 = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ms[i] > 0 && ids[i] == "01_naive") t01 = ms[i];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!(ms[i] > 0)) continue;
    out[i].x_step01 = t01 > 0 ? t01 / ms[i] : 0;
    if (!is_step(i)) continue;
    const std::string key = step_key(ids[i]);
    std::string prev_key;
    double prev_ms = 0;
    for (size_t j = 0; j < ids.size(); ++j) {
      if (!(ms[j] > 0) || !is_step(j)) continue;
      const std::string k = step_key(ids[j]);
      if (k >= key) continue;
      if (k > prev_key) {
        prev_key = k;
        prev_ms = ms[j];
      } else if (k == prev_key) {
        prev_ms = std::min(prev_ms, ms[j]);
      }
    }
    out[i].x_prev = prev_ms > 0 ? prev_ms / ms[i] : 0;
  }
  return out;
}

PreparedStep::PreparedStep(const Step& step, const Problem& p, const DeviceInfo& dev)
    : PreparedStep(step, p, fs::plan_for(step, p, dev)) {}

PreparedStep::PreparedStep(const Step& step, const Problem& p, Plan plan)
    : step_(&step), problem_(p), plan_(std::move(plan)) {
  if (!plan_.accepted()) throw Error("step " + step.id + " refused " + describe(p) + ": " + plan_.refusal);
  workspace_ = DeviceBuffer(plan_.workspace_bytes);
}

void PreparedStep::launch(const Tensors& t, cudaStream_t stream) const {
  run(*step_, problem_, plan_, t, workspace_.get(), workspace_.bytes(), stream);
}

PreparedDecode::PreparedDecode(const Step& step, const DecodeProblem& p, const DeviceInfo& dev)
    : step_(&step), problem_(p), plan_(plan_decode_for(step, p, dev)) {
  if (!plan_.accepted()) throw Error("step " + step.id + " refused " + describe(p) + ": " + plan_.refusal);
  workspace_ = DeviceBuffer(plan_.workspace_bytes);
}

void PreparedDecode::launch(const DecodeTensors& t, cudaStream_t stream) const {
  run_decode(*step_, problem_, plan_, t, workspace_.get(), workspace_.bytes(), stream);
}

PreparedBackward::PreparedBackward(const Step& step, const BackwardProblem& p, const DeviceInfo& dev)
    : step_(&step), problem_(p), plan_(plan_backward_for(step, p, dev)) {
  if (!plan_.accepted()) throw Error("step " + step.id + " refused " + describe(p) + ": " + plan_.refusal);
  workspace_ = DeviceBuffer(plan_.workspace_bytes);
}

void PreparedBackward::launch(const BackwardTensors& t, cudaStream_t stream) const {
  run_backward(*step_, problem_, plan_, t, workspace_.get(), workspace_.bytes(), stream);
}

}  // namespace fs
