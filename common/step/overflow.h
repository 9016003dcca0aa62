// Checked 64-bit arithmetic for every size computed from user input (products of dimensions,
// strides, extents, element and byte counts, workspaces). A size that does not fit is refused with a
// sentence, never wrapped: signed overflow is undefined behaviour, and a wrapped size is a small
// allocation that a kernel then writes past.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace fs {

// a · b, or nothing when it does not fit in int64_t.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nothing when it does not fit in int64_t.
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of all factors (0 when one of them is 0), or nothing when it does not fit.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  for (int64_t f : factors)
    if (f == 0) return 0;
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}

}  // namespace fs
