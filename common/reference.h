// The two references every step is checked against.
//   reference_cpu: fp64 on the CPU, from the already-rounded fp16/bf16 inputs. Small shapes.
//   GpuReference:  fp32 on the GPU with cuBLAS (S = scale·Q·Kᵀ GEMM, masked softmax kernel,
//                  O = P·V GEMM). Large shapes; itself tested against reference_cpu. It is also
//                  the "unfused cuBLAS" baseline row of the runner.
// Both take decoding problems too (common/decode.h): each sequence's keys are gathered from the
// cache (contiguous or paged) into a contiguous (length, heads_kv, head_dim) view, and the forward
// reference runs on every sequence with seqlen_k = its length.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "buffer.h"
#include "decode.h"
#include "problem.h"
#include "workload.h"

namespace fs {

// O as (batch, seqlen_q, heads_q, head_dim) contiguous; LSE as (batch, heads_q, seqlen_q).
struct Reference {
  std::vector<double> o;
  std::vector<double> lse;
};

Reference reference_cpu(const Problem& p, const HostInputs& in);

// Multiply-adds of the CPU reference, to decide when it is too slow (B·Hq·Sq·Sk·d).
double reference_cpu_cost(const Problem& p);

// Host copies of a decoding problem's inputs: the Q view's storage and the caches' storage as floats
// (index with the problem's strides), the lengths (empty: seqlen_k each) and the block table.
struct DecodeHostInputs {
  std::vector<float> q, k_cache, v_cache;
  std::vector<int32_t> lengths, block_table;
};

// The keys (or values) of sequence b, its first `len` rows gathered from `cache` (a contiguous or
// paged cache with strides `st`): a contiguous (len, heads_kv, head_dim) array.
std::vector<float> gather_sequence(const DecodeProblem& p, const std::vector<float>& cache, const Strides& st,
                                   const std::vector<int32_t>& block_table, int64_t b, int64_t len);

Reference reference_cpu_decode(const DecodeProblem& p, const DecodeHostInputs& in);
double reference_cpu_decode_cost(const DecodeProblem& p, const std::vector<int32_t>& lengths);

class GpuReference {
 public:
  GpuReference();
  ~GpuReference();
  GpuReference(const GpuReference&) = delete;
  GpuReference& operator=(const GpuReference&) = delete;

  // Enqueues the reference on `stream`. Writes, where the pointer is not null:
  //   o32   fp32 O, (batch, seqlen_q, heads_q, head_dim) contiguous
  //   t.o   O in the problem's dtype and strides (the "unfused cuBLAS" baseline)
  //   t.lse fp32 LSE
  // Works in row chunks so that its scratch S stays under `max_scratch_bytes`.
  void run(const Problem& p, const Tensors& t, float* o32, cudaStream_t stream);

  // Runs the reference and downloads O and LSE.
  Reference compute(const Workload& w);

  // The decoding reference on device inputs: each sequence's keys gathered into a contiguous buffer
  // (the device block table is read), then run() per sequence. `lengths` are the host copies of
  // cache_seqlens (empty: seqlen_k each). Downloads O and LSE.
  Reference compute_decode(const DecodeProblem& p, const DecodeTensors& t, const std::vector<int32_t>& lengths);

 private:
  void reserve(size_t bytes, DeviceBuffer& buf);
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer s_;      // scores, then probabilities, fp32
  DeviceBuffer v32_;    // V of one K/V head as fp32
  DeviceBuffer o32_;    // fp32 O of one chunk
  DeviceBuffer k_seq_, v_seq_;  // one sequence's gathered keys and values (compute_decode)
  size_t max_scratch_bytes_ = size_t(1) << 30;
};

}  // namespace fs
