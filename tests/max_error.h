// The largest |x| of an array and the largest |a - b| of two: how the backward's reference tests
// measure their errors (tests/test_reference_backward.cpp, tests/test_gpu_backward.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace fs::test {

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t e = 0; e < a.size(); ++e) m = std::max(m, std::fabs(a[e] - b[e]));
  return m;
}

}  // namespace fs::test
