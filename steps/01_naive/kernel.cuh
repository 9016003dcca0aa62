// Step 01 — naive attention: the textbook algorithm, with the score matrix S in global memory.
//
//   kernel 1  S = scale · Q·Kᵀ     one thread per element of S, fp32, masked entries = -inf
//   kernel 2  P = softmax(S)       one thread per row: max, sum of exponentials, normalize; LSE
//   kernel 3  O = P·V              one thread per element of O
//
// It is correct for everything the harness allows and it is the baseline every later step is
// measured against. It is slow on purpose: S is B·H·Sq·Sk floats (512 MiB at the default shape),
// written, read three times and rewritten by the softmax, read again by P·V (six passes), and every
// thread re-reads its Q/K/V rows from memory.
// notes/01_naive.md counts the bytes. Which thread computes which element: traits.h.
#pragma once

#include <cmath>

#include "common/forward/problem.h"
#include "common/step/dtype.cuh"
#include "steps/01_naive/traits.h"

namespace fs::step01 {

// ---- kernel 1: S[b, h, i, j] = scale · q_i · k_j, or -inf where causal masks it out -------------
template <typename T>
__global__ void scores_kernel(const T* q, const T* k, float* s, Problem p) {
  const int64_t n = score_elements(p);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const auto [b, h, i, j] = score_coord(e, p);
    if (p.causal && !causal_allows(i, j, p.seqlen_q, p.seqlen_k)) {
      s[e] = -INFINITY;
      continue;
    }
    const T* q_row = q + offset_of(p.q, b, i, h);
    const T* k_row = k + offset_of(p.k, b, j, kv_head_of(p, h));
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += to_float(q_row[d]) * to_float(k_row[d]);
    s[e] = p.softmax_scale * dot;
  }
}

// ---- kernel 2: row-wise softmax in place, S -> P, and LSE = max + log(sum) ----------------------
__global__ void softmax_kernel(float* s, float* lse, Problem p) {
  const int64_t rows = score_rows(p);  // row r = (b·H + h)·Sq + i: LSE's own order
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    float* row = s + r * p.seqlen_k;
    float row_max = -INFINITY;
    for (int64_t j = 0; j < p.seqlen_k; ++j) row_max = fmaxf(row_max, row[j]);
    if (row_max == -INFINITY) {  // every key masked: P = 0, so O = 0; LSE = log(0) = -inf
      for (int64_t j = 0; j < p.seqlen_k; ++j) row[j] = 0.0f;
      if (lse) lse[r] = -INFINITY;
      continue;
    }
    float row_sum = 0.0f;
    for (int64_t j = 0; j < p.seqlen_k; ++j) row_sum += expf(row[j] - row_max);  // exp(-inf) = 0
    for (int64_t j = 0; j < p.seqlen_k; ++j) row[j] = expf(row[j] - row_max) / row_sum;
    if (lse) lse[r] = row_max + logf(row_sum);
  }
}

// ---- kernel 3: O[b, i, h, d] = sum_j P[b, h, i, j] · V[b, j, h_kv, d] ----------------------------
template <typename T>
__global__ void output_kernel(const float* s, const T* v, T* o, Problem p) {
  const int64_t n = output_elements(p);  // O's logical (b, i, h, d) order
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const auto [b, i, h, d] = output_coord(e, p);
    const float* p_row = s + ((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
    const T* v_col = v + offset_of(p.v, b, 0, kv_head_of(p, h)) + d;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.seqlen_k; ++j) acc += p_row[j] * to_float(v_col[j * p.v.row]);
    o[offset_of(p.o, b, i, h) + d] = from_float<T>(acc);
  }
}

}  // namespace fs::step01
