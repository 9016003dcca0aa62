// A DeviceInfo for the CPU tests of plans: an H100/H200-sized GPU (132 SMs, 80 GiB free) of the given
// compute capability and opt-in shared memory per block.
#pragma once

#include <cstddef>

#include "common/step/device.h"

inline fs::DeviceInfo fake_device(int cc, size_t smem_optin) {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = cc;
  d.sm_count = 132;
  d.smem_per_block_optin = smem_optin;
  d.free_bytes = d.total_bytes = size_t(80) << 30;
  return d;
}
