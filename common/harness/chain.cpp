#include "harness/chain.h"

#include <algorithm>
#include <cctype>

#include "backward/rules.h"
#include "decode/rules.h"
#include "forward/rules.h"

namespace fs {

// One declaration per registered step directory, generated from steps/CMakeLists.txt:
// FS_STEP(dir, arch), arch 0 or the architecture of an ARCH 90a step (90).
#define FS_STEP(dir, arch) void register_step_##dir(Registry& r);
#include "steps_list.inc"
#undef FS_STEP

void Registry::add(Step step) {
  if (step.id.empty()) throw Error("a step must have an id");
  const struct { const char* name; bool present, complete; } passes[] = {
      {"forward pass", step.forward.present(), step.forward.complete()},
      {"decoding entry", step.decode.present(), step.decode.complete()},
      {"backward entry", step.backward.present(), step.backward.complete()}};
  for (const auto& pass : passes)
    if (pass.present && !pass.complete)
      throw Error("step " + step.id + "'s " + pass.name + " must have all of limits(), plan(), launch() and claims()");
  if (!step.forward.present() && !step.backward.present())
    throw Error("step " + step.id + " has neither a forward pass (limits(), plan(), launch(), claims()) nor a "
                "backward entry");
  if (std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) { return s.id == step.id; }))
    throw Error("step id '" + step.id + "' is registered twice");
  step.dir = dir_;
  if (arch_ != 0) step.arch_specific = step.min_compute_capability = arch_;
  steps_.push_back(std::move(step));
}

const std::vector<Step>& steps() {
  static const std::vector<Step> all = [] {
    Registry r;
#define FS_STEP(dir, arch) \
  r.set_dir(#dir, arch);   \
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

static std::string compute_capability_name(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

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

std::string validate_workspace_pointer(const void* workspace, size_t workspace_bytes) {
  if (workspace == nullptr && workspace_bytes > 0)
    return sentence("the workspace is a null pointer with workspace_bytes ", workspace_bytes,
                    "; pass a buffer of that many bytes, or NULL with 0");
  return validate_pointers({{"the workspace", workspace, false}});
}

std::string validate_workspace(const Plan& plan, const void* workspace, size_t workspace_bytes,
                               const char* size_function) {
  if (plan.workspace_bytes == 0) return "";
  if (workspace == nullptr)
    return sentence("the workspace is a null pointer; this problem needs ", plan.workspace_bytes,
                    " bytes of workspace (see ", size_function, ")");
  if (workspace_bytes < plan.workspace_bytes)
    return sentence("the workspace is ", workspace_bytes, " bytes; this problem needs ", plan.workspace_bytes, " (see ",
                    size_function, ")");
  return "";
}

// "" when the step implements every feature the problem asks for (softcap, window, variable-length
// batches), else a sentence naming a step that does for this pass.
template <typename Problem>
std::string feature_refusal(const Step& step, const Problem& problem) {
  const fs_problem& p = Pass<Problem>::attention(problem);
  auto refuse = [&](bool Step::*has, const char* feature, const std::string& what, const char* off = "0") {
    const auto& all = steps();
    const auto it = std::find_if(all.rbegin(), all.rend(),  // the newest step with it
                                 [&](const Step& s) { return s.*has && Pass<Problem>::entry(s).present(); });
    return sentence(what, "; step ", step.id, " has no ", feature, " (", off, " turns it off)",
                    it == all.rend() ? std::string() : "; step " + it->id + " has it");
  };
  if (p.softcap != 0 && !step.softcap) return refuse(&Step::softcap, "softcapping", sentence("softcap is ", p.softcap));
  if (p.window != 0 && !step.window)
    return refuse(&Step::window, "sliding window", sentence("window is 1 (", p.window_left, ", ", p.window_right, ")"));
  if (is_varlen(p) && !step.varlen)
    return refuse(&Step::varlen, "variable-length batches",
                  sentence("cu_seqlens_q is set (a variable-length batch of ", p.batch, " sequences)"), "NULL");
  return "";
}

template <typename Problem>
std::string static_refusal(const Step& step, const Problem& p) {
  const auto& entry = Pass<Problem>::entry(step);
  if (!entry.present()) return Pass<Problem>::missing(step);
  std::string why = validate(p);
  if (why.empty()) why = feature_refusal(step, p);
  return why.empty() ? entry.limits(p) : why;
}

template <typename Problem>
Plan plan_on_device(const Step& step, const Problem& p, const DeviceInfo& dev) {
  if (std::string why = check_architecture(step, dev); !why.empty()) return Plan{.refusal = why};
  Plan plan = Pass<Problem>::entry(step).plan(p, dev);
  if (plan.accepted()) plan.workspace_bytes += Pass<Problem>::harness_workspace(p);
  return plan;
}

template <typename Problem>
void launch(const Step& step, const Problem& p, const Plan& plan, const PassTensors<Problem>& t, void* workspace,
            cudaStream_t stream) {
  bool done = false;
  const std::string why = Pass<Problem>::harness_launch(p, t, workspace, stream, done);
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  if (done) return;
  const size_t own = Pass<Problem>::harness_workspace(p);  // the harness's part comes first
  void* step_workspace = plan.workspace_bytes > own ? static_cast<char*>(workspace) + own : nullptr;
  Pass<Problem>::entry(step).launch(p, t, plan, step_workspace, stream);
}

template <typename Problem>
void run(const Step& step, const Problem& p, const Plan& plan, const PassTensors<Problem>& t, void* workspace,
         size_t workspace_bytes, cudaStream_t stream) {
  std::string why = plan.refusal;
  if (why.empty() && !Pass<Problem>::entry(step).present()) why = Pass<Problem>::missing(step);  // another step's plan
  if (why.empty()) why = validate_tensors(p, t);
  if (why.empty()) why = validate_workspace_pointer(workspace, workspace_bytes);
  if (why.empty()) why = validate_workspace(plan, workspace, workspace_bytes, Pass<Problem>::workspace_function);
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  launch(step, p, plan, t, workspace, stream);
}

template <typename Problem>
Prepared<Problem>::Prepared(const Step& step, const Problem& p, Plan plan)
    : step_(&step), problem_(p), plan_(std::move(plan)) {
  if (!plan_.accepted()) throw Error("step " + step.id + " refused " + describe(p) + ": " + plan_.refusal);
  workspace_ = DeviceBuffer(plan_.workspace_bytes);
}

// The passes: one line each.
#define FS_PASS(Problem)                                                                                           \
  template std::string static_refusal(const Step&, const Problem&);                                               \
  template Plan plan_on_device(const Step&, const Problem&, const DeviceInfo&);                                    \
  template void launch(const Step&, const Problem&, const Plan&, const PassTensors<Problem>&, void*, cudaStream_t); \
  template void run(const Step&, const Problem&, const Plan&, const PassTensors<Problem>&, void*, size_t,         \
                    cudaStream_t);                                                                                 \
  template class Prepared<Problem>;
FS_PASS(Problem)
FS_PASS(DecodeProblem)
FS_PASS(BackwardProblem)
#undef FS_PASS

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

}  // namespace fs
