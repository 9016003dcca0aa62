// Logit softcapping (fs_problem::softcap, Gemma 2's attention): every logit c = scale·s of a raw score
// s = q·k becomes softcap·tanh(c / softcap) before the softmax. A kernel computes
//     t = tanh(s · pre),   pre = scale / softcap,
// one FMUL and one MUFU.TANH per score, and uses softcap wherever it used the scale (the logit is
// softcap·t): its exponent's factor is softcap·log2(e) in place of scale·log2(e) (logit_scale below), so
// the softmax, the masks and the LSE need no change. The backward multiplies dS by the logit's slope,
// 1 - t². pre is finite: the harness's rules bound scale / softcap.
#pragma once

#include <type_traits>

#include "forward/problem.h"
#include "step/hd.h"

namespace fs {

struct Softcap {
  float pre = 0.0f;  // scale / softcap (0, which no kernel reads, when softcapping is off)
};

inline Softcap softcap_of(const fs_problem& p) {
  if (!(p.softcap > 0.0f)) return {};
  return {float(double(p.softmax_scale) / p.softcap)};
}

// f(std::true_type) when the problem caps its logits, f(std::false_type) otherwise: a kernel's SOFTCAP
// template flag, from the run-time problem (a step's host code).
template <class F>
decltype(auto) with_softcap(const fs_problem& p, F&& f) {
  if (p.softcap > 0.0f) return f(std::true_type{});
  return f(std::false_type{});
}

// The logit of one unit of what a kernel's scores hold: scale (raw scores), or softcap (tanh values).
FS_HD inline float logit_scale(const fs_problem& p) { return p.softcap > 0.0f ? p.softcap : p.softmax_scale; }
// The same where a kernel's SOFTCAP flag already says which (with_softcap sets it iff softcap > 0): no compare.
template <bool SOFTCAP>
FS_HD inline float logit_scale(const fs_problem& p) { return SOFTCAP ? p.softcap : p.softmax_scale; }

#ifdef __CUDACC__
// tanh as one MUFU.TANH (tanh.approx.f32, sm_75 and newer), as FlashAttention's kernels compute it.
__device__ inline float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

}  // namespace fs
