// The rules every pass applies to its tensors, written once: a (dim0, rows, heads, head_dim) view's
// size, strides and extent, whether it overlaps itself, and the pointers of a launch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "forward/problem.h"

namespace fs {

// The harness's limits on every view (common/flash_steps.h).
inline constexpr int64_t kHeadDimMultiple = 8;  // 16-byte rows for fp16/bf16
// Elements one tensor may span (its logical size and its view's extent): 2^58, far beyond any device,
// and small enough that every size derived from it (bytes as fp64 on the host, Q, K and V in one
// buffer) fits in int64_t.
inline constexpr int64_t kMaxTensorElements = int64_t(1) << 58;

// One tensor view as the sentences name it: "K" of the pair "K and V", over (batch, seqlen_k, heads_kv,
// head_dim), or (num_pages, page_size, ...) for a paged cache, whose first stride is then "page".
struct View {
  const char* name;         // "K"
  const char* pair;         // "K and V": the tensors that share its sizes
  const Strides& s;
  int64_t dim0, rows, heads, head_dim;
  const char* rows_name;    // "seqlen_k"
  const char* heads_name;   // "heads_kv"
  const char* dim0_name = "batch";
  const char* dim0_stride = "batch";
};

// "" when dim0 * rows * heads * head_dim is at most kMaxTensorElements.
std::string validate_size(const View& v);
// "" when head_dim is contiguous, every stride is >= 0 and a multiple of 8, and rows and heads do not
// overlap the head_dim of the next one.
std::string validate_strides(const View& v);
// "" when the view spans at most kMaxTensorElements from its base pointer.
std::string validate_extent(const View& v);
// All three, in that order.
std::string validate_view(const View& v);

// "" when no two elements of the view share an address, as O, dQ, dK and dV must not. The rule: sorted
// by stride, every dimension of extent > 1 starts at or past the span of the dimensions below it (the
// largest offset they reach, plus 1); every dense or padded layout, in any dimension order, follows
// it. `may_overlap` names, in the sentence, the tensors that may ("Q, K and V"). Call after validate_view.
std::string validate_no_overlap(const View& v, const char* may_overlap);

// One pointer of a launch: null is refused when `needed`; it must be `align`-byte aligned.
struct Pointer {
  const char* name;
  const void* ptr;
  bool needed;
  uintptr_t align = 16;
};
std::string validate_pointers(std::initializer_list<Pointer> pointers);

// Number of elements a tensor view spans from its base pointer (largest offset + 1); 0 if empty.
// Nothing when it does not fit in int64_t (negative strides or sizes are not expected: validate first).
std::optional<int64_t> checked_view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads,
                                           int64_t head_dim);
// The same for a view validate() accepted; throws std::overflow_error when it does not fit.
int64_t view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim);

// Contiguous strides of a (batch, seqlen, heads, head_dim) tensor. A stride that does not fit in
// int64_t is set to -1; the size rule refuses the dimensions that cause it before any stride is read.
Strides contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim);

}  // namespace fs
