// A model of shared-memory bank conflicts: given the addresses one warp touches in one instruction,
// how many wavefronts (passes through the 32 banks) does the instruction take?
//
// The rule it encodes (NVIDIA GPUs since Maxwell, Hopper included):
//   - Shared memory has 32 banks, each 4 bytes wide: byte address a lies in bank (a / 4) % 32, and
//     one wavefront reads or writes at most one 4-byte word in each bank, 128 bytes in all.
//   - An instruction whose lanes move 4, 8 or 16 bytes each is served in phases of 32, 16 or 8
//     consecutive lanes (a warp, half-warps, quarter-warps): 128 bytes per phase. Only lanes of the
//     same phase can conflict with each other.
//   - Within a phase, lanes that touch the same word share it (a broadcast for loads; for stores
//     one of the values is written), so a phase takes as many wavefronts as its busiest bank has
//     distinct words: an "n-way bank conflict" is a phase that takes n wavefronts.
//   - The ideal is one wavefront per phase that has an active lane (one per 128 bytes requested).
// Nsight Compute's l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld / _op_st count the
// wavefronts above the ideal: wavefronts() - ideal_wavefronts(), summed over all instructions.
// Not modelled: merging of identical addresses that fall in *different* phases (e.g. lanes 0 and 16
// of a 16-byte load reading the same 16 bytes); each phase is counted on its own.
//
// Everything here is constexpr: the tests check textbook cases with static_assert, and the layouts
// are the (row, col) -> offset functions that the kernels use (a step's traits.h; common/model/bank_report.h
// replays a whole kernel).
#pragma once

#include <cstdint>

#include "step/hd.h"

namespace fs::bank {

inline constexpr int kBanks = 32;
inline constexpr int kBankBytes = 4;
inline constexpr int kWavefrontBytes = kBanks * kBankBytes;  // 128
inline constexpr int kWarpSize = 32;

// One shared-memory instruction of one warp.
struct WarpAccess {
  int width = 4;                 // bytes each lane reads or writes: 4, 8 or 16
  uint32_t active = 0xffffffffu; // bit l set: lane l takes part
  uint32_t addr[kWarpSize] = {}; // byte address of lane l's access, a multiple of width
};

FS_HD constexpr int bank_of(uint32_t byte_addr) { return int(byte_addr / kBankBytes % kBanks); }

// Lanes served together: 32 for 4-byte, 16 for 8-byte and 8 for 16-byte accesses.
FS_HD constexpr int lanes_per_phase(int width) { return kWavefrontBytes / width; }

FS_HD constexpr bool lane_active(const WarpAccess& a, int lane) { return ((a.active >> lane) & 1u) != 0; }

// A width of 4, 8 or 16 bytes and every active address aligned to it.
FS_HD constexpr bool is_valid(const WarpAccess& a) {
  if (a.width != 4 && a.width != 8 && a.width != 16) return false;
  for (int l = 0; l < kWarpSize; ++l)
    if (lane_active(a, l) && a.addr[l] % uint32_t(a.width) != 0) return false;
  return true;
}

// Wavefronts of one phase: the largest number of distinct words any one bank must deliver.
FS_HD constexpr int phase_wavefronts(const WarpAccess& a, int phase) {
  const int lanes = lanes_per_phase(a.width);
  const int words_per_lane = a.width / kBankBytes;
  uint32_t words[kBanks] = {};  // the distinct words of the phase: at most 128 bytes' worth
  int n = 0;
  for (int l = phase * lanes; l < (phase + 1) * lanes; ++l) {
    if (!lane_active(a, l)) continue;
    for (int w = 0; w < words_per_lane; ++w) {
      const uint32_t word = a.addr[l] / kBankBytes + uint32_t(w);
      bool seen = false;
      for (int k = 0; k < n; ++k) seen = seen || words[k] == word;
      if (!seen) words[n++] = word;
    }
  }
  int per_bank[kBanks] = {};
  int busiest = 0;
  for (int k = 0; k < n; ++k) {
    const int count = ++per_bank[words[k] % kBanks];
    busiest = count > busiest ? count : busiest;
  }
  return busiest;
}

// Wavefronts of the whole instruction (the phases one after the other); -1 if !is_valid(a).
FS_HD constexpr int wavefronts(const WarpAccess& a) {
  if (!is_valid(a)) return -1;
  int total = 0;
  for (int phase = 0; phase < kWarpSize / lanes_per_phase(a.width); ++phase) total += phase_wavefronts(a, phase);
  return total;
}

// The conflict-free minimum: one wavefront per phase with an active lane; -1 if !is_valid(a).
FS_HD constexpr int ideal_wavefronts(const WarpAccess& a) {
  if (!is_valid(a)) return -1;
  const int lanes = lanes_per_phase(a.width);
  int ideal = 0;
  for (int phase = 0; phase < kWarpSize / lanes; ++phase) {
    bool any = false;
    for (int l = phase * lanes; l < (phase + 1) * lanes; ++l) any = any || lane_active(a, l);
    ideal += any ? 1 : 0;
  }
  return ideal;
}

// An element of a tile.
struct Coord {
  int row, col;
};

// The access of a warp whose lane l touches `width` bytes starting at element lane_coord(l) of a
// tile laid out by Layout (a type with offset(row, col)), with elements of elem_bytes bytes, that starts at
// byte `base` of shared memory. All 32 lanes take part.
template <class Layout, class LaneCoord>
constexpr WarpAccess tile_access(int width, int elem_bytes, uint32_t base, LaneCoord lane_coord) {
  WarpAccess a{};
  a.width = width;
  for (int l = 0; l < kWarpSize; ++l) {
    const Coord c = lane_coord(l);
    a.addr[l] = base + uint32_t(Layout::offset(c.row, c.col) * elem_bytes);
  }
  return a;
}

}  // namespace fs::bank
