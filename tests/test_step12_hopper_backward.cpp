// Step 12's index math on the CPU (steps/12_hopper_backward/traits.h), against the PTX ISA's canonical
// shared-memory layouts (tests/ptx_isa.h) and brute force:
//   - every descriptor view of the five products reads exactly the elements the TMA (or the dSᵀ stores)
//     put there: Sᵀ and dPᵀ (K-major A and B), dV and dK (MN-major B), dQ (MN-major A and B);
//   - the dSᵀ stores write each (key, query) of the tile once, from the A fragments of dK, and a warp's
//     4-byte stores are conflict-free;
//   - the two warpgroups' dQ tiles cover the block's [BLOCK_Q, HEAD_DIM] exactly once;
//   - the shared-memory map, the tile table, and the refusals.
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "fake_device.h"
#include "common/backward/rules.h"
#include "common/model/bank_model.h"
#include "common/harness/chain.h"
#include "ptx_isa.h"
#include "steps/12_hopper_backward/traits.h"

namespace {

namespace s12 = fs::step12;
using fs::ptx_isa::isa_k_major_address;
using fs::ptx_isa::isa_mn_major_address;
using fs::ptx_isa::isa_swizzled_address;
using fs::ptx_isa::isa_tma_address;

template <class Tr>
void check_views() {
  constexpr int BQ = Tr::BLOCK_Q, BKV = s12::BLOCK_KV, D = Tr::HEAD_DIM;
  CAPTURE(D, BQ);
  const uint32_t base = 0x400;  // a 1024-byte-aligned shared address
  const uint32_t k = base + Tr::K_OFFSET, q = base + Tr::Q_OFFSET + Tr::Q_BYTES, ds = base + Tr::DS_OFFSET;
  // Sᵀ = K·Qᵀ, k16 step ks: A(m, kd) = K[64·wg + m][16·ks + kd], B(kd, n) = Q[n][16·ks + kd].
  for (int ks = 0; ks < Tr::D_K_STEPS; ++ks)
    for (int kd = 0; kd < 16; ++kd) {
      const int col = 16 * ks + kd;
      for (int wg = 0; wg < s12::NUM_WARPGROUPS; ++wg)
        for (int m = 0; m < 64; ++m)
          REQUIRE(isa_k_major_address(k + s12::kv_rows_step(wg, ks), fs::step08::SBO_8_ROWS, m, kd) ==
                  isa_tma_address(k, BKV, col / 64, 64 * wg + m, col % 64));
      for (int n = 0; n < BQ; ++n)
        REQUIRE(isa_k_major_address(q + s12::q_k_major_step(BQ, ks), fs::step08::SBO_8_ROWS, n, kd) ==
                isa_tma_address(q, BQ, col / 64, n, col % 64));
    }
  // dV += Pᵀ·dO (and dK += dSᵀ·Q), k16 step kk: B(kq, n) = dO[16·kk + kq][n], MN-major.
  for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
    for (int kq = 0; kq < 16; ++kq)
      for (int n = 0; n < D; ++n)
        REQUIRE(isa_mn_major_address(q + s12::q_mn_major_step(kk), s12::mn_major_lbo(BQ), fs::step08::SBO_8_ROWS, kq,
                                     n) == isa_tma_address(q, BQ, n / 64, 16 * kk + kq, n % 64));
  // dQ = dS·K for each warpgroup's tile, k16 step kk over keys: A(m, kk') = dS[64·row_tile + m][16·kk + kk'],
  // stored as dSᵀ at ds_offset(key, query); B(kk', n) = K[16·kk + kk'][64·col_block + n]. A is MN-major
  // (m contiguous), so the ISA's MN-major address of A element (k, m) is the one to match.
  for (int wg = 0; wg < s12::NUM_WARPGROUPS; ++wg) {
    const s12::DqTile t = s12::dq_tile_of(wg, BQ);
    for (int kk = 0; kk < BKV / 16; ++kk)
      for (int kk2 = 0; kk2 < 16; ++kk2) {
        const int key = 16 * kk + kk2;
        for (int m = 0; m < 64; ++m)
          REQUIRE(isa_mn_major_address(ds + s12::ds_step(t.row_tile, kk), s12::mn_major_lbo(BKV),
                                       fs::step08::SBO_8_ROWS, kk2, m) ==
                  isa_swizzled_address(ds + uint32_t(t.row_tile) * uint32_t(BKV) * 128 + uint32_t(key) * 128 +
                                       uint32_t(m) * 2));
        for (int n = 0; n < 64; ++n)
          REQUIRE(isa_mn_major_address(k + s12::k_mn_major_step(t.col_block, kk), s12::mn_major_lbo(BKV),
                                       fs::step08::SBO_8_ROWS, kk2, n) ==
                  isa_tma_address(k, BKV, t.col_block, key, n));
      }
  }
  // dSᵀ is stored as the TMA would store a [BLOCK_KV, BLOCK_Q] tile: query 64·c + x of key r in box c.
  for (int key = 0; key < BKV; ++key)
    for (int query = 0; query < BQ; ++query)
      REQUIRE(ds + s12::ds_offset(key, query) == isa_tma_address(ds, BKV, query / 64, key, query % 64));
}

template <class Tr>
void check_ds_stores() {
  constexpr int BQ = Tr::BLOCK_Q;
  // The kernel stores register r of k16 step kk of dSᵀ's A fragment (elements (key, query), (key,
  // query + 1)) at ds_offset(64·wg + row, 16·kk + col): every element of the tile exactly once.
  std::set<uint32_t> written;
  for (int wg = 0; wg < s12::NUM_WARPGROUPS; ++wg)
    for (int t = 0; t < 128; ++t)
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
        for (int r = 0; r < 4; ++r)
          for (int h = 0; h < 2; ++h) {
            const fs::step08::frag::Coord c = fs::step08::wgmma_a(t, r, h);
            REQUIRE(c.col % 2 == h);  // the pair is one aligned 4-byte word
            written.insert(s12::ds_offset(64 * wg + c.row, 16 * kk + c.col));
          }
  CHECK(written.size() == size_t(s12::BLOCK_KV * BQ));
  CHECK(*written.rbegin() == uint32_t(Tr::DS_BYTES - 2));
  // One warp's 4-byte stores of one (kk, r): 8 rows × 4 threads, 8 rows of 16 bytes in 8 different
  // chunks: one wavefront.
  for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
    for (int r = 0; r < 4; ++r) {
      fs::bank::WarpAccess a{};
      for (int lane = 0; lane < 32; ++lane) {
        const fs::step08::frag::Coord c = fs::step08::wgmma_a(lane, r, 0);
        a.addr[lane] = s12::ds_offset(c.row, 16 * kk + c.col);
      }
      CAPTURE(kk, r);
      CHECK(fs::bank::wavefronts(a) == 1);
    }
}

// 12c's dQ staging (dq_slot): each warp's 8-byte stores of its accumulator pairs take the ideal two
// wavefronts, and a warpgroup's slots are every float of its 64 × 64 tile once, so that the block's
// two tiles fill the query tile's [BLOCK_Q, HEAD_DIM] floats of the accumulator exactly.
template <class Tr>
void check_dq_slots() {
  std::set<int> slots;
  for (int warp = 0; warp < 4; ++warp)
    for (int i = 0; i < Tr::DQ_REGS; i += 2) {
      fs::bank::WarpAccess a{};
      a.width = 8;
      for (int lane = 0; lane < 32; ++lane) {
        const int slot = s12::dq_slot(32 * warp + lane, i);
        REQUIRE(slot % 2 == 0);
        a.addr[lane] = uint32_t(slot * 4);
        slots.insert(slot);
        slots.insert(s12::dq_slot(32 * warp + lane, i + 1));
      }
      CAPTURE(warp, i);
      CHECK(fs::bank::wavefronts(a) == 2);
    }
  CHECK(slots.size() == size_t(s12::DQ_TILE * s12::DQ_TILE));
  CHECK(*slots.rbegin() == s12::DQ_TILE * s12::DQ_TILE - 1);
  CHECK(s12::NUM_WARPGROUPS * s12::DQ_TILE * s12::DQ_TILE == Tr::BLOCK_Q * Tr::HEAD_DIM);
  CHECK(Tr::DQ_TILE_BYTES % 16 == 0);
}

// 12c's conversion reads the accumulator 8 floats at a time and stores them as one 16-byte row
// segment: each 8 consecutive slots must be one row's 8 consecutive columns (8-aligned), starting
// where dq_run_start (the kernel's store address) says.
void check_dq_slot_rows() {
  std::map<int, fs::step08::frag::Coord> at;  // slot -> the cell of the 64 x 64 tile it holds
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < s12::DQ_TILE / 2; ++i) at[s12::dq_slot(t, i)] = fs::step08::wgmma_acc(t, i);
  REQUIRE(at.size() == size_t(s12::DQ_TILE * s12::DQ_TILE));
  for (int slot = 0; slot < s12::DQ_TILE * s12::DQ_TILE; slot += 8) {
    const fs::step08::frag::Coord first = s12::dq_run_start(slot);
    CAPTURE(slot);
    CHECK(first.col % 8 == 0);
    for (int k = 0; k < 8; ++k) {
      CHECK(at[slot + k].row == first.row);
      CHECK(at[slot + k].col == first.col + k);
    }
  }
}

template <class Tr>
void check_dq_cover() {
  std::set<std::pair<int, int>> cells;
  for (int wg = 0; wg < s12::NUM_WARPGROUPS; ++wg) {
    const s12::DqTile t = s12::dq_tile_of(wg, Tr::BLOCK_Q);
    REQUIRE(t.row_tile < Tr::DQ_ROW_TILES);
    REQUIRE(t.col_block < Tr::COL_BLOCKS);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 64; ++c) cells.insert({64 * t.row_tile + r, 64 * t.col_block + c});
  }
  CHECK(cells.size() == size_t(Tr::BLOCK_Q * Tr::HEAD_DIM));
}

template <class Tr>
void check_smem_map() {
  const int offsets[] = {Tr::K_OFFSET, Tr::V_OFFSET, Tr::Q_OFFSET, Tr::Q_OFFSET + Tr::Q_BYTES, Tr::DO_OFFSET,
                         Tr::DO_OFFSET + Tr::Q_BYTES, Tr::DS_OFFSET};
  for (int o : offsets) CHECK(o % 1024 == 0);  // every swizzled tile on the swizzle's repeat
  CHECK(Tr::LSE_OFFSET % 16 == 0);             // bulk copies: 16-byte aligned
  CHECK(Tr::D_OFFSET % 16 == 0);
  CHECK(Tr::DQ_OFFSET % 16 == 0);
  CHECK(Tr::BARRIER_OFFSET - Tr::DQ_OFFSET == (Tr::has(s12::kBulkDq) ? Tr::DQ_TILE_BYTES : 0));
  CHECK(Tr::VISIT_BYTES == uint32_t(2 * Tr::BLOCK_Q * Tr::HEAD_DIM * 2 + 2 * Tr::BLOCK_Q * 4));
  CHECK(Tr::SMEM_BYTES <= 227 * 1024);
}

template <int... I>
void check_all(std::integer_sequence<int, I...>) {
  (check_views<s12::TraitsOf<I>>(), ...);
  (check_ds_stores<s12::TraitsOf<I>>(), ...);
  (check_dq_cover<s12::TraitsOf<I>>(), ...);
  (check_dq_slots<s12::TraitsOf<I>>(), ...);
  check_dq_slot_rows();
  (check_smem_map<s12::Traits<s12::kConfigs[I].head_dim, s12::kConfigs[I].block_q, s12::kBulkDq>>(), ...);
  (check_smem_map<s12::TraitsOf<I>>(), ...);
}

}  // namespace

TEST_CASE("step 12: every wgmma operand view reads what the TMA and the dSᵀ stores wrote", "[step12]") {
  check_all(std::make_integer_sequence<int, s12::kNumConfigs>{});
}

TEST_CASE("step 12: the tile table covers head_dim up to 128 and the registers' budget", "[step12]") {
  for (int64_t d = 8; d <= 256; d += 8) {
    const int c = s12::config_for(d);
    CAPTURE(d, c);
    if (d > 128) {
      CHECK(c == -1);
      continue;
    }
    REQUIRE(c >= 0);
    CHECK(s12::kConfigs[c].head_dim >= d);
    CHECK(s12::kConfigs[c].head_dim - d < 64);
    // Per thread at the peak: dK, dV (HEAD_DIM / 2 each) and Sᵀ, dPᵀ (BLOCK_Q / 2 each).
    CHECK(s12::kConfigs[c].head_dim + s12::kConfigs[c].block_q <= 192);
  }
  fs::BackwardProblem p = fs::make_backward_problem(1, 100, 100, 4, 2, 64, fs::DType::fp16, true, 0);
  CHECK(s12::grid_blocks(p.attention) == 1 * 2 * 1);
  p = fs::make_backward_problem(3, 100, 257, 4, 2, 64, fs::DType::fp16, true, 0);
  CHECK(s12::grid_blocks(p.attention) == 3 * 2 * 3);
}

TEST_CASE("step 12 runs on sm_90 only and refuses, in a sentence, what it does not run", "[step12][registry]") {
  const char* id = GENERATE("12a_hopper_data_path", "12b_async_wgmma", "12c_bulk_dq");
  INFO(id);
  const fs::Step* s = fs::find_step(id);
  REQUIRE(s != nullptr);
  CHECK(s->arch_specific == 90);
  CHECK_FALSE(s->forward.present());
  REQUIRE(s->backward.present());
  const fs::BackwardProblem wide = fs::make_backward_problem(1, 64, 64, 2, 2, 160, fs::DType::fp16, false, 0);
  const std::string why = s->backward.limits(wide);
  CHECK(why.find("head_dim 160") != std::string::npos);
  CHECK(why.find("11_backward") != std::string::npos);
  fs::DeviceInfo h200;
  h200.compute_capability = 90;
  h200.smem_per_block_optin = 227 * 1024;
  const fs::BackwardProblem ok = fs::make_backward_problem(1, 64, 64, 2, 2, 128, fs::DType::bf16, true, 1);
  CHECK(s->backward.limits(ok).empty());
  CHECK(s->backward.claims(ok, h200));
  CHECK_FALSE(s->backward.claims(wide, h200));
  fs::DeviceInfo small = h200;
  small.smem_per_block_optin = 99 * 1024;
  CHECK_FALSE(s->backward.claims(ok, small));
  const fs::Plan plan = s->backward.plan(ok, small);
  CHECK_FALSE(plan.accepted());
  CHECK(plan.refusal.find("this GPU allows 101376") != std::string::npos);
}

TEST_CASE("step 12 explains its maps and each sub-step's schedule without a GPU", "[step12]") {
  for (const char* id : {"12a_hopper_data_path", "12b_async_wgmma", "12c_bulk_dq"}) {
    INFO(id);
    const fs::Step* s = fs::find_step(id);
    REQUIRE(s != nullptr);
    REQUIRE(s->explain);
    std::ostringstream out;
    s->explain(out);
    CHECK(out.str().find("imm-trans-a 1") != std::string::npos);
    CHECK(out.str().find("HEAD_DIM 128: BLOCK_Q 64") != std::string::npos);
    const bool async = std::string(id) != "12a_hopper_data_path", bulk = std::string(id) == "12c_bulk_dq";
    CHECK((out.str().find("[S^T] [dP^T] wait 1") != std::string::npos) == async);
    CHECK((out.str().find("[S^T dP^T] wait 0") != std::string::npos) == !async);
    CHECK((out.str().find("one bulk reduce-add") != std::string::npos) == bulk);
    CHECK((out.str().find("atomics  wait 0") != std::string::npos) == (async && !bulk));
  }
}

// The rule flash_steps' default_step applies to a backward problem (python/flash_steps/_torch.py: the
// newest registered step whose plan accepts it on the device), on the registry itself: 13c (12c's kernel,
// softcapping, the window and packed batches off) on an H100/H200 up to head_dim 128; step 11 above that, and on
// any other GPU.
TEST_CASE("the default backward step: 13c on sm_90 up to head_dim 128, step 11 elsewhere", "[step12][registry]") {
  auto newest = [](const fs::BackwardProblem& p, const fs::DeviceInfo& dev) {
    const std::vector<fs::Step>& all = fs::steps();
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (it->backward.present() && fs::plan(*it, p, dev).accepted()) return it->id;
    return std::string("none");
  };
  const fs::DeviceInfo h200 = fake_device(90, 227 * 1024), a100 = fake_device(80, 163 * 1024),
                       l40 = fake_device(89, 99 * 1024);
  for (const bool causal : {false, true})
    for (const int64_t d : {64, 96, 128}) {
      const fs::BackwardProblem p = fs::make_backward_problem(2, 1000, 1000, 8, 2, d, fs::DType::bf16, causal, 0);
      INFO("head_dim " << d << ", causal " << causal);
      CHECK(newest(p, h200) == "13c_varlen");
      CHECK(newest(p, a100) == "11_backward");
      CHECK(newest(p, l40) == "11_backward");
    }
  const fs::BackwardProblem wide = fs::make_backward_problem(2, 1000, 1000, 8, 8, 256, fs::DType::fp16, true, 0);
  CHECK(newest(wide, h200) == "11_backward");
  const fs::BackwardProblem deterministic = fs::make_backward_problem(1, 512, 512, 4, 4, 128, fs::DType::fp16, false, 1);
  CHECK(newest(deterministic, h200) == "13c_varlen");
}
