/*
 * flash_steps.h — the C ABI of flash-steps (libflash_steps.so): every step listed, checked and
 * launched from C, Python (ctypes: python/flash_steps) or any language with a C FFI. A step runs one
 * or more passes — forward, decoding, backward — each with the same three verbs:
 *     check            FS_OK when the step can run the problem on the current CUDA device
 *     workspace_size   the device scratch memory the launch needs (0: none; pass NULL)
 *     run              checks, then enqueues the step on `stream` (a cudaStream_t; NULL: the default)
 * on the problem structs of common/forward/problem.h, decode/problem.h and backward/problem.h.
 *
 * Tensors follow FlashAttention's convention:
 *   Q : (batch, seqlen_q, heads_q,  head_dim)     O : (batch, seqlen_q, heads_q, head_dim)
 *   K : (batch, seqlen_k, heads_kv, head_dim)     V : (batch, seqlen_k, heads_kv, head_dim)
 * fp16 or bf16 (all four alike), element strides for batch, row (seqlen) and head, head_dim
 * contiguous; every stride a multiple of 8 elements and every pointer 16-byte aligned (16-byte rows).
 *
 * Sizes: batch·heads_q <= 2^31 - 1, seqlens <= 2^31 - 1, head_dim a multiple of 8 from 8 to 256; every
 * tensor holds and spans (its strided view's extent) at most 2^58 elements, so that every size derived
 * from it fits in 64 bits. A larger problem is refused with a sentence naming the values, never wrapped.
 *
 * Aliasing: Q, K and V may alias each other and themselves: a batch stride of 0 broadcasts one batch
 * entry to every batch (as PyTorch's expand() does), and a packed QKV buffer is three views of one
 * allocation. A row or head stride is at least head_dim wherever that dimension has more than one
 * entry, so a tensor expanded over heads (head stride 0) is refused: pass its one head as GQA/MQA
 * (heads_kv < heads_q) instead. O must not overlap itself: sorted by stride,
 * each dimension of O must start past the span of the dimensions below it. O and LSE must not share
 * memory with Q, K, V or each other; that is not checked.
 * LSE (optional, may be NULL) is fp32, contiguous (batch, heads_q, seqlen_q) (a variable-length batch:
 * (heads_q, total_q), below), natural log:
 *   LSE[b][h][i] = log(sum_j exp(scale * q_i . k_j)) over the keys j that row i may attend.
 *
 * Workspace: ask the pass's workspace_size (it depends on the problem and the device; 0: none, pass
 * NULL), allocate it 16-byte aligned (as cudaMalloc is), pass it to run; a NULL or too small one is
 * refused with a sentence. It is only used during the launch.
 *
 * Semantics:
 *   - softmax_scale multiplies Q.K^T before the softmax (fs_problem_init: 1/sqrt(head_dim)). It must be
 *     finite, > 0, and small enough that the kernels' fp32 logits s·scale·log2(e) (s = q.k in fp32)
 *     stay within 2^126, so that every logit and the difference of any two are finite:
 *       fp16: scale <= 2^126 / (log2(e)·head_dim·65504²), about 1.1e26 at head_dim 128: then every
 *             fp16 input gives finite logits (|q.k| <= head_dim·65504²).
 *       bf16: scale <= 2^126 / log2(e), about 5.9e37. bf16 values up to 3.4e38 have products beyond
 *             fp32 whatever the scale, so the caller keeps |q.k| <= 2^126 / (scale·log2(e)).
 *   - softcap (fs_problem_init: 0, off): > 0 turns every logit c = scale·q.k into softcap·tanh(c / softcap)
 *     before the softmax (Gemma 2), forward and backward. It must be finite, >= 0, at most 2^126 / log2(e),
 *     and scale / softcap at most FLT_MAX. Only steps with softcapping run it (13a and later; 11_backward
 *     for the backward); every other step refuses it with a sentence naming one that does.
 *   - window (fs_problem_init and a zeroed struct: 0, off): 1 restricts query i to the keys j with
 *       i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right
 *     (bottom-right aligned, as causal; Mistral's and Gemma's local attention); a bound of -1 is
 *     unbounded on its side, (-1, 0) is causal, and with causal set too the right bound is 0. Bounds must
 *     be >= -1 (and 0 or -1 while window is 0). Only steps with windows run it (13b and later; 11_backward
 *     for the backward); the others refuse it with a sentence naming one that does.
 *   - variable-length batch (cu_seqlens_q, cu_seqlens_k; NULL, as fs_problem_init and a zeroed struct leave
 *     them: off; both or neither): sequences of different lengths packed one after another,
 *     FlashAttention's varlen layout (flash_attn_varlen_func):
 *       Q, O : (total_q, heads_q,  head_dim)     K, V : (total_k, heads_kv, head_dim)
 *     with row and head strides; the batch strides are not used and must be 0. cu_seqlens_q and
 *     cu_seqlens_k are device arrays of batch + 1 int32 offsets: sequence b is rows cu_seqlens_q[b] ...
 *     cu_seqlens_q[b + 1] - 1 of Q and O and rows cu_seqlens_k[b] ... cu_seqlens_k[b + 1] - 1 of K and V.
 *     batch counts the sequences; seqlen_q and seqlen_k bound their lengths (FlashAttention's max_seqlen_q
 *     and max_seqlen_k: a tighter bound helps); total_q and total_k (0 without cu_seqlens) count the rows of
 *     the packed tensors, each at most 2^31 - 1 (the kernels count rows in int32) and at most batch times
 *     its bound. Every rule above (causal, the window, empty rows) holds per sequence on its own lengths:
 *     bottom-right aligned on (q_len, k_len) of that sequence; a sequence of length 0 is allowed. LSE is
 *     packed (heads_q, total_q): LSE[h][cu_seqlens_q[b] + i]. The backward's dO, dQ, dK, dV are packed as
 *     Q, Q, K, V and its LSE input as the forward's.
 *     The offsets are the caller's contract, not checked by fs_run (they are on the device): cu[0] = 0,
 *     cu[b] <= cu[b + 1], cu[batch] = the total, every length at most its bound. Even when it is broken
 *     no kernel reads or writes outside the packed tensors: a side whose offsets break it reads as empty,
 *     so the output is wrong but memory is safe. fs_check_offsets checks them (it synchronizes); fs_varlen_flops
 *     checks host copies. Only steps with variable-length batches run them (13c and later); the others
 *     refuse them with a sentence naming one that does.
 *   - GQA / MQA: heads_q a multiple of heads_kv; query head h reads K/V head h / (heads_q / heads_kv).
 *   - causal is bottom-right aligned, as in FlashAttention >= 2.1: query i attends to key j iff
 *     j <= i + seqlen_k - seqlen_q. A query row with no key to attend gets O = 0 and LSE = -inf.
 *   - seqlen_k == 0: every row has no key, so O = 0 and LSE = -inf. seqlen_q == 0: nothing to do.
 *   - All work is enqueued on `stream`; run does not synchronize.
 *
 * Errors: a function that can fail returns an fs_status; fs_last_error() then returns a sentence
 * (thread-local, valid until the next call on this thread) naming the offending value and the limit
 * it broke. Nothing is launched on a problem that fails its checks.
 */
#ifndef FLASH_STEPS_H
#define FLASH_STEPS_H

#include <stdint.h>

#include "backward/problem.h"
#include "decode/problem.h"
#include "forward/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FS_API __attribute__((visibility("default")))

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

/* The passes a step may run. */
typedef enum fs_pass { FS_FORWARD = 0, FS_DECODE = 1, FS_BACKWARD = 2 } fs_pass;

/* The message of the last failed call on this thread ("" if none). */
FS_API const char* fs_last_error(void);

/* ---- The registered steps, in order. Index out of range: NULL / -1 (0 steps if the registry failed). */
FS_API int fs_step_count(void);
FS_API const char* fs_step_id(int index);     /* e.g. "01_naive" */
FS_API const char* fs_step_name(int index);   /* e.g. "naive" */
FS_API const char* fs_step_lesson(int index); /* one line */
FS_API const char* fs_step_dir(int index);    /* e.g. "04_bank_conflicts": its directory under steps/ */
FS_API int fs_step_min_compute_capability(int index); /* e.g. 80 for sm_80 */
/* 1 when the step at `index` runs `pass` (fs_pass), 0 when not, -1 for an index or pass out of range.
 * A step without a forward pass (11_backward) refuses every forward problem with a sentence. */
FS_API int fs_step_runs(int index, int32_t pass);

/* ---- The forward pass: O and LSE of softmax attention --------------------------------------- */

/* Fills *p with the given shape, contiguous strides, softmax_scale = 1/sqrt(head_dim) and softcap 0. */
FS_API void fs_problem_init(fs_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                            int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                            int32_t causal);
FS_API fs_status fs_check(const char* step_id, const fs_problem* p);
FS_API fs_status fs_workspace_size(const char* step_id, const fs_problem* p, uint64_t* bytes);
FS_API fs_status fs_run(const char* step_id, const fs_problem* p, const void* q, const void* k,
                        const void* v, void* o, float* lse, void* workspace, uint64_t workspace_bytes,
                        void* stream);

/* FLOPs of the forward pass as FlashAttention counts them: 4·batch·heads_q·seqlen_q·seqlen_k·head_dim
 * (two matrix products, a multiply-add counts 2), halved when causal; the softmax is not counted. With a
 * sliding window (window = 1) the pairs are counted exactly: 4·batch·heads_q·head_dim per visible pair.
 * A variable-length batch is counted with every sequence at the bounds seqlen_q and seqlen_k: an upper
 * bound (its offsets are on the device); fs_varlen_flops counts it exactly. 0 for a NULL problem. */
FS_API double fs_problem_flops(const fs_problem* p);
/* The FLOPs of a variable-length batch, in *flops: the sum over its sequences of fs_problem_flops of each
 * on its own (batch 1, its lengths, the same masks). cu_seqlens_q and cu_seqlens_k are host copies of the
 * batch + 1 offsets each. FS_ERR_INVALID for a NULL pointer, a problem fs_check's rules refuse or one
 * without cu_seqlens, or offsets that break the contract (the sentence names the first bad one). */
FS_API fs_status fs_varlen_flops(const fs_problem* p, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                 double* flops);
/* Checks a variable-length batch's device offsets (p->cu_seqlens_q, _k) against the contract above: they
 * are copied to the host on `stream` (a cudaStream_t; NULL: the default), which is synchronized.
 * FS_ERR_INVALID with a sentence naming the first bad offset ("cu_seqlens_q[3] is 70, below
 * cu_seqlens_q[2] = 80: ..."), or for a problem fs_check's rules refuse; FS_OK for a dense problem. */
FS_API fs_status fs_check_offsets(const fs_problem* p, void* stream);

/* ---- Decoding: a few new tokens against a KV cache (steps/10_decoding) ------------------------
 *
 * Each of `batch` sequences has seqlen_q new query tokens and its own number of keys in a cache:
 *   Q : (batch, seqlen_q, heads_q, head_dim)      O : (batch, seqlen_q, heads_q, head_dim)
 *   cache_seqlens : int32 (batch), on the device: sequence b attends to keys 0 ... cache_seqlens[b]-1
 *                   (NULL: every sequence has seqlen_k keys)
 * and K and V live in one of two caches, both fp16/bf16 like Q, with element strides and a
 * contiguous head_dim (every stride a multiple of 8, every pointer 16-byte aligned, as above):
 *   contiguous (page_size = 0):  (batch, >= seqlen_k rows, heads_kv, head_dim); key j of sequence b
 *                                is row j of batch entry b (strides: k.batch, k.row, k.head)
 *   paged (page_size > 0):       (num_pages, page_size, heads_kv, head_dim) and an int32 block table
 *                                (batch, max_pages_per_seq) on the device, rows block_table_stride
 *                                apart: key j of sequence b is row j % page_size of page
 *                                block_table[b][j / page_size] (strides: k.batch is the page stride)
 * page_size: any multiple of 16 from 16 on (every group of 16 keys that starts at a multiple of 16
 * then lies in one page); seqlen_k <= max_pages_per_seq·page_size.
 * seqlen_k (attention.seqlen_k) is the capacity: the most keys a sequence may have (cache_seqlens[b] <=
 * seqlen_k). It bounds every read and sizes the split of the keys (num_splits = 0), so a tighter bound
 * helps.
 *
 * The semantics are fs_run's for each sequence on its own, with seqlen_k = cache_seqlens[b]: causal
 * is bottom-right per sequence (token i of sequence b sees key j iff j <= i + cache_seqlens[b] -
 * seqlen_q); a row with no key gets O = 0 and LSE = -inf; LSE (optional) is (batch, heads_q, seqlen_q).
 *
 * Device data (cache_seqlens and block_table) is the caller's contract, not checked by default:
 * 0 <= cache_seqlens[b] <= seqlen_k, and block_table[b][i] in [0, num_pages) for every page a
 * sequence uses (i < ceil(cache_seqlens[b] / page_size)); entries past those are never read. Even
 * when the contract is broken no kernel reads outside the caches or the table: a length is clamped
 * to [0, seqlen_k] and a page outside [0, num_pages) reads as zeros, so the output is wrong but
 * memory is safe. With checked = 1, a small kernel first checks every length and every used table
 * entry, the stream is synchronized, and the first bad one is reported (FS_ERR_INVALID, with its
 * index and value in fs_last_error) instead of being read: nothing else is launched then.
 *
 * num_splits: 0 lets the step choose how many parts the keys of one sequence are cut into (a
 * documented heuristic on the GPU's SM count and the work); 1 to 128 forces that many.
 * The workspace holds the partial outputs of the split keys, and 256 bytes for the checked mode. */

/* Fills *p: contiguous Q and O, softmax_scale = 1/sqrt(head_dim), num_splits 0, checked 0; with
 * page_size 0 a contiguous (batch, seqlen_k, heads_kv, head_dim) cache, else a paged one with
 * max_pages_per_seq = ceil(seqlen_k / page_size), num_pages = batch·max_pages_per_seq and a dense
 * block table. Change num_pages (a larger pool) or the strides afterwards as needed. */
FS_API void fs_decode_problem_init(fs_decode_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                   int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                                   int32_t causal, int64_t page_size);
FS_API fs_status fs_decode_check(const char* step_id, const fs_decode_problem* p);
FS_API fs_status fs_decode_workspace_size(const char* step_id, const fs_decode_problem* p, uint64_t* bytes);
/* block_table: NULL for a contiguous cache; cache_seqlens: NULL when every sequence has seqlen_k keys;
 * lse may be NULL. */
FS_API fs_status fs_run_decode(const char* step_id, const fs_decode_problem* p, const void* q, const void* k_cache,
                               const void* v_cache, const int32_t* block_table, const int32_t* cache_seqlens,
                               void* o, float* lse, void* workspace, uint64_t workspace_bytes, void* stream);

/* Bytes of K and V a decoding problem must read, in *bytes: sum over b of cache_seqlens[b]·heads_kv·
 * head_dim·2 for K and as many for V (2-byte elements). `lengths` is a host array of num_lengths =
 * batch lengths, each in [0, seqlen_k], or NULL (num_lengths 0) for seqlen_k each. FS_ERR_INVALID for
 * a NULL p or bytes, a problem fs_decode_check's rules refuse, or lengths that break these. */
FS_API fs_status fs_decode_kv_bytes(const fs_decode_problem* p, const int32_t* lengths, int64_t num_lengths,
                                    double* bytes);

/* ---- The backward pass: dQ, dK, dV from the forward's O and LSE (steps/11_backward) ------------
 *
 * Given dO = dLoss/dO, the gradients of the forward problem `attention`:
 *   dQ : like Q (batch, seqlen_q, heads_q,  head_dim)   dK, dV : like K, V (batch, seqlen_k, heads_kv, head_dim)
 * with GQA/MQA: dK and dV of a K/V head are summed over the query heads that read it. Inputs are the
 * forward's Q, K, V, its output O and its LSE (fp32, (batch, heads_q, seqlen_q), natural log, -inf for
 * a row with no key: such a row contributes nothing to dK, dV and gets dQ = 0), and dO. All tensors
 * are fp16 or bf16 like Q (LSE fp32), with the rules of fs_run for strides and alignment; dO has its
 * own strides, so do dQ, dK and dV, none of which may overlap itself (as O). dQ, dK, dV must not
 * share memory with each other or with the inputs; that is not checked.
 *
 * deterministic = 1 asks for bitwise repeatable dQ, dK, dV (same inputs, same GPU, same result on
 * every run): no floating-point atomics, at a cost the step's note measures. With 0 the step may
 * accumulate dQ with atomics (the result then varies in its last bits from run to run).
 *
 * seqlen_k == 0: dQ = 0. seqlen_q == 0: dK = dV = 0. Both are written; nothing else is launched.
 * The workspace holds the fp32 dQ accumulator, the rows' D = rowsum(dO∘O) and LSE in base 2. */

/* Fills *p: attention as fs_problem_init, contiguous dO, dQ, dK, dV. */
FS_API void fs_backward_problem_init(fs_backward_problem* p, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                                     int64_t heads_q, int64_t heads_kv, int64_t head_dim, int32_t dtype,
                                     int32_t causal, int32_t deterministic);
FS_API fs_status fs_backward_check(const char* step_id, const fs_backward_problem* p);
FS_API fs_status fs_backward_workspace_size(const char* step_id, const fs_backward_problem* p, uint64_t* bytes);
/* lse must not be NULL. */
FS_API fs_status fs_run_backward(const char* step_id, const fs_backward_problem* p, const void* q, const void* k,
                                 const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                                 void* dk, void* dv, void* workspace, uint64_t workspace_bytes, void* stream);

/* FLOPs of the backward pass as FlashAttention counts them: 2.5 × the forward's (five matrix products
 * instead of two: S = Q·Kᵀ again, dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q). A variable-length
 * batch at the bounds, as fs_problem_flops: 2.5 × fs_varlen_flops of its attention counts it exactly.
 * 0 for NULL. */
FS_API double fs_backward_flops(const fs_backward_problem* p);

/* ---- The rules the benchmarks and the Python tools share, written once here ----------------- */

/* The tolerance every forward or decoding output is checked with (common/forward/check.h has the
 * reasoning), for `dtype` (fs_dtype) and the largest |V| of the inputs: an element of O passes when
 * |out - ref| <= atol + rtol·|ref|, an element of LSE when |err| <= lse_tol·(1 + |ref|).
 * FS_ERR_INVALID for an unknown dtype, a negative or non-finite max_abs_v, or a NULL output. */
FS_API fs_status fs_tolerance(int32_t dtype, double max_abs_v, double* atol, double* rtol, double* lse_tol);

/* The backward's acceptance rule (common/backward/check.h explains it), for one gradient tensor: with
 * ref_err the largest |x - exact| of the same computation done in the dtype and max_abs_exact the
 * largest |exact| element over all three gradients dQ, dK, dV, writes the largest error a step may make:
 *   *bound = 2·ref_err + u·max_abs_exact   (u: 2^-11 fp16, 2^-8 bf16).
 * FS_ERR_INVALID for an unknown dtype, negative or non-finite inputs, or a NULL output. */
FS_API fs_status fs_backward_bound(int32_t dtype, double ref_err, double max_abs_exact, double* bound);

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
