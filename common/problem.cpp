#include "problem.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "checked.h"

namespace fs {

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case FS_FP16: return "fp16";
    case FS_BF16: return "bf16";
    default: return "dtype?";
  }
}

Strides contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim) {
  auto or_invalid = [](std::optional<int64_t> x) { return x ? *x : int64_t(-1); };
  return Strides{or_invalid(checked_product({seqlen, heads, head_dim})), or_invalid(checked_mul(heads, head_dim)),
                 head_dim, 1};
}

double max_softmax_scale(int32_t dtype, int64_t head_dim) {
  if (dtype == FS_FP16) return kMaxLogit / (kLog2e * double(head_dim) * kMaxAbsFp16 * kMaxAbsFp16);
  return kMaxLogit / kLog2e;
}

Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, DType dtype, bool causal) {
  Problem p{};
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.dtype = static_cast<int32_t>(dtype);
  p.causal = causal ? 1 : 0;
  p.softmax_scale = head_dim > 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))) : 1.0f;
  p.q = contiguous_strides(seqlen_q, heads_q, head_dim);
  p.o = p.q;
  p.k = contiguous_strides(seqlen_k, heads_kv, head_dim);
  p.v = p.k;
  return p;
}

namespace {

std::string check_strides(const char* name, const Strides& s, int64_t seqlen, int64_t heads,
                          int64_t head_dim, const char* dim0_stride = "batch") {
  if (s.dim != 1) {
    std::ostringstream m;
    m << name << "'s head_dim stride is " << s.dim << "; the last dimension must be contiguous (stride 1)";
    return m.str();
  }
  const struct { const char* what; int64_t stride; int64_t extent; } dims[] = {
      {dim0_stride, s.batch, 1}, {"row", s.row, seqlen}, {"head", s.head, heads}};
  for (const auto& d : dims) {
    std::ostringstream m;
    if (d.stride < 0) {
      m << name << "'s " << d.what << " stride is " << d.stride << "; strides must be >= 0";
      return m.str();
    }
    if (d.stride % kHeadDimMultiple != 0) {
      m << name << "'s " << d.what << " stride is " << d.stride
        << " elements; it must be a multiple of " << kHeadDimMultiple
        << " so that every row starts 16-byte aligned";
      return m.str();
    }
  }
  // Rows of one head must not overlap the head_dim of the next row or head.
  if (seqlen > 1 && s.row < head_dim) {
    std::ostringstream m;
    m << name << "'s row stride " << s.row << " is smaller than head_dim " << head_dim
      << "; rows would overlap (the last dimension must be contiguous)";
    return m.str();
  }
  if (heads > 1 && s.head < head_dim) {
    std::ostringstream m;
    m << name << "'s head stride " << s.head << " is smaller than head_dim " << head_dim
      << "; heads would overlap (the last dimension must be contiguous)";
    return m.str();
  }
  return "";
}

// "" when batch * seqlen * heads * head_dim is at most kMaxTensorElements.
std::string check_size(const char* names, const char* seqlen_name, const char* heads_name, int64_t batch,
                       int64_t seqlen, int64_t heads, int64_t head_dim, const char* batch_name = "batch") {
  const auto n = checked_product({batch, seqlen, heads, head_dim});
  if (n && *n <= kMaxTensorElements) return "";
  std::ostringstream m;
  m << names << " have " << batch_name << " * " << seqlen_name << " * " << heads_name << " * head_dim = " << batch << " * "
    << seqlen << " * " << heads << " * " << head_dim;
  if (n) m << " = " << *n;
  m << " elements" << (n ? "" : ", which overflows 64 bits") << "; a tensor may hold at most 2^58 ("
    << kMaxTensorElements << ")";
  return m.str();
}

// "" when the view spans at most kMaxTensorElements from its base pointer.
std::string check_extent(const char* name, const Strides& s, const char* dim0_stride, const char* dim0_name,
                         int64_t dim0, const char* rows_name, int64_t rows, const char* heads_name, int64_t heads,
                         int64_t head_dim) {
  const auto extent = checked_view_extent(s, dim0, rows, heads, head_dim);
  if (extent && *extent <= kMaxTensorElements) return "";
  std::ostringstream m;
  m << name << "'s strides (" << dim0_stride << " " << s.batch << ", row " << s.row << ", head " << s.head << ") over "
    << dim0_name << " " << dim0 << ", " << rows_name << " " << rows << ", " << heads_name << " " << heads << " span ";
  if (extent) m << *extent << " elements";
  else m << "more than 2^63 elements";
  m << "; a tensor may span at most 2^58 (" << kMaxTensorElements << ")";
  return m.str();
}

}  // namespace

std::string validate_no_overlap(const char* name, const char* may_overlap, const Strides& s, int64_t batch,
                                const char* rows_name, int64_t rows, const char* heads_name, int64_t heads,
                                int64_t head_dim) {
  struct Dim {
    const char* what;
    const char* size_name;
    int64_t extent, stride;
  };
  Dim dims[] = {{"head_dim", "head_dim", head_dim, s.dim},
                {"head", heads_name, heads, s.head},
                {"row", rows_name, rows, s.row},
                {"batch", "batch", batch, s.batch}};
  if (std::any_of(std::begin(dims), std::end(dims), [](const Dim& d) { return d.extent == 0; })) return "";  // empty
  std::stable_sort(std::begin(dims), std::end(dims), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t span = 1;  // offsets reached by the dimensions below: 0 ... span - 1
  std::string below;
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < span) {
      std::ostringstream m;
      m << name << "'s " << d.what << " stride is " << d.stride << " with " << d.size_name << " " << d.extent;
      if (!below.empty()) m << ", less than the " << span << " elements spanned by its " << below << " dimensions";
      m << ": two elements of " << name << " would share one address (" << name << " must not overlap itself; "
        << may_overlap << " may)";
      return m.str();
    }
    span += (d.extent - 1) * d.stride;  // no overflow: the view's extent was checked first
    below += below.empty() ? d.what : std::string(" and ") + d.what;
  }
  return "";
}

std::string validate(const Problem& p) {
  std::ostringstream m;
  if (p.dtype != FS_FP16 && p.dtype != FS_BF16) {
    m << "dtype is " << p.dtype << "; it must be " << FS_FP16 << " (fp16) or " << FS_BF16 << " (bf16)";
    return m.str();
  }
  if (p.batch < 1) {
    m << "batch is " << p.batch << "; it must be at least 1";
    return m.str();
  }
  if (p.seqlen_q < 0 || p.seqlen_q > kMaxSeqlen) {
    m << "seqlen_q is " << p.seqlen_q << "; it must be between 0 and " << kMaxSeqlen;
    return m.str();
  }
  if (p.seqlen_k < 0 || p.seqlen_k > kMaxSeqlen) {
    m << "seqlen_k is " << p.seqlen_k << "; it must be between 0 and " << kMaxSeqlen;
    return m.str();
  }
  if (p.heads_q < 1) {
    m << "heads_q is " << p.heads_q << "; it must be at least 1";
    return m.str();
  }
  if (p.heads_kv < 1) {
    m << "heads_kv is " << p.heads_kv << "; it must be at least 1";
    return m.str();
  }
  if (p.heads_q % p.heads_kv != 0) {
    m << "heads_q (" << p.heads_q << ") is not a multiple of heads_kv (" << p.heads_kv
      << "); GQA needs every K/V head shared by the same number of query heads";
    return m.str();
  }
  if (const auto bh = checked_mul(p.batch, p.heads_q); !bh || *bh > kMaxBatchHeads) {
    m << "batch * heads_q is " << p.batch << " * " << p.heads_q;
    if (bh) m << " = " << *bh;
    else m << ", which overflows 64 bits";
    m << "; it must be at most " << kMaxBatchHeads;
    return m.str();
  }
  if (p.head_dim < kHeadDimMultiple || p.head_dim > kMaxHeadDim || p.head_dim % kHeadDimMultiple != 0) {
    m << "head_dim is " << p.head_dim << "; it must be a multiple of " << kHeadDimMultiple
      << " between " << kHeadDimMultiple << " and " << kMaxHeadDim;
    return m.str();
  }
  if (p.causal != 0 && p.causal != 1) {
    m << "causal is " << p.causal << "; it must be 0 or 1";
    return m.str();
  }
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.0f) {
    m << "softmax_scale is " << p.softmax_scale << "; it must be finite and greater than 0";
    return m.str();
  }
  if (const double bound = max_softmax_scale(p.dtype, p.head_dim); double(p.softmax_scale) > bound) {
    m << "softmax_scale is " << p.softmax_scale << "; ";
    if (p.dtype == FS_FP16)
      m << "with fp16 inputs and head_dim " << p.head_dim << " it must be at most " << bound
        << ", so that the largest possible logit, head_dim * 65504^2 * scale * log2(e), is at most 2^126 "
           "(finite in fp32)";
    else
      m << "it must be at most " << bound << ", so that scale * log2(e) is at most 2^126 (finite in fp32)";
    return m.str();
  }
  // Sizes, from the dimensions given, before any stride is read (contiguous strides are derived from them).
  std::string s;
  if (!(s = check_size("Q and O", "seqlen_q", "heads_q", p.batch, p.seqlen_q, p.heads_q, p.head_dim)).empty()) return s;
  if (!(s = check_size("K and V", "seqlen_k", "heads_kv", p.batch, p.seqlen_k, p.heads_kv, p.head_dim)).empty()) return s;
  const struct { const char* name; const Strides& st; int64_t seqlen, heads; const char* seqlen_name; const char* heads_name; } views[] = {
      {"Q", p.q, p.seqlen_q, p.heads_q, "seqlen_q", "heads_q"}, {"K", p.k, p.seqlen_k, p.heads_kv, "seqlen_k", "heads_kv"},
      {"V", p.v, p.seqlen_k, p.heads_kv, "seqlen_k", "heads_kv"}, {"O", p.o, p.seqlen_q, p.heads_q, "seqlen_q", "heads_q"}};
  for (const auto& v : views) {
    if (!(s = check_strides(v.name, v.st, v.seqlen, v.heads, p.head_dim)).empty()) return s;
    if (!(s = check_extent(v.name, v.st, "batch", "batch", p.batch, v.seqlen_name, v.seqlen, v.heads_name, v.heads,
                           p.head_dim)).empty())
      return s;
  }
  return validate_no_overlap("O", "Q, K and V", p.o, p.batch, "seqlen_q", p.seqlen_q, "heads_q", p.heads_q, p.head_dim);
}

std::string validate_view(const char* names, const char* name, const Strides& s, const char* dim0_name,
                          const char* dim0_stride, int64_t dim0, const char* rows_name, int64_t rows,
                          const char* heads_name, int64_t heads, int64_t head_dim) {
  std::string m = check_size(names, rows_name, heads_name, dim0, rows, heads, head_dim, dim0_name);
  if (m.empty()) m = check_strides(name, s, rows, heads, head_dim, dim0_stride);
  if (m.empty()) m = check_extent(name, s, dim0_stride, dim0_name, dim0, rows_name, rows, heads_name, heads, head_dim);
  return m;
}

std::string validate_tensors(const Problem& p, const Tensors& t) {
  const struct { const char* name; const void* ptr; bool needed; } ptrs[] = {
      {"Q", t.q, p.seqlen_q > 0}, {"K", t.k, p.seqlen_k > 0 && p.seqlen_q > 0},
      {"V", t.v, p.seqlen_k > 0 && p.seqlen_q > 0}, {"O", t.o, p.seqlen_q > 0}};
  for (const auto& x : ptrs) {
    std::ostringstream m;
    if (x.needed && x.ptr == nullptr) {
      m << x.name << " is a null pointer";
      return m.str();
    }
    if (reinterpret_cast<uintptr_t>(x.ptr) % 16 != 0) {
      m << x.name << " pointer " << x.ptr << " is not 16-byte aligned (address mod 16 = "
        << reinterpret_cast<uintptr_t>(x.ptr) % 16 << ")";
      return m.str();
    }
  }
  if (reinterpret_cast<uintptr_t>(t.lse) % 4 != 0) {
    std::ostringstream m;
    m << "LSE pointer " << static_cast<const void*>(t.lse) << " is not 4-byte aligned";
    return m.str();
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

double attention_flops(const Problem& p) {
  const double f = 4.0 * double(p.batch) * double(p.heads_q) * double(p.seqlen_q) *
                   double(p.seqlen_k) * double(p.head_dim);
  return p.causal ? f / 2 : f;
}

std::string describe(const Problem& p) {
  std::ostringstream m;
  m << "b" << p.batch << " h" << p.heads_q << "/" << p.heads_kv << " sq" << p.seqlen_q << " sk"
    << p.seqlen_k << " d" << p.head_dim << " " << dtype_name(p.dtype) << (p.causal ? " causal" : "");
  return m.str();
}

}  // namespace fs
