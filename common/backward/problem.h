/* The backward problem: dQ, dK, dV of softmax attention from the forward's O and LSE and from dO
 * (common/flash_steps.h has the contract). The struct of the C ABI and, for C++, what a backward kernel
 * needs to read it. */
#ifndef FLASH_STEPS_BACKWARD_PROBLEM_H
#define FLASH_STEPS_BACKWARD_PROBLEM_H

#include "forward/problem.h"

typedef struct fs_backward_problem {
  fs_problem attention;  /* the forward problem: sizes, dtype, causal, softmax_scale, strides of Q, K, V, O */
  int32_t deterministic; /* 0 or 1 */
  fs_strides d_o, dq, dk, dv;
} fs_backward_problem;

#ifdef __cplusplus

namespace fs {

using BackwardProblem = fs_backward_problem;

// Device pointers of one backward launch. lse is the forward's (never null).
struct BackwardTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const float* lse = nullptr;
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

}  // namespace fs

#endif  // __cplusplus
#endif  // FLASH_STEPS_BACKWARD_PROBLEM_H
