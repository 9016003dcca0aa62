#pragma once

#include <cstdlib>
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

}  // namespace fs::test
