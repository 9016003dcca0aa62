// Comparing a step's output with a reference.
//
// Tolerance, per element: |out - ref| <= atol + rtol * |ref|, with u the unit roundoff of the dtype
// (fp16: 2^-11, bf16: 2^-8) and
//   rtol = 2u            O is rounded to the dtype once: at most u·|O|.
//   atol = 2u · max|V|   the fused steps round the probabilities P (each in [0, 1]) to the dtype
//                        before P·V: O = Σ p̃_j v_j / l with |p̃_j - p_j| <= u·p_j, so the error is at
//                        most u · Σ p_j |v_j| / l <= u · max|V|.
// Both bounds are worst cases and the factor 2 leaves room for the fp32 accumulation order and the
// exp2/log2 approximations (relative errors near 2^-22). LSE is fp32 throughout: |err| <= 1e-4 · (1 + |ref|).
// A NaN or infinity anywhere in O fails; in LSE only -inf where the reference has -inf passes.
#pragma once

#include <string>
#include <vector>

#include "problem.h"
#include "reference.h"

namespace fs {

struct Tolerance {
  double atol, rtol, lse_rtol;
};
Tolerance tolerance_for(int32_t dtype, double max_abs_v);
double unit_roundoff(int32_t dtype);

struct Comparison {
  double max_abs_err = 0;       // over O
  double rel_fro_err = 0;       // ||out - ref||_F / ||ref||_F over O
  double max_lse_err = 0;
  int64_t nonfinite = 0;        // NaN / inf in O, and NaN / wrong inf in LSE
  int64_t mismatches = 0;       // elements outside the tolerance (O and LSE)
  std::vector<std::string> first_mismatches;  // up to 8, with coordinates (b, s, h, d)
  bool pass() const { return nonfinite == 0 && mismatches == 0; }
  std::string summary() const;  // one line
};

// `o` is the O view's storage (index with p.o strides); `lse` is (batch, heads_q, seqlen_q), or
// empty to skip the LSE check.
Comparison compare(const Problem& p, const std::vector<float>& o, const std::vector<float>& lse,
                   const Reference& ref, double max_abs_v);

}  // namespace fs
