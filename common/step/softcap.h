// Logit softcapping (fs_problem::softcap, Gemma 2's attention): every logit c = scale·s becomes
// softcap·tanh(c / softcap) before the softmax. A kernel keeps its softmax as it is and changes the
// raw score s (q·k) it feeds it into
//     post · tanh(s · pre),   pre = scale / softcap,   post = softcap / scale,
// whose product with the scale is the capped logit; the backward multiplies dS by the logit's slope,
// 1 - tanh². Both factors are finite: the harness's rules bound softcap / scale and scale / softcap.
#pragma once

#include "step/hd.h"

namespace fs {

struct Softcap {
  float pre = 0.0f;   // scale / softcap
  float post = 0.0f;  // softcap / scale
};

// The factors of a problem with softcap > 0 (a Softcap of zeros otherwise, which no kernel reads).
inline Softcap softcap_of(float softmax_scale, float softcap) {
  if (!(softcap > 0.0f)) return {};
  return {float(double(softmax_scale) / softcap), float(double(softcap) / softmax_scale)};
}

#ifdef __CUDACC__
// tanh as one MUFU.TANH (tanh.approx.f32, sm_75 and newer), as FlashAttention's kernels compute it.
__device__ inline float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

}  // namespace fs
