// Step 13 — the compile-time choices of the production features. Its sub-steps reuse step 09's forward
// tiles, rings and index math (steps/09_warp_specialized/traits.h) and step 12's backward ones
// (steps/12_hopper_backward/traits.h) as they are; what each adds is one template flag per kernel:
// 13a the two factors of common/step/softcap.h, 13b the band of common/step/window.h (which K/V tiles a
// query tile visits, and which of them need the mask), 13c the sequences of common/step/varlen.h.
#pragma once

#include "steps/09_warp_specialized/traits.h"
#include "steps/12_hopper_backward/traits.h"
#include "common/step/window.h"

namespace fs::step13 {

// ---- the ideas of step 13 ----------------------------------------------------------------------
enum Idea : int {
  kSoftcap = 1,  // 13a  logit softcapping, softcap·tanh(s / softcap), where the scores are in registers:
                 //      in the forward before the row max, in the backward before P, whose dS takes
                 //      the slope 1 - tanh²
  kWindow = 2,   // 13b  sliding window (Mistral, Gemma): each query tile visits only the K/V tiles its band
                 //      touches, and masks only the tiles that straddle an edge of the band; the backward's
                 //      K/V tiles visit only the query tiles that see them
  kVarlen = 3,   // 13c  variable-length batches (FlashAttention's varlen): sequences packed into one tensor;
                 //      a block per tile of the padded batch, exiting when its sequence has no such tile,
                 //      and each sequence's own masks and offsets inside the tile loop
};

// The forward runs step 09f's kernel (its tile table and persistent schedule), the backward step 12c's.
inline constexpr int kForwardIdeas = step09::kPersistent;
inline constexpr int kBackwardIdeas = step12::kBulkDq;

}  // namespace fs::step13
