/*
 * flash_steps.h — the C ABI of flash-steps (libflash_steps.so).
 *
 * Every step of the project can be listed, checked and launched through these functions, from C,
 * from Python (ctypes: see bench/compare_torch.py) or from any language with a C FFI.
 *
 * Tensors follow FlashAttention's convention:
 *   Q : (batch, seqlen_q, heads_q,  head_dim)     O : (batch, seqlen_q, heads_q, head_dim)
 *   K : (batch, seqlen_k, heads_kv, head_dim)     V : (batch, seqlen_k, heads_kv, head_dim)
 * in fp16 or bf16 (all four the same dtype), with element strides for the batch, row (seqlen) and
 * head dimensions and a contiguous head_dim. Every stride must be a multiple of 8 elements and
 * every pointer 16-byte aligned, so that any row can be moved with 16-byte accesses.
 *
 * Sizes: batch·heads_q <= 2^31 - 1, seqlens <= 2^31 - 1, head_dim a multiple of 8 from 8 to 256, and
 * every tensor holds and spans at most 2^58 elements (its logical size and the extent of its strided
 * view), so that every size derived from it fits in 64 bits. A larger problem is refused with a
 * sentence naming the values, never wrapped.
 *
 * Aliasing: Q, K and V may alias each other and themselves (a batch or head stride of 0 broadcasts;
 * a packed QKV buffer is three views of one allocation). O must not overlap itself: strides under
 * which two elements of O share an address are refused (sorted by stride, each dimension of O must
 * start past the span of the dimensions below it). O and LSE must not share memory with Q, K, V or
 * each other; that is not checked.
 * LSE (optional, may be NULL) is fp32, contiguous (batch, heads_q, seqlen_q), natural log:
 *   LSE[b][h][i] = log(sum_j exp(scale * q_i . k_j)) over the keys j that row i may attend.
 *
 * Workspace: a step may need device scratch memory (partial results, a score matrix). Ask
 * fs_workspace_size for the bytes, allocate them (16-byte aligned, as cudaMalloc is), and pass them to
 * fs_run; a NULL or too small workspace is refused with a sentence. The size depends on the problem and
 * the device; 0 means none (pass NULL). The workspace is only used during the launch, on `stream`.
 *
 * Semantics:
 *   - softmax_scale multiplies Q.K^T before the softmax; fs_problem_init sets it to 1/sqrt(head_dim).
 *     It must be finite and > 0, and small enough that the kernels' logits stay finite in fp32: they
 *     compute s·scale·log2(e), with s = q.k accumulated in fp32, and the harness bounds that by 2^126
 *     (so every logit and the difference of any two are finite):
 *       fp16: scale <= 2^126 / (log2(e)·head_dim·65504²), about 1.1e26 at head_dim 128: every input
 *             fp16 can hold then gives finite logits (|q.k| <= head_dim·65504²).
 *       bf16: scale <= 2^126 / log2(e), about 5.9e37 (scale·log2(e) finite). bf16 holds values up to
 *             3.4e38, whose products overflow fp32 whatever the scale, so with bf16 the caller keeps
 *             |q.k|·scale·log2(e) <= 2^126; any |q.k| <= 2^126 / (scale·log2(e)) is safe.
 *   - GQA / MQA: heads_q must be a multiple of heads_kv; query head h reads K/V head
 *     h / (heads_q / heads_kv).
 *   - causal is bottom-right aligned, as in FlashAttention >= 2.1: query i attends to key j iff
 *     j <= i + seqlen_k - seqlen_q. A query row with no key to attend gets O = 0 and LSE = -inf.
 *   - seqlen_k == 0: every row has no key, so O = 0 and LSE = -inf. seqlen_q == 0: nothing to do.
 *   - All work is enqueued on `stream` (a cudaStream_t, NULL for the default stream); fs_run does
 *     not synchronize.
 *
 * Errors: every function that can fail returns an fs_status; fs_last_error() then returns a sentence
 * (thread-local, valid until the next call on this thread) that names the offending value and the
 * limit it broke. Nothing is launched on a problem that fails its checks.
 */
#ifndef FLASH_STEPS_H
#define FLASH_STEPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FS_API __attribute__((visibility("default")))

typedef enum fs_dtype { FS_FP16 = 0, FS_BF16 = 1 } fs_dtype;

/* A refusal that needs no device (the harness's rules, a step's static limits such as head_dim) is
 * FS_ERR_INVALID with or without a GPU; FS_ERR_CUDA is only ever a CUDA failure. */
typedef enum fs_status {
  FS_OK = 0,
  FS_ERR_INVALID = 1,       /* the problem or a pointer breaks a rule of the harness or of the step */
  FS_ERR_UNKNOWN_STEP = 2,  /* no step has this id */
  FS_ERR_CUDA = 3,          /* a CUDA call failed (no device, driver too old, launch failure, ...) */
  FS_ERR_OUT_OF_MEMORY = 4, /* an allocation failed; the message names the bytes asked */
  FS_ERR_INTERNAL = 5       /* a bug in the library: an unexpected exception, described by the message */
} fs_status;

/* Element strides of one (batch, seqlen, heads, head_dim) tensor. `dim`, the stride of head_dim,
 * must be 1 (the last dimension contiguous); it is there so that a caller can pass a framework
 * tensor's four strides as they are and get a clear refusal when the last one is not 1. */
typedef struct fs_strides {
  int64_t batch;
  int64_t row;
  int64_t head;
  int64_t dim;
} fs_strides;

typedef struct fs_problem {
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim;
  int32_t dtype;  /* fs_dtype */
  int32_t causal; /* 0 or 1 */
  float softmax_scale;
  fs_strides q, k, v, o;
} fs_problem;

/* Fills *p with the given shape, contiguous strides and softmax_scale = 1/sqrt(head_dim). */
FS_API void fs_problem_init(fs_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                            int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                            int32_t causal);

/* The registered steps, in order. Index out of range: NULL / -1 (0 steps if the registry failed). */
FS_API int fs_step_count(void);
FS_API const char* fs_step_id(int index);     /* e.g. "01_naive" */
FS_API const char* fs_step_name(int index);   /* e.g. "naive" */
FS_API const char* fs_step_lesson(int index); /* one line */
FS_API const char* fs_step_dir(int index);    /* e.g. "04_bank_conflicts": its directory under steps/ */
FS_API int fs_step_min_compute_capability(int index); /* e.g. 80 for sm_80 */

/* FS_OK when `step_id` can run `p` on the current CUDA device. */
FS_API fs_status fs_check(const char* step_id, const fs_problem* p);

/* The device workspace `step_id` needs for `p` on the current CUDA device, in *bytes (0: none). */
FS_API fs_status fs_workspace_size(const char* step_id, const fs_problem* p, uint64_t* bytes);

/* Checks, then enqueues the step on `stream`. `workspace` holds at least fs_workspace_size bytes
 * (NULL when that is 0). The backward pass will have its own entry point beside this one. */
FS_API fs_status fs_run(const char* step_id, const fs_problem* p, const void* q, const void* k,
                        const void* v, void* o, float* lse, void* workspace, uint64_t workspace_bytes,
                        void* stream);

/* The message of the last failed call on this thread ("" if none). */
FS_API const char* fs_last_error(void);

/* ---- The rules the benchmarks and the Python tools share, written once here ----------------- */

/* FLOPs of the forward pass as FlashAttention counts them: 4·batch·heads_q·seqlen_q·seqlen_k·head_dim
 * (two matrix products, a multiply-add counts 2), halved when causal; the softmax is not counted.
 * 0 for a NULL problem. */
FS_API double fs_problem_flops(const fs_problem* p);

/* The tolerance every step's output is checked with (the reasoning is in common/compare.h), for
 * `dtype` (fs_dtype) and the largest |V| of the inputs: an element of O passes when
 * |out - ref| <= atol + rtol·|ref|, an element of LSE when |err| <= lse_tol·(1 + |ref|).
 * FS_ERR_INVALID for an unknown dtype, a negative or non-finite max_abs_v, or a NULL output. */
FS_API fs_status fs_tolerance(int32_t dtype, double max_abs_v, double* atol, double* rtol, double* lse_tol);

/* The ladder's speed-ups of n timed rows: ids[i] a step id (or a baseline's name), ms[i] its time
 * (<= 0: not timed). Writes, for each row,
 *   x_step01[i] = time of 01_naive / ms[i]
 *   x_prev[i]   = time of the fastest row of the previous step number / ms[i]
 * where a step's number is its id up to the first '_' ("04" for both 04_pad and 04_swizzle, "07b"
 * for 07b_work_order), so alternatives of one step are each measured against the step before them.
 * A row whose id does not start with a digit gets x_step01 only; 0 where there is nothing to compare.
 * FS_ERR_INVALID for n < 0 or a NULL pointer. */
FS_API fs_status fs_speedups(int n, const char* const* ids, const double* ms, double* x_step01, double* x_prev);

/* The benchmark sweep (bench/compare_torch.py and flash_steps_bench measure it). Every shape holds
 * fs_sweep_tokens() = batch·seqlen tokens and heads·head_dim = 2048 channels, so every shape moves
 * the same Q/K/V bytes: 16 heads at head_dim 128, 32 at 64.
 * The lists: the full sweep (quick = 0) or the one-minute look (quick = 1). Each returns how many
 * values the list has and writes the first min(that, max) of them to out (out may be NULL when max
 * is 0). Seqlens ascending; dtypes as fs_dtype values. */
FS_API int64_t fs_sweep_tokens(void);
FS_API int fs_sweep_seqlens(int32_t quick, int64_t* out, int max);
FS_API int fs_sweep_head_dims(int32_t quick, int64_t* out, int max);
FS_API int fs_sweep_dtypes(int32_t quick, int32_t* out, int max);
/* The batch and heads of the sweep's shape at (seqlen, head_dim) with `tokens` = batch·seqlen
 * (fs_sweep_tokens() for the sweep itself). FS_ERR_INVALID when seqlen does not divide tokens or
 * head_dim does not divide 2048, with the sentence in fs_last_error. */
FS_API fs_status fs_sweep_shape(int64_t tokens, int64_t seqlen, int64_t head_dim, int64_t* batch, int64_t* heads);

#ifdef __cplusplus
}
#endif

#endif /* FLASH_STEPS_H */
