// Step 07's index math on the CPU (steps/07_flash_attention2/traits.h): the K/V tile ranges and the
// mask against brute force, the grid order, the traits table, the swizzle identity behind its
// ldmatrix addresses, the 64-byte swizzle, its ldmatrix operand maps
// simulated against the fragment layout, and its refusals.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "steps/06_ldmatrix_mma/traits.h"
#include "steps/07_flash_attention2/traits.h"

namespace {

namespace fa2 = fs::step07;
namespace frag = fs::step07::frag;
using frag::Coord;

TEST_CASE("step 07: K/V tile ranges match the causal rule and the end of K", "[step07]") {
  for (bool causal : {false, true})
    for (int64_t sq : {1, 7, 63, 64, 65, 128, 129, 300})
      for (int64_t sk : {1, 31, 32, 33, 64, 100, 129, 300})
        for (int block_q : {64, 128})
          for (int block_kv : {32, 64})
            for (int64_t q0 = 0; q0 < sq; q0 += block_q) {
              const int64_t q_rows = std::min<int64_t>(block_q, sq - q0);
              const fa2::KvTiles r = fa2::kv_tiles_for(q0, q_rows, block_kv, sq, sk, causal);
              CAPTURE(causal, sq, sk, block_q, block_kv, q0, r.count, r.unmasked);
              REQUIRE(0 <= r.unmasked);
              REQUIRE(r.unmasked <= r.count);
              for (int64_t j = 0; j * block_kv < sk; ++j) {
                bool some = false, all = true;  // over the real rows and the keys of tile j
                for (int64_t i = q0; i < q0 + q_rows; ++i)
                  for (int64_t key = j * block_kv; key < (j + 1) * block_kv; ++key) {
                    const bool seen = key < sk && (!causal || fs::causal_allows(i, key, sq, sk));
                    some = some || seen;
                    all = all && seen;
                  }
                // Every tile with a visible key is visited; none past `count` is.
                CHECK(some == (j < r.count));
                // A tile visited without a mask must be seen whole by every row, rows past the end of
                // Q included (they start at q0, so they see at least what row q0 sees).
                if (j < r.unmasked) CHECK(all);
              }
            }
}

TEST_CASE("step 07: the mask keeps exactly the keys a row may see", "[step07]") {
  for (bool causal : {false, true})
    for (int64_t sq : {1, 5, 64, 200})
      for (int64_t sk : {1, 5, 64, 200})
        for (int64_t row = 0; row < sq + 8; ++row)  // rows past the end of Q must not break it
          for (int64_t kv0 = 0; kv0 < sk; kv0 += 32) {
            const int last = fa2::last_visible_key(row, kv0, 32, sq, sk, causal);
            CAPTURE(causal, sq, sk, row, kv0, last);
            CHECK((last >= -1 && last < 32));
            if (row >= sq) continue;
            for (int key = 0; key < 32; ++key) {
              const bool seen = kv0 + key < sk && (!causal || fs::causal_allows(row, kv0 + key, sq, sk));
              CHECK(seen == (key <= last));
            }
          }
}

TEST_CASE("step 07: the grid covers every (head, query tile) once, longest tile of a head first", "[step07]") {
  for (uint32_t q_tiles : {1u, 3u, 8u})
    for (uint32_t heads : {1u, 5u}) {
      std::set<std::pair<uint32_t, int>> seen;
      for (uint32_t block = 0; block < q_tiles * heads; ++block) {
        const fa2::BlockTile t = fa2::block_tile(block, q_tiles);
        CHECK(t.bh < heads);
        CHECK((t.q_tile >= 0 && uint32_t(t.q_tile) < q_tiles));
        CHECK(seen.insert({t.bh, t.q_tile}).second);
        // Neighbouring blocks share a head (and so their K/V) except at head boundaries.
        if (block % q_tiles == 0) CHECK(uint32_t(t.q_tile) == q_tiles - 1);
      }
      CHECK(seen.size() == size_t(q_tiles * heads));
    }
  const fs::Problem p = fs::make_problem(3, 1000, 1000, 8, 2, 64, fs::DType::fp16, true);
  CHECK(fa2::grid_blocks(p, 128) == 8 * 3 * 8);
}

// Bytes a block may opt in to on the GPU families the table is written for.
constexpr int64_t kSm90 = 227 * 1024, kSm80 = 163 * 1024, kSm86 = 99 * 1024;

TEST_CASE("step 07: the traits table has a configuration for every head_dim on every GPU family", "[step07]") {
  for (int64_t optin : {kSm90, kSm80, kSm86})
    for (int64_t d = 8; d <= 256; d += 8) {
      CAPTURE(optin, d);
      const int c = fa2::choose_config(fa2::kHeadDimTable, d, optin);
      REQUIRE(c >= 0);
      const fa2::Config& cfg = fa2::kConfigs[c];
      CHECK(cfg.head_dim == fa2::padded_head_dim(d));
      CHECK(cfg.head_dim >= d);
      CHECK(cfg.head_dim - d < 64);  // the next tile width, not any wider one
      CHECK(fa2::smem_bytes(cfg) <= optin);
    }
  // The tuned head dims on the H200: two K/V buffers.
  CHECK(fa2::choose_config(fa2::kHeadDimTable, 128, kSm90) == fa2::kD128_S2);
  CHECK(fa2::choose_config(fa2::kHeadDimTable, 64, kSm90) == fa2::kD64);
  // Two blocks of 128 threads per SM wherever the tiles of 4-warp configurations are chosen: the
  // SM has the opt-in limit + 1 KiB, and each block reserves 1 KiB more.
  for (int64_t optin : {kSm90, kSm80, kSm86})
    for (int64_t d : {32, 64, 96, 128}) {
      const fa2::Config& cfg = fa2::kConfigs[fa2::choose_config(fa2::kHeadDimTable, d, optin)];
      CAPTURE(optin, d);
      CHECK(2 * (fa2::smem_bytes(cfg) + 1024) <= optin + 1024);
    }
  CHECK(fa2::choose_config(fa2::kHeadDimTable, 256, 48 * 1024) == -1);
  CHECK(fa2::min_smem_bytes(fa2::kHeadDimTable, 256) == 64 * 1024);
}

// Layout::offset(row0 + r, col0 + c) == Layout::offset(r, col0 % SWIZZLE_COLS + c) + origin(row0, col0)
// for every 16×16 operand tile a kernel of this configuration reads.
template <int CONFIG>
void check_origin_identity() {
  using Tr = fa2::TraitsOf<CONFIG, fa2::kHeadDimTable>;
  using L = typename Tr::Layout;
  for (int row0 = 0; row0 + 16 <= Tr::BLOCK_Q; row0 += 8)
    for (int col0 = 0; col0 + 16 <= Tr::HEAD_DIM; col0 += 16)
      for (int r = 0; r < 16; ++r)
        for (int c : {0, 8})
          REQUIRE(L::offset(row0 + r, col0 + c) == L::offset(r, col0 % Tr::SWIZZLE_COLS + c) + Tr::origin(row0, col0));
}
template <int... CONFIGS>
void check_origin_identities(std::integer_sequence<int, CONFIGS...>) {
  (check_origin_identity<CONFIGS>(), ...);
}

TEST_CASE("step 07: an ldmatrix address is a per-lane offset plus a compile-time constant", "[step07]") {
  check_origin_identities(std::make_integer_sequence<int, fa2::kNumConfigs>{});
}

// 16-byte bank group (0..7) of element offset `e` (2-byte elements, 32 banks of 4 bytes).
int bank_group(int e) { return (e * 2 / 16) % 8; }

template <class L>
void check_swizzle(int rows) {
  // A bijection onto [0, size).
  std::set<int> offsets;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < L::kCols; ++c) offsets.insert(L::offset(r, c));
  CHECK(int(offsets.size()) == L::size(rows));
  CHECK(*offsets.rbegin() == L::size(rows) - 1);
  // ldmatrix phases: 8 rows (from a multiple of 8) at one 16-byte column chunk hit 8 bank groups.
  for (int r0 = 0; r0 < rows; r0 += 8)
    for (int c = 0; c < L::kCols; c += 8) {
      std::set<int> groups;
      for (int r = r0; r < r0 + 8; ++r) groups.insert(bank_group(L::offset(r, c)));
      CHECK(groups.size() == 8);
    }
  // cp.async and the epilogue's 16-byte reads: 8 consecutive chunks in row-major order.
  const int chunks = L::kCols / 8;
  for (int first = 0; first + 8 <= rows * chunks; first += 8) {
    std::set<int> groups;
    for (int i = first; i < first + 8; ++i) groups.insert(bank_group(L::offset(i / chunks, i % chunks * 8)));
    CHECK(groups.size() == 8);
  }
}

TEST_CASE("step 07: the swizzles of every tile width are bijective and conflict-free", "[step07][bank]") {
  check_swizzle<fa2::Swizzled64Layout<32>>(64);
  check_swizzle<fa2::Swizzled64Layout<96>>(64);
  check_swizzle<fa2::Swizzled128Layout<64>>(64);
  check_swizzle<fa2::Swizzled128Layout<128>>(64);
  check_swizzle<fa2::Swizzled128Layout<192>>(64);
  check_swizzle<fa2::Swizzled128Layout<256>>(64);
}

// ldmatrix on the CPU over a 16×16 operand tile stored with layout L at (row0, col0): lane l's
// address is the tile's (row, col) `address(l)`, resolved by the kernel's formula (lane offset +
// origin). Returns, per lane and register, the (row, col) inside the operand tile of the two
// elements received.
struct Received {
  Coord element[32][4][2];
};
template <class Tr>
Received ldmatrix_cpu(Coord (*address)(int), int row0, int col0, bool trans) {
  using L = typename Tr::Layout;
  // Where each element of the tile lives.
  std::vector<Coord> at(size_t(L::size(Tr::BLOCK_Q)), Coord{-1, -1});
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) at[size_t(L::offset(row0 + r, col0 + c))] = Coord{r, c};
  Received out{};
  for (int m = 0; m < 4; ++m)
    for (int row = 0; row < 8; ++row) {
      const int lane = frag::ldmatrix_address_lane(m, row);
      const Coord a = address(lane);
      const int offset = L::offset(a.row, col0 % Tr::SWIZZLE_COLS + a.col) + Tr::origin(row0, col0);  // the kernel's sum
      for (int lane_to = 0; lane_to < 32; ++lane_to)
        for (int half = 0; half < 2; ++half) {
          const Coord e = frag::ldmatrix_element(lane_to, half, trans);
          if (e.row != row) continue;
          out.element[lane_to][m][half] = at[size_t(offset + e.col)];
        }
    }
  return out;
}

template <int CONFIG>
void check_operands() {
  using Tr = fa2::TraitsOf<CONFIG, fa2::kHeadDimTable>;
  for (int row0 : {0, 16, Tr::BLOCK_KV - 16})
    for (int col0 : {0, 16, Tr::HEAD_DIM - 16}) {
      CAPTURE(CONFIG, row0, col0);
      // Q [query row, dim] as A: register m of the x4 is a[m].
      const Received q = ldmatrix_cpu<Tr>(frag::ldmatrix_x4_quadrants, row0, col0, false);
      // K [key, dim] as B = Kᵀ of two n8 tiles: registers 2n, 2n+1 are b[0], b[1] of tile n; B is
      // (k = dim, n = key).
      const Received kk = ldmatrix_cpu<Tr>(fa2::ldmatrix_x4_k_pair, row0, col0, false);
      // V [key, dim] through .trans as B of two n8 tiles: registers 2n, 2n+1 are b[0], b[1] of tile n
      // (dims 8n …); B is (k = key, n = dim).
      const Received vv = ldmatrix_cpu<Tr>(frag::ldmatrix_x4_quadrants, row0, col0, true);
      for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < 4; ++reg)
          for (int half = 0; half < 2; ++half) {
            CHECK(q.element[lane][reg][half] == frag::mma_a(lane, reg, half));
            const int n_tile = reg / 2;
            const Coord bk = frag::mma_b(lane, reg % 2, half);
            CHECK(kk.element[lane][reg][half] == Coord{8 * n_tile + bk.col, bk.row});
            CHECK(vv.element[lane][reg][half] == Coord{bk.row, 8 * n_tile + bk.col});
          }
    }
}
template <int... CONFIGS>
void check_all_operands(std::integer_sequence<int, CONFIGS...>) {
  (check_operands<CONFIGS>(), ...);
}

TEST_CASE("step 07: ldmatrix through the kernel's addresses delivers the mma operands", "[step07]") {
  check_all_operands(std::make_integer_sequence<int, fa2::kNumConfigs>{});
}

TEST_CASE("step 07: its copies of step 06's fragment maps and swizzle are step 06's", "[step07]") {
  namespace f6 = fs::step06::frag;
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const f6::Coord a = f6::mma_a(lane, reg, half);
        CHECK(frag::mma_a(lane, reg, half) == Coord{a.row, a.col});
        const f6::Coord e = f6::ldmatrix_element(lane, half, reg % 2 == 1);
        CHECK(frag::ldmatrix_element(lane, half, reg % 2 == 1) == Coord{e.row, e.col});
      }
    for (int reg = 0; reg < 2; ++reg)
      for (int half = 0; half < 2; ++half) {
        const f6::Coord b = f6::mma_b(lane, reg, half);
        CHECK(frag::mma_b(lane, reg, half) == Coord{b.row, b.col});
      }
    for (int i = 0; i < 4; ++i) {
      const f6::Coord c = f6::mma_c(lane, i);
      CHECK(frag::mma_c(lane, i) == Coord{c.row, c.col});
      CHECK(frag::mma_a_reg_of_c(i / 2, i) == f6::mma_a_reg_of_c(i / 2, i));
    }
    const f6::Coord q = f6::ldmatrix_x4_quadrants(lane);
    CHECK(frag::ldmatrix_x4_quadrants(lane) == Coord{q.row, q.col});
  }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 128; ++c)
      CHECK(fa2::Swizzled128Layout<128>::offset(r, c) == fs::step06::Swizzled128Layout<128>::offset(r, c));
}

TEST_CASE("step 07: the accumulators of S are P's A fragment", "[step07]") {
  // p_frag[kk][mma_a_reg_of_c(n_half, i)] packs C elements i, i+1 of S's n8 tile 2·kk + n_half.
  for (int lane = 0; lane < 32; ++lane)
    for (int n_half = 0; n_half < 2; ++n_half)
      for (int i = 0; i < 4; i += 2)
        for (int half = 0; half < 2; ++half) {
          const Coord c = frag::mma_c(lane, i + half);
          CHECK(frag::mma_a(lane, frag::mma_a_reg_of_c(n_half, i), half) == Coord{c.row, 8 * n_half + c.col});
        }
}

fs::DeviceInfo fake_device(size_t smem_optin) {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = 90;
  d.sm_count = 132;
  d.smem_per_block_optin = smem_optin;
  d.free_bytes = d.total_bytes = size_t(80) << 30;
  return d;
}

TEST_CASE("step 07: the sub-steps before 07g have their two rows only, 07g every other", "[step07]") {
  for (int ideas = fa2::kRows32; ideas < fa2::kHeadDimTable; ++ideas) {
    CAPTURE(ideas);
    for (int64_t optin : {kSm90, kSm80, kSm86}) {
      CHECK(fa2::choose_config(ideas, 64, optin) == fa2::kD64);
      CHECK(fa2::choose_config(ideas, 128, optin) == fa2::kD128_K32);
    }
    for (int64_t d : {8, 40, 96, 120, 136, 256}) CHECK(fa2::choose_config(ideas, d, kSm90) == -1);
    for (int c = 0; c < fa2::kNumConfigs; ++c) CHECK(fa2::has_config(ideas, c) == (c == fa2::kD64 || c == fa2::kD128_K32));
  }
  for (int c = 0; c < fa2::kNumConfigs; ++c) CHECK(fa2::has_config(fa2::kHeadDimTable, c) == (c != fa2::kD128_K32));
  for (int64_t optin : {kSm90, kSm80, kSm86})
    for (int64_t d = 8; d <= 256; d += 8) CHECK(fa2::choose_config(fa2::kHeadDimTable, d, optin) != fa2::kD128_K32);
}

TEST_CASE("step 07: every sub-step is registered, in idea order, and refuses what it does not have", "[step07][registry]") {
  const char* ids[] = {"07a_rows32", "07b_work_order", "07c_ldmatrix_pipeline", "07d_smem_epilogue",
                       "07e_rescale_skip", "07f_fast_exp2", "07g_flash_attention2"};
  const fs::Problem d40 = fs::make_problem(1, 100, 100, 2, 2, 40, fs::DType::fp16, false);
  const fs::Problem d128 = fs::make_problem(1, 100, 100, 2, 2, 128, fs::DType::bf16, true);
  for (const char* id : ids) {
    CAPTURE(id);
    const fs::Step* s = fs::find_step(id);
    REQUIRE(s != nullptr);
    CHECK(s->dir == "07_flash_attention2");
    const fs::Plan plan = fs::plan(*s, d128, fake_device(kSm90));
    REQUIRE(plan.accepted());
    REQUIRE(plan.kernels.size() == 1);
    CHECK(plan.kernels[0].threads == 128);
    const bool table = std::string(id) == "07g_flash_attention2";
    CHECK(plan.config == (table ? fa2::kD128_S2 : fa2::kD128_K32));
    CHECK(plan.kernels[0].smem_bytes == size_t(fa2::smem_bytes(fa2::kConfigs[plan.config])));
    CHECK(s->forward.claims(d128, fake_device(kSm90)));
    CHECK(fs::plan(*s, d40, fake_device(kSm90)).accepted() == table);
    CHECK(s->forward.claims(d40, fake_device(kSm90)) == table);
    if (!table)
      CHECK(fs::plan(*s, d40, fake_device(kSm90)).refusal ==
            "head_dim is 40; this sub-step has tiles for head_dim 64 and 128 only (07g_flash_attention2 adds every "
            "head_dim)");
  }
  // 07a keeps step 06's 2-D grid (x = query tiles, y = batch·heads); 07b and later a 1-D grid.
  CHECK(fs::plan(*fs::find_step("07a_rows32"), d128, fake_device(kSm90)).kernels[0].blocks == 1 * 2);
  CHECK(fs::plan(*fs::find_step("07b_work_order"), d128, fake_device(kSm90)).kernels[0].blocks == 1 * 2);
  const fs::Problem many = fs::make_problem(1000, 300, 300, 100, 100, 64, fs::DType::fp16, false);
  CHECK(fs::plan(*fs::find_step("07a_rows32"), many, fake_device(kSm90)).kernels[0].blocks == 3 * 65535);
  CHECK(fs::plan(*fs::find_step("07b_work_order"), many, fake_device(kSm90)).kernels[0].blocks == 3 * 100000);
}

TEST_CASE("step 07 refuses, in a sentence, what no configuration fits", "[step07][registry]") {
  const fs::Step* s = fs::find_step("07g_flash_attention2");
  REQUIRE(s != nullptr);
  const fs::Problem p = fs::make_problem(2, 1000, 1000, 8, 2, 256, fs::DType::bf16, true);
  CHECK(fs::plan(*s, p, fake_device(kSm90)).accepted());
  CHECK(fs::plan(*s, p, fake_device(kSm86)).accepted());
  CHECK(fs::plan(*s, p, fake_device(48 * 1024)).refusal ==
        "head_dim 256 runs on 256-wide tiles, which need at least 65536 bytes of shared memory per block; this "
        "GPU allows 49152");
  // 2^31 query tiles of 128 rows: one 1-D grid cannot hold them.
  fs::Problem big = fs::make_problem(1024, 128 * 1024, 1, 16, 16, 64, fs::DType::fp16, false);
  big.batch = 1024 * 8;  // 8192 · 16 · 1024 = 2^27 blocks: fine
  CHECK(fs::plan(*s, big, fake_device(kSm90)).accepted());
  big.batch = 1 << 17;  // 2^31 blocks
  CHECK(fs::plan(*s, big, fake_device(kSm90)).refusal ==
        "this step launches one block per 128 query rows per batch and head, 2147483648 blocks here, more than "
        "the grid limit of 2147483647");
}

}  // namespace
