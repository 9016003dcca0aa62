// flash_steps.h's definition of the keys a query row sees, pair by pair, for the tests of what implements
// it: the references' reference_keys (common/forward/check.h: tests/test_reference_cpu.cpp,
// tests/test_reference_backward.cpp) and the kernels' common/step/window.h (tests/test_window.cpp).
// Written apart from both, as the header states it, so that neither is checked against itself.
#pragma once

#include <cstdint>

#include "common/forward/problem.h"

namespace fs::test {

// Row i sees key j: j is a key (0 <= j < seqlen_k); causal: j <= i + seqlen_k - seqlen_q; a window:
// i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right, -1 unbounded.
inline bool sees(const Problem& p, int64_t i, int64_t j) {
  const int64_t past = j - (i + p.seqlen_k - p.seqlen_q);  // how far j lies past row i's diagonal
  if (j < 0 || j >= p.seqlen_k) return false;
  if (p.causal && past > 0) return false;
  if (p.window && p.window_left != -1 && past < -int64_t(p.window_left)) return false;
  if (p.window && p.window_right != -1 && past > int64_t(p.window_right)) return false;
  return true;
}

}  // namespace fs::test
