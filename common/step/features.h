// The production features a kernel may be built with (note 13): logit softcapping (step/softcap.h), a
// sliding window (step/window.h) and a packed batch of variable-length sequences (step/varlen.h). Each is
// a template flag of the kernels that have it, false leaving the kernel as it was (step 13's forward: 09f's
// PTX) or within a loop's copy of it (its backward; note 13, Appendix E); a step's host code picks the
// instantiation from the run-time problem here, once for every flag.
#pragma once

#include <type_traits>

#include "forward/problem.h"
#include "step/softcap.h"
#include "step/varlen.h"
#include "step/window.h"

namespace fs {

// f(capped, windowed), each std::true_type or std::false_type as the problem asks: a kernel's SOFTCAP and
// WINDOW template flags, e.g.  with_features(p, [&](auto capped, auto windowed) {
//     kernel<T, decltype(capped)::value, decltype(windowed)::value><<<...>>>(...); });
template <class F>
decltype(auto) with_features(const fs_problem& p, F&& f) {
  return with_softcap(p, [&](auto capped) {
    if (p.window) return f(capped, std::true_type{});
    return f(capped, std::false_type{});
  });
}

// f(capped, windowed, packed): as with_features, with a packed batch (13c) as a third flag. A packed batch
// always takes the window's code: each sequence's mask (causal, its window, none) is a band of its own.
template <class F>
decltype(auto) with_packed_features(const fs_problem& p, F&& f) {
  return with_softcap(p, [&](auto capped) {
    if (is_varlen(p)) return f(capped, std::true_type{}, std::true_type{});
    if (p.window) return f(capped, std::true_type{}, std::false_type{});
    return f(capped, std::false_type{}, std::false_type{});
  });
}

}  // namespace fs
