// The shared-memory matrix descriptor of wgmma.mma_async and the one operand layout the wgmma
// ceiling uses, as constexpr functions: the kernel (wgmma.cu) builds its descriptors with them, and
// tests/test_ceilings.cpp checks them on the CPU against the PTX ISA's own examples.
//
// PTX ISA, "Matrix Descriptor Format" (asynchronous warpgroup-level matrix instructions): a 64-bit
// value,
//     bits  0-13  encode(matrix start address)
//     bits 16-29  encode(leading dimension byte offset)
//     bits 32-45  encode(stride dimension byte offset)
//     bits 49-51  matrix base offset (used by the swizzled modes only; 0 here)
//     bits 62-63  swizzle mode: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
// with encode(x) = (x & 0x3FFFF) >> 4: byte values in units of 16 bytes, shared addresses below 256 KiB.
#pragma once

#include <cstdint>

#include "common/forward/rules.h"  // FS_HD

namespace fs::ceilings {

FS_HD constexpr uint64_t descriptor_encode(uint32_t bytes) { return (bytes & 0x3FFFFu) >> 4; }

FS_HD constexpr uint64_t matrix_descriptor(uint32_t start_address, uint32_t leading_byte_offset,
                                           uint32_t stride_byte_offset, uint32_t base_offset = 0,
                                           uint32_t swizzle_mode = 0) {
  return descriptor_encode(start_address) | descriptor_encode(leading_byte_offset) << 16 |
         descriptor_encode(stride_byte_offset) << 32 | uint64_t(base_offset & 0x7u) << 49 |
         uint64_t(swizzle_mode & 0x3u) << 62;
}

// The operand layout of the ceiling: K-major, no swizzle, 16-bit elements, one k16 slice (wgmma's K
// for fp16/bf16). The ISA's canonical K-major layout without swizzling is, in CuTe terms,
//     ((8, m), (T, 2k)) : ((T, SBO), (1, LBO))      T = 8 elements of 16 bits = 16 bytes
// built of "core matrices" of 8 rows × 16 bytes stored as 128 contiguous bytes. Here the two core
// matrices of a group of 8 rows (K = 0-7 and K = 8-15) sit next to each other, and the groups of
// 8 rows follow each other:
//     core matrix (row / 8, k / 8) at byte 128·(2·(row / 8) + k / 8)
// so the leading byte offset (next core matrix along K) is 128 and the stride byte offset (next 8
// rows) is 256. A tile of R rows takes 32·R bytes: 2 KiB for A (64 × 16), 8 KiB for B (256 × 16).
inline constexpr uint32_t kCoreMatrixBytes = 128;
inline constexpr uint32_t kLeadingByteOffset = kCoreMatrixBytes;
inline constexpr uint32_t kStrideByteOffset = 2 * kCoreMatrixBytes;

// Byte offset of element (row, k), k < 16, of a 16-bit K-major tile in this layout: the ISA's
// canonical formula with T = 8, LBO = kLeadingByteOffset, SBO = kStrideByteOffset.
FS_HD constexpr uint32_t kmajor_offset_bytes(int row, int k) {
  return uint32_t(row % 8) * 16 + uint32_t(row / 8) * kStrideByteOffset + uint32_t(k % 8) * 2 +
         uint32_t(k / 8) * kLeadingByteOffset;
}

// Bytes of a tile of `rows` rows and K = 16 in this layout.
FS_HD constexpr uint32_t kmajor_tile_bytes(int rows) { return uint32_t(rows) * 16 * 2; }

}  // namespace fs::ceilings
