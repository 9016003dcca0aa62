#include "forward/rules.h"

#include <cmath>

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
  return Problem{batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, int32_t(dtype), causal, scale, 0.0f, q, k, k, q, 0, 0, 0};
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
  const View q{"Q", "Q and O", p.q, p.batch, p.seqlen_q, p.heads_q, p.head_dim, "seqlen_q", "heads_q"};
  const View k{"K", "K and V", p.k, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, "seqlen_k", "heads_kv"};
  const View v{"V", "K and V", p.v, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, "seqlen_k", "heads_kv"};
  const View o{"O", "Q and O", p.o, p.batch, p.seqlen_q, p.heads_q, p.head_dim, "seqlen_q", "heads_q"};
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
  const bool work = p.seqlen_q > 0, reads = work && p.seqlen_k > 0;
  return validate_pointers(
      {{"Q", t.q, work}, {"K", t.k, reads}, {"V", t.v, reads}, {"O", t.o, work}, {"LSE", t.lse, false, 4}});
}

double attention_flops(const Problem& p) {
  const double f = 4.0 * double(p.batch) * double(p.heads_q) * double(p.head_dim);
  if (p.window) return f * visible_pairs(band_of(p), p.seqlen_q);
  return p.causal ? f * double(p.seqlen_q) * double(p.seqlen_k) / 2 : f * double(p.seqlen_q) * double(p.seqlen_k);
}

std::string describe(const Problem& p) {
  return sentence("b", p.batch, " h", p.heads_q, "/", p.heads_kv, " sq", p.seqlen_q, " sk", p.seqlen_k, " d",
                  p.head_dim, " ", dtype_name(p.dtype), p.causal ? " causal" : "",
                  p.window ? sentence(" window ", p.window_left, ",", p.window_right) : std::string(),
                  p.softcap > 0 ? sentence(" softcap ", p.softcap) : std::string());
}

}  // namespace fs
