// Input values of the ceiling kernels: pseudo-random, non-zero and finite, derived from the thread's
// index at run time, so the compiler cannot fold them and the units work on varied bits (a unit fed
// zeros may draw less power and clock higher than it would on real data).
#pragma once

#include <cstdint>

namespace fs::ceilings {

// A 32-bit integer hash (two multiply-xorshift rounds).
__device__ inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// A value in [-1, 1) from the top 24 bits of hash32(i).
__device__ inline float hashed_unit(uint32_t i) { return float(hash32(i) >> 8) * (2.0f / 16777216.0f) - 1.0f; }

}  // namespace fs::ceilings
