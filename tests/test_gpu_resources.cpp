// Every kernel a plan lists (Plan::kernels) is a kernel the runtime knows and can make resident with
// the block size and dynamic shared memory of the plan: what `flash-steps resources` reports.
#include <string>

#include "catch.h"
#include "gpu_test_config.h"
#include "common/forward/rules.h"
#include "runner/resources.h"

TEST_CASE("every kernel a plan lists fits on an SM as the plan launches it", "[harness]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const fs::Step& step : fs::steps()) {
    if (!step.forward.present() || !fs::test::step_selected(step.id)) continue;
    for (int64_t d : {64, 128})
      for (fs::DType dt : {fs::DType::fp16, fs::DType::bf16}) {
        const fs::Problem p = fs::make_problem(2, 1024, 1024, 8, 8, d, dt, true);
        const fs::Plan plan = fs::plan(step, p, dev);
        if (!plan.accepted()) continue;
        for (const fs::KernelLaunch& k : plan.kernels) {
          CAPTURE(step.id, fs::describe(p), k.threads, k.smem_bytes);
          const fs::KernelResources r = fs::kernel_resources(k);
          CAPTURE(r.name);
          CHECK(r.registers > 0);
          CHECK(r.blocks > 0);
          CHECK(r.blocks_per_sm >= 1);
          CHECK(r.occupancy() > 0);
          CHECK(r.occupancy() <= 1);
#if CUDART_VERSION >= 12030
          CHECK(r.mangled.rfind("_Z", 0) == 0);
#endif
        }
      }
  }
}
