// The C ABI of common/flash_steps.h over the C++ registry. No exception crosses this boundary: every
// entry point runs inside guard() or guarded().
#include <cmath>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "c_api_status.h"
#include "compare.h"
#include "flash_steps.h"
#include "registry.h"
#include "sweep.h"

namespace fs {

fs_status status_of_current_exception(std::string& message) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    message = e.what();
    return FS_ERR_OUT_OF_MEMORY;
  } catch (const std::bad_alloc&) {
    message = "out of host memory (std::bad_alloc)";
    return FS_ERR_OUT_OF_MEMORY;
  } catch (const CudaError& e) {
    message = e.what();
    return FS_ERR_CUDA;
  } catch (const Error& e) {
    message = e.what();
    return FS_ERR_INVALID;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    return FS_ERR_INTERNAL;
  } catch (...) {
    message = "internal error: an exception that is not a std::exception";
    return FS_ERR_INTERNAL;
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

const fs::Step* step_at(int index) {
  const auto& all = fs::steps();
  return index >= 0 && size_t(index) < all.size() ? &all[size_t(index)] : nullptr;
}

// Looks up the step, then runs `body`; any exception becomes a status and last_error. P is fs_problem,
// fs_decode_problem or fs_backward_problem.
template <typename P, typename F>
fs_status guarded(const char* step_id, const P* p, F&& body) noexcept {
  last_error.clear();
  try {
    if (!step_id) return fail(FS_ERR_UNKNOWN_STEP, "step id is a null pointer");
    if (!p) return fail(FS_ERR_INVALID, "problem is a null pointer");
    const fs::Step* step = fs::find_step(step_id);
    if (!step) return fail(FS_ERR_UNKNOWN_STEP, std::string("no step has id '") + step_id + "' (see fs_step_id)");
    return body(*step, *p);
  } catch (...) {
    return fail_current_exception();
  }
}

}  // namespace

extern "C" {

FS_API void fs_problem_init(fs_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                            int64_t heads_kv, int64_t head_dim, int32_t dtype, int32_t causal) {
  if (!p) return;
  const bool ok = guard(false, [&] {
    *p = fs::make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, static_cast<fs::DType>(dtype),
                          causal != 0);
    p->causal = causal;  // keep the caller's value so that a bad one is reported by fs_check
    return true;
  });
  if (!ok) *p = fs_problem{};  // all zero: fs_check refuses it ("batch is 0")
}

FS_API int fs_step_count(void) {
  return guard(0, [] { return int(fs::steps().size()); });
}

FS_API const char* fs_step_id(int index) {
  return guard<const char*>(nullptr, [&] { return step_at(index) ? step_at(index)->id.c_str() : nullptr; });
}
FS_API const char* fs_step_name(int index) {
  return guard<const char*>(nullptr, [&] { return step_at(index) ? step_at(index)->name.c_str() : nullptr; });
}
FS_API const char* fs_step_lesson(int index) {
  return guard<const char*>(nullptr, [&] { return step_at(index) ? step_at(index)->lesson.c_str() : nullptr; });
}
FS_API const char* fs_step_dir(int index) {
  return guard<const char*>(nullptr, [&] { return step_at(index) ? step_at(index)->dir.c_str() : nullptr; });
}
FS_API int fs_step_min_compute_capability(int index) {
  return guard(-1, [&] { return step_at(index) ? step_at(index)->min_compute_capability : -1; });
}

FS_API fs_status fs_check(const char* step_id, const fs_problem* p) {
  return guarded(step_id, p, [](const fs::Step& step, const fs_problem& prob) {
    const std::string why = fs::check_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_for(step, prob, fs::current_device());
    return plan.accepted() ? FS_OK : fail(FS_ERR_INVALID, plan.refusal);
  });
}

FS_API fs_status fs_workspace_size(const char* step_id, const fs_problem* p, uint64_t* bytes) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_problem& prob) {
    if (!bytes) return fail(FS_ERR_INVALID, "bytes is a null pointer");
    const std::string why = fs::check_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_for(step, prob, fs::current_device());
    if (!plan.accepted()) return fail(FS_ERR_INVALID, plan.refusal);
    *bytes = plan.workspace_bytes;
    return FS_OK;
  });
}

FS_API fs_status fs_run(const char* step_id, const fs_problem* p, const void* q, const void* k, const void* v,
                        void* o, float* lse, void* workspace, uint64_t workspace_bytes, void* stream) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_problem& prob) {
    const fs::Tensors t{q, k, v, o, lse};
    std::string why = fs::check_static(step, prob);  // before touching the GPU
    if (why.empty()) why = fs::validate_tensors(prob, t);
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_for(step, prob, fs::current_device());
    why = plan.refusal;
    if (why.empty()) why = fs::check_workspace(plan, workspace, size_t(workspace_bytes));
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    fs::run(step, prob, plan, t, workspace, size_t(workspace_bytes), static_cast<cudaStream_t>(stream));
    return FS_OK;
  });
}

FS_API void fs_decode_problem_init(fs_decode_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                   int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype, int32_t causal,
                                   int64_t page_size) {
  if (!p) return;
  const bool ok = guard(false, [&] {
    *p = fs::make_decode_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, static_cast<fs::DType>(dtype),
                                 causal != 0, page_size);
    p->causal = causal;  // kept as given, so that a bad one is reported by fs_decode_check
    return true;
  });
  if (!ok) *p = fs_decode_problem{};  // all zero: fs_decode_check refuses it ("batch is 0")
}

FS_API int fs_step_decodes(int index) {
  return guard(-1, [&] { return step_at(index) ? int(step_at(index)->decode.present()) : -1; });
}

FS_API fs_status fs_decode_check(const char* step_id, const fs_decode_problem* p) {
  return guarded(step_id, p, [](const fs::Step& step, const fs_decode_problem& prob) {
    const std::string why = fs::check_decode_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_decode_for(step, prob, fs::current_device());
    return plan.accepted() ? FS_OK : fail(FS_ERR_INVALID, plan.refusal);
  });
}

FS_API fs_status fs_decode_workspace_size(const char* step_id, const fs_decode_problem* p, uint64_t* bytes) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_decode_problem& prob) {
    if (!bytes) return fail(FS_ERR_INVALID, "bytes is a null pointer");
    const std::string why = fs::check_decode_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_decode_for(step, prob, fs::current_device());
    if (!plan.accepted()) return fail(FS_ERR_INVALID, plan.refusal);
    *bytes = plan.workspace_bytes;
    return FS_OK;
  });
}

FS_API fs_status fs_run_decode(const char* step_id, const fs_decode_problem* p, const void* q, const void* k_cache,
                               const void* v_cache, const int32_t* block_table, const int32_t* cache_seqlens,
                               void* o, float* lse, void* workspace, uint64_t workspace_bytes, void* stream) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_decode_problem& prob) {
    const fs::DecodeTensors t{q, k_cache, v_cache, block_table, cache_seqlens, o, lse};
    std::string why = fs::check_decode_static(step, prob);  // before touching the GPU
    if (why.empty()) why = fs::validate_decode_tensors(prob, t);
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_decode_for(step, prob, fs::current_device());
    why = plan.refusal;
    if (why.empty()) why = fs::check_workspace(plan, workspace, size_t(workspace_bytes), "fs_decode_workspace_size");
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    fs::run_decode(step, prob, plan, t, workspace, size_t(workspace_bytes), static_cast<cudaStream_t>(stream));
    return FS_OK;
  });
}

FS_API void fs_backward_problem_init(fs_backward_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                                     int32_t causal, int32_t deterministic) {
  if (!p) return;
  const bool ok = guard(false, [&] {
    *p = fs::make_backward_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                   static_cast<fs::DType>(dtype), causal != 0, deterministic != 0);
    p->forward.causal = causal;    // kept as given, so that a bad one is reported by fs_backward_check
    p->deterministic = deterministic;
    return true;
  });
  if (!ok) *p = fs_backward_problem{};  // all zero: fs_backward_check refuses it ("batch is 0")
}

FS_API int fs_step_has_forward(int index) {
  return guard(-1, [&] { return step_at(index) ? int(step_at(index)->has_forward()) : -1; });
}

FS_API int fs_step_has_backward(int index) {
  return guard(-1, [&] { return step_at(index) ? int(step_at(index)->backward.present()) : -1; });
}

FS_API fs_status fs_backward_check(const char* step_id, const fs_backward_problem* p) {
  return guarded(step_id, p, [](const fs::Step& step, const fs_backward_problem& prob) {
    const std::string why = fs::check_backward_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_backward_for(step, prob, fs::current_device());
    return plan.accepted() ? FS_OK : fail(FS_ERR_INVALID, plan.refusal);
  });
}

FS_API fs_status fs_backward_workspace_size(const char* step_id, const fs_backward_problem* p, uint64_t* bytes) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_backward_problem& prob) {
    if (!bytes) return fail(FS_ERR_INVALID, "bytes is a null pointer");
    const std::string why = fs::check_backward_static(step, prob);  // before touching the GPU
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_backward_for(step, prob, fs::current_device());
    if (!plan.accepted()) return fail(FS_ERR_INVALID, plan.refusal);
    *bytes = plan.workspace_bytes;
    return FS_OK;
  });
}

FS_API fs_status fs_run_backward(const char* step_id, const fs_backward_problem* p, const void* q, const void* k,
                                 const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                                 void* dk, void* dv, void* workspace, uint64_t workspace_bytes, void* stream) {
  return guarded(step_id, p, [&](const fs::Step& step, const fs_backward_problem& prob) {
    const fs::BackwardTensors t{q, k, v, o, lse, d_o, dq, dk, dv};
    std::string why = fs::check_backward_static(step, prob);  // before touching the GPU
    if (why.empty()) why = fs::validate_backward_tensors(prob, t);
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    const fs::Plan plan = fs::plan_backward_for(step, prob, fs::current_device());
    why = plan.refusal;
    if (why.empty()) why = fs::check_workspace(plan, workspace, size_t(workspace_bytes), "fs_backward_workspace_size");
    if (!why.empty()) return fail(FS_ERR_INVALID, why);
    fs::run_backward(step, prob, plan, t, workspace, size_t(workspace_bytes), static_cast<cudaStream_t>(stream));
    return FS_OK;
  });
}

FS_API const char* fs_last_error(void) { return last_error.c_str(); }  // cannot throw

}  // extern "C"

// ---- The rules the benchmarks and the Python tools share (flash_steps.h) -----------------------

namespace {

// Copies the first min(values.size(), max) values to out; returns how many there are.
template <typename T, typename U>
int copy_list(const std::vector<T>& values, U* out, int max) {
  for (int i = 0; out && i < max && size_t(i) < values.size(); ++i) out[i] = static_cast<U>(values[size_t(i)]);
  return int(values.size());
}

}  // namespace

extern "C" {

FS_API double fs_problem_flops(const fs_problem* p) { return p ? fs::attention_flops(*p) : 0.0; }

FS_API double fs_backward_flops(const fs_backward_problem* p) { return p ? fs::backward_flops(*p) : 0.0; }

FS_API fs_status fs_backward_bound(int32_t dtype, double ref_err, double max_abs_exact, double* bound) {
  last_error.clear();
  try {
    if (dtype != FS_FP16 && dtype != FS_BF16)
      return fail(FS_ERR_INVALID, "dtype is " + std::to_string(dtype) + "; it must be FS_FP16 (0) or FS_BF16 (1)");
    if (!std::isfinite(ref_err) || ref_err < 0)
      return fail(FS_ERR_INVALID, "ref_err is " + std::to_string(ref_err) + "; it must be finite and >= 0");
    if (!std::isfinite(max_abs_exact) || max_abs_exact < 0)
      return fail(FS_ERR_INVALID, "max_abs_exact is " + std::to_string(max_abs_exact) + "; it must be finite and >= 0");
    if (!bound) return fail(FS_ERR_INVALID, "bound is a null pointer");
    *bound = fs::backward_bound(dtype, ref_err, max_abs_exact);
    return FS_OK;
  } catch (const std::exception& e) {
    return fail(FS_ERR_INVALID, e.what());
  } catch (...) {
    return fail(FS_ERR_INVALID, "fs_backward_bound: unknown exception");
  }
}

FS_API double fs_decode_kv_bytes(const fs_decode_problem* p, const int32_t* lengths) {
  if (!p || p->batch < 0) return 0.0;
  return guard(0.0, [&] {
    return fs::decode_kv_bytes(*p, lengths ? std::vector<int32_t>(lengths, lengths + p->batch) : std::vector<int32_t>());
  });
}

FS_API fs_status fs_tolerance(int32_t dtype, double max_abs_v, double* atol, double* rtol, double* lse_tol) {
  last_error.clear();
  try {
    if (dtype != FS_FP16 && dtype != FS_BF16)
      return fail(FS_ERR_INVALID, "dtype is " + std::to_string(dtype) + "; it must be FS_FP16 (0) or FS_BF16 (1)");
    if (!std::isfinite(max_abs_v) || max_abs_v < 0)
      return fail(FS_ERR_INVALID, "max_abs_v is " + std::to_string(max_abs_v) + "; it must be finite and >= 0");
    if (!atol || !rtol || !lse_tol) return fail(FS_ERR_INVALID, "atol, rtol and lse_tol must not be null pointers");
    const fs::Tolerance t = fs::tolerance_for(dtype, max_abs_v);
    *atol = t.atol;
    *rtol = t.rtol;
    *lse_tol = t.lse_rtol;
    return FS_OK;
  } catch (const std::exception& e) {
    return fail(FS_ERR_INVALID, e.what());
  } catch (...) {
    return fail(FS_ERR_INVALID, "fs_tolerance: unknown exception");
  }
}

FS_API fs_status fs_speedups(int n, const char* const* ids, const double* ms, double* x_step01, double* x_prev) {
  last_error.clear();
  try {
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
  } catch (const std::exception& e) {
    return fail(FS_ERR_INVALID, e.what());
  } catch (...) {
    return fail(FS_ERR_INVALID, "fs_speedups: unknown exception");
  }
}

FS_API int64_t fs_sweep_tokens(void) { return fs::kSweepTokens; }

FS_API int fs_sweep_seqlens(int32_t quick, int64_t* out, int max) {
  try {
    return copy_list(fs::sweep(quick != 0).seqlens, out, max);
  } catch (...) {
    return 0;
  }
}

FS_API int fs_sweep_head_dims(int32_t quick, int64_t* out, int max) {
  try {
    return copy_list(fs::sweep(quick != 0).head_dims, out, max);
  } catch (...) {
    return 0;
  }
}

FS_API int fs_sweep_dtypes(int32_t quick, int32_t* out, int max) {
  try {
    return copy_list(fs::sweep(quick != 0).dtypes, out, max);
  } catch (...) {
    return 0;
  }
}

FS_API fs_status fs_sweep_shape(int64_t tokens, int64_t seqlen, int64_t head_dim, int64_t* batch, int64_t* heads) {
  last_error.clear();
  try {
    if (!batch || !heads) return fail(FS_ERR_INVALID, "batch and heads must not be null pointers");
    const std::string why = fs::sweep_shape(tokens, seqlen, head_dim, *batch, *heads);
    return why.empty() ? FS_OK : fail(FS_ERR_INVALID, why);
  } catch (const std::exception& e) {
    return fail(FS_ERR_INVALID, e.what());
  } catch (...) {
    return fail(FS_ERR_INVALID, "fs_sweep_shape: unknown exception");
  }
}

}  // extern "C"
