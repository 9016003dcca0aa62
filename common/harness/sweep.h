// The benchmark sweep, written once: the shapes bench/compare_torch.py (through the C ABI,
// fs_sweep_* in flash_steps.h) and flash_steps_bench measure. Every shape moves the same Q, K, V and
// O bytes (16384 · 2048 elements per tensor); only attention's cost, quadratic in seqlen, changes:
//     seqlen 512 … 16384 → batch 32 … 1;  head_dim 128 → 16 heads, 64 → 32 heads
// Full: seqlen 512 … 16k × head_dim 128, 64 × fp16, bf16 (each causal and not); quick (about a
// minute): seqlen 1k, 2k, 4k × head_dim 128 × fp16.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "forward/problem.h"

namespace fs {

inline constexpr int64_t kSweepTokens = 16384;  // batch · seqlen of every shape
inline constexpr int64_t kSweepWidth = 2048;    // heads · head_dim of every shape

struct Sweep {
  std::vector<int64_t> seqlens;   // ascending
  std::vector<int64_t> head_dims;
  std::vector<DType> dtypes;
};
Sweep sweep(bool quick);

// fs_sweep_shape: "" and the batch and heads, or a sentence naming the value that does not divide.
std::string sweep_shape(int64_t tokens, int64_t seqlen, int64_t head_dim, int64_t& batch, int64_t& heads);

}  // namespace fs
