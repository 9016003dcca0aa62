// Step 08 — Hopper I: the Hopper data path. TMA copies, mbarrier waits, wgmma products.
//
// Extends step 07 (FlashAttention-2 on mma.sync). The one idea: let the hardware move and feed the
// tiles. On the H200, step 07's threads spend issue slots on cp.async addresses and on ldmatrix, and
// no mma.sync kernel can pass about 650 TFLOP/s there, the mma.sync peak the project measures
// (flash_steps_ceilings, bench/results/ceilings-*.json); wgmma's measured peak is about 835 at fp16.
// Hopper has two engines that take that work off the threads:
//
//   * the Tensor Memory Accelerator (TMA) copies a whole box of a tensor from global to shared
//     memory on one instruction of one thread, swizzling it for the tensor cores, filling what lies
//     outside the tensor with zeros, and reports the bytes it wrote to an mbarrier;
//   * wgmma, issued by a warpgroup (4 warps, 128 threads), multiplies a 64 × N × 16 slice with its B
//     operand (and here also the A operand of S = Q·Kᵀ) read straight from shared memory through a
//     64-bit matrix descriptor: no ldmatrix, no fragments in registers, asynchronously.
//
// The same threads still do everything (separate producer and consumer warps are step 09's lesson):
// two warpgroups of 64 query rows each, and thread 0 issues the copies. The per-tile order:
//
//     wait K(t)   S = Q·K(t)ᵀ (wgmma, both from shared memory)   mask, online softmax, P
//     wait V(t)   O += P·V(t) (wgmma, P from registers)          __syncthreads   thread 0: TMA K/V(t+2)
//
// The K/V ring, KV_STAGES = 2, with the mbarrier phase each wait tests (traits.h, kv_parity):
//
//   thread 0  Q K0 V0 K1 V1 ....................... K2 V2 .................... K3 V3 ........
//   stage 0   [  K0 V0: phase 0 completes ]  read by visit 0  | [K2 V2: phase 1]  read by visit 2 |
//   stage 1   [  K1 V1: phase 0 completes ]                  read by visit 1    | [K3 V3: phase 1] ...
//   waits     visit 0: parity 0   visit 1: parity 0   visit 2: parity 1   visit 3: parity 1   visit 4: 0
//
// A stage is refilled only after the barrier at the end of the visit that read it, so the copy of
// tile t+2 has all of visit t+1 to land, and a wait can never see a phase two fills ahead.
//
// The rest is step 07's: online softmax in registers with exp2 and the scale folded in, masked tiles
// (the end of K, the causal diagonal) apart from the others, tiles above the diagonal never loaded,
// GQA/MQA, LSE, any seqlen and stride, fp16 and bf16, the longest (causal) query tiles first. New:
// ragged tails and padded head dims cost nothing (the TMA fills zeros on load and drops them on
// store), and O leaves through a TMA store.
//
// Expected: the tensor cores get wgmma's rate and the threads get back the copy and ldmatrix work,
// but the two warpgroups still compute the softmax at the same time while the tensor cores wait, so
// well short of FlashAttention-3; measured: 1.40× step 07g at the ladder shape (notes/08_tma_wgmma.md).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: nothing here calls the driver)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/step/dtype.cuh"
#include "steps/08_tma_wgmma/traits.h"

namespace fs::step08 {

// ---- step 07's helpers, as it wrote them ---------------------------------------------------------
// Two floats -> one register of two fp16/bf16 (lo in the low half), rounded to nearest.
template <typename T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x as one MUFU instruction (ex2.approx.ftz: relative error about 2^-22, 2^-inf = 0).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- the Hopper instructions -------------------------------------------------------------------
namespace sm90 {

__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// mbarrier: a 64-bit object in shared memory that counts arrivals and transaction bytes per phase.
__device__ inline void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// The producer's one arrival of a phase, announcing the bytes the TMA will deliver to this phase:
// the phase completes when they have all landed.
__device__ inline void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire: the data the TMA wrote in that
// phase is visible afterwards). try_wait may suspend the thread for a while before it says no.
__device__ inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Orders this thread's prior generic-proxy accesses to shared memory (ordinary loads and stores,
// mbarrier.init) before its later async-proxy ones (TMA, wgmma), and the other way round.
__device__ inline void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// TMA load of one box at coordinates (c0, c1, c2, c3), innermost first, into shared memory at `dst`;
// the bytes are reported to the mbarrier `bar` (complete-tx). The .shared::cluster destination
// names this block's own shared memory when, as here, the launch has no cluster.
__device__ inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// TMA store of one box from shared memory at `src`; elements outside the tensor are not written.
__device__ inline void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
__device__ inline void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the committed stores have read their shared memory (which may then be released).
__device__ inline void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// wgmma: fence (register accesses before it are ordered before the next wgmma), commit (closes a
// group of issued wgmma), wait (until at most N groups are pending). All three, like wgmma itself,
// are executed by all 128 threads of the warpgroup.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The compiler sees a wgmma as an ordinary asm statement that reads and writes its registers at once.
// An empty volatile asm that "modifies" each register pins the order: placed before wgmma_fence it
// keeps earlier writes (the O rescale, the P conversion) from sinking past the fence; placed after
// wgmma_wait it keeps later reads from being hoisted above the wait.
template <int N>
__device__ inline void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ inline void fence_operands(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}, N = 64 … 256:
//   ss: D (+)= A·B, A and B from shared memory through descriptors, both K-major (imm-trans 0, 0);
//       accumulate = 0 gives D = A·B (the first k16 step of a tile: s_acc needs no zeroing).
//   rs: D += A·B, A from 4 registers (wgmma_a), B an N-major descriptor (imm-trans-b 1).
// The N/2 accumulators are the first N/2 asm operands, so the operand numbers of the other inputs
// depend on N; the register lists are written out below, 8 at a time.
template <int N, typename T>
struct Wgmma;

#define FS_WGMMA_D0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FS_WGMMA_D8 "%8, %9, %10, %11, %12, %13, %14, %15"
#define FS_WGMMA_D16 "%16, %17, %18, %19, %20, %21, %22, %23"
#define FS_WGMMA_D24 "%24, %25, %26, %27, %28, %29, %30, %31"
#define FS_WGMMA_D32 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FS_WGMMA_D40 "%40, %41, %42, %43, %44, %45, %46, %47"
#define FS_WGMMA_D48 "%48, %49, %50, %51, %52, %53, %54, %55"
#define FS_WGMMA_D56 "%56, %57, %58, %59, %60, %61, %62, %63"
#define FS_WGMMA_D64 "%64, %65, %66, %67, %68, %69, %70, %71"
#define FS_WGMMA_D72 "%72, %73, %74, %75, %76, %77, %78, %79"
#define FS_WGMMA_D80 "%80, %81, %82, %83, %84, %85, %86, %87"
#define FS_WGMMA_D88 "%88, %89, %90, %91, %92, %93, %94, %95"
#define FS_WGMMA_D96 "%96, %97, %98, %99, %100, %101, %102, %103"
#define FS_WGMMA_D104 "%104, %105, %106, %107, %108, %109, %110, %111"
#define FS_WGMMA_D112 "%112, %113, %114, %115, %116, %117, %118, %119"
#define FS_WGMMA_D120 "%120, %121, %122, %123, %124, %125, %126, %127"
#define FS_WGMMA_REGS_32 FS_WGMMA_D0 ", " FS_WGMMA_D8 ", " FS_WGMMA_D16 ", " FS_WGMMA_D24
#define FS_WGMMA_REGS_48 FS_WGMMA_REGS_32 ", " FS_WGMMA_D32 ", " FS_WGMMA_D40
#define FS_WGMMA_REGS_64 FS_WGMMA_REGS_48 ", " FS_WGMMA_D48 ", " FS_WGMMA_D56
#define FS_WGMMA_REGS_96 FS_WGMMA_REGS_64 ", " FS_WGMMA_D64 ", " FS_WGMMA_D72 ", " FS_WGMMA_D80 ", " FS_WGMMA_D88
#define FS_WGMMA_REGS_128 FS_WGMMA_REGS_96 ", " FS_WGMMA_D96 ", " FS_WGMMA_D104 ", " FS_WGMMA_D112 ", " FS_WGMMA_D120

#define FS_WGMMA_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FS_WGMMA_ACC_32(d) FS_WGMMA_ACC8(d, 0), FS_WGMMA_ACC8(d, 8), FS_WGMMA_ACC8(d, 16), FS_WGMMA_ACC8(d, 24)
#define FS_WGMMA_ACC_48(d) FS_WGMMA_ACC_32(d), FS_WGMMA_ACC8(d, 32), FS_WGMMA_ACC8(d, 40)
#define FS_WGMMA_ACC_64(d) FS_WGMMA_ACC_48(d), FS_WGMMA_ACC8(d, 48), FS_WGMMA_ACC8(d, 56)
#define FS_WGMMA_ACC_96(d) \
  FS_WGMMA_ACC_64(d), FS_WGMMA_ACC8(d, 64), FS_WGMMA_ACC8(d, 72), FS_WGMMA_ACC8(d, 80), FS_WGMMA_ACC8(d, 88)
#define FS_WGMMA_ACC_128(d) \
  FS_WGMMA_ACC_96(d), FS_WGMMA_ACC8(d, 96), FS_WGMMA_ACC8(d, 104), FS_WGMMA_ACC8(d, 112), FS_WGMMA_ACC8(d, 120)

// IN0 … IN4: the operand numbers N/2 … N/2 + 4 of the inputs (ss: a_desc, b_desc, accumulate;
// rs: a[0 … 3], b_desc).
#define FS_WGMMA(N, T, PTX_T, REGS, ACC, IN0, IN1, IN2, IN3, IN4)                                                \
  template <>                                                                                                  \
  struct Wgmma<N, T> {                                                                                         \
    __device__ static void ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {           \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IN2 ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N        \
                   "k16.f32." PTX_T "." PTX_T " {" REGS "}, " IN0 ", " IN1 ", p, 1, 1, 0, 0;\n}\n"             \
                   : ACC(d)                                                                                    \
                   : "l"(a_desc), "l"(b_desc), "r"(accumulate));                                               \
    }                                                                                                          \
    __device__ static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc) {                    \
      asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " {" REGS "}, {" IN0 ", " \
                   IN1 ", " IN2 ", " IN3 "}, " IN4 ", 1, 1, 1, 1;\n"                                           \
                   : ACC(d)                                                                                    \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));                                 \
    }                                                                                                          \
  };

FS_WGMMA(64, __half, "f16", FS_WGMMA_REGS_32, FS_WGMMA_ACC_32, "%32", "%33", "%34", "%35", "%36")
FS_WGMMA(96, __half, "f16", FS_WGMMA_REGS_48, FS_WGMMA_ACC_48, "%48", "%49", "%50", "%51", "%52")
FS_WGMMA(128, __half, "f16", FS_WGMMA_REGS_64, FS_WGMMA_ACC_64, "%64", "%65", "%66", "%67", "%68")
FS_WGMMA(192, __half, "f16", FS_WGMMA_REGS_96, FS_WGMMA_ACC_96, "%96", "%97", "%98", "%99", "%100")
FS_WGMMA(256, __half, "f16", FS_WGMMA_REGS_128, FS_WGMMA_ACC_128, "%128", "%129", "%130", "%131", "%132")
FS_WGMMA(64, __nv_bfloat16, "bf16", FS_WGMMA_REGS_32, FS_WGMMA_ACC_32, "%32", "%33", "%34", "%35", "%36")
FS_WGMMA(96, __nv_bfloat16, "bf16", FS_WGMMA_REGS_48, FS_WGMMA_ACC_48, "%48", "%49", "%50", "%51", "%52")
FS_WGMMA(128, __nv_bfloat16, "bf16", FS_WGMMA_REGS_64, FS_WGMMA_ACC_64, "%64", "%65", "%66", "%67", "%68")
FS_WGMMA(192, __nv_bfloat16, "bf16", FS_WGMMA_REGS_96, FS_WGMMA_ACC_96, "%96", "%97", "%98", "%99", "%100")
FS_WGMMA(256, __nv_bfloat16, "bf16", FS_WGMMA_REGS_128, FS_WGMMA_ACC_128, "%128", "%129", "%130", "%131", "%132")

}  // namespace sm90

// One block = BLOCK_Q = 128 query rows of one (batch, head): warpgroup wg = threadIdx.x / 128 owns
// rows 64·wg … 64·wg + 63. In thread t of a warpgroup, row state r (0, 1) belongs to the row
// wgmma_acc(t, 2r).row of the warpgroup's 64: rows g and g + 8 of its warp's 16 (g = lane / 4).
template <typename T, int HEAD_DIM, int BLOCK_KV, int KV_STAGES>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    tma_wgmma_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                     float* __restrict__ lse, const Problem p, const float scale_log2) {
  using Tr = Traits<HEAD_DIM, BLOCK_KV, KV_STAGES>;

  // The swizzle repeats every 1024 bytes from an aligned address, and TMA and wgmma both assume
  // tiles that start on it: round the base up (SMEM_BYTES includes the 1024 bytes of slack).
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw);
  const uint32_t base = (raw + SWIZZLE_ATOM - 1) & ~(SWIZZLE_ATOM - 1);
  unsigned char* const smem = smem_raw + (base - raw);
  const uint32_t q_smem = base + Tr::Q_OFFSET;  // [BLOCK_Q, HEAD_DIM] as COL_BLOCKS boxes [BLOCK_Q, 64], swizzled; O at the end
  const uint32_t k_smem = base + Tr::K_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  const uint32_t v_smem = base + Tr::V_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  const uint32_t q_full = base + Tr::BARRIER_OFFSET;  // mbarriers, 8 bytes each: Q, then K and V per stage
  auto k_full = [&](int stage) { return q_full + 8u * uint32_t(1 + stage); };
  auto v_full = [&](int stage) { return q_full + 8u * uint32_t(1 + KV_STAGES + stage); };

  // Block and head indices are below 2^31 (plan() checks the grid): 32-bit divisions do.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k);
  const unsigned q_tiles = (unsigned(seqlen_q) + BLOCK_Q - 1) / BLOCK_Q;
  const BlockTile tile = block_tile(blockIdx.x, q_tiles);
  const int h = int(tile.bh % unsigned(p.heads_q)), b = int(tile.bh / unsigned(p.heads_q));
  const int h_kv = int(unsigned(h) / (unsigned(p.heads_q) / unsigned(p.heads_kv)));  // GQA: kv_head_of(p, h)
  const int q0 = tile.q_tile * BLOCK_Q;
  const int q_rows = min(BLOCK_Q, seqlen_q - q0);  // real query rows in this tile

  // Warpgroup and thread inside it. The shuffle tells the compiler what it cannot see: wg is the same
  // in every lane of a warp, so Q's descriptors can live in uniform registers, as wgmma wants them.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0), t = threadIdx.x % 128;
  const KvTiles kv = kv_tiles_for(q0, q_rows, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0);
  const int kv_tiles = kv.count, masked_tiles = kv.count - kv.unmasked;

  // One arrival per phase (thread 0's arrive.expect_tx); the TMA's bytes complete it. mbarrier.init
  // writes through the generic proxy and the TMA's complete-tx reaches the barrier through the async
  // proxy, so the fence orders the one before the other (the CUDA Programming Guide's TMA example
  // fences here the same way); the block barrier then publishes the barriers to every thread.
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(q_full, 1);
    for (int s = 0; s < KV_STAGES; ++s) {
      sm90::mbarrier_init(k_full(s), 1);
      sm90::mbarrier_init(v_full(s), 1);
    }
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();

  // The copies, issued by thread 0 only. A tile is COL_BLOCKS boxes [rows, 64]; rows past seqlen and
  // columns past head_dim come in as zeros, and count in the bytes the barrier expects all the same.
  auto load_tile = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int rows, int row0, int head) {
#pragma unroll
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      const BoxCoord c = tma_box(cb, row0, head, b);
      sm90::tma_load_4d(dst + box_offset(rows, cb), &map, bar, c.col, c.row, c.head, c.batch);
    }
  };
  // Visit v of the loop reads K/V tile j = kv_tiles - 1 - v, in stage kv_stage(v).
  auto load_kv = [&](int v) {
    const int s = kv_stage(v, KV_STAGES), row0 = (kv_tiles - 1 - v) * BLOCK_KV;
    sm90::mbarrier_arrive_expect_tx(k_full(s), Tr::KV_BYTES);
    load_tile(k_map, k_smem + uint32_t(s * Tr::KV_BYTES), k_full(s), BLOCK_KV, row0, h_kv);
    sm90::mbarrier_arrive_expect_tx(v_full(s), Tr::KV_BYTES);
    load_tile(v_map, v_smem + uint32_t(s * Tr::KV_BYTES), v_full(s), BLOCK_KV, row0, h_kv);
  };

  // ---- load Q
  // Q, then the first KV_STAGES K/V tiles, all in flight at once. A tile whose rows see no key at all
  // (causal, seqlen_q > seqlen_k) loads nothing and writes O = 0, LSE = -inf.
  if (threadIdx.x == 0 && kv_tiles > 0) {
    sm90::mbarrier_arrive_expect_tx(q_full, Tr::Q_BYTES);
    load_tile(q_map, q_smem, q_full, BLOCK_Q, q0, h);
    for (int v = 0; v < prologue_fills(kv_tiles, KV_STAGES); ++v) load_kv(v);
  }

  float o_acc[Tr::O_REGS] = {};  // [64 rows, HEAD_DIM] fp32 of this warpgroup, wgmma_acc layout
  float row_max[2] = {-INFINITY, -INFINITY};  // raw-score max (scale not applied) of rows r = 0, 1
  float row_sum[2] = {0.0f, 0.0f};            // this thread's part of the row sums

  // Descriptors: this warpgroup's 64 rows of Q (rows 64·wg …: 64 rows of 128 bytes into each column
  // block), and stage 0 of K and V; the kernel moves them with advance(). K-major: Q and K; V N-major.
  const uint64_t q_desc = matrix_descriptor(q_smem + uint32_t(wg * ROWS_PER_WARPGROUP) * ROW_BYTES, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t k_desc0 = matrix_descriptor(k_smem, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t v_desc0 = matrix_descriptor(v_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);

  if (kv_tiles > 0) sm90::mbarrier_wait(q_full, 0);

  // One K/V tile: visit v, tile j = kv_tiles - 1 - v. MASKED (a compile-time constant) is true for
  // the first masked_tiles visits only.
  auto process_tile = [&](const int v, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    const int j = kv_tiles - 1 - v, s = kv_stage(v, KV_STAGES);
    const uint32_t parity = kv_parity(v, KV_STAGES);

    // ---- S = Q·Kᵀ
    // QK_K_STEPS wgmma m64nBLOCK_KVk16, each reading 64 rows × 16 head dims of Q and BLOCK_KV keys ×
    // 16 head dims of K from shared memory; the first overwrites s_acc, the others accumulate.
    float s_acc[Tr::S_REGS];  // [64 rows, BLOCK_KV] fp32, wgmma_acc layout
    sm90::mbarrier_wait(k_full(s), parity);
    const uint64_t k_desc = advance(k_desc0, uint32_t(s * Tr::KV_BYTES));
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
      sm90::Wgmma<BLOCK_KV, T>::ss(s_acc, advance(q_desc, k_major_step_offset(BLOCK_Q, ks)),
                                   advance(k_desc, k_major_step_offset(BLOCK_KV, ks)), ks > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_operands(s_acc);

    // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get -inf.
    if constexpr (MASKED) {
      const int kv0 = j * BLOCK_KV;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = int64_t(q0) + wg * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;
        const int last = last_visible_key(row, kv0, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0);
#pragma unroll
        for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            if (wgmma_acc(t, 4 * nt + 2 * r + c).col > last) s_acc[4 * nt + 2 * r + c] = -INFINITY;
      }
    }

    // ---- online softmax
    // As step 07: exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)), one FFMA and one
    // MUFU ex2 per score; each row's 4 threads (lanes 4g … 4g + 3) combine their maxima with shuffles.
    float max_scaled[2], correction[2];
    bool max_grew = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = row_max[r];
#pragma unroll
      for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * nt + 2 * r], s_acc[4 * nt + 2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      // A row that has seen no key yet keeps max -inf and subtracts 0, never -inf - (-inf).
      max_scaled[r] = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
      correction[r] = exp2_approx(row_max[r] * scale_log2 - max_scaled[r]);
      max_grew |= tile_max > row_max[r];
      row_max[r] = tile_max;
    }
    // The O rescale is skipped by a warp none of whose row maxima grew (every correction is 1).
    if (__any_sync(0xffffffffu, max_grew)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_sum[r] *= correction[r];
#pragma unroll
        for (int nt = 0; nt < HEAD_DIM / 8; ++nt) {
          o_acc[4 * nt + 2 * r] *= correction[r];
          o_acc[4 * nt + 2 * r + 1] *= correction[r];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = s_acc[4 * nt + 2 * r + c];
          x = exp2_approx(fmaf(x, scale_log2, -max_scaled[r]));
          row_sum[r] += x;
        }

    // ---- O += P·V
    // P for keys 16·kk … 16·kk + 15 is s_acc[8kk … 8kk + 7] rounded pairwise (traits.h, p_source):
    // exactly wgmma's register-A fragment. PV_K_STEPS wgmma m64nHEAD_DIMk16 then read 16 keys × HEAD_DIM
    // of V each, N-major, from shared memory.
    uint32_t p_frag[Tr::PV_K_STEPS][4];  // [64 rows, BLOCK_KV] fp16/bf16, wgmma_a layout per k16 step
#pragma unroll
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        p_frag[kk][r] = pack2<T>(s_acc[p_source(kk, r)], s_acc[p_source(kk, r) + 1]);
    sm90::mbarrier_wait(v_full(s), parity);
    const uint64_t v_desc = advance(v_desc0, uint32_t(s * Tr::KV_BYTES));
    sm90::fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) sm90::fence_operands(p_frag[kk]);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
      sm90::Wgmma<HEAD_DIM, T>::rs(o_acc, p_frag[kk], advance(v_desc, mn_major_step_offset(kk)));
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_operands(o_acc);

    // Every thread has waited for its warpgroup's wgmma, which read K and V of stage s: after the
    // barrier no one reads the stage, and thread 0 refills it. (wgmma and the TMA both access shared
    // memory through the async proxy, and the wait completed the reads: no proxy fence is needed.)
    __syncthreads();
    if (threadIdx.x == 0 && refills_after(v, kv_tiles, KV_STAGES)) load_kv(v + KV_STAGES);
  };

  for (int v = 0; v < masked_tiles; ++v) process_tile(v, std::true_type{});
  for (int v = masked_tiles; v < kv_tiles; ++v) process_tile(v, std::false_type{});

  // ---- epilogue
  // The row sums over each row's 4 threads; a row that saw no key has sum 0: O = 0, LSE = -inf.
  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv_sum[r] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
    const int row = wg * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;  // inside the tile
    if (lse && t % 4 == 0 && row < q_rows)
      lse[int64_t(tile.bh) * seqlen_q + q0 + row] = sum > 0.0f ? row_max[r] * p.softmax_scale + logf(sum) : -INFINITY;
  }

  // O, normalized and rounded, into this warpgroup's own rows of q_smem, in the layout the TMA reads
  // back (tile_offset): a warp's 4-byte stores cover 8 rows × 16 bytes of 8 different chunks, one
  // wavefront. Those rows were last read by this warpgroup's wgmma, complete since its last wait
  // (whose completion the ISA follows with an implicit generic-async proxy fence), and written by the
  // TMA before the wait on q_full: ordinary stores may overwrite them.
#pragma unroll
  for (int nt = 0; nt < HEAD_DIM / 8; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const frag::Coord c = wgmma_acc(t, 4 * nt + 2 * r);
      *reinterpret_cast<uint32_t*>(smem + Tr::Q_OFFSET + tile_offset(BLOCK_Q, wg * ROWS_PER_WARPGROUP + c.row, c.col)) =
          pack2<T>(o_acc[4 * nt + 2 * r] * inv_sum[r], o_acc[4 * nt + 2 * r + 1] * inv_sum[r]);
    }
  // The TMA store reads q_smem through the async proxy: each thread fences its ordinary stores
  // towards it, then the barrier makes all of them precede thread 0's store.
  sm90::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      const BoxCoord c = tma_box(cb, q0, h, b);  // rows past seqlen_q, columns past head_dim: not written
      sm90::tma_store_4d(&o_map, q_smem + box_offset(BLOCK_Q, cb), c.col, c.row, c.head, c.batch);
    }
    sm90::tma_store_commit();
    // The block's shared memory must outlive the store's reads of it; the writes to global memory
    // complete on their own and are visible when the kernel has finished.
    sm90::tma_store_wait_read();
  }
}

}  // namespace fs::step08
