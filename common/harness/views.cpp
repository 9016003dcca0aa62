#include "harness/views.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "step/device.h"
#include "step/overflow.h"

namespace fs {

std::string validate_size(const View& v) {
  const auto n = checked_product({v.dim0, v.rows, v.heads, v.head_dim});
  if (n && *n <= kMaxTensorElements) return "";
  return sentence(v.pair, " have ", v.dim0_name, " * ", v.rows_name, " * ", v.heads_name, " * head_dim = ", v.dim0,
                  " * ", v.rows, " * ", v.heads, " * ", v.head_dim,
                  n ? " = " + std::to_string(*n) + " elements" : std::string(" elements, which overflows 64 bits"),
                  "; a tensor may hold at most 2^58 (", kMaxTensorElements, ")");
}

std::string validate_strides(const View& v) {
  const Strides& s = v.s;
  if (s.dim != 1)
    return sentence(v.name, "'s head_dim stride is ", s.dim, "; the last dimension must be contiguous (stride 1)");
  const struct { const char* what; int64_t stride; } dims[] = {{v.dim0_stride, s.batch}, {"row", s.row}, {"head", s.head}};
  for (const auto& d : dims) {
    if (d.stride < 0) return sentence(v.name, "'s ", d.what, " stride is ", d.stride, "; strides must be >= 0");
    if (d.stride % kHeadDimMultiple != 0)
      return sentence(v.name, "'s ", d.what, " stride is ", d.stride, " elements; it must be a multiple of ",
                      kHeadDimMultiple, " so that every row starts 16-byte aligned");
  }
  // Rows of one head must not overlap the head_dim of the next row or head. A K or V expanded over
  // heads (head stride 0) is GQA/MQA given another way: only a batch stride of 0 broadcasts.
  for (const auto& [what, count, stride] : {std::tuple{"row", v.rows, s.row}, std::tuple{"head", v.heads, s.head}})
    if (count > 1 && stride < v.head_dim)
      return sentence(v.name, "'s ", what, " stride ", stride, " is smaller than head_dim ", v.head_dim, "; ", what,
                      "s would overlap (the last dimension must be contiguous)",
                      stride == 0 && what[0] == 'h' && v.pair[0] == 'K'
                          ? ". Only a batch stride of 0 broadcasts: pass the one K/V head as MQA (heads_kv 1)"
                          : "");
  return "";
}

std::string validate_extent(const View& v) {
  const auto extent = checked_view_extent(v.s, v.dim0, v.rows, v.heads, v.head_dim);
  if (extent && *extent <= kMaxTensorElements) return "";
  return sentence(v.name, "'s strides (", v.dim0_stride, " ", v.s.batch, ", row ", v.s.row, ", head ", v.s.head,
                  ") over ", v.dim0_name, " ", v.dim0, ", ", v.rows_name, " ", v.rows, ", ", v.heads_name, " ", v.heads,
                  " span ", extent ? std::to_string(*extent) : std::string("more than 2^63"),
                  " elements; a tensor may span at most 2^58 (", kMaxTensorElements, ")");
}

std::string validate_view(const View& v) {
  std::string why = validate_size(v);
  if (why.empty()) why = validate_strides(v);
  if (why.empty()) why = validate_extent(v);
  return why;
}

std::string validate_no_overlap(const View& v, const char* may_overlap) {
  struct Dim {
    const char* what;
    const char* size_name;
    int64_t extent, stride;
  };
  Dim dims[] = {{"head_dim", "head_dim", v.head_dim, v.s.dim},
                {"head", v.heads_name, v.heads, v.s.head},
                {"row", v.rows_name, v.rows, v.s.row},
                {"batch", "batch", v.dim0, v.s.batch}};
  if (std::any_of(std::begin(dims), std::end(dims), [](const Dim& d) { return d.extent == 0; })) return "";  // empty
  std::stable_sort(std::begin(dims), std::end(dims), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = 1;  // offsets reached by the dimensions below: 0 ... span - 1
  std::string below;
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < span)
      return sentence(v.name, "'s ", d.what, " stride is ", d.stride, " with ", d.size_name, " ", d.extent,
                      below.empty() ? "" : sentence(", less than the ", span, " elements spanned by its ", below,
                                                    " dimensions"),
                      ": two elements of ", v.name, " would share one address (", v.name, " must not overlap itself; ",
                      may_overlap, " may)");
    span += (d.extent - 1) * d.stride;  // no overflow: the view's extent was checked first
    below += below.empty() ? d.what : std::string(" and ") + d.what;
  }
  return "";
}

std::string validate_pointers(std::initializer_list<Pointer> pointers) {
  for (const Pointer& x : pointers) {
    if (x.needed && x.ptr == nullptr) return sentence(x.name, " is a null pointer");
    if (const uintptr_t off = reinterpret_cast<uintptr_t>(x.ptr) % x.align; off != 0)
      return sentence(x.name, " pointer ", x.ptr, " is not ", x.align, "-byte aligned (address mod ", x.align, " = ",
                      off, ")");
  }
  return "";
}

std::optional<int64_t> checked_view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads,
                                           int64_t head_dim) {
  if (batch == 0 || seqlen == 0 || heads == 0 || head_dim == 0) return 0;
  std::optional<int64_t> extent = head_dim;
  for (const auto& [n, stride] : {std::pair{batch, s.batch}, std::pair{seqlen, s.row}, std::pair{heads, s.head}}) {
    const auto term = checked_mul(n - 1, stride);
    extent = term && extent ? checked_add(*extent, *term) : std::nullopt;
  }
  return extent;
}

int64_t view_extent(const Strides& s, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  const auto extent = checked_view_extent(s, batch, seqlen, heads, head_dim);
  if (!extent) throw std::overflow_error("view_extent: the view spans more than 2^63 elements (validate the problem first)");
  return *extent;
}

Strides contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim) {
  auto or_invalid = [](std::optional<int64_t> x) { return x ? *x : int64_t(-1); };
  return Strides{or_invalid(checked_product({seqlen, heads, head_dim})), or_invalid(checked_mul(heads, head_dim)),
                 head_dim, 1};
}

}  // namespace fs
