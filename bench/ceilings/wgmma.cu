// wgmma.mma_async, Hopper's warpgroup tensor-core instruction: the dense fp16/bf16 peak that the
// Hopper steps aim at. Built for sm_90a only (bench/CMakeLists.txt: flash_steps_cuda_arch(... ARCH
// 90a)); the host code launches it only on a GPU of compute capability 9.0.
//
// Each block holds one A tile (64 × 16) and one B tile (256 × 16) in shared memory, filled with
// pseudo-random values, and its two warpgroups each issue wgmma.mma_async.m64n256k16 back to back
// into their own accumulator (64 × 256 fp32, 128 registers per thread), kWgmmaPerGroup per commit
// group, then wait for the group. While one warpgroup waits, the other keeps the tensor cores busy.
// A and B never change: the instruction's throughput does not depend on which tiles it reads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/harness/gpu.h"
#include "instructions.cuh"
#include "kernels.h"
#include "values.cuh"
#include "wgmma_desc.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cu must be built for sm_90a only: flash_steps_cuda_arch(<target> ARCH 90a)"
#endif

namespace fs::ceilings {

constexpr int kM = 64, kN = 256, kK = 16;  // wgmma.m64n256k16
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kWgmmaPerGroup = 8;
constexpr double kWgmmaFlops = 2.0 * kM * kN * kK;
constexpr int kAccumulators = kM * kN / 128;  // fp32 per thread of the warpgroup

// The 128 accumulator registers %0-%127 of one wgmma.m64n256k16 with an fp32 accumulator, and the
// matching "+f" operands: d is read and written by every wgmma (D = A·B + D).
#define FS_WGMMA_D128_REGS \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"

#define FS_WGMMA_D128_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D += A·B, A and B K-major in shared memory (imm-trans-a = imm-trans-b = 0), scale-d = 1,
// imm-scale-a = imm-scale-b = 1.
template <typename T>
__device__ inline void wgmma_m64n256k16(float (&d)[kAccumulators], uint64_t a_desc, uint64_t b_desc);

template <>
__device__ inline void wgmma_m64n256k16<__half>(float (&d)[kAccumulators], uint64_t a_desc, uint64_t b_desc) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " FS_WGMMA_D128_REGS
               ", %128, %129, 1, 1, 1, 0, 0;\n"
               : FS_WGMMA_D128_OPERANDS(d)
               : "l"(a_desc), "l"(b_desc));
}
template <>
__device__ inline void wgmma_m64n256k16<__nv_bfloat16>(float (&d)[kAccumulators], uint64_t a_desc, uint64_t b_desc) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " FS_WGMMA_D128_REGS
               ", %128, %129, 1, 1, 1, 0, 0;\n"
               : FS_WGMMA_D128_OPERANDS(d)
               : "l"(a_desc), "l"(b_desc));
}

// Orders this thread's earlier register accesses before the wgmma that follow (needed before the
// first wgmma, and whenever other instructions touched the accumulator).
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmma issued since the last commit.
__device__ inline void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N groups are pending; after N = 0 the accumulator may be read.
template <int N>
__device__ inline void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

template <typename T>
__device__ inline uint16_t bits_of(float x);
template <>
__device__ inline uint16_t bits_of<__half>(float x) { return __half_as_ushort(__float2half_rn(x)); }
template <>
__device__ inline uint16_t bits_of<__nv_bfloat16>(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) wgmma_peak(int iters, float* sink) {
  // [kM, kK] and [kN, kK] 16-bit elements in the K-major layout of wgmma_desc.h (2 KiB and 8 KiB).
  // The values are arbitrary, so the fill writes them in storage order.
  __shared__ alignas(128) uint16_t a_smem[kmajor_tile_bytes(kM) / 2];
  __shared__ alignas(128) uint16_t b_smem[kmajor_tile_bytes(kN) / 2];
  const uint32_t seed = blockIdx.x * (kM + kN) * kK;
  for (int i = threadIdx.x; i < kM * kK; i += kThreads) a_smem[i] = bits_of<T>(hashed_unit(seed + i));
  for (int i = threadIdx.x; i < kN * kK; i += kThreads) b_smem[i] = bits_of<T>(hashed_unit(seed + kM * kK + i));
  // wgmma reads shared memory through the async proxy: each thread orders its writes before any
  // async-proxy read, then the barrier waits for every thread's.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const uint64_t a_desc = matrix_descriptor(smem_u32(a_smem), kLeadingByteOffset, kStrideByteOffset);
  const uint64_t b_desc = matrix_descriptor(smem_u32(b_smem), kLeadingByteOffset, kStrideByteOffset);
  float d[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) d[j] = 0.0f;
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kWgmmaPerGroup; ++j) wgmma_m64n256k16<T>(d, a_desc, b_desc);
    wgmma_commit_group();
    wgmma_wait_group<0>();
  }
  float sum = 0;
  for (int j = 0; j < kAccumulators; ++j) sum += d[j];
  if (isnan(sum)) *sink = sum;
}

template <typename T>
void launch_wgmma(int blocks, int iters, float* sink, cudaStream_t stream) {
  wgmma_peak<T><<<blocks, kThreads, 0, stream>>>(iters, sink);
  CHECK_LAUNCH();
}

LoopKernel wgmma_kernel(bool bf16) {
  LoopKernel k;
  k.function = bf16 ? reinterpret_cast<const void*>(wgmma_peak<__nv_bfloat16>)
                    : reinterpret_cast<const void*>(wgmma_peak<__half>);
  k.threads = kThreads;
  k.work_per_block_iteration = kWarpgroups * kWgmmaPerGroup * kWgmmaFlops;
  k.shape = "2 warpgroups/block, each 8 wgmma m64n256k16 per commit group into one accumulator";
  k.launch = bf16 ? launch_wgmma<__nv_bfloat16> : launch_wgmma<__half>;
  return k;
}

}  // namespace fs::ceilings
