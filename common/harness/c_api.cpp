// The C ABI of common/flash_steps.h over the chain (harness/chain.h). Each pass's check, workspace size
// and run are one template each; no exception crosses this boundary (guard, guarded).
#include <cmath>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "backward/rules.h"
#include "decode/rules.h"
#include "flash_steps.h"
#include "forward/check.h"
#include "harness/status.h"
#include "harness/sweep.h"

namespace fs {

fs_status status_of_current_exception(std::string& message) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    return message = e.what(), FS_ERR_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    return message = "out of host memory (std::bad_alloc)", FS_ERR_OUT_OF_MEMORY;
  } catch (const CudaError& e) {
    return message = e.what(), FS_ERR_CUDA;
  } catch (const Error& e) {
    return message = e.what(), FS_ERR_INVALID;
  } catch (const std::exception& e) {
    return message = std::string("internal error: ") + e.what(), FS_ERR_INTERNAL;
  } catch (...) {
    return message = "internal error: an exception that is not a std::exception", FS_ERR_INTERNAL;
  }
}

}  // namespace fs

namespace {

thread_local std::string last_error;

fs_status fail(fs_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

// Inside a catch block: records the exception's message and returns its status. Never throws (when
// not even the message can be stored, the status alone is returned).
fs_status fail_current_exception() noexcept {
  try {
    std::string message;
    const fs_status status = fs::status_of_current_exception(message);
    last_error = std::move(message);
    return status;
  } catch (...) {
    last_error.clear();
    return FS_ERR_OUT_OF_MEMORY;
  }
}

// Runs `body`; an exception becomes `fallback`, with its message in last_error. For the entry points
// that return a value rather than a status.
template <typename T, typename F>
T guard(T fallback, F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    fail_current_exception();
    return fallback;
  }
}

// The same for the entry points that return a status: last_error cleared first.
template <typename F>
fs_status guarded(F&& body) noexcept {
  last_error.clear();
  try {
    return body();
  } catch (...) {
    return fail_current_exception();
  }
}

const fs::Step* step_at(int index) {
  const auto& all = fs::steps();
  return index >= 0 && size_t(index) < all.size() ? &all[size_t(index)] : nullptr;
}
const char* step_text(int index, std::string fs::Step::*field) {
  return guard<const char*>(nullptr, [&] { return step_at(index) ? (step_at(index)->*field).c_str() : nullptr; });
}

// Looks up the step, then runs body(step, problem).
template <typename Problem, typename F>
fs_status with_step(const char* step_id, const Problem* p, F&& body) noexcept {
  return guarded([&] {
    if (!step_id) return fail(FS_ERR_UNKNOWN_STEP, "step id is a null pointer");
    if (!p) return fail(FS_ERR_INVALID, "problem is a null pointer");
    const fs::Step* step = fs::find_step(step_id);
    if (!step) return fail(FS_ERR_UNKNOWN_STEP, std::string("no step has id '") + step_id + "' (see fs_step_id)");
    return body(*step, *p);
  });
}

// The plan on the current device, the rules that need none first (no device is touched for them).
template <typename Problem>
fs::Plan plan_here(const fs::Step& step, const Problem& p) {
  std::string why = fs::static_refusal(step, p);
  return why.empty() ? fs::plan_on_device(step, p, fs::current_device(step.reads_free_memory)) : fs::Plan{.refusal = why};
}

template <typename Problem>
fs_status check(const char* step_id, const Problem* p) {
  return with_step(step_id, p, [](const fs::Step& step, const Problem& prob) {
    const fs::Plan plan = plan_here(step, prob);
    return plan.accepted() ? FS_OK : fail(FS_ERR_INVALID, plan.refusal);
  });
}

template <typename Problem>
fs_status workspace_size(const char* step_id, const Problem* p, uint64_t* bytes) {
  return with_step(step_id, p, [&](const fs::Step& step, const Problem& prob) {
    if (!bytes) return fail(FS_ERR_INVALID, "bytes is a null pointer");
    const fs::Plan plan = plan_here(step, prob);
    if (!plan.accepted()) return fail(FS_ERR_INVALID, plan.refusal);
    *bytes = plan.workspace_bytes;
    return FS_OK;
  });
}

template <typename Problem>
fs_status run(const char* step_id, const Problem* p, const fs::PassTensors<Problem>& t, void* workspace,
              uint64_t workspace_bytes, void* stream) {
  return with_step(step_id, p, [&](const fs::Step& step, const Problem& prob) {
    std::string why = fs::static_refusal(step, prob);  // before touching the GPU
    if (why.empty()) why = fs::validate_tensors(prob, t);
    if (why.empty()) why = fs::validate_workspace_pointer(workspace, size_t(workspace_bytes));
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_on_device(step, prob, fs::current_device(step.reads_free_memory));
    why = plan.refusal;
    if (why.empty())
      why = fs::validate_workspace(plan, workspace, size_t(workspace_bytes), fs::Pass<Problem>::workspace_function);
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    fs::launch(step, prob, plan, t, workspace, static_cast<cudaStream_t>(stream));
    return FS_OK;
  });
}

// *p = make() (the shape as given, so that a bad value is reported by the check), or all zero when even
// that fails: the check then refuses it ("batch is 0").
template <typename Problem, typename F>
void init(Problem* p, F&& make) {
  if (p && !guard(false, [&] {
        *p = make();
        return true;
      }))
    *p = Problem{};
}

// Copies the first min(values.size(), max) values to out; returns how many there are.
template <typename T, typename U>
int copy_list(const std::vector<T>& values, U* out, int max) {
  for (int i = 0; out && i < max && size_t(i) < values.size(); ++i) out[i] = static_cast<U>(values[size_t(i)]);
  return int(values.size());
}

fs_status check_dtype(int32_t dtype) {
  return dtype == FS_FP16 || dtype == FS_BF16
             ? FS_OK
             : fail(FS_ERR_INVALID, "dtype is " + std::to_string(dtype) + "; it must be FS_FP16 (0) or FS_BF16 (1)");
}

fs_status check_nonnegative(const char* name, double x) {
  return std::isfinite(x) && x >= 0 ? FS_OK
                                    : fail(FS_ERR_INVALID, fs::sentence(name, " is ", x, "; it must be finite and >= 0"));
}

}  // namespace

extern "C" {

FS_API const char* fs_last_error(void) { return last_error.c_str(); }  // cannot throw

FS_API int fs_step_count(void) {
  return guard(0, [] { return int(fs::steps().size()); });
}
FS_API const char* fs_step_id(int index) { return step_text(index, &fs::Step::id); }
FS_API const char* fs_step_name(int index) { return step_text(index, &fs::Step::name); }
FS_API const char* fs_step_lesson(int index) { return step_text(index, &fs::Step::lesson); }
FS_API const char* fs_step_dir(int index) { return step_text(index, &fs::Step::dir); }
FS_API int fs_step_min_compute_capability(int index) {
  return guard(-1, [&] { return step_at(index) ? step_at(index)->min_compute_capability : -1; });
}
FS_API int fs_step_runs(int index, int32_t pass) {
  return guard(-1, [&] {
    const fs::Step* s = step_at(index);
    if (!s || pass < FS_FORWARD || pass > FS_BACKWARD) return -1;
    const bool runs[] = {s->forward.present(), s->decode.present(), s->backward.present()};  // by fs_pass
    return int(runs[pass]);
  });
}

FS_API void fs_problem_init(fs_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                            int64_t heads_kv, int64_t head_dim, int32_t dtype, int32_t causal) {
  init(p, [&] {
    return fs::make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, fs::DType(dtype), causal);
  });
}
FS_API fs_status fs_check(const char* step_id, const fs_problem* p) { return check(step_id, p); }
FS_API fs_status fs_workspace_size(const char* step_id, const fs_problem* p, uint64_t* bytes) {
  return workspace_size(step_id, p, bytes);
}
FS_API fs_status fs_run(const char* step_id, const fs_problem* p, const void* q, const void* k, const void* v,
                        void* o, float* lse, void* workspace, uint64_t workspace_bytes, void* stream) {
  return run(step_id, p, fs::Tensors{q, k, v, o, lse}, workspace, workspace_bytes, stream);
}
FS_API double fs_problem_flops(const fs_problem* p) { return p ? fs::attention_flops(*p) : 0.0; }
FS_API fs_status fs_varlen_flops(const fs_problem* p, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                 double* flops) {
  return guarded([&] {
    if (!p || !flops) return fail(FS_ERR_INVALID, "p and flops must not be null pointers");
    std::string why = fs::validate(*p);
    if (why.empty() && !fs::is_varlen(*p))
      why = "the problem has no cu_seqlens (a dense batch: fs_problem_flops counts it exactly)";
    if (why.empty() && (!cu_seqlens_q || !cu_seqlens_k))
      why = "cu_seqlens_q and cu_seqlens_k (the host copies of the offsets) must not be null pointers";
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const std::span<const int32_t> cu_q(cu_seqlens_q, size_t(p->batch) + 1), cu_k(cu_seqlens_k, size_t(p->batch) + 1);
    if (why = fs::validate_offsets(*p, cu_q, cu_k); !why.empty()) return fail(FS_ERR_INVALID, why);
    *flops = fs::varlen_flops(*p, cu_q, cu_k);
    return FS_OK;
  });
}
FS_API fs_status fs_check_offsets(const fs_problem* p, void* stream) {
  return guarded([&] {
    if (!p) return fail(FS_ERR_INVALID, "problem is a null pointer");
    std::string why = fs::validate(*p);
    if (why.empty()) why = fs::validate_device_offsets(*p, static_cast<cudaStream_t>(stream));
    return why.empty() ? FS_OK : fail(FS_ERR_INVALID, why);
  });
}

FS_API void fs_decode_problem_init(fs_decode_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                   int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype, int32_t causal,
                                   int64_t page_size) {
  init(p, [&] {
    return fs::make_decode_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, fs::DType(dtype), causal,
                                   page_size);
  });
}
FS_API fs_status fs_decode_check(const char* step_id, const fs_decode_problem* p) { return check(step_id, p); }
FS_API fs_status fs_decode_workspace_size(const char* step_id, const fs_decode_problem* p, uint64_t* bytes) {
  return workspace_size(step_id, p, bytes);
}
FS_API fs_status fs_run_decode(const char* step_id, const fs_decode_problem* p, const void* q, const void* k_cache,
                               const void* v_cache, const int32_t* block_table, const int32_t* cache_seqlens,
                               void* o, float* lse, void* workspace, uint64_t workspace_bytes, void* stream) {
  return run(step_id, p, fs::DecodeTensors{q, k_cache, v_cache, block_table, cache_seqlens, o, lse}, workspace,
             workspace_bytes, stream);
}
FS_API fs_status fs_decode_kv_bytes(const fs_decode_problem* p, const int32_t* lengths, int64_t num_lengths,
                                    double* bytes) {
  return guarded([&] {
    if (!p || !bytes) return fail(FS_ERR_INVALID, "p and bytes must not be null pointers");
    std::string why = fs::validate(*p);
    if (why.empty() && !lengths && num_lengths != 0)
      why = fs::sentence("num_lengths is ", num_lengths, " with no lengths (NULL); it must be 0");
    if (why.empty() && lengths && num_lengths != p->attention.batch)
      why = fs::sentence("num_lengths is ", num_lengths, "; it must be batch (", p->attention.batch, ")");
    const std::span<const int32_t> given(lengths, lengths ? size_t(num_lengths) : 0);
    if (why.empty()) why = fs::validate_lengths(*p, given);
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    *bytes = fs::decode_kv_bytes(*p, given);
    return FS_OK;
  });
}

FS_API void fs_backward_problem_init(fs_backward_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                                     int32_t causal, int32_t deterministic) {
  init(p, [&] {
    return fs::make_backward_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, fs::DType(dtype), causal,
                                     deterministic);
  });
}
FS_API fs_status fs_backward_check(const char* step_id, const fs_backward_problem* p) { return check(step_id, p); }
FS_API fs_status fs_backward_workspace_size(const char* step_id, const fs_backward_problem* p, uint64_t* bytes) {
  return workspace_size(step_id, p, bytes);
}
FS_API fs_status fs_run_backward(const char* step_id, const fs_backward_problem* p, const void* q, const void* k,
                                 const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                                 void* dk, void* dv, void* workspace, uint64_t workspace_bytes, void* stream) {
  return run(step_id, p, fs::BackwardTensors{q, k, v, o, lse, d_o, dq, dk, dv}, workspace, workspace_bytes, stream);
}
FS_API double fs_backward_flops(const fs_backward_problem* p) { return p ? fs::backward_flops(*p) : 0.0; }

FS_API fs_status fs_tolerance(int32_t dtype, double max_abs_v, double* atol, double* rtol, double* lse_tol) {
  return guarded([&] {
    if (check_dtype(dtype) != FS_OK || check_nonnegative("max_abs_v", max_abs_v) != FS_OK) return FS_ERR_INVALID;
    if (!atol || !rtol || !lse_tol) return fail(FS_ERR_INVALID, "atol, rtol and lse_tol must not be null pointers");
    const fs::Tolerance t = fs::tolerance_for(dtype, max_abs_v);
    *atol = t.atol;
    *rtol = t.rtol;
    *lse_tol = t.lse_rtol;
    return FS_OK;
  });
}

FS_API fs_status fs_backward_bound(int32_t dtype, double ref_err, double max_abs_exact, double* bound) {
  return guarded([&] {
    if (check_dtype(dtype) != FS_OK || check_nonnegative("ref_err", ref_err) != FS_OK ||
        check_nonnegative("max_abs_exact", max_abs_exact) != FS_OK)
      return FS_ERR_INVALID;
    if (!bound) return fail(FS_ERR_INVALID, "bound is a null pointer");
    *bound = fs::backward_bound(dtype, ref_err, max_abs_exact);
    return FS_OK;
  });
}

FS_API fs_status fs_speedups(int n, const char* const* ids, const double* ms, double* x_step01, double* x_prev) {
  return guarded([&] {
    if (n < 0) return fail(FS_ERR_INVALID, "n is " + std::to_string(n) + "; it must be >= 0");
    if (n > 0 && (!ids || !ms || !x_step01 || !x_prev))
      return fail(FS_ERR_INVALID, "ids, ms, x_step01 and x_prev must not be null pointers");
    std::vector<std::string> id(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      if (!ids[i]) return fail(FS_ERR_INVALID, "ids[" + std::to_string(i) + "] is a null pointer");
      id[size_t(i)] = ids[i];
    }
    const std::vector<fs::Speedup> x = fs::speedups(id, std::vector<double>(ms, ms + n));
    for (int i = 0; i < n; ++i) {
      x_step01[i] = x[size_t(i)].x_step01;
      x_prev[i] = x[size_t(i)].x_prev;
    }
    return FS_OK;
  });
}

FS_API int64_t fs_sweep_tokens(void) { return fs::kSweepTokens; }
FS_API int fs_sweep_seqlens(int32_t quick, int64_t* out, int max) {
  return guard(0, [&] { return copy_list(fs::sweep(quick != 0).seqlens, out, max); });
}
FS_API int fs_sweep_head_dims(int32_t quick, int64_t* out, int max) {
  return guard(0, [&] { return copy_list(fs::sweep(quick != 0).head_dims, out, max); });
}
FS_API int fs_sweep_dtypes(int32_t quick, int32_t* out, int max) {
  return guard(0, [&] { return copy_list(fs::sweep(quick != 0).dtypes, out, max); });
}
FS_API fs_status fs_sweep_shape(int64_t tokens, int64_t seqlen, int64_t head_dim, int64_t* batch, int64_t* heads) {
  return guarded([&] {
    if (!batch || !heads) return fail(FS_ERR_INVALID, "batch and heads must not be null pointers");
    const std::string why = fs::sweep_shape(tokens, seqlen, head_dim, *batch, *heads);
    return why.empty() ? FS_OK : fail(FS_ERR_INVALID, why);
  });
}

}  // extern "C"
