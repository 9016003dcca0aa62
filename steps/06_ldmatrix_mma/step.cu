// Step 06 — tensor cores, ldmatrix + mma.sync: what it accepts (limits, plan, claims), how it launches the
// kernel of kernel.cuh, and its registration.
#include <algorithm>
#include <functional>
#include <ostream>
#include <string>

#include "common/step/dispatch.h"
#include "common/step/step.h"
#include "steps/06_ldmatrix_mma/kernel.cuh"

namespace fs::step06 {
namespace {

// One block per BLOCK_Q query rows; (batch, head) pairs along y, looped over past 65535. Computed
// here once, for plan() (Plan::kernels) and launch().
template <class Tr>
dim3 grid_for(const Problem& p) {
  return dim3(unsigned((p.seqlen_q + Tr::BLOCK_Q - 1) / Tr::BLOCK_Q),
              unsigned(std::min<int64_t>(p.batch * p.heads_q, 65535)));
}

template <typename T, int HEAD_DIM, template <int> class TileLayout>
KernelLaunch kernel_launch(const Problem& p) {
  using Tr = Traits<HEAD_DIM>;
  const dim3 grid = grid_for<Tr>(p);
  return {reinterpret_cast<const void*>(&ldmatrix_mma_kernel<T, HEAD_DIM, TileLayout>), Tr::NUM_THREADS,
          size_t(Tr::template smem_bytes<TileLayout<HEAD_DIM>>(int(sizeof(T)))), int64_t(grid.x) * grid.y};
}

template <typename T, int HEAD_DIM, template <int> class TileLayout>
void launch_for(const Problem& p, const Tensors& t, cudaStream_t stream) {
  using Tr = Traits<HEAD_DIM>;
  const int smem_bytes = Tr::template smem_bytes<TileLayout<HEAD_DIM>>(int(sizeof(T)));
  const auto kernel = ldmatrix_mma_kernel<T, HEAD_DIM, TileLayout>;
  // Above 48 KB a block must opt in to more dynamic shared memory; plan() checked the limit.
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  const dim3 grid = grid_for<Tr>(p);
  kernel<<<grid, Tr::NUM_THREADS, smem_bytes, stream>>>(static_cast<const T*>(t.q), static_cast<const T*>(t.k),
                                                        static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse, p);
  CHECK_LAUNCH();
}

std::string limits(const Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    return "head_dim is " + std::to_string(p.head_dim) +
           "; this step handles head_dim 64 and 128 only (its tiles and register fragments are sized at compile "
           "time)";
  return "";
}

bool claims(const Problem& p, const DeviceInfo&) { return p.head_dim == 64 || p.head_dim == 128; }

// Plan::config is the HEAD_DIM to instantiate: 64 or 128.
template <template <int> class TileLayout>
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = int(p.head_dim);
  pl.kernels = {dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return pl.config == 64 ? kernel_launch<T, 64, TileLayout>(p) : kernel_launch<T, 128, TileLayout>(p);
  })};
  const size_t smem_bytes = pl.kernels[0].smem_bytes;
  if (smem_bytes > dev.smem_per_block_optin)
    pl.refusal = "this step needs " + std::to_string(smem_bytes) + " bytes of shared memory per block for head_dim " +
                 std::to_string(p.head_dim) + "; this GPU allows " + std::to_string(dev.smem_per_block_optin);
  return pl;
}

template <template <int> class TileLayout>
void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (plan.config == 64)
      launch_for<T, 64, TileLayout>(p, t, stream);
    else
      launch_for<T, 128, TileLayout>(p, t, stream);
  });
}

// What `flash-steps explain --step 06_ldmatrix_mma` prints (Step::explain): the fragment maps of
// traits.h as pictures, element by element: which lane holds it.
void print_lane_grid(std::ostream& out, const char* title, int rows, int cols,
                     const std::function<int(int, int)>& lane_of) {
  out << title << "\n     ";
  for (int c = 0; c < cols; ++c) out << (c < 10 ? "  " : " ") << c;
  out << "\n";
  for (int r = 0; r < rows; ++r) {
    out << (r < 10 ? "  " : " ") << r << " |";
    for (int c = 0; c < cols; ++c) {
      const int l = lane_of(r, c);
      out << (l < 10 ? "  " : " ") << l;
    }
    out << "\n";
  }
  out << "\n";
}

void explain(std::ostream& out) {
  out << "Which lane of a warp holds each element of an mma.sync.m16n8k16 operand (traits.h, frag::).\n"
         "g = lane / 4 picks the row, t = lane % 4 the pair of columns; each register holds two elements.\n\n";
  auto find = [](auto holds) {
    for (int lane = 0; lane < 32; ++lane)
      if (holds(lane)) return lane;
    return -1;
  };
  print_lane_grid(out, "C/D (16 x 8, fp32): the scores S of one n8 tile of keys, and O", 16, 8, [&](int r, int c) {
    return find([&](int lane) {
      for (int i = 0; i < 4; ++i)
        if (frag::mma_c(lane, i) == frag::Coord{r, c}) return true;
      return false;
    });
  });
  print_lane_grid(out, "A (16 x 16): Q for S = Q.K^T, and P for O += P.V (the same lanes as two C tiles side by side)",
                  16, 16, [&](int r, int c) {
                    return find([&](int lane) {
                      for (int reg = 0; reg < 4; ++reg)
                        for (int half = 0; half < 2; ++half)
                          if (frag::mma_a(lane, reg, half) == frag::Coord{r, c}) return true;
                      return false;
                    });
                  });
  print_lane_grid(out, "B (16 x 8, k x n): K^T for S, V for O", 16, 8, [&](int r, int c) {
    return find([&](int lane) {
      for (int reg = 0; reg < 2; ++reg)
        for (int half = 0; half < 2; ++half)
          if (frag::mma_b(lane, reg, half) == frag::Coord{r, c}) return true;
      return false;
    });
  });
  out << "ldmatrix.x4 over a 16 x 16 tile: the lane that gives the address of each 16-byte row (8 elements)\n";
  for (int r = 0; r < 16; ++r) {
    out << (r < 10 ? "  " : " ") << r << " |";
    for (int c = 0; c < 16; c += 8)
      out << "  cols " << c << "-" << c + 7 << ": lane "
          << find([&](int lane) { return frag::ldmatrix_x4_a(lane) == frag::Coord{r, c}; });
    out << "\n";
  }
}

}  // namespace
}  // namespace fs::step06

namespace fs {

void register_step_06_ldmatrix_mma(Registry& r) {
  using namespace step06;
  r.add({.id = "06_ldmatrix_mma",
         .name = "tensor cores: ldmatrix + mma.sync",
         .lesson = "S = Q·Kᵀ and O = P·V on the tensor cores: ldmatrix fragments, mma.sync.m16n8k16, P kept in "
                   "registers",
         .forward = {limits, plan<Swizzled128Layout>, launch<Swizzled128Layout>, claims},
         .explain = explain});
}

}  // namespace fs
