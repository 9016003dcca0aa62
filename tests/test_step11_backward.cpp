// Step 11's index math on the CPU (steps/11_backward/traits.h and the addresses kernel.cuh computes):
// every ldmatrix of backward_kernel and dq_kernel, simulated over the kernel's shared memory with the
// PTX ISA's tables (tests/ptx_isa.h), delivers the mma operand the code assumes, for every warp of the
// split (key groups, and the warps of a group sharing queries and columns), Pᵀ and dSᵀ included
// (stored by 4-byte stores, read back as A, and dSᵀ transposed for dQ), or Pᵀ and dSᵀ as A straight
// from the accumulators when a warp has every query; the warps' dK, dV and dQ pieces cover their tiles
// once; those accesses are free of bank conflicts (the 64-byte swizzle of 32-query dSᵀ included); the
// work split against brute force; the tile copies; the table of configurations and its shared memory;
// step 11's copies of step 07's maps and swizzles. Nothing here needs the registry or a GPU.
#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/forward/problem.h"
#include "common/model/bank_model.h"
#include "ptx_isa.h"
#include "steps/07_flash_attention2/traits.h"
#include "steps/11_backward/traits.h"

namespace {

namespace bw = fs::step11;
namespace frag = fs::step11::frag;
namespace isa = fs::ptx_isa;
using isa::kLanes;
using Addresses = std::array<int, kLanes>;

// ---- the kernels' shared memory on the CPU -----------------------------------------------------
// One int per 2-byte element; element (row, col) of a tile holds code(buffer, row, col), so a value
// read back names its buffer, row and column.
int code(int buffer, int row, int col) { return buffer * 1000000 + row * 1000 + col; }
std::string describe(int value) {
  std::ostringstream s;
  if (value < 0)
    s << "an unwritten element";
  else
    s << "buffer " << value / 1000000 << " (" << value / 1000 % 1000 << ", " << value % 1000 << ")";
  return s.str();
}

struct Smem {
  std::vector<int> cell;
  explicit Smem(int bytes) : cell(size_t(bytes / 2), -1) {}
  // A [rows, Layout::kCols] tile at element `base`: every element lands inside the tile's range and
  // on a cell no other element (of this tile or another buffer) holds.
  template <class Layout>
  void fill(int base, int rows, int buffer) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < Layout::kCols; ++c) {
        const int e = Layout::offset(r, c);
        REQUIRE((e >= 0 && e < Layout::size(rows)));
        REQUIRE(cell[size_t(base + e)] == -1);
        cell[size_t(base + e)] = code(buffer, r, c);
      }
  }
};

// The values an operand's register `reg`, half `half` of `lane` must hold.
using Expect = std::function<int(int lane, int reg, int half)>;

// A 16×16 A operand whose element (m, k) is a(m, k): a_{2·reg + half} of the ISA's table.
template <class F>
Expect a_operand(F a) {
  return [a](int lane, int reg, int half) {
    const isa::Element e = isa::mma_a(lane, 2 * reg + half);
    return a(e.row, e.col);
  };
}
// The B operands of two n8 tiles from one ldmatrix.x4: registers 2j, 2j+1 are b[0], b[1] of tile j,
// whose element (k, n) is b(j, k, n).
template <class F>
Expect b_pair(F b) {
  return [b](int lane, int reg, int half) {
    const isa::Element e = isa::mma_b(lane, 2 * (reg % 2) + half);
    return b(reg / 2, e.row, e.col);
  };
}

// Loads checked so far: mismatches and bank-conflicted loads, with the first of each described.
struct Tally {
  int loads = 0, wrong = 0, conflicted = 0;
  std::string first_wrong, first_conflict;
};

// ldmatrix.x4 (with or without .trans) from `address` (element offsets into `smem`) must deliver
// `expect` to every lane, and its four phases must take one wavefront each.
void check_load(Tally& t, const Smem& smem, const Addresses& address, bool trans, const Expect& expect,
                const std::string& what) {
  ++t.loads;
  const isa::Regs r = isa::ldmatrix(smem.cell, address, 4, trans);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const int got = r[size_t(lane)][size_t(reg)][size_t(half)], want = expect(lane, reg, half);
        if (got != want && t.wrong++ == 0) {
          std::ostringstream s;
          s << what << ": lane " << lane << " register " << reg << " half " << half << " holds " << describe(got)
            << ", the mma needs " << describe(want);
          t.first_wrong = s.str();
        }
      }
  const int wavefronts = isa::ldmatrix_wavefronts(address, 4);
  if (wavefronts != 1 && t.conflicted++ == 0) t.first_conflict = what + ": " + std::to_string(wavefronts) + "-way";
}

void report(const Tally& t, const char* what) {
  INFO(what << ": " << t.loads << " loads; first wrong: " << t.first_wrong);
  CHECK(t.loads > 0);
  CHECK(t.wrong == 0);
  INFO("first conflicted: " << t.first_conflict);
  CHECK(t.conflicted == 0);
}

template <class F>
Addresses per_lane(F f) {
  Addresses a{};
  for (int lane = 0; lane < kLanes; ++lane) a[size_t(lane)] = f(lane);
  return a;
}

// The kernels' lane offsets of the two ldmatrix orders, for columns 16·u … of a 64-column group:
// quad_off[u] and pair_off[u] of kernel.cuh.
template <class Layout>
struct LaneOffsets {
  int quad[4][kLanes], pair[4][kLanes];
  LaneOffsets() {
    for (int u = 0; u < 4; ++u)
      for (int lane = 0; lane < kLanes; ++lane) {
        const frag::Coord a = frag::ldmatrix_x4_quadrants(lane), c = bw::ldmatrix_x4_k_pair(lane);
        quad[u][lane] = Layout::offset(a.row, 16 * u + a.col);
        pair[u][lane] = Layout::offset(c.row, 16 * u + c.col);
      }
  }
};

// ---- backward_kernel ---------------------------------------------------------------------------
// Its buffers as it carves them from shared memory (element offsets; the row arrays in bytes): Pᵀ
// has a tile only when warps share keys (COL_GROUPS > 1).
template <class Tr>
struct MainBuffers {
  static constexpr int k = 0;
  static constexpr int v = k + Tr::KV_ELEMS;
  static constexpr int q = v + Tr::KV_ELEMS;
  static constexpr int d_o = q + Tr::Q_STAGES * Tr::Q_ELEMS;
  static constexpr int ds = d_o + Tr::Q_STAGES * Tr::Q_ELEMS;
  static constexpr int p = ds + Tr::DS_ELEMS;
  static constexpr int lse_byte = (p + (Tr::COL_GROUPS > 1 ? Tr::DS_ELEMS : 0)) * 2;
  static constexpr int dd_byte = lse_byte + Tr::Q_STAGES * Tr::BLOCK_Q * 4;
  static constexpr int end_byte = dd_byte + Tr::Q_STAGES * Tr::BLOCK_Q * 4;
};
// Buffer numbers of the codes.
enum : int { kK = 1, kV = 2, kQ = 3, kDo = 5, kDsT = 7, kPT = 9 };  // kQ + stage, kDo + stage

// Warp w of a block whose slice starts at column col0: keys kr0 … kr0 + WARP_KEYS - 1 of the block
// (key group w / COL_GROUPS), queries wq0 … wq0 + WARP_QUERIES - 1 of Sᵀ and dPᵀ, columns
// wc0 … wc0 + WARP_COLS - 1 of dK and dV (w % COL_GROUPS picks both).
template <class Tr>
struct WarpShare {
  int kr0, wq0, wc0;
  WarpShare(int warp, int col0)
      : kr0(warp / Tr::COL_GROUPS * Tr::WARP_KEYS),
        wq0(warp % Tr::COL_GROUPS * Tr::WARP_QUERIES),
        wc0(col0 + warp % Tr::COL_GROUPS * Tr::WARP_COLS) {}
};

// Every element of a [rows, cols] tile (from row0, col0) produced exactly once: `outside` counts
// elements outside it or produced twice, `missing` those never produced.
struct Coverage {
  int row0, rows, col0, cols, outside = 0;
  std::set<std::pair<int, int>> seen;
  Coverage(int row0_, int rows_, int col0_, int cols_) : row0(row0_), rows(rows_), col0(col0_), cols(cols_) {}
  void add(int row, int col) {
    if (row < row0 || row >= row0 + rows || col < col0 || col >= col0 + cols || !seen.insert({row, col}).second)
      ++outside;
  }
  int missing() const { return rows * cols - int(seen.size()); }
};

std::string where(const char* what, std::initializer_list<std::pair<const char*, int>> values) {
  std::ostringstream s;
  s << what;
  for (const auto& [name, value] : values) s << " " << name << " " << value;
  return s.str();
}

template <int CONFIG>
void check_backward_kernel() {
  using Tr = bw::TraitsOf<CONFIG>;
  using L = typename Tr::Layout;
  using DL = typename Tr::DsLayout;
  using B = MainBuffers<Tr>;
  using W = WarpShare<Tr>;
  constexpr int M = Tr::KEY_TILES;
  CAPTURE(CONFIG, Tr::HEAD_DIM, Tr::BLOCK_Q, Tr::BLOCK_KV, Tr::D_SLICES, Tr::KEY_TILES, Tr::COL_GROUPS);
  REQUIRE(B::end_byte == Tr::SMEM_BYTES);

  Smem s(Tr::SMEM_BYTES);
  s.fill<L>(B::k, Tr::BLOCK_KV, kK);
  s.fill<L>(B::v, Tr::BLOCK_KV, kV);
  for (int st = 0; st < Tr::Q_STAGES; ++st) {
    s.fill<L>(B::q + st * Tr::Q_ELEMS, Tr::BLOCK_Q, kQ + st);
    s.fill<L>(B::d_o + st * Tr::Q_ELEMS, Tr::BLOCK_Q, kDo + st);
  }
  const LaneOffsets<L> off;
  auto q_or_do = [](int buf, int st) { return (buf == kQ + st ? B::q : B::d_o) + st * Tr::Q_ELEMS; };

  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: the rows of the warp's key tile mi as A (keys × dims), Q and dO rows
  // of its queries as the B of the n8 tiles 2·np, 2·np + 1 (s_acc[mi][nt] holds queries wq0 + 8·nt …):
  // A(m, k) = K[kr0 + 16·mi + m][16·ks + k], B(k, n) = Q[wq0 + 8·nt + n][16·ks + k].
  Tally s_dp;
  for (int warp = 0; warp < Tr::NUM_WARPS; ++warp) {
    const W w(warp, 0);
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks) {
      const int u = ks % 4, col = ks / 4 * 64;
      for (int mi = 0; mi < M; ++mi)
        for (int buf : {kK, kV}) {
          const int base = (buf == kK ? B::k : B::v) + L::origin(w.kr0, 0);  // k_warp, v_warp
          const auto address = per_lane([&](int lane) { return base + off.quad[u][lane] + L::origin(16 * mi, col); });
          check_load(s_dp, s, address, false,
                     a_operand([&](int m, int k) { return code(buf, w.kr0 + 16 * mi + m, 16 * ks + k); }),
                     where("K/V", {{"warp", warp}, {"ks", ks}, {"mi", mi}}));
        }
      for (int st = 0; st < Tr::Q_STAGES; ++st)
        for (int np = 0; np < Tr::Q_N_TILES / 2; ++np)
          for (int buf : {kQ + st, kDo + st}) {
            const auto address = per_lane([&](int lane) {
              return q_or_do(buf, st) + off.pair[u][lane] + L::origin(w.wq0 + 16 * np, col);
            });
            const auto q_b = [&](int j, int k, int n) { return code(buf, w.wq0 + 8 * (2 * np + j) + n, 16 * ks + k); };
            check_load(s_dp, s, address, false, b_pair(q_b),
                       where("Q/dO", {{"warp", warp}, {"stage", st}, {"ks", ks}, {"np", np}}));
          }
    }
  }
  report(s_dp, "S^T and dP^T: K, V as A; Q, dO as B pairs at wq0");

  // store_rows: warp w's C tile (mi, nt) holds Pᵀ (dSᵀ) [kr0 + 16·mi + row][wq0 + 8·nt + col] (the
  // ISA's C map); the kernel stores elements 2r, 2r+1 of it with one 4-byte store at
  // DsLayout::offset(of frag::mma_c). dSᵀ always (dQ reads it; with COL_GROUPS > 1 dK does too), Pᵀ
  // when COL_GROUPS > 1. Together the warps' stores must fill each [BLOCK_KV, BLOCK_Q] tile once.
  int store_conflicts = 0, outside = 0, unwritten = 0;
  auto store_rows = [&](int base, int buf) {
    for (int warp = 0; warp < Tr::NUM_WARPS; ++warp) {
      const W w(warp, 0);
      for (int mi = 0; mi < M; ++mi)
        for (int nt = 0; nt < Tr::Q_N_TILES; ++nt)
          for (int r = 0; r < 2; ++r) {
            fs::bank::WarpAccess a{};
            a.width = 4;
            for (int lane = 0; lane < kLanes; ++lane) {
              const frag::Coord c = frag::mma_c(lane, 2 * r);
              const int e = base + DL::offset(w.kr0 + 16 * mi + c.row, w.wq0 + nt * 8 + c.col);
              a.addr[lane] = uint32_t(e * 2);
              if (e % 2 != 0 || e < base || e + 2 > base + Tr::DS_ELEMS) {
                ++outside;
                continue;
              }
              for (int half = 0; half < 2; ++half) {
                const isa::Element v = isa::mma_c(lane, 2 * r + half);
                REQUIRE(s.cell[size_t(e + half)] == -1);  // no element stored twice
                s.cell[size_t(e + half)] = code(buf, w.kr0 + 16 * mi + v.row, w.wq0 + 8 * nt + v.col);
              }
            }
            if (fs::bank::wavefronts(a) != fs::bank::ideal_wavefronts(a)) ++store_conflicts;
          }
    }
    for (int e = base; e < base + Tr::DS_ELEMS; ++e) unwritten += s.cell[size_t(e)] == -1;
  };
  store_rows(B::ds, kDsT);
  if (Tr::COL_GROUPS > 1) store_rows(B::p, kPT);
  {
    INFO("store_rows: the 4-byte stores of dS^T (and P^T) stay in their tiles, fill them, and are conflict-free");
    CHECK(outside == 0);
    CHECK(unwritten == 0);
    CHECK(store_conflicts == 0);
  }

  // a_fragment: the A operand of Pᵀ (dSᵀ) for keys kr0 + 16·mi …, queries 16·kk …:
  // A(m, k) = Pᵀ[kr0 + 16·mi + m][16·kk + k].
  Tally p_ds;
  int reg_wrong = 0, reg_twice = 0, reg_unset = 0;
  std::string first_reg_wrong;
  for (int warp = 0; warp < Tr::NUM_WARPS; ++warp) {
    const W w(warp, 0);
    for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
      for (int mi = 0; mi < M; ++mi)
        for (int buf : {kPT, kDsT}) {
          if (Tr::COL_GROUPS > 1) {
            // ldmatrix.x4 from the tile the key group wrote, at DsLayout::origin(kr0 + 16·mi, 0) + pq_off[kk].
            const int base = buf == kPT ? B::p : B::ds;
            const auto address = per_lane([&](int lane) {
              const frag::Coord qd = frag::ldmatrix_x4_quadrants(lane);
              const int pq_off = DL::offset(qd.row, 16 * kk + qd.col);
              return base + DL::origin(w.kr0 + 16 * mi, 0) + pq_off;
            });
            check_load(p_ds, s, address, false,
                       a_operand([&](int m, int k) { return code(buf, w.kr0 + 16 * mi + m, 16 * kk + k); }),
                       where(buf == kPT ? "P^T as A" : "dS^T as A", {{"warp", warp}, {"kk", kk}, {"mi", mi}}));
          } else {
            // From the warp's own accumulators: register mma_a_reg_of_c(n_half, i) of the A operand
            // packs C elements i, i+1 of n8 tile 2·kk + n_half (queries wq0 + 8·(2·kk + n_half) …).
            int a[kLanes][4][2];
            for (auto& lane_regs : a)
              for (auto& reg : lane_regs) reg[0] = reg[1] = -1;
            for (int lane = 0; lane < kLanes; ++lane)
              for (int n_half = 0; n_half < 2; ++n_half)
                for (int i = 0; i < 4; i += 2)
                  for (int half = 0; half < 2; ++half) {
                    const int nt = 2 * kk + n_half;
                    const isa::Element c = isa::mma_c(lane, i + half);
                    const int reg = frag::mma_a_reg_of_c(n_half, i);
                    REQUIRE((reg >= 0 && reg < 4 && nt < Tr::Q_N_TILES));
                    if (a[lane][reg][half] != -1) ++reg_twice;
                    a[lane][reg][half] = code(buf, w.kr0 + 16 * mi + c.row, w.wq0 + 8 * nt + c.col);
                  }
            for (int lane = 0; lane < kLanes; ++lane)
              for (int reg = 0; reg < 4; ++reg)
                for (int half = 0; half < 2; ++half) {
                  const isa::Element e = isa::mma_a(lane, 2 * reg + half);
                  const int want = code(buf, w.kr0 + 16 * mi + e.row, 16 * kk + e.col);
                  if (a[lane][reg][half] == -1) ++reg_unset;
                  if (a[lane][reg][half] != want && reg_wrong++ == 0)
                    first_reg_wrong = where("registers", {{"warp", warp}, {"kk", kk}, {"mi", mi}, {"lane", lane},
                                                          {"reg", reg}, {"half", half}}) +
                                      " hold " + describe(a[lane][reg][half]) + ", the mma needs " + describe(want);
                }
          }
        }
  }
  if (Tr::COL_GROUPS > 1) {
    report(p_ds, "P^T and dS^T read back as A by ldmatrix at pq_off");
  } else {
    INFO("P^T and dS^T as A from the accumulators (mma_a_reg_of_c); first wrong: " << first_reg_wrong);
    CHECK(reg_wrong == 0);
    CHECK(reg_twice == 0);
    CHECK(reg_unset == 0);
  }

  // dV += Pᵀ·dO and dK += dSᵀ·Q: dO and Q through .trans as B of the warp's n8 tiles 2·np, 2·np + 1
  // (dv_acc[mi][nt] holds columns wc0 + 8·nt …): B(k, n) = dO[16·kk + k][wc0 + 8·nt + n]. The
  // epilogue's pieces (keys kr0 + 16·mi + row, columns wc0 + 8·nt + col) cover the block's keys and
  // its slice once.
  Tally dv_dk;
  int dkv_outside = 0, dkv_missing = 0;
  for (int slice = 0; slice < Tr::D_SLICES; ++slice) {
    const int col0 = slice * Tr::SLICE;
    Coverage pieces(0, Tr::BLOCK_KV, col0, Tr::SLICE);
    for (int warp = 0; warp < Tr::NUM_WARPS; ++warp) {
      const W w(warp, col0);
      for (int st = 0; st < Tr::Q_STAGES; ++st)
        for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
          for (int np = 0; np < Tr::SLICE_N_TILES / 2; ++np) {
            const int col = w.wc0 + np / 4 * 64;
            for (int buf : {kDo + st, kQ + st}) {
              const auto address = per_lane(
                  [&](int lane) { return q_or_do(buf, st) + off.quad[np % 4][lane] + L::origin(16 * kk, col); });
              const auto b = [&](int j, int k, int n) { return code(buf, 16 * kk + k, w.wc0 + 8 * (2 * np + j) + n); };
              check_load(dv_dk, s, address, true, b_pair(b),
                         where("dO/Q.trans", {{"slice", slice}, {"warp", warp}, {"st", st}, {"kk", kk}, {"np", np}}));
            }
          }
      for (int mi = 0; mi < M; ++mi)
        for (int nt = 0; nt < Tr::SLICE_N_TILES; ++nt)
          for (int lane = 0; lane < kLanes; ++lane)
            for (int r = 0; r < 2; ++r) {
              const frag::Coord c = frag::mma_c(lane, 2 * r);
              for (int half = 0; half < 2; ++half) pieces.add(w.kr0 + 16 * mi + c.row, w.wc0 + nt * 8 + c.col + half);
            }
    }
    dkv_outside += pieces.outside;
    dkv_missing += pieces.missing();
  }
  report(dv_dk, "dV and dK: dO, Q through .trans as B pairs at wc0");
  {
    INFO("dK, dV: the warps' pieces cover the block's keys and the slice once");
    CHECK(dkv_outside == 0);
    CHECK(dkv_missing == 0);
  }

  // dQ[q0 …, slice] += dS·K: warp w has rows dq_row0 = 32·(w % DQ_ROW_GROUPS) … (m16 tiles mi = 0, 1)
  // and columns dq_col = col0 + DQ_COLS·(w / DQ_ROW_GROUPS) …. dS [query][key] read from dSᵀ
  // [key][query] through .trans with ds_off[mi] as A: A(m, k) = dSᵀ[16·kk + k][dq_row0 + 16·mi + m];
  // K through .trans with dq_k_off[np] as B pairs: B(k, n) = K[16·kk + k][dq_col + 8·nt + n].
  Tally dq;
  int dq_outside = 0, dq_missing = 0;
  for (int slice = 0; slice < Tr::D_SLICES; ++slice) {
    const int col0 = slice * Tr::SLICE;
    Coverage pieces(0, Tr::BLOCK_Q, col0, Tr::SLICE);
    for (int warp = 0; warp < Tr::NUM_WARPS; ++warp) {
      const int dq_row0 = warp % Tr::DQ_ROW_GROUPS * 32, dq_col = col0 + warp / Tr::DQ_ROW_GROUPS * Tr::DQ_COLS;
      for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk) {
        for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi) {
          const auto a_address = per_lane([&](int lane) {
            const frag::Coord kp = bw::ldmatrix_x4_k_pair(lane);
            return B::ds + DL::origin(16 * kk, 0) + DL::offset(kp.row, dq_row0 + 16 * mi + kp.col);
          });
          check_load(dq, s, a_address, true,
                     a_operand([&](int m, int k) { return code(kDsT, 16 * kk + k, dq_row0 + 16 * mi + m); }),
                     where("dS.trans", {{"slice", slice}, {"warp", warp}, {"kk", kk}, {"mi", mi}}));
        }
        for (int np = 0; np < Tr::DQ_N_TILES / 2; ++np) {
          const auto b_address = per_lane([&](int lane) {
            const frag::Coord qd = frag::ldmatrix_x4_quadrants(lane);
            return B::k + L::origin(16 * kk, 0) + L::offset(qd.row, dq_col + 16 * np + qd.col);
          });
          check_load(dq, s, b_address, true,
                     b_pair([&](int j, int k, int n) { return code(kK, 16 * kk + k, dq_col + 8 * (2 * np + j) + n); }),
                     where("K.trans for dQ", {{"slice", slice}, {"warp", warp}, {"kk", kk}, {"np", np}}));
        }
      }
      // The elements this warp adds to dQ (the atomics' rows dq_row0 + 16·mi + c.row, columns
      // dq_col + 8·nt + c.col and the next).
      for (int mi = 0; mi < Tr::DQ_M_TILES; ++mi)
        for (int nt = 0; nt < Tr::DQ_N_TILES; ++nt)
          for (int lane = 0; lane < kLanes; ++lane)
            for (int r = 0; r < 2; ++r) {
              const frag::Coord c = frag::mma_c(lane, 2 * r);
              for (int half = 0; half < 2; ++half)
                pieces.add(dq_row0 + 16 * mi + c.row, dq_col + 8 * nt + c.col + half);
            }
    }
    dq_outside += pieces.outside;
    dq_missing += pieces.missing();
  }
  report(dq, "dQ: dS^T read back through .trans as A, K through .trans as B pairs");
  {
    INFO("dQ: the warps cover the slice of the query tile once");
    CHECK(dq_outside == 0);
    CHECK(dq_missing == 0);
  }

  // LSE₂ and D of a visit: threads 0 … BLOCK_Q/4 - 1 copy 16-byte chunks of LSE₂, the next as many
  // of D, into their stage's rows.
  {
    INFO("the rows' LSE and D: 16-byte chunks, each float once, inside their buffers");
    std::vector<int> copies(size_t(B::end_byte - B::lse_byte) / 4, 0);
    constexpr int CHUNKS = Tr::BLOCK_Q / 4;
    for (int st = 0; st < Tr::Q_STAGES; ++st)
      for (int tid = 0; tid < Tr::NUM_THREADS; ++tid) {
        int byte = -1;
        if (tid < CHUNKS)
          byte = B::lse_byte + (st * Tr::BLOCK_Q + 4 * tid) * 4;
        else if (tid < 2 * CHUNKS)
          byte = B::dd_byte + (st * Tr::BLOCK_Q + 4 * (tid - CHUNKS)) * 4;
        if (byte < 0) continue;
        CAPTURE(st, tid, byte);
        CHECK(byte % 16 == 0);
        REQUIRE((byte >= B::lse_byte && byte + 16 <= B::end_byte));
        for (int f = 0; f < 4; ++f) ++copies[size_t((byte - B::lse_byte) / 4 + f)];
      }
    for (int c : copies) CHECK(c == 1);
    CHECK(B::end_byte <= Tr::SMEM_BYTES);
  }
}

// ---- dq_kernel ---------------------------------------------------------------------------------
template <class Tr>
struct DqBuffers {
  static constexpr int q = 0;
  static constexpr int d_o = q + Tr::Q_ELEMS;
  static constexpr int k = d_o + Tr::Q_ELEMS;      // two stages
  static constexpr int v = k + 2 * Tr::KV_ELEMS;   // two stages
  static constexpr int end_byte = (v + 2 * Tr::KV_ELEMS) * 2;
};
enum : int { kDqQ = 11, kDqDo = 12, kDqK = 13, kDqV = 15 };  // kDqK + stage, kDqV + stage

template <int CONFIG>
void check_dq_kernel() {
  using Tr = bw::DqTraitsOf<CONFIG>;
  using L = typename Tr::Layout;
  using B = DqBuffers<Tr>;
  CAPTURE(CONFIG, Tr::HEAD_DIM, Tr::D_SLICES);
  REQUIRE(B::end_byte == Tr::SMEM_BYTES);

  Smem s(Tr::SMEM_BYTES);
  s.fill<L>(B::q, Tr::BLOCK_Q, kDqQ);
  s.fill<L>(B::d_o, Tr::BLOCK_Q, kDqDo);
  for (int st = 0; st < 2; ++st) {
    s.fill<L>(B::k + st * Tr::KV_ELEMS, Tr::BLOCK_KV, kDqK + st);
    s.fill<L>(B::v + st * Tr::KV_ELEMS, Tr::BLOCK_KV, kDqV + st);
  }
  const LaneOffsets<L> off;

  // S = Q·Kᵀ and dP = dO·Vᵀ: Q, dO rows of the warp as A; K, V as B pairs: B(k, n) = K[8·nt + n][16·ks + k].
  Tally s_dp;
  for (int ks = 0; ks < Tr::D_K_STEPS; ++ks) {
    const int u = ks % 4, col = ks / 4 * 64;
    for (int warp = 0; warp < Tr::NUM_WARPS; ++warp)
      for (int buf : {kDqQ, kDqDo}) {
        const int base = (buf == kDqQ ? B::q : B::d_o) + L::origin(16 * warp, 0);
        const auto address = per_lane([&](int lane) { return base + off.quad[u][lane] + col; });
        check_load(s_dp, s, address, false,
                   a_operand([&](int m, int k) { return code(buf, 16 * warp + m, 16 * ks + k); }),
                   "Q/dO warp " + std::to_string(warp) + " ks " + std::to_string(ks));
      }
    for (int st = 0; st < 2; ++st)
      for (int np = 0; np < Tr::KV_N_TILES / 2; ++np)
        for (int buf : {kDqK + st, kDqV + st}) {
          const int tile = (buf == kDqK + st ? B::k : B::v) + st * Tr::KV_ELEMS;
          const auto address = per_lane([&](int lane) { return tile + off.pair[u][lane] + L::origin(16 * np, col); });
          check_load(s_dp, s, address, false,
                     b_pair([&](int j, int k, int n) { return code(buf, 8 * (2 * np + j) + n, 16 * ks + k); }),
                     "K/V stage " + std::to_string(st) + " ks " + std::to_string(ks) + " np " + std::to_string(np));
        }
  }
  report(s_dp, "dq_kernel S and dP: Q, dO as A; K, V as B pairs");

  // dQ += dS·K: K through .trans as B pairs of the slice: B(k, n) = K[16·kk + k][col0 + 8·nt + n].
  Tally dq;
  for (int slice = 0; slice < Tr::D_SLICES; ++slice) {
    const int col0 = slice * Tr::SLICE;
    for (int st = 0; st < 2; ++st)
      for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk)
        for (int np = 0; np < Tr::SLICE_N_TILES / 2; ++np) {
          const int tile = B::k + st * Tr::KV_ELEMS;
          const auto address = per_lane([&](int lane) {
            return tile + off.quad[np % 4][lane] + L::origin(16 * kk, col0 + np / 4 * 64);
          });
          const auto k_b = [&](int j, int k, int n) {
            return code(kDqK + st, 16 * kk + k, col0 + 8 * (2 * np + j) + n);
          };
          check_load(dq, s, address, true, b_pair(k_b),
                     "K.trans slice " + std::to_string(slice) + " kk " + std::to_string(kk) + " np " +
                         std::to_string(np));
        }
  }
  report(dq, "dq_kernel dQ: K through .trans as B pairs of the slice");
}

template <int... CONFIGS>
void check_all_kernels(std::integer_sequence<int, CONFIGS...>) {
  (check_backward_kernel<CONFIGS>(), ...);
  (check_dq_kernel<CONFIGS>(), ...);
}

// ---- brute force of the causal rule ------------------------------------------------------------
// seen(i, j) for real rows i < sq and keys j < sk, by fs::causal_allows pair by pair, with prefix
// sums so that the seen pairs of any rectangle are counted at once.
struct Seen {
  int64_t sq, sk;
  std::vector<int64_t> sum;  // sum[(i)·(sk+1) + j]: seen pairs of rows < i, keys < j
  Seen(int64_t sq_, int64_t sk_, bool causal) : sq(sq_), sk(sk_), sum(size_t((sq + 1) * (sk + 1)), 0) {
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j) {
        const bool seen = !causal || fs::causal_allows(i, j, sq, sk);
        at(i + 1, j + 1) = at(i, j + 1) + at(i + 1, j) - at(i, j) + (seen ? 1 : 0);
      }
  }
  int64_t& at(int64_t i, int64_t j) { return sum[size_t(i * (sk + 1) + j)]; }
  // Seen pairs among rows [r0, r1) and keys [k0, k1), both clipped to the real ones.
  int64_t count(int64_t r0, int64_t r1, int64_t k0, int64_t k1) {
    r1 = std::min(r1, sq);
    k1 = std::min(k1, sk);
    if (r0 >= r1 || k0 >= k1) return 0;
    return at(r1, k1) - at(r0, k1) - at(r1, k0) + at(r0, k0);
  }
  // Does some real row of [r0, r1) not see some key of [k0, k1) (a key past sk included)?
  bool some_hidden(int64_t r0, int64_t r1, int64_t k0, int64_t k1) {
    const int64_t rows = std::min(r1, sq) - r0;
    if (rows <= 0) return false;
    if (k1 > sk) return true;
    return count(r0, r1, k0, k1) < rows * (k1 - k0);
  }
};

std::vector<int64_t> seqlens() {
  std::vector<int64_t> v;
  for (int64_t n = 0; n <= 20; ++n) v.push_back(n);
  for (int64_t n : {31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 191, 192, 193, 250, 255, 256, 257, 300}) v.push_back(n);
  return v;
}
// (BLOCK_Q, BLOCK_KV): the main kernel's, the dQ kernel's and a few others.
constexpr std::pair<int, int> kBlocks[] = {{32, 128}, {64, 128}, {64, 64}, {128, 64}, {16, 32}, {32, 16}};

}  // namespace

TEST_CASE("step 11: the ISA's C map is the A map of the next mma, and the kernels' C coordinates", "[step11]") {
  for (int lane = 0; lane < kLanes; ++lane) {
    CAPTURE(lane);
    for (int i = 0; i < 4; ++i) {
      const isa::Element c = isa::mma_c(lane, i);
      CHECK(frag::mma_c(lane, i) == frag::Coord{c.row, c.col});
      // dq_kernel's lse_r[i / 2], dd_r[i / 2] are the rows of mma_c(lane, 2·(i / 2)).
      CHECK(frag::mma_c(lane, 2 * (i / 2)).row == c.row);
    }
    // The 4-byte stores of a C pair (Pᵀ, dSᵀ, dK, dV, dQ) and the float2 atomics: elements 2r, 2r+1 are
    // neighbours in one row, from an even column.
    for (int r = 0; r < 2; ++r) {
      const isa::Element lo = isa::mma_c(lane, 2 * r), hi = isa::mma_c(lane, 2 * r + 1);
      CHECK(lo.col % 2 == 0);
      CHECK(hi.row == lo.row);
      CHECK(hi.col == lo.col + 1);
    }
    // Pᵀ and dSᵀ (main kernel), dS (dq_kernel): C elements i, i+1 of n8 tile n_half of a k16 step
    // are register mma_a_reg_of_c(n_half, i) of the A operand over those 16 columns.
    for (int n_half = 0; n_half < 2; ++n_half)
      for (int i = 0; i < 4; i += 2)
        for (int half = 0; half < 2; ++half) {
          const int reg = frag::mma_a_reg_of_c(n_half, i);
          const isa::Element c = isa::mma_c(lane, i + half), a = isa::mma_a(lane, 2 * reg + half);
          CAPTURE(n_half, i, half, reg);
          CHECK(a.row == c.row);
          CHECK(a.col == 8 * n_half + c.col);
        }
  }
}

TEST_CASE("step 11: every ldmatrix of both kernels delivers its mma operand, conflict-free", "[step11][bank]") {
  check_all_kernels(std::make_integer_sequence<int, bw::kNumConfigs>{});
}

// copy_tile_async (kernel.cuh) with ROWS rows of Layout and NUM_THREADS threads, as it computes its
// indices: every 16-byte chunk of the tile is copied by exactly one (thread, pass), and each warp's
// 16-byte stores into shared memory are conflict-free.
template <class Layout, int ROWS, int NUM_THREADS>
void check_copy_tile() {
  constexpr int CHUNKS = Layout::kCols / 8, ROWS_PER_PASS = NUM_THREADS / CHUNKS;
  constexpr int PASSES = (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
  CAPTURE(Layout::kCols, ROWS, NUM_THREADS);
  std::vector<int> copies(size_t(Layout::size(ROWS)), 0);
  int conflicted = 0;
  for (int i = 0; i < PASSES; ++i)
    for (int warp = 0; warp < NUM_THREADS / 32; ++warp) {
      fs::bank::WarpAccess a{};
      a.width = 16;
      a.active = 0;
      for (int lane = 0; lane < kLanes; ++lane) {
        const int tid = 32 * warp + lane;
        const int row0 = tid / CHUNKS, col = tid % CHUNKS * 8;
        const int row = row0 + i * ROWS_PER_PASS;
        if (!((NUM_THREADS % CHUNKS == 0 || row0 < ROWS_PER_PASS) && (ROWS % ROWS_PER_PASS == 0 || row < ROWS)))
          continue;
        REQUIRE((row >= 0 && row < ROWS));
        const int e = Layout::offset(row, col);
        for (int k = 0; k < 8; ++k) ++copies[size_t(e + k)];
        a.active |= 1u << lane;
        a.addr[lane] = uint32_t(e * 2);
      }
      if (fs::bank::wavefronts(a) != fs::bank::ideal_wavefronts(a)) ++conflicted;
    }
  int wrong = 0;
  for (int c : copies) wrong += c != 1;
  CHECK(wrong == 0);
  CHECK(conflicted == 0);
}

TEST_CASE("step 11: the tile copies cover each chunk once, conflict-free", "[step11][bank]") {
  auto check = [](auto tr, auto dq) {
    using Tr = decltype(tr);
    using Dq = decltype(dq);
    check_copy_tile<typename Tr::Layout, Tr::BLOCK_KV, Tr::NUM_THREADS>();  // K, V
    check_copy_tile<typename Tr::Layout, Tr::BLOCK_Q, Tr::NUM_THREADS>();   // Q, dO
    check_copy_tile<typename Dq::Layout, Dq::BLOCK_Q, Dq::NUM_THREADS>();   // dq_kernel's Q, dO
    check_copy_tile<typename Dq::Layout, Dq::BLOCK_KV, Dq::NUM_THREADS>();  // dq_kernel's K, V
  };
  check(bw::TraitsOf<bw::kD64>{}, bw::DqTraitsOf<bw::kD64>{});
  check(bw::TraitsOf<bw::kD128>{}, bw::DqTraitsOf<bw::kD128>{});
  check(bw::TraitsOf<bw::kD128_S>{}, bw::DqTraitsOf<bw::kD128_S>{});
  check(bw::TraitsOf<bw::kD192>{}, bw::DqTraitsOf<bw::kD192>{});
  check(bw::TraitsOf<bw::kD192_S>{}, bw::DqTraitsOf<bw::kD192_S>{});
  check(bw::TraitsOf<bw::kD256>{}, bw::DqTraitsOf<bw::kD256>{});
  check(bw::TraitsOf<bw::kD256_S>{}, bw::DqTraitsOf<bw::kD256_S>{});
}

TEST_CASE("step 11: the swizzle's origin identity behind the kernels' lane offsets", "[step11]") {
  // offset(row0 + r, col0 + c) = offset(r, c) + origin(row0, col0) for row0 % 8 == 0, col0 % 64 == 0,
  // c < 64: each address is a per-lane offset plus a constant.
  auto check = [](auto layout, int rows) {
    using L = decltype(layout);
    int bad = 0;
    for (int row0 = 0; row0 < rows; row0 += 8)
      for (int col0 = 0; col0 < L::kCols; col0 += 64)
        for (int r = 0; r < 8; ++r)
          for (int c = 0; c < 64; ++c) bad += L::offset(row0 + r, col0 + c) != L::offset(r, c) + L::origin(row0, col0);
    CHECK(bad == 0);
  };
  check(bw::Swizzled128Layout<64>{}, 128);
  check(bw::Swizzled128Layout<128>{}, 128);
  check(bw::Swizzled128Layout<192>{}, 64);
  check(bw::Swizzled128Layout<256>{}, 64);
  // The 64-byte swizzle of 32-query dSᵀ and Pᵀ: it repeats every 8 rows too (a_fragment's and dQ's
  // DsLayout::origin(row0, 0) + per-lane offset, row0 a multiple of 16).
  using S64 = bw::Swizzled64Layout<32>;
  int bad = 0;
  for (int row0 = 0; row0 < 128; row0 += 8)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 32; ++c) bad += S64::offset(row0 + r, c) != S64::offset(r, c) + S64::origin(row0, 0);
  CHECK(bad == 0);
}

TEST_CASE("step 11: the dS^T layouts are bijections onto their tiles, 16-byte chunks kept whole", "[step11]") {
  // Every element of [rows, COLS] lands once in [0, size(rows)), and the 8 elements of an aligned
  // 16-byte chunk stay together, in order, at a 16-byte boundary (ldmatrix rows, 4-byte stores).
  auto check = [](auto layout, int rows) {
    using L = decltype(layout);
    CAPTURE(L::kCols, rows);
    std::vector<int> hits(size_t(L::size(rows)), 0);
    int outside = 0, split = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < L::kCols; ++c) {
        const int e = L::offset(r, c);
        if (e < 0 || e >= L::size(rows)) {
          ++outside;
          continue;
        }
        ++hits[size_t(e)];
        split += e % 8 != c % 8 || e / L::kCols != r;
      }
    CHECK(outside == 0);
    CHECK(split == 0);
    CHECK(std::count(hits.begin(), hits.end(), 1) == L::size(rows));
  };
  check(bw::Swizzled64Layout<32>{}, 128);
  check(bw::Swizzled128Layout<64>{}, 128);
  check(bw::TraitsOf<bw::kD64>::DsLayout{}, bw::TraitsOf<bw::kD64>::BLOCK_KV);
  check(bw::TraitsOf<bw::kD128>::DsLayout{}, bw::TraitsOf<bw::kD128>::BLOCK_KV);
  check(bw::TraitsOf<bw::kD256_S>::DsLayout{}, bw::TraitsOf<bw::kD256_S>::BLOCK_KV);
}

TEST_CASE("step 11: the first query tile of a K/V tile is the first that sees one of its keys", "[step11]") {
  for (bool causal : {false, true})
    for (int64_t sq : seqlens())
      for (int64_t sk : seqlens()) {
        Seen seen(sq, sk, causal);
        for (const auto& [bq, bkv] : kBlocks)
          for (int64_t kv0 = 0; kv0 < sk; kv0 += bkv) {
            const int first = bw::first_query_tile(kv0, bq, sq, sk, causal);
            const int64_t q_tiles = bw::tiles(sq, bq);
            int64_t brute = q_tiles;  // the first query tile with a row that sees a key of the K/V tile
            for (int64_t t = q_tiles - 1; t >= 0; --t)
              if (seen.count(t * bq, (t + 1) * bq, kv0, kv0 + bkv) > 0) brute = t;
            CAPTURE(causal, sq, sk, bq, bkv, kv0, first, brute);
            CHECK(first >= 0);
            if (brute < q_tiles)
              CHECK(first == brute);  // none before it sees a key (no gradient lost), it does (no wasted visit)
            else
              CHECK(q_tiles - first <= 0);  // no tile sees one: no visits
          }
      }
}

TEST_CASE("step 11: a tile pair is masked exactly when some real row misses some key of it", "[step11]") {
  for (bool causal : {false, true})
    for (int64_t sq : seqlens())
      for (int64_t sk : seqlens()) {
        Seen seen(sq, sk, causal);
        for (const auto& [bq, bkv] : kBlocks)
          for (int64_t q0 = 0; q0 < sq; q0 += bq)
            for (int64_t kv0 = 0; kv0 < sk; kv0 += bkv) {
              const bool masked = bw::tile_needs_mask(q0, kv0, bkv, sq, sk, causal);
              const bool needed = seen.some_hidden(q0, q0 + bq, kv0, kv0 + bkv);
              CAPTURE(causal, sq, sk, bq, bkv, q0, kv0);
              CHECK(masked == needed);  // masked when needed (correct), only then (no wasted mask)
            }
      }
}

TEST_CASE("step 11: a query tile visits exactly the K/V tiles its rows see", "[step11]") {
  for (bool causal : {false, true})
    for (int64_t sq : seqlens())
      for (int64_t sk : seqlens()) {
        Seen seen(sq, sk, causal);
        for (const auto& [bq, bkv] : kBlocks)
          for (int64_t q0 = 0; q0 < sq; q0 += bq) {
            const int count = bw::kv_tiles_seen(q0, bq, bkv, sq, sk, causal);
            int64_t brute = 0;  // one past the last K/V tile with a pair seen
            for (int64_t j = 0; j * bkv < sk; ++j)
              if (seen.count(q0, q0 + bq, j * bkv, (j + 1) * bkv) > 0) brute = j + 1;
            CAPTURE(causal, sq, sk, bq, bkv, q0);
            CHECK(count == brute);
          }
      }
}

TEST_CASE("step 11: padded rows hold every query tile of both kernels", "[step11]") {
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 1000; ++n) lengths.push_back(n);
  for (int64_t n : {int64_t(1) << 20, int64_t(INT32_MAX) - 127}) lengths.push_back(n);
  std::vector<int> block_qs;
  for (const bw::Config& c : bw::kConfigs) {
    block_qs.push_back(c.block_q);
    block_qs.push_back(c.dq_block_q);
  }
  for (int64_t sq : lengths) {
    const int64_t rows = bw::padded_rows(sq);
    CAPTURE(sq, rows);
    CHECK(rows % 128 == 0);
    CHECK(rows >= sq);
    CHECK(rows < sq + 128);
    for (int bq : block_qs) {
      // The last tile's rows (and the LSE/D chunks copied for them) end inside the padded rows.
      const int64_t q_tiles = bw::tiles(sq, bq);
      CHECK(q_tiles * bq <= rows);
      CHECK(q_tiles * bq >= sq);
    }
  }
}

TEST_CASE("step 11: the table has the narrowest tiles for every head_dim, and its shared memory", "[step11]") {
  // Bytes a block may opt in to: sm_90, sm_80, sm_86/sm_89 (and a GPU too small for any row).
  const int64_t kSm90 = 227 * 1024, kSm80 = 163 * 1024, kSm86 = 99 * 1024, kTiny = 48 * 1024;
  for (int64_t d = 8; d <= 256; d += 8)
    for (bool det : {false, true}) {
      CAPTURE(d, det);
      CHECK(bw::padded_width(d) == (d + 63) / 64 * 64);
      for (int64_t optin : {kSm90, kSm80, kSm86}) {
        const int c = bw::choose_config(d, det, optin);
        CAPTURE(optin, c);
        REQUIRE((c >= 0 && c < bw::kNumConfigs));  // every GPU from sm_80 on has a row for every head_dim
        CHECK(bw::kConfigs[c].head_dim == bw::padded_width(d));
        CHECK(bw::smem_needed(bw::kConfigs[c], det) <= optin);
        for (int e = 0; e < c; ++e)  // no earlier row of the width would have fitted
          CHECK((bw::kConfigs[e].head_dim != bw::padded_width(d) || bw::smem_needed(bw::kConfigs[e], det) > optin));
      }
      // The fast rows where they fit: sm_80 and sm_90 run the first row of each width in the atomic mode.
      const int first = d <= 64 ? bw::kD64 : d <= 128 ? bw::kD128 : d <= 192 ? bw::kD192 : bw::kD256;
      if (!det) CHECK(bw::choose_config(d, det, kSm80) == first);
      CHECK(bw::choose_config(d, det, kSm90) == first);
      CHECK(bw::choose_config(d, det, kTiny) == -1);
      CHECK(bw::min_smem_needed(d, det) > kTiny);
      CHECK(bw::min_smem_needed(d, det) <= kSm86);
    }
  // The byte counts choose_config uses are the kernels' own.
  auto sizes = [](auto tr, auto dq, const bw::Config& cfg) {
    CHECK(bw::main_smem_bytes(cfg) == decltype(tr)::SMEM_BYTES);
    CHECK(bw::dq_smem_bytes(cfg) == decltype(dq)::SMEM_BYTES);
  };
  sizes(bw::TraitsOf<bw::kD64>{}, bw::DqTraitsOf<bw::kD64>{}, bw::kConfigs[bw::kD64]);
  sizes(bw::TraitsOf<bw::kD128>{}, bw::DqTraitsOf<bw::kD128>{}, bw::kConfigs[bw::kD128]);
  sizes(bw::TraitsOf<bw::kD128_S>{}, bw::DqTraitsOf<bw::kD128_S>{}, bw::kConfigs[bw::kD128_S]);
  sizes(bw::TraitsOf<bw::kD192>{}, bw::DqTraitsOf<bw::kD192>{}, bw::kConfigs[bw::kD192]);
  sizes(bw::TraitsOf<bw::kD192_S>{}, bw::DqTraitsOf<bw::kD192_S>{}, bw::kConfigs[bw::kD192_S]);
  sizes(bw::TraitsOf<bw::kD256>{}, bw::DqTraitsOf<bw::kD256>{}, bw::kConfigs[bw::kD256]);
  sizes(bw::TraitsOf<bw::kD256_S>{}, bw::DqTraitsOf<bw::kD256_S>{}, bw::kConfigs[bw::kD256_S]);
  auto check = [](auto tr, auto dq, const bw::Config& cfg) {
    using Tr = decltype(tr);
    using Dq = decltype(dq);
    CAPTURE(cfg.head_dim);
    CHECK(Tr::HEAD_DIM == cfg.head_dim);
    CHECK(Tr::BLOCK_Q == cfg.block_q);
    CHECK(Tr::BLOCK_KV == cfg.block_kv);
    CHECK(Tr::Q_STAGES == cfg.q_stages);
    CHECK(Tr::D_SLICES == cfg.d_slices);
    CHECK(Tr::MIN_BLOCKS == cfg.min_blocks);
    CHECK(Tr::KEY_TILES == cfg.key_tiles);
    CHECK(Tr::COL_GROUPS == cfg.col_groups);
    // A warp per 16·KEY_TILES keys and share of the queries and columns: COL_GROUPS warps per key group.
    CHECK(Tr::NUM_THREADS == 32 * cfg.col_groups * cfg.block_kv / (16 * cfg.key_tiles));
    CHECK(Tr::WARP_QUERIES * cfg.col_groups == cfg.block_q);
    CHECK(Tr::WARP_COLS * cfg.col_groups * cfg.d_slices == cfg.head_dim);
    CHECK(Tr::SLICE * cfg.d_slices == cfg.head_dim);
    // dQ: 32-row warp tiles, the warps' row groups times column groups.
    CHECK(Tr::DQ_ROW_GROUPS * 32 == cfg.block_q);
    CHECK(Tr::DQ_ROW_GROUPS * Tr::DQ_COL_GROUPS == Tr::NUM_WARPS);
    CHECK(Tr::DQ_COLS * Tr::DQ_COL_GROUPS == Tr::SLICE);
    // dSᵀ rows of 32 queries take step 07's 64-byte swizzle, wider rows the 128-byte one.
    constexpr bool swizzle64 = std::is_same_v<typename Tr::DsLayout, bw::Swizzled64Layout<Tr::BLOCK_Q>>;
    constexpr bool swizzle128 = std::is_same_v<typename Tr::DsLayout, bw::Swizzled128Layout<Tr::BLOCK_Q>>;
    CHECK(swizzle64 == (cfg.block_q == 32));
    CHECK(swizzle128 == (cfg.block_q != 32));
    // K, V [BLOCK_KV, HEAD_DIM]; Q, dO stages × [BLOCK_Q, HEAD_DIM]; dSᵀ [BLOCK_KV, BLOCK_Q] and, when
    // warps share keys, Pᵀ [BLOCK_KV, BLOCK_Q], 2 bytes each; LSE₂ and D stages × BLOCK_Q, 4 bytes each.
    const int64_t ds_tiles = cfg.col_groups > 1 ? 2 : 1;
    const int64_t main = 2 * (2 * cfg.block_kv * cfg.head_dim) + 2 * (2 * cfg.q_stages * cfg.block_q * cfg.head_dim) +
                         2 * (ds_tiles * cfg.block_kv * cfg.block_q) + 4 * (2 * cfg.q_stages * cfg.block_q);
    CHECK(Tr::SMEM_BYTES == main);
    // dq_kernel: Q, dO [BLOCK_Q, HEAD_DIM]; K, V two stages of [BLOCK_KV, HEAD_DIM].
    CHECK(Dq::HEAD_DIM == cfg.head_dim);
    CHECK(Dq::SLICE * cfg.d_slices == cfg.head_dim);
    CHECK(Dq::BLOCK_Q == cfg.dq_block_q);
    CHECK(Dq::BLOCK_KV == cfg.dq_block_kv);
    CHECK(Dq::NUM_THREADS == 32 * Dq::BLOCK_Q / 16);
    CHECK(Dq::SMEM_BYTES == 2 * (2 * Dq::BLOCK_Q * cfg.head_dim) + 2 * (2 * 2 * Dq::BLOCK_KV * cfg.head_dim));
  };
  check(bw::TraitsOf<bw::kD64>{}, bw::DqTraitsOf<bw::kD64>{}, bw::kConfigs[bw::kD64]);
  check(bw::TraitsOf<bw::kD128>{}, bw::DqTraitsOf<bw::kD128>{}, bw::kConfigs[bw::kD128]);
  check(bw::TraitsOf<bw::kD128_S>{}, bw::DqTraitsOf<bw::kD128_S>{}, bw::kConfigs[bw::kD128_S]);
  check(bw::TraitsOf<bw::kD192>{}, bw::DqTraitsOf<bw::kD192>{}, bw::kConfigs[bw::kD192]);
  check(bw::TraitsOf<bw::kD192_S>{}, bw::DqTraitsOf<bw::kD192_S>{}, bw::kConfigs[bw::kD192_S]);
  check(bw::TraitsOf<bw::kD256>{}, bw::DqTraitsOf<bw::kD256>{}, bw::kConfigs[bw::kD256]);
  check(bw::TraitsOf<bw::kD256_S>{}, bw::DqTraitsOf<bw::kD256_S>{}, bw::kConfigs[bw::kD256_S]);
}

TEST_CASE("step 11: its copies of step 07's fragment maps and swizzle are step 07's", "[step11]") {
  namespace f7 = fs::step07::frag;
  for (int lane = 0; lane < kLanes; ++lane) {
    CAPTURE(lane);
    CHECK(frag::group_of(lane) == f7::group_of(lane));
    CHECK(frag::thread_in_group(lane) == f7::thread_in_group(lane));
    CHECK(frag::ldmatrix_matrix_of(lane) == f7::ldmatrix_matrix_of(lane));
    CHECK(frag::ldmatrix_row_of(lane) == f7::ldmatrix_row_of(lane));
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const f7::Coord a = f7::mma_a(lane, reg, half);
        CHECK(frag::mma_a(lane, reg, half) == frag::Coord{a.row, a.col});
      }
    for (int reg = 0; reg < 2; ++reg)
      for (int half = 0; half < 2; ++half) {
        const f7::Coord b = f7::mma_b(lane, reg, half);
        CHECK(frag::mma_b(lane, reg, half) == frag::Coord{b.row, b.col});
        const bool trans = reg == 1;
        const f7::Coord e = f7::ldmatrix_element(lane, half, trans);
        CHECK(frag::ldmatrix_element(lane, half, trans) == frag::Coord{e.row, e.col});
      }
    for (int i = 0; i < 4; ++i) {
      const f7::Coord c = f7::mma_c(lane, i);
      CHECK(frag::mma_c(lane, i) == frag::Coord{c.row, c.col});
    }
    for (int n_half = 0; n_half < 2; ++n_half)
      for (int i = 0; i < 4; i += 2) CHECK(frag::mma_a_reg_of_c(n_half, i) == f7::mma_a_reg_of_c(n_half, i));
    const f7::Coord q = f7::ldmatrix_x4_quadrants(lane), k = fs::step07::ldmatrix_x4_k_pair(lane);
    CHECK(frag::ldmatrix_x4_quadrants(lane) == frag::Coord{q.row, q.col});
    CHECK(bw::ldmatrix_x4_k_pair(lane) == frag::Coord{k.row, k.col});
  }
  auto same = [](auto mine, auto theirs, int rows) {
    using A = decltype(mine);
    using B = decltype(theirs);
    int bad = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < A::kCols; ++c) bad += A::offset(r, c) != B::offset(r, c);
    CHECK(bad == 0);
    CHECK(A::size(rows) == B::size(rows));
  };
  same(bw::Swizzled128Layout<64>{}, fs::step07::Swizzled128Layout<64>{}, 128);
  same(bw::Swizzled128Layout<128>{}, fs::step07::Swizzled128Layout<128>{}, 128);
  same(bw::Swizzled128Layout<192>{}, fs::step07::Swizzled128Layout<192>{}, 64);
  same(bw::Swizzled128Layout<256>{}, fs::step07::Swizzled128Layout<256>{}, 64);
  same(bw::Swizzled64Layout<32>{}, fs::step07::Swizzled64Layout<32>{}, 128);
}
