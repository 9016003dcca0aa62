// Step 01 — naive attention: the textbook algorithm, with the score matrix S in global memory.
//
//   kernel 1  S = scale · Q·Kᵀ     one thread per element of S, fp32, masked entries = -inf
//   kernel 2  P = softmax(S)       one thread per row: max, sum of exponentials, normalize; LSE
//   kernel 3  O = P·V              one thread per element of O
//
// It is correct for everything the harness allows and it is the baseline every later step is
// measured against. It is slow on purpose: S is B·H·Sq·Sk floats (512 MiB at the default shape),
// written once and read three times, and every thread re-reads its Q/K/V rows from memory.
// notes/01_naive.md counts the bytes.
#include <cmath>
#include <optional>
#include <sstream>

#include "common/checked.h"
#include "common/dtype.cuh"
#include "common/registry.h"
#include "common/workload.h"

namespace fs {
namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items (64-bit n: S can have more than 2^31 elements).
unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20)); }

// ---- kernel 1: S[b, h, i, j] = scale · q_i · k_j, or -inf where causal masks it out -------------
template <typename T>
__global__ void scores_kernel(const T* q, const T* k, float* s, Problem p) {
  const int64_t n = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % p.seqlen_k;
    const int64_t i = (e / p.seqlen_k) % p.seqlen_q;
    const int64_t h = (e / (p.seqlen_k * p.seqlen_q)) % p.heads_q;
    const int64_t b = e / (p.seqlen_k * p.seqlen_q * p.heads_q);
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
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;  // row r = (b·H + h)·Sq + i: LSE's own order
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
  const int64_t n = p.batch * p.seqlen_q * p.heads_q * p.head_dim;  // O's logical (b, i, h, d) order
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % p.head_dim;
    const int64_t h = (e / p.head_dim) % p.heads_q;
    const int64_t i = (e / (p.head_dim * p.heads_q)) % p.seqlen_q;
    const int64_t b = e / (p.head_dim * p.heads_q * p.seqlen_q);
    const float* p_row = s + ((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
    const T* v_col = v + offset_of(p.v, b, 0, kv_head_of(p, h)) + d;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.seqlen_k; ++j) acc += p_row[j] * to_float(v_col[j * p.v.row]);
    o[offset_of(p.o, b, i, h) + d] = from_float<T>(acc);
  }
}

// Bytes of S, B·H·Sq·Sk·4; nothing when that does not fit in 64 bits (limits() refuses those problems).
std::optional<int64_t> score_bytes(const Problem& p) {
  return checked_product({p.batch, p.heads_q, p.seqlen_q, p.seqlen_k, int64_t(sizeof(float))});
}

std::string limits(const Problem& p) {
  if (score_bytes(p)) return "";
  std::ostringstream m;
  m << "the score matrix S would need batch·heads·seqlen_q·seqlen_k·4 = " << p.batch << "·" << p.heads_q << "·"
    << p.seqlen_q << "·" << p.seqlen_k << "·4 bytes, which overflows 64 bits";
  return m.str();
}

// S is the launch's workspace: B·H·Sq·Sk fp32, which must fit in device memory with 10 % left.
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  const int64_t bytes = *score_bytes(p);  // limits() passed
  const double free_budget = 0.9 * double(dev.free_bytes);
  if (double(bytes) > free_budget) {
    std::ostringstream m;
    m << "the score matrix S needs " << bytes / (1 << 20) << " MiB (batch·heads·seqlen_q·seqlen_k·4 bytes)"
      << " but only " << int64_t(free_budget) / (1 << 20) << " MiB (90 % of free device memory) is available";
    pl.refusal = m.str();
    return pl;
  }
  pl.workspace_bytes = size_t(bytes);
  return pl;
}

// Documented support: every problem whose S takes at most half of the free device memory.
bool claims(const Problem& p, const DeviceInfo& dev) {
  const std::optional<int64_t> bytes = score_bytes(p);
  return bytes && double(*bytes) <= 0.5 * double(dev.free_bytes);
}

void launch(const Problem& p, const Tensors& t, const Plan&, void* workspace, cudaStream_t stream) {
  float* s = static_cast<float*>(workspace);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scores_kernel<T><<<blocks_for(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k), kThreads, 0, stream>>>(
        static_cast<const T*>(t.q), static_cast<const T*>(t.k), s, p);
    CHECK_LAUNCH();
    softmax_kernel<<<blocks_for(p.batch * p.heads_q * p.seqlen_q), kThreads, 0, stream>>>(s, t.lse, p);
    CHECK_LAUNCH();
    output_kernel<T><<<blocks_for(p.batch * p.seqlen_q * p.heads_q * p.head_dim), kThreads, 0, stream>>>(
        s, static_cast<const T*>(t.v), static_cast<T*>(t.o), p);
    CHECK_LAUNCH();
  });
}

}  // namespace

void register_step_01_naive(Registry& r) {
  r.add(Step{"01_naive", "naive attention",
             "textbook attention: S = QKᵀ, softmax and P·V as three kernels, S in global memory", "", 80, 0,
             limits, plan, launch, claims});
}

}  // namespace fs
