// The fp32 cuBLAS reference of the backward pass (common/backward/check.h). Per (batch, K/V head), the
// query heads of its group together, in chunks of query rows:
//   S  = scale·Q·Kᵀ          masked softmax -> P          dP = dO·Vᵀ
//   D  = rowsum(P ∘ dP), or (rounded) rowsum(dO ∘ O) with O = P·V rounded to the dtype
//   dS = P ∘ (dP - D)        dQ = scale·dS·K              dK += scale·dSᵀ·Q      dV += Pᵀ·dO
// (softcapping: S becomes softcap·tanh(S / softcap) before the softmax and dS takes its slope 1 - tanh²).
// dK and dV add up over the chunks and over the group's query heads (GQA), in fp32.
//
// Q, K, V and dO are first converted to contiguous fp32 matrices (exact: fp16 and bf16 values are
// fp32 values), so every product is an fp32 cuBLAS GEMM on dense operands whatever the strides.
#include <algorithm>
#include <optional>

#include "backward/check.h"
#include "harness/cublas.h"
#include "harness/reference_kernels.cuh"
#include "step/dispatch.h"
#include "step/overflow.h"

namespace fs {

namespace {

template <typename T>
__device__ inline float round_to(float x) {
  return to_float(from_float<T>(x));
}

// One block of kSoftmaxThreads per row r of the chunk: row_d[r] = Σ_d dO[r][d]·O[r][d] with O
// rounded to the dtype (the forward's output, from which a kernel forms D).
template <typename T>
__global__ void rowsum_do_o_kernel(const float* d_o, const float* o, int64_t head_dim, float* row_d) {
  const int64_t r = blockIdx.x;
  float acc = 0.0f;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x)
    acc += d_o[r * head_dim + d] * round_to<T>(o[r * head_dim + d]);
  acc = block_reduce(acc, false);
  if (threadIdx.x == 0) row_d[r] = acc;
}

// One block of kSoftmaxThreads per row r of the chunk. D = row_d[r] when given, else Σ_j P·dP; then
// dS = P ∘ (dP - D) overwrites dP. rounded: dS rounded to the dtype, and then P (after dS used it
// unrounded), as in reference_cpu_backward. slope (softcapping; else null): dS is also multiplied by
// the logit's derivative, as masked_softmax_kernel wrote it.
template <typename T>
__global__ void ds_kernel(float* prob, float* dp, int64_t seqlen_k, const float* row_d, bool rounded,
                          const float* slope) {
  const int64_t r = blockIdx.x;
  float* p_row = prob + r * seqlen_k;
  float* dp_row = dp + r * seqlen_k;
  float d_sum;
  if (row_d) {
    d_sum = row_d[r];
  } else {
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < seqlen_k; j += blockDim.x) acc += p_row[j] * dp_row[j];
    d_sum = block_reduce(acc, false);
  }
  for (int64_t j = threadIdx.x; j < seqlen_k; j += blockDim.x) {
    const float p = p_row[j];
    const float ds = p * (dp_row[j] - d_sum) * (slope ? slope[r * seqlen_k + j] : 1.0f);
    dp_row[j] = rounded ? round_to<T>(ds) : ds;
    p_row[j] = rounded ? round_to<T>(p) : p;
  }
}

}  // namespace

void GpuReference::run(const BackwardProblem& bp, const BackwardTensors& t, bool rounded, float* dq32,
                               float* dk32, float* dv32, cudaStream_t stream) {
  const std::string why = validate(bp);
  if (!why.empty()) throw Error("backward reference: " + why);
  if (is_varlen(bp.attention)) return run_varlen(bp, t, rounded, dq32, dk32, dv32, stream);
  const Problem& p = bp.attention;
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, Hkv = p.heads_kv, D = p.head_dim;
  const int64_t group = H / Hkv;
  // dQ is written row by row (beta = 0); dK and dV are sums (beta = 1), so they start at 0. The
  // empty problems end here: seqlen_k == 0 leaves dQ = 0, seqlen_q == 0 leaves dK = dV = 0.
  const size_t kv_bytes = size_t(B * Sk * Hkv * D) * sizeof(float);
  if (kv_bytes) {
    CHECK_CUDA(cudaMemsetAsync(dk32, 0, kv_bytes, stream));
    CHECK_CUDA(cudaMemsetAsync(dv32, 0, kv_bytes, stream));
  }
  const size_t q_bytes = size_t(B * Sq * H * D) * sizeof(float);
  if (Sk == 0 && q_bytes) CHECK_CUDA(cudaMemsetAsync(dq32, 0, q_bytes, stream));
  if (Sq == 0 || Sk == 0) return;

  // Scratch of one query row of the group: P and dP (Sk each), the logits' slopes (Sk, softcapping only),
  // Q, dO and O (D each), D (1).
  const int64_t row_floats = (p.softcap > 0 ? 3 : 2) * Sk + 3 * D + 1;
  const std::optional<int64_t> row_bytes = checked_product({int64_t(sizeof(float)), group, row_floats});
  if (!row_bytes)
    throw Error(sentence("backward reference: one query row of P and dP for ", group, " query heads and seqlen_k ", Sk,
                         " needs more than 2^63 bytes"));
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(Sq, int64_t(max_scratch_bytes_) / *row_bytes));
  const int64_t kv_elems = Sk * D;  // one K/V head as fp32: K and V
  const int64_t chunk = group * rows;  // rows of the chunk, [group][rows]
  const size_t scratch_bytes = size_t(2 * kv_elems + chunk * row_floats) * sizeof(float);
  reserve(scratch_bytes, s_);
  float* k32 = s_.as<float>();
  float* v32 = k32 + kv_elems;
  float* prob = v32 + kv_elems;      // [group·rows][Sk]: S, then P (rounded: P rounded after dS)
  float* dp = prob + chunk * Sk;     // [group·rows][Sk]: dP, then dS
  float* q32 = dp + chunk * Sk;      // [group][rows][D]
  float* do32 = q32 + chunk * D;     // [group][rows][D]
  float* o32 = do32 + chunk * D;     // [group][rows][D] (rounded only)
  float* row_d = o32 + chunk * D;    // [group·rows] (rounded only)
  float* slope = p.softcap > 0 ? row_d + chunk : nullptr;  // [group·rows][Sk] (softcapping only)
  CHECK_CUBLAS(cublasSetStream(handle_, stream));
  const float zero = 0.0f, one = 1.0f, scale = p.softmax_scale;

  // Column-major views of the row-major arrays above: a [rows][cols] array is a cols × rows matrix
  // with leading dimension cols. k32, v32: D × Sk; q32, do32, o32: D × (group·n); prob, dp: Sk × (group·n).
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        const int64_t h0 = hk * group;  // the query heads that read this K/V head: h0 … h0+group-1
        rows_to_float_kernel<T><<<grid_for(kv_elems), 256, 0, stream>>>(static_cast<const T*>(t.k), p.k, b, 0, Sk,
                                                                        hk, 1, D, k32);
        CHECK_LAUNCH();
        rows_to_float_kernel<T><<<grid_for(kv_elems), 256, 0, stream>>>(static_cast<const T*>(t.v), p.v, b, 0, Sk,
                                                                        hk, 1, D, v32);
        CHECK_LAUNCH();
        float* dk = dk32 + (b * Sk * Hkv + hk) * D;  // row j at dk + j·Hkv·D
        float* dv = dv32 + (b * Sk * Hkv + hk) * D;
        for (int64_t i0 = 0; i0 < Sq; i0 += rows) {
          const int64_t n = std::min(rows, Sq - i0), gn = group * n;
          rows_to_float_kernel<T><<<grid_for(gn * D), 256, 0, stream>>>(static_cast<const T*>(t.q), p.q, b, i0, n,
                                                                       h0, group, D, q32);
          CHECK_LAUNCH();
          rows_to_float_kernel<T><<<grid_for(gn * D), 256, 0, stream>>>(static_cast<const T*>(t.d_o), bp.d_o, b, i0,
                                                                       n, h0, group, D, do32);
          CHECK_LAUNCH();
          // S (Sk × gn) = scale · Kᵀ · Q, then P; dP (Sk × gn) = Vᵀ · dO.
          CHECK_CUBLAS(cublasSgemm_64(handle_, CUBLAS_OP_T, CUBLAS_OP_N, Sk, gn, D, &scale, k32, D, q32, D, &zero,
                                      prob, Sk));
          masked_softmax_kernel<<<unsigned(gn), kSoftmaxThreads, 0, stream>>>(prob, p, n, i0, b, h0, nullptr, slope);
          CHECK_LAUNCH();
          CHECK_CUBLAS(cublasSgemm_64(handle_, CUBLAS_OP_T, CUBLAS_OP_N, Sk, gn, D, &one, v32, D, do32, D, &zero, dp,
                                      Sk));
          if (rounded) {
            // O (D × gn) = V · P, then D = rowsum(dO ∘ O rounded).
            CHECK_CUBLAS(cublasSgemm_64(handle_, CUBLAS_OP_N, CUBLAS_OP_N, D, gn, Sk, &one, v32, D, prob, Sk, &zero,
                                        o32, D));
            rowsum_do_o_kernel<T><<<unsigned(gn), kSoftmaxThreads, 0, stream>>>(do32, o32, D, row_d);
            CHECK_LAUNCH();
          }
          ds_kernel<T><<<unsigned(gn), kSoftmaxThreads, 0, stream>>>(prob, dp, Sk, rounded ? row_d : nullptr, rounded,
                                                                     slope);
          CHECK_LAUNCH();
          // dQ (D × n per head) = scale · K · dS, written straight into (b, i, h, d) order: one batch
          // entry per query head, leading dimension H·D.
          CHECK_CUBLAS(cublasSgemmStridedBatched_64(handle_, CUBLAS_OP_N, CUBLAS_OP_N, D, n, Sk, &scale, k32, D, 0,
                                                    dp, Sk, n * Sk, &zero, dq32 + ((b * Sq + i0) * H + h0) * D, H * D,
                                                    D, group));
          // dK (D × Sk) += scale · Q · dSᵀ and dV (D × Sk) += dO · Pᵀ: the group's heads and the chunk's
          // rows are one inner dimension of length group·n, so GQA's sum is part of the product.
          CHECK_CUBLAS(cublasSgemm_64(handle_, CUBLAS_OP_N, CUBLAS_OP_T, D, Sk, gn, &scale, q32, D, dp, Sk, &one, dk,
                                      Hkv * D));
          CHECK_CUBLAS(cublasSgemm_64(handle_, CUBLAS_OP_N, CUBLAS_OP_T, D, Sk, gn, &one, do32, D, prob, Sk, &one, dv,
                                      Hkv * D));
        }
      }
  });
}

// Each sequence of a variable-length batch as the dense problem it is on its own rows (one_sequence): its
// rows of Q, K, V and dO are a dense (1, len, heads, head_dim) view at its start, and its gradients the
// rows from its start of the packed dq32, dk32, dv32. A sequence without query rows leaves its dK and dV 0,
// one without keys its dQ 0 (the dense run's empty problems); the offsets cover every row.
void GpuReference::run_varlen(const BackwardProblem& bp, const BackwardTensors& t, bool rounded, float* dq32,
                              float* dk32, float* dv32, cudaStream_t stream) {
  const Problem& p = bp.attention;
  const Offsets cu = download_offsets(p, stream);
  if (const std::string why = validate_offsets(p, cu.q, cu.k); !why.empty())
    throw Error("backward reference: " + why);
  for_each_sequence(p, cu.q, cu.k, [&](int64_t, const Sequence& s) {
    BackwardProblem one = bp;
    one.attention = one_sequence(p, s);
    // O and LSE are not read (P is recomputed): none is given.
    const BackwardTensors ts{packed_row(t.q, p.q, s.q_start),  packed_row(t.k, p.k, s.k_start),
                             packed_row(t.v, p.v, s.k_start),  nullptr,
                             nullptr,                          packed_row(t.d_o, bp.d_o, s.q_start),
                             nullptr,                          nullptr,
                             nullptr};
    run(one, ts, rounded, dq32 + s.q_start * p.heads_q * p.head_dim, dk32 + s.k_start * p.heads_kv * p.head_dim,
        dv32 + s.k_start * p.heads_kv * p.head_dim, stream);
  });
}

}  // namespace fs
