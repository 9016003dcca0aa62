#include "registry.h"

#include <algorithm>
#include <sstream>

#include "workload.h"

namespace fs {

// One declaration per registered step, generated from steps/CMakeLists.txt.
#define FS_STEP(dir) void register_step_##dir(Registry& r);
#include "steps_list.inc"
#undef FS_STEP

void Registry::add(Step step) {
  if (step.id.empty() || !step.supports || !step.launch)
    throw Error("a step must have an id, a supports() and a launch()");
  if (std::any_of(steps_.begin(), steps_.end(), [&](const Step& s) { return s.id == step.id; }))
    throw Error("step id '" + step.id + "' is registered twice");
  steps_.push_back(std::move(step));
}

const std::vector<Step>& steps() {
  static const std::vector<Step> all = [] {
    Registry r;
#define FS_STEP(dir) register_step_##dir(r);
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

std::string check(const Step& step, const Problem& p, const DeviceInfo& dev) {
  std::string why = validate(p);
  if (!why.empty()) return why;
  if (dev.compute_capability < step.min_compute_capability) {
    std::ostringstream m;
    m << "step " << step.id << " needs compute capability " << step.min_compute_capability / 10
      << "." << step.min_compute_capability % 10 << " or newer; this GPU is "
      << dev.compute_capability / 10 << "." << dev.compute_capability % 10;
    return m.str();
  }
  return step.supports(p, dev);
}

void run(const Step& step, const Problem& p, const Tensors& t, cudaStream_t stream,
         const DeviceInfo& dev) {
  std::string why = check(step, p, dev);
  if (why.empty()) why = validate_tensors(p, t);
  if (!why.empty()) throw Error("step " + step.id + " refused " + describe(p) + ": " + why);
  if (p.seqlen_q == 0) return;
  if (p.seqlen_k == 0) {
    fill_empty_output(p, t, stream);
    return;
  }
  step.launch(p, t, stream);
}

}  // namespace fs
