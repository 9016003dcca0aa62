#pragma once

#include <cstdlib>
#include <iostream>
#include <string>

namespace fs::test {

// Exit code of a GPU test executable that found no GPU; ctest reports it as skipped.
inline constexpr int kSkipCode = 77;

// FLASH_STEPS_ONLY=<prefix> limits the registry-driven tests to the steps whose id starts with it,
// so that ctest can run one test per step (tests/CMakeLists.txt).
inline bool step_selected(const std::string& id) {
  const char* only = std::getenv("FLASH_STEPS_ONLY");
  return !only || id.rfind(only, 0) == 0;
}

// Tests that could not run on this machine (not enough free memory, ...). main_gpu.cpp exits with
// kSkipCode when one did and nothing failed, so ctest shows "Skipped", never "Passed".
inline int& skipped_count() {
  static int n = 0;
  return n;
}

// Says why a test cannot run here and counts it; the test then returns.
inline void skip(const std::string& why) {
  std::cout << "SKIPPED: " << why << "\n";
  ++skipped_count();
}

}  // namespace fs::test
