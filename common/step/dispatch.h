// From run-time choices to compile-time ones, for a step's host code: the dtype of the problem, and
// the row of its tile table that the plan chose.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "forward/problem.h"
#include "step/device.h"

namespace fs {

template <typename T>
struct TypeTag {
  using type = T;
};

// dispatch_dtype(p.dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <typename F>
decltype(auto) dispatch_dtype(int32_t dtype, F&& f) {
  if (dtype == FS_FP16) return f(TypeTag<__half>{});
  if (dtype == FS_BF16) return f(TypeTag<__nv_bfloat16>{});
  throw Error("unknown dtype " + std::to_string(dtype));
}

template <typename F, int... CONFIGS>
void with_config(int config, F&& f, std::integer_sequence<int, CONFIGS...>) {
  const bool found = ((config == CONFIGS ? (f(std::integral_constant<int, CONFIGS>{}), true) : false) || ...);
  if (!found) throw Error("no tile configuration " + std::to_string(config));
}

// with_config<kNumConfigs>(plan.config, [&](auto c) { constexpr int CONFIG = decltype(c)::value; ... })
// calls f(std::integral_constant<int, CONFIG>) for the run-time row `config` of a table of N rows
// (fs::Error when there is none). f is instantiated for every row; a step whose sub-steps have only
// some rows guards its body with `if constexpr`.
template <int N, typename F>
void with_config(int config, F&& f) {
  with_config(config, std::forward<F>(f), std::make_integer_sequence<int, N>{});
}

}  // namespace fs
