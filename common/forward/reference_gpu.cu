#include <cmath>
#include <optional>

#include "forward/check.h"
#include "harness/cublas.h"
#include "harness/reference_kernels.cuh"
#include "harness/tensors.h"
#include "step/dispatch.h"
#include "step/overflow.h"

namespace fs {

namespace {

// fp32 contiguous O -> the problem's dtype and strides.
template <typename T>
__global__ void o_from_float_kernel(const float* o32, T* o, Strides st, int64_t batch, int64_t seqlen_q,
                                    int64_t heads, int64_t head_dim) {
  const int64_t n = batch * seqlen_q * heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim, h = (i / head_dim) % heads, s = (i / (head_dim * heads)) % seqlen_q,
                  b = i / (head_dim * heads * seqlen_q);
    o[offset_of(st, b, s, h) + d] = from_float<T>(o32[i]);
  }
}

cudaDataType_t cuda_type(int32_t dtype) { return dtype == FS_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

}  // namespace

GpuReference::GpuReference() { CHECK_CUBLAS(cublasCreate(&handle_)); }
GpuReference::~GpuReference() {
  if (handle_) cublasDestroy(handle_);
}

void GpuReference::reserve(size_t bytes, DeviceBuffer& buf) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
}

void GpuReference::run(const Problem& p, const Tensors& t, float* o32, cudaStream_t stream) {
  const std::string why = validate(p);
  if (!why.empty()) throw Error("reference: " + why);
  if (is_varlen(p)) return run_varlen(p, t, o32, stream);
  const int64_t B = p.batch, Sq = p.seqlen_q, Sk = p.seqlen_k, H = p.heads_q, D = p.head_dim;
  const int64_t group = p.heads_q / p.heads_kv;
  if (Sq == 0) return;
  if (Sk == 0) {
    fill_empty_output(p, t, stream);
    if (o32) CHECK_CUDA(cudaMemsetAsync(o32, 0, size_t(B * Sq * H * D) * sizeof(float), stream));
    return;
  }
  if (!o32) {
    reserve(size_t(B * Sq * H * D) * sizeof(float), o32_);
    o32 = o32_.as<float>();
  }
  // Query rows per chunk, so that S (group × rows × Sk fp32) fits the scratch budget; at least one row.
  const std::optional<int64_t> row_bytes = checked_product({int64_t(sizeof(float)), group, Sk});
  if (!row_bytes)
    throw Error(sentence("reference: one query row of S for ", group, " query heads and seqlen_k ", Sk,
                         " needs more than 2^63 bytes"));
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(Sq, int64_t(max_scratch_bytes_) / *row_bytes));
  reserve(size_t(rows * *row_bytes), s_);  // rows · row_bytes <= max(budget, row_bytes)
  reserve(size_t(Sk * D) * sizeof(float), v32_);
  CHECK_CUBLAS(cublasSetStream(handle_, stream));
  const cudaDataType_t in_type = cuda_type(p.dtype);
  const int elem = 2;
  const float zero = 0.0f, one = 1.0f, scale = p.softmax_scale;

  // The 64-bit cuBLAS API (_64): leading dimensions are the problem's row strides, which may exceed
  // 2^31 elements (a strided view), and are passed as they are.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t h0 = hk * group;  // the query heads that read this K/V head: h0 … h0+group-1
      dispatch_dtype(p.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        rows_to_float_kernel<T><<<grid_for(Sk * D), 256, 0, stream>>>(static_cast<const T*>(t.v), p.v, b, 0, Sk, hk,
                                                                      1, D, v32_.as<float>());
        CHECK_LAUNCH();
      });
      const char* k = static_cast<const char*>(t.k) + offset_of(p.k, b, 0, hk) * elem;
      for (int64_t i0 = 0; i0 < Sq; i0 += rows) {
        const int64_t n = std::min(rows, Sq - i0);
        const char* q = static_cast<const char*>(t.q) + offset_of(p.q, b, i0, h0) * elem;
        // Column-major view (a leading dimension below D only happens with one row, where it is unused): S_cm (Sk × n) = K_cm(D × Sk)ᵀ · Q_cm(D × n), one batch entry per query head.
        CHECK_CUBLAS(cublasGemmStridedBatchedEx_64(
            handle_, CUBLAS_OP_T, CUBLAS_OP_N, Sk, n, D, &scale, k, in_type, std::max(p.k.row, D), 0, q, in_type,
            std::max(p.q.row, D), p.q.head, &zero, s_.get(), CUDA_R_32F, Sk, n * Sk, group, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
        masked_softmax_kernel<<<unsigned(group * n), kSoftmaxThreads, 0, stream>>>(s_.as<float>(), p, n, i0, b, h0,
                                                                                   t.lse);
        CHECK_LAUNCH();
        // O_cm (D × n) = V32_cm (D × Sk) · P_cm (Sk × n), written straight into (b, s, h, d) order.
        float* o = o32 + ((b * Sq + i0) * H + h0) * D;
        CHECK_CUBLAS(cublasSgemmStridedBatched_64(handle_, CUBLAS_OP_N, CUBLAS_OP_N, D, n, Sk, &one, v32_.as<float>(),
                                                  D, 0, s_.as<float>(), Sk, n * Sk, &zero, o, H * D, D, group));
      }
    }
  if (t.o) {
    dispatch_dtype(p.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      o_from_float_kernel<T><<<grid_for(B * Sq * H * D), 256, 0, stream>>>(o32, static_cast<T*>(t.o), p.o, B, Sq,
                                                                          H, D);
      CHECK_LAUNCH();
    });
  }
}

// Each sequence of a variable-length batch as the dense problem it is on its own rows; its LSE (heads_q,
// q_len) is written to lse_ and copied into the packed (heads_q, total_q) at column q_start.
void GpuReference::run_varlen(const Problem& p, const Tensors& t, float* o32, cudaStream_t stream) {
  const Offsets cu = download_offsets(p, stream);
  if (const std::string why = validate_offsets(p, cu.q, cu.k); !why.empty()) throw Error("reference: " + why);
  const int64_t row = p.heads_q * p.head_dim;  // floats of one row of o32
  if (!o32) {
    reserve(size_t(p.total_q * row) * sizeof(float), o32_);
    o32 = o32_.as<float>();
  }
  reserve(size_t(p.heads_q * std::max<int64_t>(p.seqlen_q, 1)) * sizeof(float), lse_);  // once: the longest
  for_each_sequence(p, cu.q, cu.k, [&](int64_t, const Sequence& s) {
    if (s.q_len == 0) return;
    const Tensors one{packed_row(t.q, p.q, s.q_start), packed_row(t.k, p.k, s.k_start),
                      packed_row(t.v, p.v, s.k_start), const_cast<char*>(packed_row(t.o, p.o, s.q_start)),
                      t.lse ? lse_.as<float>() : nullptr};
    run(one_sequence(p, s), one, o32 + s.q_start * row, stream);
    if (t.lse)
      CHECK_CUDA(cudaMemcpy2DAsync(t.lse + s.q_start, size_t(p.total_q) * sizeof(float), lse_.get(),
                                   size_t(s.q_len) * sizeof(float), size_t(s.q_len) * sizeof(float), size_t(p.heads_q),
                                   cudaMemcpyDeviceToDevice, stream));
  });
}

Reference gpu_reference(const Workload& w, GpuReference& gpu) {
  const Problem p = dense_view(w.problem());  // the sizes: a variable-length batch's packed tensors
  const int64_t o_elems = p.batch * p.seqlen_q * p.heads_q * p.head_dim, lse_elems = p.batch * p.heads_q * p.seqlen_q;
  DeviceBuffer o32(size_t(o_elems) * sizeof(float)), lse(size_t(lse_elems) * sizeof(float));
  Tensors t = w.tensors();
  t.o = nullptr;
  t.lse = lse.as<float>();
  gpu.run(w.problem(), t, o32.as<float>(), nullptr);
  return Reference{download_doubles(o32.as<float>(), o_elems), download_doubles(lse.as<float>(), lse_elems)};
}

}  // namespace fs
