#include "backward/rules.h"

#include "harness/check.h"
#include "harness/tensors.h"

namespace fs {

BackwardProblem make_backward_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, DType dtype, int32_t causal,
                                      int32_t deterministic) {
  return backward_of(make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal),
                     deterministic);
}

BackwardProblem backward_of(const Problem& forward, int32_t deterministic) {
  return BackwardProblem{forward, deterministic, forward.o, forward.q, forward.k, forward.v};
}

std::string validate(const BackwardProblem& p) {
  if (std::string why = validate(p.attention); !why.empty()) return why;
  if (p.deterministic != 0 && p.deterministic != 1)
    return sentence("deterministic is ", p.deterministic, "; it must be 0 or 1");
  // dO and dQ have Q's sizes, dK and dV K's: validate(p.attention) checked them, so only the strides and
  // the extents of the views can break a rule here. A variable-length batch's are packed as Q's and K's.
  const Problem f = dense_view(p.attention);
  if (is_varlen(p.attention))
    if (std::string why = validate_packed_strides({{"d_o", p.d_o}, {"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}});
        !why.empty())
      return why;
  const char *rows_q = rows_q_name(p.attention), *rows_k = rows_k_name(p.attention);
  const View views[] = {{"dO", "dO and dQ", p.d_o, f.batch, f.seqlen_q, f.heads_q, f.head_dim, rows_q, "heads_q"},
                        {"dQ", "dO and dQ", p.dq, f.batch, f.seqlen_q, f.heads_q, f.head_dim, rows_q, "heads_q"},
                        {"dK", "dK and dV", p.dk, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, rows_k, "heads_kv"},
                        {"dV", "dK and dV", p.dv, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, rows_k, "heads_kv"}};
  for (const View& v : views)
    if (std::string why = validate_view(v); !why.empty()) return why;
  for (const View& v : views)  // the gradients are written: none may overlap itself (dO, which is read, may)
    if (std::string why = &v == &views[0] ? "" : validate_no_overlap(v, "Q, K, V, O and dO"); !why.empty()) return why;
  return "";
}

std::string validate_tensors(const BackwardProblem& p, const BackwardTensors& t) {
  const Problem f = dense_view(p.attention);  // a variable-length batch: by its totals
  const int64_t sq = f.seqlen_q, sk = f.seqlen_k;
  const bool work = sq > 0 && sk > 0;
  return validate_pointers({{"Q", t.q, work}, {"K", t.k, work}, {"V", t.v, work}, {"O", t.o, work},
                            {"LSE", t.lse, work, 4}, {"dO", t.d_o, work}, {"dQ", t.dq, sq > 0}, {"dK", t.dk, sk > 0},
                            {"dV", t.dv, sk > 0}});
}

double backward_flops(const BackwardProblem& p) { return 2.5 * attention_flops(p.attention); }
double backward_varlen_flops(const BackwardProblem& p, std::span<const int32_t> cu_q, std::span<const int32_t> cu_k) {
  return 2.5 * varlen_flops(p.attention, cu_q, cu_k);
}

double backward_bound(int32_t dtype, double ref_err, double max_abs_exact) {
  return 2 * ref_err + unit_roundoff(dtype) * max_abs_exact;
}

std::string describe(const BackwardProblem& p) {
  return "backward " + describe(p.attention) + (p.deterministic ? " deterministic" : "");
}

void fill_empty_gradients(const BackwardProblem& p, const BackwardTensors& t, cudaStream_t stream) {
  const Problem f = dense_view(p.attention);
  if (f.seqlen_k == 0) fill_zero(t.dq, p.dq, f.batch, f.seqlen_q, f.heads_q, f.head_dim, f.dtype, stream);
  if (f.seqlen_q == 0) {
    fill_zero(t.dk, p.dk, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, f.dtype, stream);
    fill_zero(t.dv, p.dv, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, f.dtype, stream);
  }
}

std::string Pass<BackwardProblem>::missing(const Step& s) {
  std::string with;
  for (const Step& other : steps())
    if (other.backward.present()) with += (with.empty() ? "" : ", ") + other.id;
  return "step " + s.id + " has no backward pass; " +
         (with.empty() ? std::string("no registered step has one") : "the steps with one are: " + with);
}

}  // namespace fs
