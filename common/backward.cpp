// The backward problem's harness side: its rules, its FLOPs, the acceptance bound and the gradients
// of empty problems (common/backward.h). The references are in their own files.
#include "backward.h"

#include <cstdint>
#include <sstream>

#include "compare.h"

namespace fs {

BackwardProblem make_backward_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                      int64_t heads_kv, int64_t head_dim, DType dtype, bool causal,
                                      bool deterministic) {
  return backward_of(make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal),
                     deterministic);
}

BackwardProblem backward_of(const Problem& forward, bool deterministic) {
  BackwardProblem p{};
  p.forward = forward;
  p.deterministic = deterministic ? 1 : 0;
  p.d_o = forward.o;
  p.dq = forward.q;
  p.dk = forward.k;
  p.dv = forward.v;
  return p;
}

std::string validate_backward(const BackwardProblem& p) {
  if (std::string why = validate(p.forward); !why.empty()) return why;
  if (p.deterministic != 0 && p.deterministic != 1) {
    std::ostringstream m;
    m << "deterministic is " << p.deterministic << "; it must be 0 or 1";
    return m.str();
  }
  const Problem& f = p.forward;
  // dO and dQ have Q's sizes, dK and dV K's: validate(p.forward) checked them, so only the strides and
  // the extents of the views can break a rule here.
  const struct {
    const char* names;
    const char* name;
    const Strides& s;
    const char* rows_name;
    int64_t rows;
    const char* heads_name;
    int64_t heads;
    bool written;  // a gradient: it must not overlap itself (dO, which is read, may)
  } views[] = {{"dO and dQ", "dO", p.d_o, "seqlen_q", f.seqlen_q, "heads_q", f.heads_q, false},
               {"dO and dQ", "dQ", p.dq, "seqlen_q", f.seqlen_q, "heads_q", f.heads_q, true},
               {"dK and dV", "dK", p.dk, "seqlen_k", f.seqlen_k, "heads_kv", f.heads_kv, true},
               {"dK and dV", "dV", p.dv, "seqlen_k", f.seqlen_k, "heads_kv", f.heads_kv, true}};
  for (const auto& v : views)
    if (std::string why = validate_view(v.names, v.name, v.s, "batch", "batch", f.batch, v.rows_name, v.rows,
                                        v.heads_name, v.heads, f.head_dim);
        !why.empty())
      return why;
  for (const auto& v : views)
    if (std::string why = v.written ? validate_no_overlap(v.name, "Q, K, V, O and dO", v.s, f.batch, v.rows_name,
                                                          v.rows, v.heads_name, v.heads, f.head_dim)
                                    : "";
        !why.empty())
      return why;
  return "";
}

std::string validate_backward_tensors(const BackwardProblem& p, const BackwardTensors& t) {
  const bool work = p.forward.seqlen_q > 0 && p.forward.seqlen_k > 0;
  const struct { const char* name; const void* ptr; bool needed; uintptr_t align; } ptrs[] = {
      {"Q", t.q, work, 16},
      {"K", t.k, work, 16},
      {"V", t.v, work, 16},
      {"O", t.o, work, 16},
      {"LSE", t.lse, work, 4},
      {"dO", t.d_o, work, 16},
      {"dQ", t.dq, p.forward.seqlen_q > 0, 16},  // written when seqlen_k == 0 too (zeros)
      {"dK", t.dk, p.forward.seqlen_k > 0, 16},  // written when seqlen_q == 0 too (zeros)
      {"dV", t.dv, p.forward.seqlen_k > 0, 16}};
  for (const auto& x : ptrs) {
    std::ostringstream m;
    if (x.needed && x.ptr == nullptr) {
      m << x.name << " is a null pointer";
      return m.str();
    }
    if (reinterpret_cast<uintptr_t>(x.ptr) % x.align != 0) {
      m << x.name << " pointer " << x.ptr << " is not " << x.align << "-byte aligned (address mod " << x.align
        << " = " << reinterpret_cast<uintptr_t>(x.ptr) % x.align << ")";
      return m.str();
    }
  }
  return "";
}

double backward_flops(const BackwardProblem& p) { return 2.5 * attention_flops(p.forward); }

double backward_bound(int32_t dtype, double ref_err, double max_abs_exact) {
  return 2 * ref_err + unit_roundoff(dtype) * max_abs_exact;
}

void fill_empty_gradients(const BackwardProblem& p, const BackwardTensors& t, cudaStream_t stream) {
  const Problem& f = p.forward;
  if (f.seqlen_k == 0) fill_zero(t.dq, p.dq, f.batch, f.seqlen_q, f.heads_q, f.head_dim, f.dtype, stream);
  if (f.seqlen_q == 0) {
    fill_zero(t.dk, p.dk, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, f.dtype, stream);
    fill_zero(t.dv, p.dv, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, f.dtype, stream);
  }
}

std::string describe(const BackwardProblem& p) {
  return "backward " + describe(p.forward) + (p.deterministic ? " deterministic" : "");
}

}  // namespace fs
