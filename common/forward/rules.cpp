#include "forward/rules.h"

#include <algorithm>
#include <cmath>

#include "harness/gpu.h"
#include "step/overflow.h"
#include "step/window.h"

namespace fs {

const char* dtype_name(int32_t dtype) { return dtype == FS_FP16 ? "fp16" : dtype == FS_BF16 ? "bf16" : "dtype?"; }

double max_softmax_scale(int32_t dtype, int64_t head_dim) {
  if (dtype == FS_FP16) return kMaxLogit / (kLog2e * double(head_dim) * kMaxAbsFp16 * kMaxAbsFp16);
  return kMaxLogit / kLog2e;
}

Problem make_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                     int64_t head_dim, DType dtype, int32_t causal) {
  const Strides q = contiguous_strides(seqlen_q, heads_q, head_dim), k = contiguous_strides(seqlen_k, heads_kv, head_dim);
  const float scale = head_dim > 0 ? float(1.0 / std::sqrt(double(head_dim))) : 1.0f;
  return Problem{batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, int32_t(dtype), causal, scale, 0.0f,
                 q,     k,        k,        q,       0,        0,        0,              nullptr, nullptr, 0, 0};
}

namespace {

// The fields of a variable-length batch (flash_steps.h): both offset arrays or neither; with them, the
// totals within the kernels' int32 row counts and within what batch sequences of the bounds can hold, and
// no batch strides (the tensors are packed); without them, no totals.
std::string validate_varlen(const Problem& p) {
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return sentence(p.cu_seqlens_q ? "cu_seqlens_q is set but cu_seqlens_k is NULL"
                                   : "cu_seqlens_k is set but cu_seqlens_q is NULL",
                    "; a variable-length batch needs both (NULL for both turns it off)");
  const std::pair<const char*, int64_t> totals[] = {{"total_q", p.total_q}, {"total_k", p.total_k}};
  if (!is_varlen(p)) {
    for (const auto& [name, total] : totals)
      if (total != 0)
        return sentence(name, " is ", total, " but cu_seqlens_q and cu_seqlens_k are NULL; it must be 0 (the totals ",
                        "count the rows of a variable-length batch)");
    return "";
  }
  for (const auto& [name, total] : totals)
    if (total < 0 || total > kMaxSeqlen)
      return sentence(name, " is ", total, "; it must be between 0 and ", kMaxSeqlen,
                      " (the kernels count the rows of the packed tensors in int32)");
  const struct { const char* total_name; int64_t total, bound; const char* bound_name; } sides[] = {
      {"total_q", p.total_q, p.seqlen_q, "seqlen_q"}, {"total_k", p.total_k, p.seqlen_k, "seqlen_k"}};
  for (const auto& s : sides)  // no overflow: batch and the bounds are below 2^31
    if (s.total > p.batch * s.bound)
      return sentence(s.total_name, " is ", s.total, ", more than batch * ", s.bound_name, " = ", p.batch, " * ",
                      s.bound, " = ", p.batch * s.bound, ": ", p.batch, " sequences of at most ", s.bound,
                      " rows cannot hold them (", s.bound_name, " bounds every sequence's length)");
  return validate_packed_strides({{"q", p.q}, {"k", p.k}, {"v", p.v}, {"o", p.o}});
}

}  // namespace

std::string validate_packed_strides(std::initializer_list<std::pair<const char*, Strides>> views) {
  for (const auto& [name, st] : views)
    if (st.batch != 0)
      return sentence("with cu_seqlens the tensors are (total, heads, head_dim): ", name, ".batch is ", st.batch,
                      ", it must be 0");
  return "";
}

std::string validate(const Problem& p) {
  if (p.dtype != FS_FP16 && p.dtype != FS_BF16)
    return sentence("dtype is ", p.dtype, "; it must be ", FS_FP16, " (fp16) or ", FS_BF16, " (bf16)");
  if (p.batch < 1) return sentence("batch is ", p.batch, "; it must be at least 1");
  for (const auto& [name, len] : {std::pair{"seqlen_q", p.seqlen_q}, std::pair{"seqlen_k", p.seqlen_k}})
    if (len < 0 || len > kMaxSeqlen) return sentence(name, " is ", len, "; it must be between 0 and ", kMaxSeqlen);
  for (const auto& [name, heads] : {std::pair{"heads_q", p.heads_q}, std::pair{"heads_kv", p.heads_kv}})
    if (heads < 1) return sentence(name, " is ", heads, "; it must be at least 1");
  if (p.heads_q % p.heads_kv != 0)
    return sentence("heads_q (", p.heads_q, ") is not a multiple of heads_kv (", p.heads_kv,
                    "); GQA needs every K/V head shared by the same number of query heads");
  if (const auto bh = checked_mul(p.batch, p.heads_q); !bh || *bh > kMaxBatchHeads)
    return sentence("batch * heads_q is ", p.batch, " * ", p.heads_q,
                    bh ? " = " + std::to_string(*bh) : std::string(", which overflows 64 bits"), "; it must be at most ",
                    kMaxBatchHeads);
  if (p.head_dim < kHeadDimMultiple || p.head_dim > kMaxHeadDim || p.head_dim % kHeadDimMultiple != 0)
    return sentence("head_dim is ", p.head_dim, "; it must be a multiple of ", kHeadDimMultiple, " between ",
                    kHeadDimMultiple, " and ", kMaxHeadDim);
  if (p.causal != 0 && p.causal != 1) return sentence("causal is ", p.causal, "; it must be 0 or 1");
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0.0f)
    return sentence("softmax_scale is ", p.softmax_scale, "; it must be finite and greater than 0");
  if (const double bound = max_softmax_scale(p.dtype, p.head_dim); double(p.softmax_scale) > bound) {
    if (p.dtype == FS_FP16)
      return sentence("softmax_scale is ", p.softmax_scale, "; with fp16 inputs and head_dim ", p.head_dim,
                      " it must be at most ", bound,
                      ", so that the largest possible logit, head_dim * 65504^2 * scale * log2(e), is at most 2^126 "
                      "(finite in fp32)");
    return sentence("softmax_scale is ", p.softmax_scale, "; it must be at most ", bound,
                    ", so that scale * log2(e) is at most 2^126 (finite in fp32)");
  }
  if (!std::isfinite(p.softcap) || p.softcap < 0.0f)
    return sentence("softcap is ", p.softcap, "; it must be finite and at least 0 (0: no softcapping)");
  if (p.softcap > 0.0f) {
    if (double(p.softcap) > kMaxLogit / kLog2e)
      return sentence("softcap is ", p.softcap, "; it must be at most ", kMaxLogit / kLog2e,
                      ", so that softcap * log2(e), the largest logit, is at most 2^126 (finite in fp32)");
    const double pre = double(p.softmax_scale) / p.softcap;  // common/step/softcap.h
    if (pre > kMaxFloat)
      return sentence("softcap is ", p.softcap, " and softmax_scale ", p.softmax_scale,
                      "; the kernels form softmax_scale / softcap = ", pre, " in fp32, which must be at most ", kMaxFloat);
  }
  if (p.window != 0 && p.window != 1)
    return sentence("window is ", p.window, "; it must be 0 (no sliding window) or 1 (window_left, window_right)");
  for (const auto& [name, bound] : {std::pair{"window_left", p.window_left}, std::pair{"window_right", p.window_right}}) {
    if (p.window && bound < -1)
      return sentence(name, " is ", bound, "; it must be at least -1 (-1: unbounded on that side)");
    if (!p.window && bound != 0 && bound != -1)
      return sentence(name, " is ", bound, " but window is 0, which ignores it; set window to 1 for a sliding window");
  }
  if (std::string why = validate_varlen(p); !why.empty()) return why;
  // The tensors as they lie in memory: a variable-length batch's are (1, total, heads, head_dim).
  const Problem d = dense_view(p);
  const char *rows_q = rows_q_name(p), *rows_k = rows_k_name(p);
  const View q{"Q", "Q and O", p.q, d.batch, d.seqlen_q, p.heads_q, p.head_dim, rows_q, "heads_q"};
  const View k{"K", "K and V", p.k, d.batch, d.seqlen_k, p.heads_kv, p.head_dim, rows_k, "heads_kv"};
  const View v{"V", "K and V", p.v, d.batch, d.seqlen_k, p.heads_kv, p.head_dim, rows_k, "heads_kv"};
  const View o{"O", "Q and O", p.o, d.batch, d.seqlen_q, p.heads_q, p.head_dim, rows_q, "heads_q"};
  // Sizes, from the dimensions given, before any stride is read (contiguous strides are derived from them).
  std::string why = validate_size(q);
  if (why.empty()) why = validate_size(k);
  for (const View* view : {&q, &k, &v, &o}) {
    if (why.empty()) why = validate_strides(*view);
    if (why.empty()) why = validate_extent(*view);
  }
  return why.empty() ? validate_no_overlap(o, "Q, K and V") : why;
}

std::string validate_tensors(const Problem& p, const Tensors& t) {
  const Problem d = dense_view(p);  // a variable-length batch: by its totals
  const bool work = d.seqlen_q > 0, reads = work && d.seqlen_k > 0;
  return validate_pointers(
      {{"Q", t.q, work}, {"K", t.k, reads}, {"V", t.v, reads}, {"O", t.o, work}, {"LSE", t.lse, false, 4}});
}

double attention_flops(const Problem& p) {
  const double f = 4.0 * double(p.batch) * double(p.heads_q) * double(p.head_dim);
  if (p.window) return f * visible_pairs(band_of(p), p.seqlen_q);
  return p.causal ? f * double(p.seqlen_q) * double(p.seqlen_k) / 2 : f * double(p.seqlen_q) * double(p.seqlen_k);
}

std::string describe(const Problem& p) {
  const std::string bound = is_varlen(p) ? "<=" : "";
  return sentence(is_varlen(p) ? "varlen " : "", "b", p.batch, " h", p.heads_q, "/", p.heads_kv, " sq", bound,
                  p.seqlen_q, " sk", bound, p.seqlen_k,
                  is_varlen(p) ? sentence(" tq", p.total_q, " tk", p.total_k) : std::string(), " d", p.head_dim, " ",
                  dtype_name(p.dtype), p.causal ? " causal" : "",
                  p.window ? sentence(" window ", p.window_left, ",", p.window_right) : std::string(),
                  p.softcap > 0 ? sentence(" softcap ", p.softcap) : std::string());
}

Offsets offsets_of(std::span<const int32_t> lengths_q, std::span<const int32_t> lengths_k) {
  if (lengths_k.empty()) lengths_k = lengths_q;
  if (lengths_k.size() != lengths_q.size())
    throw Error(sentence(lengths_q.size(), " query lengths and ", lengths_k.size(),
                         " key lengths; a variable-length batch has one of each per sequence"));
  Offsets cu;
  for (const auto& [lengths, out] : {std::pair{lengths_q, &cu.q}, std::pair{lengths_k, &cu.k}}) {
    int64_t sum = 0;
    out->push_back(0);
    for (const int32_t n : lengths) {
      sum += n;
      if (n < 0 || sum > kMaxSeqlen)
        throw Error(sentence("a sequence length is ", n, " with ", sum, " rows so far; lengths must be >= 0 and ",
                             "add up to at most ", kMaxSeqlen));
      out->push_back(int32_t(sum));
    }
  }
  return cu;
}

Problem varlen_problem(const Problem& shape, const Offsets& cu) {
  Problem p = shape;
  p.batch = int64_t(cu.q.size()) - 1;
  p.seqlen_q = p.seqlen_k = 0;
  for (size_t b = 0; b + 1 < cu.q.size() && b + 1 < cu.k.size(); ++b) {
    p.seqlen_q = std::max<int64_t>(p.seqlen_q, cu.q[b + 1] - cu.q[b]);
    p.seqlen_k = std::max<int64_t>(p.seqlen_k, cu.k[b + 1] - cu.k[b]);
  }
  p.total_q = cu.q.empty() ? 0 : cu.q.back(), p.total_k = cu.k.empty() ? 0 : cu.k.back();
  p.q = p.o = contiguous_strides(p.total_q, p.heads_q, p.head_dim);
  p.k = p.v = contiguous_strides(p.total_k, p.heads_kv, p.head_dim);
  p.q.batch = p.k.batch = p.v.batch = p.o.batch = 0;
  p.cu_seqlens_q = cu.q.data(), p.cu_seqlens_k = cu.k.data();
  return p;
}

std::string validate_offsets(const Problem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k) {
  const struct Side {
    const char* name;   // "cu_seqlens_q"
    std::span<const int32_t> cu;
    int64_t total, bound;
    const char *total_name, *bound_name, *rows;
  } sides[] = {{"cu_seqlens_q", cu_q, p.total_q, p.seqlen_q, "total_q", "seqlen_q", "query rows"},
               {"cu_seqlens_k", cu_k, p.total_k, p.seqlen_k, "total_k", "seqlen_k", "key rows"}};
  for (const Side& s : sides) {
    if (int64_t(s.cu.size()) != p.batch + 1)
      return sentence(s.name, " has ", s.cu.size(), " offsets; a batch of ", p.batch, " sequences has batch + 1 = ",
                      p.batch + 1);
    if (s.cu[0] != 0) return sentence(s.name, "[0] is ", s.cu[0], "; it must be 0");
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t begin = s.cu[size_t(b)], end = s.cu[size_t(b) + 1];
      if (end < begin)
        return sentence(s.name, "[", b + 1, "] is ", end, ", below ", s.name, "[", b, "] = ", begin,
                        ": the offsets must not decrease");
      if (end - begin > s.bound)
        return sentence("sequence ", b, " has ", end - begin, " ", s.rows, " (", s.name, "[", b + 1, "] - ", s.name,
                        "[", b, "]); ", s.bound_name, ", the bound on every sequence's length, is ", s.bound);
    }
    if (s.cu[size_t(p.batch)] != s.total)
      return sentence(s.name, "[", p.batch, "] (the last) is ", s.cu[size_t(p.batch)], "; it must equal ",
                      s.total_name, " (", s.total, ")");
  }
  return "";
}

Offsets download_offsets(const Problem& p, cudaStream_t stream) {
  Offsets cu{std::vector<int32_t>(size_t(p.batch) + 1), std::vector<int32_t>(size_t(p.batch) + 1)};
  for (const auto& [from, to] : {std::pair{p.cu_seqlens_q, &cu.q}, std::pair{p.cu_seqlens_k, &cu.k}})
    CHECK_CUDA(cudaMemcpyAsync(to->data(), from, to->size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return cu;
}

std::string validate_device_offsets(const Problem& p, cudaStream_t stream) {
  if (!is_varlen(p)) return "";
  const Offsets cu = download_offsets(p, stream);
  return validate_offsets(p, cu.q, cu.k);
}

double varlen_flops(const Problem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k) {
  double flops = 0;
  for_each_sequence(p, cu_q, cu_k, [&](int64_t, const Sequence& s) { flops += attention_flops(one_sequence(p, s)); });
  return flops;
}

}  // namespace fs
