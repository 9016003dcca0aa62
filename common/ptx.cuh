// Thin wrappers over the PTX instructions that steps 05 and 06 teach (cp.async in
// steps/05_cp_async, ldmatrix and mma.sync in steps/06_ldmatrix_mma, where each is written out and
// explained), for the steps after them. Each says which lane holds what; the same maps are the
// constexpr functions of common/fragment_layout.h (named below), tested on the CPU against the PTX
// ISA's tables by tests/test_fragment_layout.cpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fs::ptx {

// The 32-bit shared-memory address that cp.async and ldmatrix take.
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ---- cp.async (sm_80+): global -> shared without passing through registers --------------------
// Copies 16 bytes; with src_bytes < 16 only that many are read and the rest of the 16 are zero-filled
// (src_bytes = 0: nothing is read, the 16 bytes become zero — the predicated tail). `.cg` caches in
// L2 only. `gmem` must be a valid address even when src_bytes is 0: pass the tensor's base.
__device__ inline void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
// Closes the group of cp.async issued since the last commit.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N groups are still in flight (N = 0: all of them). Each thread waits for its
// own copies only: a __syncthreads() must follow before other threads read the data.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix: 8×8 matrices of 16-bit elements from shared memory into the mma fragment layout --
// Lane 8·m + r gives the 16-byte-aligned address of row r of matrix m (frag::ldmatrix_address_lane);
// .x4 reads the addresses of all 32 lanes, .x2 of lanes 0-15, .x1 of lanes 0-7. After the
// instruction, register r[m] of lane l holds row l/4, elements 2·(l%4) (low half) and 2·(l%4)+1
// (high half) of matrix m. .trans delivers the transpose: r[m] of lane l holds column l/4, rows
// 2·(l%4) and 2·(l%4)+1 of the stored matrix m (used for V, whose rows are keys). Both cases are
// frag::ldmatrix_element(lane, half, trans). The lane addresses that build whole mma operands are
// frag::ldmatrix_x4_a (A, 16×16), frag::ldmatrix_x2_b (B stored [n][k]) and frag::ldmatrix_x4_trans_b
// (two B fragments, stored [k][n]). In a tile whose rows are 128 or 256 bytes, the 8 rows of a
// matrix are one shared-memory phase: use Swizzled128Layout (or padding) to keep it to 1 wavefront.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(smem)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(smem)));
}

// ---- mma.sync.aligned.m16n8k16, fp32 accumulate in place: d += a · b ----------------------------
// A (16×16, row) in 4 registers of 2 elements: lane l holds rows l/4 and l/4+8, columns
// 2·(l%4)+{0,1} and 2·(l%4)+8+{0,1}: a[0] = (row l/4, cols 0-7 part), a[1] = (row l/4+8, cols 0-7),
// a[2] = (row l/4, cols 8-15), a[3] = (row l/4+8, cols 8-15)            (frag::mma_a(lane, reg, half)).
// B (16×8, col) in 2 registers: b[0] = rows 2·(l%4)+{0,1} of column l/4, b[1] = the same rows + 8
//                                                                        (frag::mma_b(lane, reg, half)).
// C/D (16×8) in 4 floats: d[0], d[1] = row l/4, columns 2·(l%4)+{0,1}; d[2], d[3] = row l/4+8
//                                                                        (frag::mma_c(lane, i)).
// The C/D pairs of two neighbouring n8 tiles are exactly the A registers of a 16×16 tile
// (frag::mma_a_reg_of_c): an S accumulator becomes P's A fragment with pack2, no shuffle.
template <typename T>
__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ inline void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> one 32-bit register of two fp16/bf16 (lo in the low half), round to nearest.
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

// 2^x on the MUFU unit (ex2.approx: relative error about 2^-22; 2^-inf = 0).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fs::ptx
