// Step 09 — Hopper II: warp specialization, ping-pong and intra-warpgroup overlap. The schedule
// FlashAttention-3 published, one idea per lettered sub-step (09a … 09f) so that the ladder measures
// what each buys.
//
// Extends step 08 (TMA + mbarrier + wgmma, two warpgroups that each load, multiply and exponentiate,
// a block barrier at the end of every K/V tile). Step 08 measured where that stops (notes/08): the
// tensor pipe busy 54 % of the time and 36 % of the warp cycles spent at the block barrier, because
// both warpgroups run their softmax at the same time while the tensor cores wait, then both wait for
// their products. The kernel is templated on Traits<HEAD_DIM, BLOCK_KV, KV_STAGES, CONSUMERS, IDEAS>
// (traits.h). 09a is the kernel itself.
// From 09b: `Tr::has(kPingPong)` marks where 09b changes it.
// From 09c: softmax_under_pv(Tr::IDEAS, …) marks the wait that 09c splits.
// From 09d: 09d and 09e change only the tile table (choose_config).
// From 09f: `Tr::has(kPersistent)` marks the grid that 09f makes persistent.
//
//   09a kWarpSpecialization  warpgroup 0 is a producer: one thread issues every TMA copy, in the order
//                            the consumers need them, and the warpgroup gives its registers away
//                            (setmaxnreg.dec to 24); warpgroups 1 … CONSUMERS (two) are consumers of
//                            64 query rows each and take them (setmaxnreg.inc to 240). Each K and V
//                            stage has a full barrier (the TMA's bytes) and an empty barrier (one
//                            arrival per consumer warp once its wgmma reading the stage has
//                            completed): no block barrier in the loop, so neither consumer waits for
//                            the other. The loop is made of turns: turn k issues S(k) = Q·K(k)ᵀ and
//                            O += P(k-1)·V(k-1) back to back.
//   09b kPingPong            the consumers take turns: named barriers (bar.sync / bar.arrive) let a
//                            consumer issue its products only after the one before it in the rotation
//                            (0, 1, …, 0, …) has issued its own, so their products reach the tensor
//                            cores one consumer at a time and one consumer's softmax runs under
//                            another's products.
//   09c kIntraOverlap        inside a turn, S(k) is committed first and waited for alone
//                            (wgmma.wait_group 1): the softmax of tile k runs while P·V of tile k - 1 is
//                            still in the tensor cores; wait_group 0 comes only before the O rescale.
//   09d kTileSizes           the larger register budget buys wider K/V tiles: 128 × 176 at head_dim 128,
//                            112 and 80 keys at 192 and 256 (FlashAttention-3's tiles there), 128 × 192 at
//                            64, 128 keys with causal masking at 64 and 128; fewer turns per query tile.
//   09e kThreeConsumers      at head_dim 64 a third consumer warpgroup: 192 query rows a block (as
//                            FlashAttention-3 there), 512 threads, 160 registers a consumer thread, so
//                            tiles of 128 keys; three softmaxes take turns under the tensor cores' work.
//   09f kPersistent          without causal masking the grid is at most one block per SM, and the
//                            blocks take the tiles in rounds (persistent_position): the rings and
//                            the Q barriers run on from tile to tile, so the producer loads the next
//                            tile's K(0) while the consumers finish the last turns, and its Q as soon
//                            as they have stored O from q_smem (q_empty); no block is launched, no
//                            barrier initialized and no register reallocated per tile.
//
// One turn of a consumer (kv_stage / kv_parity / release_parity, traits.h, give every phase):
//
//     wait K(k) full, V(k-1) full                 mbarrier.try_wait.parity
// From 09b: bar.sync turn_barrier(c)              my turn
//     S(k) = Q·K(k)ᵀ          wgmma ss, commit    in flight
//     O += P(k-1)·V(k-1)      wgmma rs, commit    in flight
// From 09b: bar.arrive turn_barrier(next)         the next consumer's turn
// Before 09c:     wgmma.wait_group 0      S(k) and P·V(k-1) done; release V(k-1): mbarrier.arrive v_empty
// From 09c: wgmma.wait_group 1            S(k) done
//     mask, row max, exp2, row sums of S(k)
// From 09c: (P·V(k-1) still running under the softmax)
//     release K(k)            mbarrier.arrive k_empty
// From 09c: wgmma.wait_group 0            P·V(k-1) done; release V(k-1): mbarrier.arrive v_empty
//     O rescale, P(k) = S(k) rounded to fp16/bf16
//
// and of the producer thread, copy after copy (kv_load): wait for the stage's release (empty
// barrier), announce the bytes (arrive.expect_tx on the full barrier), issue the TMA copy.
//
// Expected: the tensor cores busy while a softmax runs, most of step 08's barrier stall gone.
// notes/09_warp_specialized.md measures each sub-step against the one before it in one run on the
// H200, and sets FlashAttention-3's published ablation beside those figures.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: nothing here calls the driver)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/step/dtype.cuh"
#include "steps/09_warp_specialized/traits.h"

namespace fs::step09 {

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
// One plain arrival (release semantics at CTA scope, the default): a consumer warp's release of a
// stage, made by lane 0 after the warp's wgmma reading the stage has completed; a consumer's release
// of q_smem (q_empty); the producer's q_full arrival for a tile that loads no Q.
__device__ inline void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
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

// Named barriers (bar.sync / bar.arrive with an id and a thread count, a multiple of 32): bar.sync
// counts this warp's arrival and waits until `threads` threads have arrived; bar.arrive counts it
// and goes on. The barrier then resets for its next use. Every thread of a warp executes them.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg: every warp of a warpgroup sets its per-thread register count to REGISTERS, giving
// registers back to the block's pool (dec) or taking them from it (inc, which waits until the pool
// has them). It needs a register cap at launch (__launch_bounds__(threads, 1)); without one ptxas
// ignores it with warning C7508.
template <int REGISTERS>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

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
#define FS_WGMMA_REGS_40 FS_WGMMA_REGS_32 ", " FS_WGMMA_D32
#define FS_WGMMA_REGS_48 FS_WGMMA_REGS_32 ", " FS_WGMMA_D32 ", " FS_WGMMA_D40
#define FS_WGMMA_REGS_56 FS_WGMMA_REGS_48 ", " FS_WGMMA_D48
#define FS_WGMMA_REGS_64 FS_WGMMA_REGS_48 ", " FS_WGMMA_D48 ", " FS_WGMMA_D56
#define FS_WGMMA_REGS_88 FS_WGMMA_REGS_64 ", " FS_WGMMA_D64 ", " FS_WGMMA_D72 ", " FS_WGMMA_D80
#define FS_WGMMA_REGS_96 FS_WGMMA_REGS_64 ", " FS_WGMMA_D64 ", " FS_WGMMA_D72 ", " FS_WGMMA_D80 ", " FS_WGMMA_D88
#define FS_WGMMA_REGS_128 FS_WGMMA_REGS_96 ", " FS_WGMMA_D96 ", " FS_WGMMA_D104 ", " FS_WGMMA_D112 ", " FS_WGMMA_D120

#define FS_WGMMA_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define FS_WGMMA_ACC_32(d) FS_WGMMA_ACC8(d, 0), FS_WGMMA_ACC8(d, 8), FS_WGMMA_ACC8(d, 16), FS_WGMMA_ACC8(d, 24)
#define FS_WGMMA_ACC_40(d) FS_WGMMA_ACC_32(d), FS_WGMMA_ACC8(d, 32)
#define FS_WGMMA_ACC_48(d) FS_WGMMA_ACC_32(d), FS_WGMMA_ACC8(d, 32), FS_WGMMA_ACC8(d, 40)
#define FS_WGMMA_ACC_56(d) FS_WGMMA_ACC_48(d), FS_WGMMA_ACC8(d, 48)
#define FS_WGMMA_ACC_64(d) FS_WGMMA_ACC_48(d), FS_WGMMA_ACC8(d, 48), FS_WGMMA_ACC8(d, 56)
#define FS_WGMMA_ACC_88(d) FS_WGMMA_ACC_64(d), FS_WGMMA_ACC8(d, 64), FS_WGMMA_ACC8(d, 72), FS_WGMMA_ACC8(d, 80)
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

// N: BLOCK_KV (64, 80, 96, 112, 128, 176, 192) for S = Q·Kᵀ, HEAD_DIM (64, 128, 192, 256) for O += P·V.
#define FS_WGMMA_TYPES(N, REGS, ACC, IN0, IN1, IN2, IN3, IN4)            \
  FS_WGMMA(N, __half, "f16", REGS, ACC, IN0, IN1, IN2, IN3, IN4)          \
  FS_WGMMA(N, __nv_bfloat16, "bf16", REGS, ACC, IN0, IN1, IN2, IN3, IN4)
FS_WGMMA_TYPES(64, FS_WGMMA_REGS_32, FS_WGMMA_ACC_32, "%32", "%33", "%34", "%35", "%36")
FS_WGMMA_TYPES(80, FS_WGMMA_REGS_40, FS_WGMMA_ACC_40, "%40", "%41", "%42", "%43", "%44")
FS_WGMMA_TYPES(96, FS_WGMMA_REGS_48, FS_WGMMA_ACC_48, "%48", "%49", "%50", "%51", "%52")
FS_WGMMA_TYPES(112, FS_WGMMA_REGS_56, FS_WGMMA_ACC_56, "%56", "%57", "%58", "%59", "%60")
FS_WGMMA_TYPES(128, FS_WGMMA_REGS_64, FS_WGMMA_ACC_64, "%64", "%65", "%66", "%67", "%68")
FS_WGMMA_TYPES(176, FS_WGMMA_REGS_88, FS_WGMMA_ACC_88, "%88", "%89", "%90", "%91", "%92")
FS_WGMMA_TYPES(192, FS_WGMMA_REGS_96, FS_WGMMA_ACC_96, "%96", "%97", "%98", "%99", "%100")
FS_WGMMA_TYPES(256, FS_WGMMA_REGS_128, FS_WGMMA_ACC_128, "%128", "%129", "%130", "%131", "%132")

}  // namespace sm90

// One block = BLOCK_Q = 64 · CONSUMERS query rows of one (batch, head), 128 · (1 + CONSUMERS) threads:
// warpgroup 0 the producer, warpgroups 1 … CONSUMERS the consumers; consumer c = warpgroup - 1 owns
// rows 64·c … 64·c + 63. In thread t of a consumer, row state r (0, 1) belongs to the row
// wgmma_acc(t, 2r).row of its 64: rows g and g + 8 of its warp's 16 (g = lane / 4).
// __launch_bounds__(NUM_THREADS, 1) caps the registers at launch (168 a thread with two consumers,
// 128 with three), which setmaxnreg needs.
template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::NUM_THREADS, 1)
    warp_specialized_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                            const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                            float* __restrict__ lse, const Problem p, const float scale_log2) {
  constexpr int HEAD_DIM = Tr::HEAD_DIM, BLOCK_KV = Tr::BLOCK_KV, KV_STAGES = Tr::KV_STAGES;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, CONSUMERS = Tr::CONSUMERS;

  // The swizzle repeats every 1024 bytes from an aligned address, and TMA and wgmma both assume
  // tiles that start on it: round the base up (SMEM_BYTES includes the 1024 bytes of slack).
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw);
  const uint32_t base = (raw + SWIZZLE_ATOM - 1) & ~(SWIZZLE_ATOM - 1);
  unsigned char* const smem = smem_raw + (base - raw);
  const uint32_t q_smem = base + Tr::Q_OFFSET;  // [BLOCK_Q, HEAD_DIM] as COL_BLOCKS boxes [BLOCK_Q, 64], swizzled; O at the end
  const uint32_t k_smem = base + Tr::K_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  const uint32_t v_smem = base + Tr::V_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  // mbarriers, 8 bytes each (barrier_offset): Q's two, then KV_STAGES of each: K full, V full, K empty, V empty.
  const uint32_t barriers = base + Tr::BARRIER_OFFSET;
  const uint32_t q_full = barriers + barrier_offset(kQFull, 0, KV_STAGES);
  const uint32_t q_empty = barriers + barrier_offset(kQEmpty, 0, KV_STAGES);
  auto k_full = [&](int stage) { return barriers + barrier_offset(kKFull, stage, KV_STAGES); };
  auto v_full = [&](int stage) { return barriers + barrier_offset(kVFull, stage, KV_STAGES); };
  auto k_empty = [&](int stage) { return barriers + barrier_offset(kKEmpty, stage, KV_STAGES); };
  auto v_empty = [&](int stage) { return barriers + barrier_offset(kVEmpty, stage, KV_STAGES); };

  // Tile and head indices are below 2^31 (plan() checks the tiles): 32-bit divisions do.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k);
  const unsigned q_tiles = (unsigned(seqlen_q) + BLOCK_Q - 1) / BLOCK_Q;
  const unsigned heads = unsigned(p.batch * p.heads_q), num_tiles = q_tiles * heads;
  // The tiles of this block, by round n.
  // Before 09f: tile blockIdx.x alone.
  // From 09f: the persistent schedule's position (persistent_position; a position past the last tile
  // ends the loop). With causal masking 09f's plan launches 09e's instantiation, one block per tile.
  const bool causal = p.causal != 0;
  auto position = [&](const unsigned n) {
    return Tr::has(kPersistent) ? persistent_position(n, blockIdx.x, gridDim.x) : (n == 0 ? blockIdx.x : num_tiles);
  };
  struct Work {
    uint32_t bh;
    int h, b, h_kv, q0, q_rows, kv_tiles, masked_tiles;
  };
  auto work_of = [&](const unsigned w) {
    const BlockTile tile = block_tile(w, q_tiles);
    Work x;
    x.bh = tile.bh;
    x.h = int(tile.bh % unsigned(p.heads_q)), x.b = int(tile.bh / unsigned(p.heads_q));
    x.h_kv = int(unsigned(x.h) / (unsigned(p.heads_q) / unsigned(p.heads_kv)));  // GQA: kv_head_of(p, h)
    x.q0 = tile.q_tile * BLOCK_Q;
    x.q_rows = min(BLOCK_Q, seqlen_q - x.q0);  // real query rows in this tile
    const KvTiles kv = kv_tiles_for(x.q0, x.q_rows, BLOCK_KV, seqlen_q, seqlen_k, causal);
    x.kv_tiles = kv.count, x.masked_tiles = kv.count - kv.unmasked;
    return x;
  };

  // Full barriers: one arrival per phase (the producer's arrive.expect_tx), completed by the TMA's
  // bytes. Empty barriers: one arrival per consumer warp. mbarrier.init writes through the generic
  // proxy and the TMA's complete-tx reaches the barrier through the async proxy, so the fence orders
  // the one before the other; the block barrier then publishes the barriers to every thread. It is
  // the kernel's only block-wide barrier.
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(q_full, 1);
    sm90::mbarrier_init(q_empty, CONSUMERS);
    for (int s = 0; s < KV_STAGES; ++s) {
      sm90::mbarrier_init(k_full(s), 1);
      sm90::mbarrier_init(v_full(s), 1);
      sm90::mbarrier_init(k_empty(s), Tr::NUM_CONSUMER_WARPS);
      sm90::mbarrier_init(v_empty(s), Tr::NUM_CONSUMER_WARPS);
    }
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();

  // The warpgroup, the same in every lane of a warp: the shuffle lets the compiler see that, so the
  // branch below is uniform and Q's descriptors can live in uniform registers, as wgmma wants them.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);

  // Each role is one branch of this if/else, the same in the 4 warps of a warpgroup: setmaxnreg must be
  // executed by every warp of the warpgroup (PTX ISA), and each branch starts with its own.
  if (wg == PRODUCER_WARPGROUP) {
    // ======== producer ===========================================================================
    // The whole warpgroup gives its registers back (every warp must execute setmaxnreg); then one
    // thread issues every copy, and the other 127 are done.
    sm90::setmaxnreg_dec<PRODUCER_REGISTERS>();
    if (threadIdx.x == 0) {
      int visits = 0;  // K/V visits of this block's earlier tiles: where the rings stand
      for (unsigned n = 0, w = position(0); w < num_tiles; w = position(++n)) {
        const Work x = work_of(w);
        // A tile is COL_BLOCKS boxes [rows, 64]; rows past seqlen and columns past head_dim come in as
        // zeros, and count in the bytes the barrier expects all the same.
        auto load_tile = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int rows, int row0, int head) {
#pragma unroll
          for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
            const BoxCoord c = tma_box(cb, row0, head, x.b);
            sm90::tma_load_4d(dst + box_offset(rows, cb), &map, bar, c.col, c.row, c.head, c.batch);
          }
        };
        // ---- load Q, once the consumers have stored the previous tile's O from q_smem. A tile whose
        // rows see no key at all (causal, seqlen_q > seqlen_k) loads nothing, and its phase of
        // q_full completes on the arrival alone.
        auto load_q = [&] {
          if (n > 0) sm90::mbarrier_wait(q_empty, (n - 1) & 1u);
          if (x.kv_tiles > 0) {
            sm90::mbarrier_arrive_expect_tx(q_full, Tr::Q_BYTES);
            load_tile(q_map, q_smem, q_full, BLOCK_Q, x.q0, x.h);
          } else {
            sm90::mbarrier_arrive(q_full);
          }
        };

        // ---- load K and V, in the order the consumers' turns need them (kv_load): K0, K1 V0, K2 V1, …,
        // Q among them at q_load_position. Visit t reads tile count - 1 - t from its stage
        // (visits + t) % KV_STAGES; a stage's fill n ≥ 1 waits until every consumer warp has released
        // fill n - 1.
        const int q_at = q_load_position(Tr::IDEAS, x.kv_tiles, n);
        for (int i = 0; i <= 2 * x.kv_tiles; ++i) {
          if (i == q_at) {
            load_q();
            continue;
          }
          const KvLoad l = kv_load(i - (i > q_at), x.kv_tiles);
          const int visit = visits + l.visit, s = kv_stage(visit, KV_STAGES);
          const uint32_t full = l.v ? v_full(s) : k_full(s), empty = l.v ? v_empty(s) : k_empty(s);
          if (waits_for_release(visit, KV_STAGES)) sm90::mbarrier_wait(empty, release_parity(visit, KV_STAGES));
          sm90::mbarrier_arrive_expect_tx(full, Tr::KV_BYTES);
          load_tile(l.v ? v_map : k_map, (l.v ? v_smem : k_smem) + uint32_t(s * Tr::KV_BYTES), full, BLOCK_KV,
                    (x.kv_tiles - 1 - l.visit) * BLOCK_KV, x.h_kv);
        }
        visits += x.kv_tiles;
      }
    }
  } else {
    // ======== consumers ==========================================================================
    sm90::setmaxnreg_inc<Tr::CONSUMER_REGISTERS>();
    const int c = consumer_of(wg), t = threadIdx.x % 128, lane = threadIdx.x % 32;

    // Descriptors: this consumer's 64 rows of Q (rows 64·c …: 64 rows of 128 bytes into each column
    // block), and stage 0 of K and V; the kernel moves them with advance(). K-major: Q and K; V N-major.
    const uint64_t q_desc = matrix_descriptor(q_smem + uint32_t(c * ROWS_PER_WARPGROUP) * ROW_BYTES, K_MAJOR_LBO, SBO_8_ROWS);
    const uint64_t k_desc0 = matrix_descriptor(k_smem, K_MAJOR_LBO, SBO_8_ROWS);
    const uint64_t v_desc0 = matrix_descriptor(v_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);

    // A warp releases a stage once its own wgmma that read it has completed: one arrival, by lane 0.
    // `after` is always true; a release given the row sums as `after` depends on every exponential of
    // the softmax, which keeps ptxas from moving the wait for P·V above them (without it, ptxas put
    // that wait after the first 16 of the 90 MUFU.EX2 of a turn at HEAD_DIM 128, BLOCK_KV 176, and
    // the softmax no longer ran under P·V; with it, all 90 come first).
    auto release = [&](uint32_t empty, bool after) {
      if (lane == 0 && after) sm90::mbarrier_arrive(empty);
    };

    int visits = 0;  // K/V visits of this block's earlier tiles, as the producer counts them
    for (unsigned n = 0, w = position(0); w < num_tiles; w = position(++n)) {
      const Work x = work_of(w);
      float o_acc[Tr::O_REGS] = {};  // [64 rows, HEAD_DIM] fp32 of this consumer, wgmma_acc layout
      float s_acc[Tr::S_REGS];       // [64 rows, BLOCK_KV] fp32: S(k), then P(k) before rounding
      uint32_t p_frag[Tr::PV_K_STEPS][4];  // [64 rows, BLOCK_KV] fp16/bf16: P(k-1), wgmma_a layout per k16 step
      float row_max[2] = {-INFINITY, -INFINITY};  // raw-score max (scale not applied) of rows r = 0, 1
      float row_sum[2] = {0.0f, 0.0f};            // this thread's part of the row sums

      // Turn k (traits.h, "the turns of a consumer"): S(k) if HAS_S, P·V(k-1) if HAS_PV, the softmax of
      // S(k). MASKED (a compile-time constant) is true for the first masked_tiles visits only.
      auto turn = [&](const int k, auto has_s, auto has_pv, auto masked) {
        constexpr bool HAS_S = decltype(has_s)::value, HAS_PV = decltype(has_pv)::value;
        constexpr bool MASKED = decltype(masked)::value;
        constexpr bool SOFTMAX_UNDER_PV = softmax_under_pv(Tr::IDEAS, HAS_S, HAS_PV);
        const int ks_stage = kv_stage(visits + k, KV_STAGES), pv_stage = kv_stage(visits + k + KV_STAGES - 1, KV_STAGES);

        // ---- wait for K(k) and V(k-1), then (ping-pong) for this consumer's turn
        if constexpr (HAS_S) sm90::mbarrier_wait(k_full(ks_stage), kv_parity(visits + k, KV_STAGES));
        if constexpr (HAS_PV) sm90::mbarrier_wait(v_full(pv_stage), kv_parity(visits + k - 1, KV_STAGES));
        if constexpr (Tr::has(kPingPong)) sm90::named_barrier_sync(turn_barrier(c), TURN_BARRIER_THREADS);

        // ---- S = Q·Kᵀ, then O += P·V: both issued, neither waited for yet
        // S(k): QK_K_STEPS wgmma m64nBLOCK_KVk16, each reading 64 rows × 16 head dims of Q and BLOCK_KV
        // keys × 16 head dims of K from shared memory; the first overwrites s_acc, the others accumulate.
        // P·V(k-1): PV_K_STEPS wgmma m64nHEAD_DIMk16, A = P(k-1) from registers (p_frag), B = 16 keys ×
        // HEAD_DIM of V, N-major. One commit group each, S first.
        if constexpr (HAS_PV) {  // the O rescale and P's rounding stay above wgmma.fence
          sm90::fence_operands(o_acc);
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) sm90::fence_operands(p_frag[kk]);
        }
        sm90::wgmma_fence();
        if constexpr (HAS_S) {
          const uint64_t k_desc = advance(k_desc0, uint32_t(ks_stage * Tr::KV_BYTES));
#pragma unroll
          for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
            sm90::Wgmma<BLOCK_KV, T>::ss(s_acc, advance(q_desc, k_major_step_offset(BLOCK_Q, ks)),
                                         advance(k_desc, k_major_step_offset(BLOCK_KV, ks)), ks > 0);
          sm90::wgmma_commit();
        }
        if constexpr (HAS_PV) {
          const uint64_t v_desc = advance(v_desc0, uint32_t(pv_stage * Tr::KV_BYTES));
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
            sm90::Wgmma<HEAD_DIM, T>::rs(o_acc, p_frag[kk], advance(v_desc, mn_major_step_offset(kk)));
          sm90::wgmma_commit();
        }
        // Ping-pong: the products are in the tensor cores' queue; the next consumer may issue its own.
        if constexpr (Tr::has(kPingPong))
          if (hands_over_after(c, k, x.kv_tiles, CONSUMERS))
            sm90::named_barrier_arrive(turn_barrier(next_consumer(c, CONSUMERS)), TURN_BARRIER_THREADS);

        // ---- wait for S(k) (and, unless the softmax runs under it, for P·V(k-1) too)
        sm90::wgmma_wait<SOFTMAX_UNDER_PV ? 1 : 0>();
        sm90::fence_operands(s_acc);
        if constexpr (HAS_PV && !SOFTMAX_UNDER_PV) release(v_empty(pv_stage), true);

        float correction[2];
        bool max_grew = false;
        if constexpr (HAS_S) {
          // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get -inf.
          // Column of register i = this thread's first column + acc_col_offset(i), a constant.
          if constexpr (MASKED) {
            const int kv0 = (x.kv_tiles - 1 - k) * BLOCK_KV;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int64_t row = int64_t(x.q0) + c * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;
              const int last = last_visible_key(row, kv0, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0) -
                               wgmma_acc(t, 0).col;
#pragma unroll
              for (int i = 2 * r; i < Tr::S_REGS; i += 4)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                  if (acc_col_offset(i + e) > last) s_acc[i + e] = -INFINITY;
            }
          }

          // ---- online softmax
          // As step 08: exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)), one FFMA and one
          // MUFU ex2 per score; each row's 4 threads (lanes 4g … 4g + 3) combine their maxima with
          // shuffles. Only s_acc and the row state are touched here: with the overlap, P·V(k-1) is still
          // reading p_frag and writing o_acc.
          float max_scaled[2];
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
            row_sum[r] *= correction[r];
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float& score = s_acc[4 * nt + 2 * r + e];
                score = exp2_approx(fmaf(score, scale_log2, -max_scaled[r]));
                row_sum[r] += score;
              }
          // The exponentials stay above the wait below: the compiler may not sink them past the fence,
          // and ptxas may not hoist the wait above the release, which needs them (a row sum is never
          // negative, and NaN < 0 is false, so the release always happens).
          sm90::fence_operands(s_acc);
          release(k_empty(ks_stage), !(row_sum[0] + row_sum[1] < 0.0f));
        }

        // ---- wait for P·V(k-1), then rescale O and round P(k)
        if constexpr (SOFTMAX_UNDER_PV) {
          sm90::wgmma_wait<0>();
          sm90::fence_operands(s_acc);
          release(v_empty(pv_stage), true);
        }
        sm90::fence_operands(o_acc);
        if constexpr (HAS_S) {
          // The O rescale is skipped by a warp none of whose row maxima grew (every correction is 1).
          if (__any_sync(0xffffffffu, max_grew)) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int nt = 0; nt < HEAD_DIM / 8; ++nt) {
                o_acc[4 * nt + 2 * r] *= correction[r];
                o_acc[4 * nt + 2 * r + 1] *= correction[r];
              }
          }
          // P for keys 16·kk … 16·kk + 15 is s_acc[8kk … 8kk + 7] rounded pairwise (traits.h, p_source):
          // exactly wgmma's register-A fragment, for P·V(k) in the next turn.
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              p_frag[kk][r] = pack2<T>(s_acc[p_source(kk, r)], s_acc[p_source(kk, r) + 1]);
        }
      };

      sm90::mbarrier_wait(q_full, n & 1u);  // Q has landed, or (no key to see) there is none
      if (x.kv_tiles > 0) {
        if constexpr (Tr::has(kPingPong))
          if (grants_first_turn(c, CONSUMERS))
            sm90::named_barrier_arrive(turn_barrier(next_consumer(c, CONSUMERS)), TURN_BARRIER_THREADS);
        // Turn 0 (S only), turns 1 … count - 1 (both; the masked visits first), turn count (P·V only).
        if (x.masked_tiles > 0)
          turn(0, std::true_type{}, std::false_type{}, std::true_type{});
        else
          turn(0, std::true_type{}, std::false_type{}, std::false_type{});
        for (int k = 1; k < x.masked_tiles; ++k) turn(k, std::true_type{}, std::true_type{}, std::true_type{});
        for (int k = max(x.masked_tiles, 1); k < x.kv_tiles; ++k)
          turn(k, std::true_type{}, std::true_type{}, std::false_type{});
        turn(x.kv_tiles, std::false_type{}, std::true_type{}, std::false_type{});
      }

      // ---- epilogue
      // The row sums over each row's 4 threads; a row that saw no key has sum 0: O = 0, LSE = -inf.
      float inv_sum[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        inv_sum[r] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
        const int row = c * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;  // inside the tile
        if (lse && t % 4 == 0 && row < x.q_rows)
          lse[int64_t(x.bh) * seqlen_q + x.q0 + row] = sum > 0.0f ? row_max[r] * p.softmax_scale + logf(sum) : -INFINITY;
      }

      // O, normalized and rounded, into this consumer's own rows of q_smem, in the layout the TMA reads
      // back (tile_offset): a warp's 4-byte stores cover 8 rows × 16 bytes of 8 different chunks, one
      // wavefront. Those rows were last read by this consumer's wgmma, complete since its last wait
      // (whose completion the ISA follows with an implicit generic-async proxy fence), and written by
      // the TMA before the wait on q_full: ordinary stores may overwrite them. The other consumers
      // read only their own rows.
#pragma unroll
      for (int nt = 0; nt < HEAD_DIM / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const frag::Coord e = wgmma_acc(t, 4 * nt + 2 * r);
          *reinterpret_cast<uint32_t*>(smem + Tr::Q_OFFSET + tile_offset(BLOCK_Q, c * ROWS_PER_WARPGROUP + e.row, e.col)) =
              pack2<T>(o_acc[4 * nt + 2 * r] * inv_sum[r], o_acc[4 * nt + 2 * r + 1] * inv_sum[r]);
        }
      // The TMA store reads them through the async proxy: each thread fences its ordinary stores
      // towards it, then the consumer's own named barrier (its 128 threads, not the block) makes all
      // of them precede the store its first thread issues.
      sm90::fence_proxy_async_shared();
      sm90::named_barrier_sync(epilogue_barrier(c, CONSUMERS), EPILOGUE_BARRIER_THREADS);
      // A consumer whose rows all lie past seqlen_q (a short last query tile) stores nothing.
      if (t == 0 && c * ROWS_PER_WARPGROUP < x.q_rows) {
#pragma unroll
        for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
          const BoxCoord e = tma_box(cb, x.q0 + c * ROWS_PER_WARPGROUP, x.h, x.b);  // past seqlen_q, head_dim: not written
          sm90::tma_store_4d(&o_map, q_smem + o_box_offset(c, cb, BLOCK_Q), e.col, e.row, e.head, e.batch);
        }
        sm90::tma_store_commit();
        // The block's shared memory must outlive the store's reads of it; the writes to global memory
        // complete on their own and are visible when the kernel has finished.
        sm90::tma_store_wait_read();
      }
      // q_smem is free again.
      // From 09f: the next tile's Q is loaded into it.
      if (t == 0) sm90::mbarrier_arrive(q_empty);
      visits += x.kv_tiles;
    }
  }
}

}  // namespace fs::step09
