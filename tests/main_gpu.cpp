// GPU tests: on a machine with no CUDA device the whole executable exits with kSkipCode, which ctest
// reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as passed. A device that is
// present but unusable (driver too old, a CUDA error) is a failure. A test that cannot run here (not
// enough free memory) calls fs::test::skip(); the run then exits with kSkipCode if nothing failed.
#include <iostream>

#include "catch_main.h"
#include "common/harness/gpu.h"
#include "gpu_test_config.h"

int main(int argc, char** argv) {
  const std::string why = fs::cuda_unavailable_reason();
  if (!why.empty()) {
    if (fs::cuda_device_absent()) {
      std::cout << "SKIPPED: " << why << "; the GPU tests need a CUDA device.\n";
      return fs::test::kSkipCode;
    }
    std::cout << "FAILED: a CUDA device is present but unusable: " << why << "\n";
    return 1;
  }
  std::cout << "GPU: " << fs::describe(fs::current_device()) << "\n";
  const int failed = Catch::Session().run(argc, argv);
  if (failed == 0 && fs::test::skipped_count() > 0) {
    std::cout << "SKIPPED: " << fs::test::skipped_count() << " test(s) could not run here (see SKIPPED above)\n";
    return fs::test::kSkipCode;
  }
  return failed;
}
