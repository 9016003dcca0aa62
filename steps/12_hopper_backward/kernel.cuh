// Step 12 — the Hopper backward: dQ, dK, dV on the TMA and wgmma.
//
// Extends step 11 (the FlashAttention-2 backward on mma.sync). Its ncu profile says what holds it
// back on the H200: the L1/shared pipe is 76 % busy against 45 % for the tensor pipe, because
// every operand of every mma.sync passes through an ldmatrix. Step 08 took the forward off that path;
// this step does the same for the five products of the backward:
//
//   * the TMA brings K and V once per block, and Q, dO (with the rows' LSE₂ and D, a 1-D bulk copy)
//     per query tile into a two-stage mbarrier ring: one thread issues them, no thread computes an
//     address;
//   * wgmma computes every product from shared memory through descriptors, or with Pᵀ and dSᵀ as its
//     register A operand, straight from the accumulators that produced them (traits.h has the table of
//     which operand lives where, and why the products are computed transposed).
//
// Per block (128 keys, two warpgroups of 64 keys) and query tile (BLOCK_Q rows, stage s):
//
//   wait Q(s), dO(s)   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   (wgmma ss)    Pᵀ = exp2(Sᵀ·scale·log2 e - LSE₂),
//                                                             dSᵀ = Pᵀ ∘ (dPᵀ - D); dSᵀ → shared
//   dV += Pᵀ·dO, dK += dSᵀ·Q  (wgmma rs)     __syncthreads     dQ = dS·K  (wgmma ss, both MN-major)
//   red.global.add dQ → fp32 accumulator      __syncthreads     thread 0: TMA Q, dO of tile t + 2 → stage s
//
// The sub-steps (traits.h's enum Idea; `Tr::has(kIdea)` marks where each changes this kernel):
//   12a kDataPath    the data path above, each commit group waited for in full (wait_group 0) before
//                    the threads read a result: the tensor cores idle while the threads work
//   12b kAsyncWgmma  wgmma is asynchronous, so wait only for what the next instructions read: Sᵀ
//                    commits apart from dPᵀ and Pᵀ is computed while dPᵀ's products run; dV is issued
//                    at once and runs under dSᵀ; dK is issued after dQ and runs under the atomics
//   12c kBulkDq      dQ leaves through shared memory: both warpgroups store their 64 × 64 tiles in the
//                    accumulators' order, and one thread adds the query tile to the fp32 accumulator
//                    with one bulk reduce-add (cp.reduce.async.bulk, the TMA's), where each thread
//                    issued 16 atomics; the accumulator is in that order, so dQ's conversion is 12c's
//
// The rest is step 11's and is reused from it: the preprocessing (D and LSE₂), the conversion of the
// fp32 dQ accumulator, and the deterministic mode's dQ kernel (steps/11_backward/kernel.cuh); step 08's
// instructions (mbarrier, TMA, wgmma) come from steps/08_tma_wgmma/kernel.cuh. What stays for later
// work: the same threads still wait for the TMA, issue the copies and hand dQ on (warp specialization, as
// step 09 did for the forward).
// From 12c: 12c converts dQ with a kernel of its own (convert_dq_tiles_kernel), for its accumulator's order.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/backward/problem.h"
#include "steps/08_tma_wgmma/kernel.cuh"
#include "steps/11_backward/kernel.cuh"
#include "steps/12_hopper_backward/traits.h"

namespace fs::step12 {

namespace sm90 = step08::sm90;
using step08::matrix_descriptor;
using step08::advance;
using step08::K_MAJOR_LBO;
using step08::SBO_8_ROWS;
using step08::wgmma_acc;
using step08::wgmma_a;
using step08::p_source;

// A 1-D bulk copy (no tensor map): `bytes` (a multiple of 16) from global to shared memory, both
// 16-byte aligned, reported to the mbarrier like a TMA box.
__device__ inline void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// A bulk reduce-add (no tensor map): `bytes` (a multiple of 16) of fp32 from shared memory added
// element by element to global memory, both 16-byte aligned, in this thread's bulk group
// (sm90::tma_store_commit closes it, tma_store_wait_read waits for its reads of shared memory); and
// the wait until all of this thread's groups are complete.
__device__ inline void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ inline void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// wgmma m64n64k16 with both operands from shared memory, both MN-major (imm-trans-a = imm-trans-b =
// 1): dQ = dS·K, dS read from dSᵀ stored [key][query] and K stored [key][dim].
template <typename T>
__device__ inline void wgmma_m64n64_ss_mn(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "fp16 or bf16");
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{" FS_WGMMA_REGS_32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : FS_WGMMA_ACC_32(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{" FS_WGMMA_REGS_32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : FS_WGMMA_ACC_32(d)
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate));
}

// One block: K/V head bh_kv, keys kv0 … kv0 + 127; warpgroup wg the keys 64·wg …. In thread t of a
// warpgroup, accumulator register i of Sᵀ, dPᵀ, dK, dV is (key, column) = wgmma_acc(t, i). ATOMIC_DQ:
// the dQ part (off in the deterministic mode, where step 11's dq_kernel computes dQ).
template <typename T, int HEAD_DIM, int BLOCK_Q, int IDEAS, bool ATOMIC_DQ>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    hopper_backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                           T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dq_accum,
                           const float* __restrict__ lse2, const float* __restrict__ d_rows, const BackwardProblem p,
                           const float scale_log2) {
  using Tr = Traits<HEAD_DIM, BLOCK_Q, IDEAS>;
  const Problem& f = p.attention;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw);
  const uint32_t base = (raw + SWIZZLE_ATOM - 1) & ~(SWIZZLE_ATOM - 1);
  unsigned char* const smem = smem_raw + (base - raw);
  const uint32_t k_smem = base + Tr::K_OFFSET, v_smem = base + Tr::V_OFFSET;
  auto q_smem = [&](int s) { return base + uint32_t(Tr::Q_OFFSET + s * Tr::Q_BYTES); };
  auto do_smem = [&](int s) { return base + uint32_t(Tr::DO_OFFSET + s * Tr::Q_BYTES); };
  const uint32_t ds_smem = base + Tr::DS_OFFSET;
  const float* lse_smem = reinterpret_cast<const float*>(smem + Tr::LSE_OFFSET);  // [Q_STAGES][BLOCK_Q]
  const float* dd_smem = reinterpret_cast<const float*>(smem + Tr::D_OFFSET);     // [Q_STAGES][BLOCK_Q]
  const uint32_t kv_full = base + Tr::BARRIER_OFFSET;
  auto q_full = [&](int s) { return kv_full + 8u * uint32_t(1 + s); };

  const int seqlen_q = int(f.seqlen_q), seqlen_k = int(f.seqlen_k), head_dim = int(f.head_dim);
  const bool causal = f.causal != 0;
  const uint32_t kv_tiles = uint32_t(step11::tiles(seqlen_k, BLOCK_KV));
  const uint32_t bh_kv = blockIdx.x / kv_tiles;
  const int kv0 = int(blockIdx.x % kv_tiles) * BLOCK_KV;
  const int b = int(bh_kv / uint32_t(f.heads_kv)), h_kv = int(bh_kv % uint32_t(f.heads_kv));
  const int group = int(f.heads_q / f.heads_kv);
  const int64_t rows_per_head = step11::padded_rows(f.seqlen_q);

  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0), t = threadIdx.x % 128;

  // The visits, as step 11: every query tile from the first that sees these keys, per query head.
  const int first_tile = step11::first_query_tile(kv0, BLOCK_Q, seqlen_q, seqlen_k, causal);
  const int tiles_per_head = int(step11::tiles(seqlen_q, BLOCK_Q)) - first_tile;
  const int visits = tiles_per_head > 0 ? group * tiles_per_head : 0;
  auto head_of = [&](int v) { return h_kv * group + v / tiles_per_head; };
  auto q0_of = [&](int v) { return (first_tile + v % tiles_per_head) * BLOCK_Q; };

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(kv_full, 1);
    for (int s = 0; s < Q_STAGES; ++s) sm90::mbarrier_init(q_full(s), 1);
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();

  // The copies, thread 0 only: a tile is COL_BLOCKS boxes [rows, 64] (zeros past the tensor's ends).
  auto load_tile = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int rows, int row0, int head) {
#pragma unroll
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      const step08::BoxCoord c = step08::tma_box(cb, row0, head, b);
      sm90::tma_load_4d(dst + box_offset(rows, cb), &map, bar, c.col, c.row, c.head, c.batch);
    }
  };
  auto load_visit = [&](int v) {
    const int s = v % Q_STAGES, h = head_of(v), q0 = q0_of(v);
    const int64_t row0 = (int64_t(b) * f.heads_q + h) * rows_per_head + q0;
    sm90::mbarrier_arrive_expect_tx(q_full(s), Tr::VISIT_BYTES);
    load_tile(q_map, q_smem(s), q_full(s), BLOCK_Q, q0, h);
    load_tile(do_map, do_smem(s), q_full(s), BLOCK_Q, q0, h);
    bulk_load(base + uint32_t(Tr::LSE_OFFSET + s * Tr::ROWS_BYTES), lse2 + row0, Tr::ROWS_BYTES, q_full(s));
    bulk_load(base + uint32_t(Tr::D_OFFSET + s * Tr::ROWS_BYTES), d_rows + row0, Tr::ROWS_BYTES, q_full(s));
  };
  if (threadIdx.x == 0 && visits > 0) {
    sm90::mbarrier_arrive_expect_tx(kv_full, 2 * Tr::KV_BYTES);
    load_tile(k_map, k_smem, kv_full, BLOCK_KV, kv0, h_kv);
    load_tile(v_map, v_smem, kv_full, BLOCK_KV, kv0, h_kv);
    for (int v = 0; v < visits && v < Q_STAGES; ++v) load_visit(v);
  }

  float dv_acc[Tr::KV_REGS] = {};  // [64 keys, HEAD_DIM] fp32, wgmma_acc layout
  float dk_acc[Tr::KV_REGS] = {};

  // Descriptors (step 08's): K-major A of Sᵀ, dPᵀ (this warpgroup's keys of K and V) and B (Q, dO);
  // MN-major B of dV, dK (dO, Q) and of dQ (K), MN-major A of dQ (dSᵀ).
  const uint64_t k_rows_desc = matrix_descriptor(k_smem, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t v_rows_desc = matrix_descriptor(v_smem, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t q_k_desc = matrix_descriptor(q_smem(0), K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t do_k_desc = matrix_descriptor(do_smem(0), K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t q_mn_desc = matrix_descriptor(q_smem(0), mn_major_lbo(BLOCK_Q), SBO_8_ROWS);
  const uint64_t do_mn_desc = matrix_descriptor(do_smem(0), mn_major_lbo(BLOCK_Q), SBO_8_ROWS);
  const uint64_t ds_desc = matrix_descriptor(ds_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);
  const uint64_t k_mn_desc = matrix_descriptor(k_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);
  const DqTile dq_tile = dq_tile_of(wg, BLOCK_Q);

  if (visits > 0) sm90::mbarrier_wait(kv_full, 0);

  for (int v = 0; v < visits; ++v) {
    const int s = v % Q_STAGES, h = head_of(v), q0 = q0_of(v);
    const uint32_t stage_bytes = uint32_t(s * Tr::Q_BYTES);
    sm90::mbarrier_wait(q_full(s), uint32_t(v / Q_STAGES) & 1u);

    // The register operands of dV and dK: Pᵀ, dSᵀ packed to fp16/bf16 (queries 16·kk … are
    // accumulators 8kk … 8kk + 7, step 08's p_source).
    uint32_t p_frag[Tr::Q_K_STEPS][4], ds_frag[Tr::Q_K_STEPS][4];
    // dV += Pᵀ·dO and dK += dSᵀ·Q   [64 keys, HEAD_DIM], Q_K_STEPS k16 steps over the queries; each
    // is one commit group.
    auto issue_dv = [&] {
      sm90::fence_operands(dv_acc);
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk) sm90::fence_operands(p_frag[kk]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
        sm90::Wgmma<HEAD_DIM, T>::rs(dv_acc, p_frag[kk], advance(do_mn_desc, stage_bytes + q_mn_major_step(kk)));
      sm90::wgmma_commit();
    };
    auto issue_dk = [&] {
      sm90::fence_operands(dk_acc);
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk) sm90::fence_operands(ds_frag[kk]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
        sm90::Wgmma<HEAD_DIM, T>::rs(dk_acc, ds_frag[kk], advance(q_mn_desc, stage_bytes + q_mn_major_step(kk)));
      sm90::wgmma_commit();
    };

    // ---- Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ   [64 keys, BLOCK_Q] each, D_K_STEPS k16 steps over head dims
    float s_acc[Tr::S_REGS], dp_acc[Tr::S_REGS];
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks)
      sm90::Wgmma<BLOCK_Q, T>::ss(s_acc, advance(k_rows_desc, kv_rows_step(wg, ks)),
                                  advance(q_k_desc, stage_bytes + q_k_major_step(BLOCK_Q, ks)), ks > 0);
    // From 12b: Sᵀ is a commit group of its own, waited for alone.
    if constexpr (Tr::has(kAsyncWgmma)) sm90::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks)
      sm90::Wgmma<BLOCK_Q, T>::ss(dp_acc, advance(v_rows_desc, kv_rows_step(wg, ks)),
                                  advance(do_k_desc, stage_bytes + q_k_major_step(BLOCK_Q, ks)), ks > 0);
    sm90::wgmma_commit();
    if constexpr (Tr::has(kAsyncWgmma)) {
      sm90::wgmma_wait<1>();  // Sᵀ is in; dPᵀ's products still run
    } else {
      sm90::wgmma_wait<0>();
      sm90::fence_operands(dp_acc);
    }
    sm90::fence_operands(s_acc);

    // ---- Pᵀ = exp2(Sᵀ·scale·log2(e) - LSE₂), as step 11: masked pairs (a key past seqlen_k or after
    // the row's diagonal) get P = 0; rows past seqlen_q have LSE₂ = +inf, P = 0.
    const float* lse_tile = lse_smem + s * BLOCK_Q;
    const float* dd_tile = dd_smem + s * BLOCK_Q;
    const bool masked = step11::tile_needs_mask(q0, kv0, BLOCK_KV, seqlen_q, seqlen_k, causal);
#pragma unroll
    for (int i = 0; i < Tr::S_REGS; ++i) {
      const step08::frag::Coord c = wgmma_acc(t, i);  // (key in the warpgroup's 64, query in the tile)
      float pv = step11::exp2_fast(fmaf(s_acc[i], scale_log2, -lse_tile[c.col]));
      if (masked) {
        const int key = kv0 + wg * KEYS_PER_WARPGROUP + c.row, row = q0 + c.col;
        if (key >= seqlen_k || (causal && key > row + seqlen_k - seqlen_q)) pv = 0.0f;
      }
      s_acc[i] = pv;
    }
#pragma unroll
    for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p_frag[kk][r] = step11::pack2<T>(s_acc[p_source(kk, r)], s_acc[p_source(kk, r) + 1]);
    if constexpr (Tr::has(kAsyncWgmma)) {
      issue_dv();             // dV's products run while the threads compute dSᵀ
      sm90::wgmma_wait<1>();  // dPᵀ is in; dV's products still run
      sm90::fence_operands(dp_acc);
    }

    // ---- dSᵀ = Pᵀ ∘ (dPᵀ - D)
#pragma unroll
    for (int i = 0; i < Tr::S_REGS; ++i) dp_acc[i] = s_acc[i] * (dp_acc[i] - dd_tile[wgmma_acc(t, i).col]);
#pragma unroll
    for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        ds_frag[kk][r] = step11::pack2<T>(dp_acc[p_source(kk, r)], dp_acc[p_source(kk, r) + 1]);

    // dSᵀ into shared memory for dQ: register r of step kk holds (key, query), (key, query + 1).
    if constexpr (ATOMIC_DQ) {
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const step08::frag::Coord c = wgmma_a(t, r, 0);
          *reinterpret_cast<uint32_t*>(smem + Tr::DS_OFFSET + ds_offset(wg * KEYS_PER_WARPGROUP + c.row, 16 * kk + c.col)) =
              ds_frag[kk][r];
        }
      sm90::fence_proxy_async_shared();  // the generic stores, before wgmma reads them (async proxy)
    }

    // Before 12b: dV's products, then dK's, issued after every wait of this visit.
    // From 12b: dV's products are issued already; dK's come after dQ's, under the dQ atomics.
    // From 12c: under dQ's staging and bulk reduce-add instead of its atomics.
    if constexpr (Tr::has(kAsyncWgmma)) {
      if constexpr (!ATOMIC_DQ) issue_dk();
    } else {
      issue_dv();
      issue_dk();
    }

    if constexpr (ATOMIC_DQ) {
      if constexpr (Tr::has(kBulkDq)) {
        // The last visit's bulk reduce-add has read the staged tile before this barrier lets it be
        // overwritten (it had this visit's first products to do so).
        if (threadIdx.x == 0) sm90::tma_store_wait_read();
      }
      __syncthreads();  // both warpgroups' dSᵀ are in

      // ---- dQ[tile] = dS·K   [64 queries, 64 dims], KV_K_STEPS k16 steps over all 128 keys
      float dq_acc[Tr::DQ_REGS];
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk)
        wgmma_m64n64_ss_mn<T>(dq_acc, advance(ds_desc, ds_step(dq_tile.row_tile, kk)),
                              advance(k_mn_desc, k_mn_major_step(dq_tile.col_block, kk)), kk > 0);
      sm90::wgmma_commit();
      if constexpr (Tr::has(kAsyncWgmma)) {
        issue_dk();             // dK's products run under dQ's atomics  // From 12c: under its staging, bulk reduce
        sm90::wgmma_wait<1>();  // dQ is in (and dV); dK's products still run
      } else {
        sm90::wgmma_wait<0>();
      }
      sm90::fence_operands(dq_acc);

      if constexpr (Tr::has(kBulkDq)) {
        // The tile into shared memory, in the accumulators' order; thread 0 adds the block's whole
        // query tile after the barrier that ends this visit.
        float* stage = reinterpret_cast<float*>(smem + Tr::DQ_OFFSET) + wg * DQ_TILE * DQ_TILE;
#pragma unroll
        for (int i = 0; i < Tr::DQ_REGS; i += 2)
          *reinterpret_cast<float2*>(stage + dq_slot(t, i)) = make_float2(dq_acc[i], dq_acc[i + 1]);
        sm90::fence_proxy_async_shared();  // the stores, before the bulk copy reads them (async proxy)
      } else {
        // Every block of this head adds to the same dQ rows: fp32 atomics, two columns at once (sm_90).
        float* acc_rows = dq_accum + ((int64_t(b) * f.heads_q + h) * rows_per_head + q0 + DQ_TILE * dq_tile.row_tile) *
                                         HEAD_DIM + DQ_TILE * dq_tile.col_block;
#pragma unroll
        for (int i = 0; i < Tr::DQ_REGS; i += 2) {
          const step08::frag::Coord c = wgmma_acc(t, i);
          atomicAdd(reinterpret_cast<float2*>(acc_rows + c.row * HEAD_DIM + c.col),
                    make_float2(dq_acc[i], dq_acc[i + 1]));
        }
      }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operands(dv_acc);
    sm90::fence_operands(dk_acc);

    // Every thread's wgmma have read stage s (and dSᵀ): thread 0 refills it with visit v + Q_STAGES.
    __syncthreads();
    if (threadIdx.x == 0 && v + Q_STAGES < visits) load_visit(v + Q_STAGES);
    if constexpr (Tr::has(kBulkDq)) {
      // Every block of this head adds to the same dQ tiles: one bulk reduce-add of the whole tile.
      if (ATOMIC_DQ && threadIdx.x == 0) {
        bulk_reduce_add_f32(dq_accum + ((int64_t(b) * f.heads_q + h) * rows_per_head + q0) * HEAD_DIM,
                            base + uint32_t(Tr::DQ_OFFSET), Tr::DQ_TILE_BYTES);
        sm90::tma_store_commit();
      }
    }
  }

  if constexpr (Tr::has(kBulkDq)) {
    // This block's bulk reduce-adds are complete before it exits (dQ's conversion reads them).
    if (ATOMIC_DQ && threadIdx.x == 0) bulk_wait_all();
  }

  // ---- epilogue: dK = scale·dK_acc and dV, this warpgroup's keys, columns < head_dim
  T* dk_rows = dk + offset_of(p.dk, b, 0, h_kv);
  T* dv_rows = dv + offset_of(p.dv, b, 0, h_kv);
#pragma unroll
  for (int i = 0; i < Tr::KV_REGS; i += 2) {
    const step08::frag::Coord c = wgmma_acc(t, i);
    const int key = kv0 + wg * KEYS_PER_WARPGROUP + c.row;
    if (key >= seqlen_k || c.col >= head_dim) continue;
    *reinterpret_cast<uint32_t*>(dk_rows + int64_t(key) * p.dk.row + c.col) =
        step11::pack2<T>(dk_acc[i] * f.softmax_scale, dk_acc[i + 1] * f.softmax_scale);
    *reinterpret_cast<uint32_t*>(dv_rows + int64_t(key) * p.dv.row + c.col) = step11::pack2<T>(dv_acc[i], dv_acc[i + 1]);
  }
}

// The tiled accumulator's dQ conversion: dQ = scale · accumulator, the accumulator in dq_slot order (a query tile's
// [BLOCK_Q, HEAD_DIM] floats, warpgroup wg's 64 × 64 tile the wg-th DQ_TILE² of them). One thread per
// 8 consecutive floats, read as two float4: threads t … t + 3's pairs, one row's 8 columns.
// VARLEN (step 13c): a packed batch, the accumulator in the padded batch's rows; row i of sequence b is
// row q_start + i of the packed dQ.
template <typename T, int HEAD_DIM, int BLOCK_Q, bool VARLEN = false>
__global__ void __launch_bounds__(step11::kConvertThreads)
    convert_dq_tiles_kernel(const float* __restrict__ dq_accum, T* __restrict__ dq, const BackwardProblem p) {
  const Problem& f = p.attention;
  constexpr int TILE = BLOCK_Q * HEAD_DIM, SUB = DQ_TILE * DQ_TILE;
  const int64_t rows_per_head = step11::padded_rows(f.seqlen_q), tiles_per_head = rows_per_head / BLOCK_Q;
  const int64_t e0 = 8 * (int64_t(blockIdx.x) * step11::kConvertThreads + threadIdx.x);
  if (e0 >= f.batch * f.heads_q * rows_per_head * HEAD_DIM) return;
  const int64_t tile = e0 / TILE, bh = tile / tiles_per_head;
  const int q0 = int(tile % tiles_per_head) * BLOCK_Q, within = int(e0 % TILE);
  const DqTile d = dq_tile_of(within / SUB, BLOCK_Q);
  // One row's 8 consecutive columns (dq_run_start), so they leave as one 16-byte store, like step 11's
  // row-major conversion.
  const step08::frag::Coord c = dq_run_start(within % SUB);
  const int row = q0 + DQ_TILE * d.row_tile + c.row, col = DQ_TILE * d.col_block + c.col;
  int64_t seqlen_q = f.seqlen_q, b = bh / f.heads_q, at = row;
  if constexpr (VARLEN) {
    const Sequence seq = load_sequence(f, b);
    seqlen_q = seq.q_len, at = seq.q_start + row, b = 0;
  }
  if (row >= seqlen_q || col >= f.head_dim) return;
  *reinterpret_cast<uint4*>(dq + offset_of(p.dq, b, at, bh % f.heads_q) + col) =
      step11::scaled_pack8<T>(dq_accum + e0, f.softmax_scale);
}

}  // namespace fs::step12
