// GPU tests: without a usable CUDA device the whole executable exits with kSkipCode, which ctest
// reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt), never as passed.
#include <iostream>

#include "catch_main.h"
#include "common/device.h"
#include "gpu_test_config.h"

int main(int argc, char** argv) {
  const std::string why = fs::cuda_unavailable_reason();
  if (!why.empty()) {
    std::cout << "SKIPPED: " << why << "; the GPU tests need a CUDA device.\n";
    return fs::test::kSkipCode;
  }
  std::cout << "GPU: " << fs::describe(fs::current_device()) << "\n";
  return Catch::Session().run(argc, argv);
}
