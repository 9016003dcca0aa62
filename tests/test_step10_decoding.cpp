// Step 10's index math on the CPU (steps/10_decoding/traits.h): the copy map and its one-page-per-
// thread property, GQA packing, the grid, the split of the keys and its heuristic, the mask, the
// workspace, the table, the swizzle identity of its ldmatrix addresses, the LSE rule against a direct
// softmax; and the step's plans and refusals on made-up GPUs. Every expectation is brute force or an
// independent formula, never the function under test.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "steps/07_flash_attention2/traits.h"
#include "steps/10_decoding/traits.h"

namespace {

namespace s10 = fs::step10;

fs::DeviceInfo fake_gpu(int cc, int64_t smem_optin, int sm_count = 132) {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = cc;
  d.sm_count = sm_count;
  d.smem_per_block_optin = size_t(smem_optin);
  d.l2_bytes = 50 << 20;
  d.free_bytes = d.total_bytes = size_t(80) << 30;
  return d;
}
constexpr int64_t kSm90 = 227 * 1024, kSm80 = 163 * 1024, kSm86 = 99 * 1024;

// The tests below for every row of the table.
template <int CONFIG>
void check_copy_map() {
  using Tr = s10::TraitsOf<CONFIG>;
  CAPTURE(CONFIG);
  // Every (key, chunk) of a K/V tile is copied by exactly one (thread, pass).
  std::set<std::pair<int, int>> seen;
  for (int x = 0; x < Tr::NUM_THREADS; ++x)
    for (int pass = 0; pass < Tr::ROWS_PER_THREAD; ++pass) {
      const int row = s10::copy_row<Tr>(x, pass), col = s10::copy_col<Tr>(x);
      REQUIRE((row >= 0 && row < Tr::BLOCK_KV && col >= 0 && col < Tr::HEAD_DIM && col % 8 == 0));
      CHECK(seen.insert({row, col}).second);
    }
  CHECK(seen.size() == size_t(Tr::BLOCK_KV * Tr::CHUNKS_PER_ROW));
  // A thread's keys of any tile lie in one page, for every page size the harness allows: the tiles
  // start at multiples of BLOCK_KV.
  for (int page_size : {16, 32, 48, 64, 80, 256, 272})
    for (int tile = 0; tile < 8; ++tile)
      for (int x = 0; x < Tr::NUM_THREADS; ++x) {
        const int first = tile * Tr::BLOCK_KV + s10::copy_row<Tr>(x, 0);
        for (int pass = 1; pass < Tr::ROWS_PER_THREAD; ++pass)
          CHECK((tile * Tr::BLOCK_KV + s10::copy_row<Tr>(x, pass)) / page_size == first / page_size);
      }
  // Q's chunks (and O's in the epilogue): every (row, chunk) of the 16-row tile once.
  std::set<int> q_seen;
  for (int i = 0; i < Tr::Q_CHUNKS_PER_THREAD; ++i)
    for (int x = 0; x < Tr::NUM_THREADS; ++x) CHECK(q_seen.insert(i * Tr::NUM_THREADS + x).second);
  CHECK(q_seen.size() == size_t(s10::BLOCK_Q * Tr::CHUNKS_PER_ROW));
  CHECK(*q_seen.rbegin() == s10::BLOCK_Q * Tr::CHUNKS_PER_ROW - 1);
}

// Layout::offset(row0 + r, col0 + c) == Layout::offset(r, col0 % 64 + c) + origin(row0, col0) for
// every 16×16 operand tile the kernel reads: Q at row 0, K and V at every warp's keys.
template <int CONFIG>
void check_origin_identity() {
  using Tr = s10::TraitsOf<CONFIG>;
  using L = typename Tr::Layout;
  CAPTURE(CONFIG);
  for (int row0 = 0; row0 < Tr::BLOCK_KV; row0 += 8)
    for (int col0 = 0; col0 < Tr::HEAD_DIM; col0 += 16)
      for (int r = 0; r < 16 && row0 + r < Tr::BLOCK_KV; ++r)
        for (int c = 0; c < 16; ++c)
          CHECK(L::offset(row0 + r, col0 + c) == L::offset(r, col0 % Tr::SWIZZLE_COLS + c) + Tr::origin(row0, col0));
}

template <int... CONFIGS>
void for_every_config(std::integer_sequence<int, CONFIGS...>) {
  (check_copy_map<CONFIGS>(), ...);
  (check_origin_identity<CONFIGS>(), ...);
}

}  // namespace

TEST_CASE("step 10: its fragment maps are step 07's", "[step10]") {
  namespace f7 = fs::step07::frag;
  namespace f10 = fs::step10::frag;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      CHECK(f10::mma_c(lane, i).row == f7::mma_c(lane, i).row);
      CHECK(f10::mma_c(lane, i).col == f7::mma_c(lane, i).col);
      CHECK(f10::mma_a_reg_of_c(i % 2, i / 2 * 2) == f7::mma_a_reg_of_c(i % 2, i / 2 * 2));
    }
    CHECK(f10::ldmatrix_x4_quadrants(lane).row == f7::ldmatrix_x4_quadrants(lane).row);
    CHECK(f10::ldmatrix_x4_quadrants(lane).col == f7::ldmatrix_x4_quadrants(lane).col);
    CHECK(s10::ldmatrix_x4_k_pair(lane).row == fs::step07::ldmatrix_x4_k_pair(lane).row);
    CHECK(s10::ldmatrix_x4_k_pair(lane).col == fs::step07::ldmatrix_x4_k_pair(lane).col);
  }
}

TEST_CASE("step 10: every K/V chunk is copied once, and a thread's keys lie in one page", "[step10]") {
  for_every_config(std::make_integer_sequence<int, s10::kNumConfigs>{});
}

TEST_CASE("step 10: the table fits every GPU family, and the H200 rows keep two blocks per SM", "[step10]") {
  for (int64_t optin : {kSm90, kSm80, kSm86})
    for (int64_t d = 8; d <= 256; d += 8) {
      CAPTURE(optin, d);
      const int c = s10::choose_config(d, optin);
      REQUIRE(c >= 0);
      CHECK(s10::kConfigs[c].head_dim >= d);
      CHECK(s10::kConfigs[c].head_dim - d < (d <= 128 ? 64 : 128));
      CHECK(s10::smem_bytes(s10::kConfigs[c]) <= optin);
    }
  // smem = (16 + 2 · stages · BLOCK_KV) · HEAD_DIM · 2 bytes, written out.
  CHECK(s10::smem_bytes(s10::kConfigs[s10::kD64]) == (16 + 2 * 3 * 128) * 64 * 2);
  CHECK(s10::smem_bytes(s10::kConfigs[s10::kD128_S3]) == (16 + 2 * 3 * 64) * 128 * 2);
  CHECK(s10::choose_config(128, kSm90) == s10::kD128_S3);
  CHECK(s10::choose_config(128, kSm86) == s10::kD128_S2);
  CHECK(s10::choose_config(200, kSm86) == s10::kD256_W2);
  CHECK(s10::choose_config(256, 48 * 1024) == -1);
  CHECK(s10::min_smem_bytes(256) == (16 + 2 * 2 * 32) * 256 * 2);
  // Two blocks per SM on the H200 at head_dim 64 and 128: 228 KiB per SM, (smem + 1 KiB) per block.
  CHECK(s10::blocks_per_sm(s10::kConfigs[s10::kD64], kSm90) == 2);
  CHECK(s10::blocks_per_sm(s10::kConfigs[s10::kD128_S3], kSm90) == 2);
  CHECK(s10::blocks_per_sm(s10::kConfigs[s10::kD256_S2], kSm90) == 1);
  CHECK(s10::blocks_per_sm(s10::kConfigs[s10::kD128_S3], kSm80) == 1);
}

TEST_CASE("step 10: GQA packing puts each (token, query head) of a KV head in one row", "[step10]") {
  for (int group : {1, 2, 4, 8, 32})
    for (int seqlen_q : {1, 3, 4, 16}) {
      const int rows = int(s10::packed_rows(int64_t(group) * 3, 3, seqlen_q));
      CHECK(rows == group * seqlen_q);
      std::set<std::pair<int, int>> seen;
      for (int r = 0; r < rows; ++r) {
        const s10::PackedRow p = s10::packed_row(r, group);
        CHECK((p.token >= 0 && p.token < seqlen_q && p.head_in_group >= 0 && p.head_in_group < group));
        CHECK(seen.insert({p.token, p.head_in_group}).second);
        // A token's query heads are consecutive rows, in head order (neighbours in Q's memory).
        if (r % group) CHECK(p.head_in_group == s10::packed_row(r - 1, group).head_in_group + 1);
      }
      CHECK(seen.size() == size_t(rows));
      CHECK(s10::row_tiles(rows) == (rows + 15) / 16);
    }
}

TEST_CASE("step 10: the grid covers every (sequence, KV head, split, row tile) once, row tile fastest", "[step10]") {
  for (uint32_t heads_kv : {1u, 3u})
    for (uint32_t splits : {1u, 4u})
      for (uint32_t tiles : {1u, 2u, 5u}) {
        const uint32_t batch = 3, blocks = batch * heads_kv * splits * tiles;
        std::set<std::vector<uint32_t>> seen;
        for (uint32_t x = 0; x < blocks; ++x) {
          const s10::BlockWork w = s10::block_work(x, heads_kv, splits, tiles);
          CHECK((w.b < batch && w.kv_head < heads_kv && w.split < splits && w.row_tile < tiles));
          CHECK(seen.insert({w.b, w.kv_head, w.split, w.row_tile}).second);
          CHECK(w.row_tile == x % tiles);
        }
        CHECK(seen.size() == size_t(blocks));
      }
}

TEST_CASE("step 10: the splits cut a sequence's tiles into disjoint, ordered, whole-tile ranges", "[step10]") {
  for (int n_keys : {0, 1, 63, 64, 65, 129, 1000, 4096, 131072})
    for (int block_kv : {32, 64, 128})
      for (int splits : {1, 2, 3, 7, 30, 128}) {
        CAPTURE(n_keys, block_kv, splits);
        const int tiles = (n_keys + block_kv - 1) / block_kv;
        int next = 0, largest = 0;
        for (int s = 0; s < splits; ++s) {
          const s10::TileRange r = s10::split_tiles(n_keys, block_kv, splits, s);
          CHECK(r.first == next);  // in order, no gap, no overlap
          CHECK(r.end >= r.first);
          next = r.end;
          largest = std::max(largest, r.end - r.first);
        }
        CHECK(next == tiles);  // every tile once
        CHECK(largest == (tiles + splits - 1) / splits);
      }
}

TEST_CASE("step 10: keys_seen and the mask follow the causal rule of each sequence", "[step10]") {
  for (bool causal : {false, true})
    for (int len : {0, 1, 5, 16, 17, 100})
      for (int seqlen_q : {1, 2, 4, 16})
        for (int last_token = 0; last_token < seqlen_q; ++last_token) {
          CAPTURE(causal, len, seqlen_q, last_token);
          // keys_seen: one past the last key any token up to last_token sees.
          int brute = 0;
          for (int i = 0; i <= last_token; ++i)
            for (int j = 0; j < len; ++j)
              if (!causal || fs::causal_allows(i, j, seqlen_q, len)) brute = std::max(brute, j + 1);
          const int n_keys = s10::keys_seen(len, seqlen_q, last_token, causal);
          CHECK(n_keys == brute);
          // The mask of a 16-key warp slice at kv0: key kv0 + k is kept iff the token sees it and it was loaded.
          for (int token = 0; token <= last_token; ++token)
            for (int kv0 = 0; kv0 < std::max(len, 1); kv0 += 16) {
              const int last = s10::last_visible_key(token, kv0, 16, seqlen_q, len, n_keys, causal);
              CHECK((last >= -1 && last < 16));
              for (int k = 0; k < 16; ++k) {
                const int j = kv0 + k;
                const bool seen = j < n_keys && (!causal || fs::causal_allows(token, j, seqlen_q, len));
                CHECK(seen == (k <= last));
              }
            }
        }
}

TEST_CASE("step 10: the split heuristic", "[step10]") {
  // The decoding shapes (compare_torch.py's DECODE_SHAPES) at seqlen_q 1, head_dim 128 on an H200:
  // 132 SMs × 2 blocks = 264 slots, 64-key
  // tiles. b1 sk131072 h32/8: 8 blocks, 2048 tiles; the best cost is 63 tiles per slot (33 splits), the
  // smallest split count within 10 % is 30 (69 tiles). b8 sk32768: 64 blocks, 4 splits (128 tiles).
  // The others have at least 264 blocks: no split.
  CHECK(s10::num_splits_for(8, 2048, 264) == 30);
  CHECK(s10::num_splits_for(64, 512, 264) == 4);
  CHECK(s10::num_splits_for(512, 64, 264) == 1);
  CHECK(s10::num_splits_for(1024, 32, 264) == 1);
  CHECK(s10::num_splits_for(512, 256, 264) == 1);
  CHECK(s10::num_splits_for(8, 4, 264) == 4);  // few tiles: one per split
  CHECK(s10::num_splits_for(1, 1, 264) == 1);
  CHECK(s10::num_splits_for(0, 100, 264) == 1);
  // Properties, against a brute-force search written here: 1 when the grid fills the GPU; at most
  // min(tiles, 128); the cost within 10 % of the best, and no smaller count is.
  std::mt19937 rng(5);
  for (int n = 0; n < 3000; ++n) {
    const int64_t slots = 1 + rng() % 600, base = 1 + rng() % 700, tiles = 1 + rng() % 5000;
    CAPTURE(slots, base, tiles);
    const int s = s10::num_splits_for(base, tiles, slots);
    auto cost = [&](int64_t k) {
      return int64_t(std::ceil(double(base * k) / double(slots))) * int64_t(std::ceil(double(tiles) / double(k)));
    };
    if (base >= slots || tiles == 1) {
      CHECK(s == 1);
      continue;
    }
    REQUIRE((s >= 1 && s <= std::min<int64_t>(tiles, 128)));
    int64_t best = cost(1);
    for (int64_t k = 1; k <= std::min<int64_t>(tiles, 128); ++k) best = std::min(best, cost(k));
    CHECK(double(cost(s)) <= 1.1 * double(best) + 1e-9);
    for (int64_t k = 1; k < s; ++k) CHECK(double(cost(k)) > 1.1 * double(best) + 1e-9);
  }
}

TEST_CASE("step 10: the workspace holds every split's LSE, then its O, 16-byte aligned", "[step10]") {
  CHECK(s10::workspace_layout(1, 1000, 128).bytes == 0);  // no split, no workspace
  for (int splits : {2, 3, 30, 128})
    for (int64_t rows_all : {1, 3, 32, 1001})
      for (int64_t d : {8, 64, 136, 256}) {
        const s10::WorkspaceLayout w = s10::workspace_layout(splits, rows_all, d);
        CHECK(w.lse_offset == 0);
        CHECK(w.o_offset >= splits * rows_all * 4);  // after every LSE
        CHECK(w.o_offset % 16 == 0);
        CHECK(w.o_offset - splits * rows_all * 4 < 16);
        CHECK(w.bytes == w.o_offset + splits * rows_all * d * 4);
      }
  // Row R = (b · heads_q + h) · seqlen_q + i: LSE's (batch, heads_q, seqlen_q) order, every row once.
  std::set<int64_t> rows;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 5; ++i) {
        const int64_t r = s10::output_row(b, h, i, 4, 5);
        CHECK(r == b * 20 + h * 5 + i);
        rows.insert(r);
      }
  CHECK(rows.size() == 60);
}

TEST_CASE("step 10: the LSE rule merges parts into the softmax over all keys", "[step10]") {
  // Scores s_j and values v_j (one column); parts = a random partition of the keys, some empty.
  std::mt19937 rng(11);
  std::normal_distribution<double> n(0.0, 3.0);
  for (int trial = 0; trial < 500; ++trial) {
    const int keys = 1 + int(rng() % 60), parts = 1 + int(rng() % 9);
    std::vector<double> s(static_cast<size_t>(keys)), v(static_cast<size_t>(keys));
    std::vector<int> part(static_cast<size_t>(keys));
    for (int j = 0; j < keys; ++j) {
      s[size_t(j)] = n(rng) * (trial % 5 == 0 ? 20 : 1);  // some rows with scores far apart
      v[size_t(j)] = n(rng);
      part[size_t(j)] = int(rng() % parts);
    }
    // Direct: lse = log Σ exp(s), o = Σ softmax · v.
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0, o = 0;
    for (int j = 0; j < keys; ++j) sum += std::exp(s[size_t(j)] - m), o += std::exp(s[size_t(j)] - m) * v[size_t(j)];
    const double lse = m + std::log(sum);
    o /= sum;
    // Each part's own lse and normalized o, in float, as the kernels hold them.
    std::vector<float> part_lse(size_t(parts), -INFINITY), part_o(size_t(parts), 0.0f);
    for (int q = 0; q < parts; ++q) {
      double pm = -INFINITY, ps = 0, po = 0;
      for (int j = 0; j < keys; ++j)
        if (part[size_t(j)] == q) pm = std::max(pm, s[size_t(j)]);
      for (int j = 0; j < keys; ++j)
        if (part[size_t(j)] == q) ps += std::exp(s[size_t(j)] - pm), po += std::exp(s[size_t(j)] - pm) * v[size_t(j)];
      if (ps > 0) part_lse[size_t(q)] = float(pm + std::log(ps)), part_o[size_t(q)] = float(po / ps);
    }
    float lse_max = -INFINITY, weight_sum = 0, merged = 0;
    for (float x : part_lse) lse_max = std::max(lse_max, x);
    for (int q = 0; q < parts; ++q) {
      const float w = s10::lse_weight(part_lse[size_t(q)], lse_max);
      weight_sum += w;
      merged += w * part_o[size_t(q)];
    }
    CAPTURE(trial, keys, parts);
    CHECK(std::fabs(s10::merged_lse(lse_max, weight_sum) - lse) <= 1e-5 * (1 + std::fabs(lse)));
    CHECK(std::fabs(merged / weight_sum - o) <= 1e-5 * (1 + std::fabs(o)));
  }
  // No part has a key: weight 0 everywhere, LSE -inf, and never a NaN.
  CHECK(s10::lse_weight(-INFINITY, -INFINITY) == 0.0f);
  CHECK(s10::merged_lse(-INFINITY, 0.0f) == -INFINITY);
}

TEST_CASE("step 10: plans, splits, workspace and refusals on made-up GPUs", "[step10]") {
  const fs::Step* s = fs::find_step("10_decoding");
  REQUIRE(s != nullptr);
  REQUIRE(s->decode.present());
  const fs::DeviceInfo h200 = fake_gpu(90, kSm90);
  // b1 sk131072 h32/8 d128: 30 splits, a combine kernel, partial O and LSE for 32 rows.
  fs::DecodeProblem p = fs::make_decode_problem(1, 1, 131072, 32, 8, 128, fs::DType::fp16, false);
  fs::Plan plan = fs::plan(*s, p, h200);
  REQUIRE(plan.accepted());
  CHECK(plan.splits == 30);
  REQUIRE(plan.kernels.size() == 2);
  CHECK(plan.kernels[0].blocks == 8 * 30);
  CHECK(plan.kernels[0].threads == 128);
  CHECK(plan.kernels[0].smem_bytes == size_t((16 + 2 * 3 * 64) * 128 * 2));
  CHECK(plan.workspace_bytes == size_t(30 * 32 * 4 + 30 * 32 * 128 * 4));
  // The same shape, paged: the same plan.
  const fs::Plan paged = fs::plan(*s, fs::make_decode_problem(1, 1, 131072, 32, 8, 128, fs::DType::fp16, false, 64), h200);
  CHECK(paged.splits == 30);
  // b64 sk4096: no split, no workspace, one kernel.
  plan = fs::plan(*s, fs::make_decode_problem(64, 1, 4096, 32, 8, 128, fs::DType::bf16, false), h200);
  CHECK(plan.splits == 1);
  CHECK(plan.workspace_bytes == 0);
  CHECK(plan.kernels.size() == 1);
  // A forced number of splits, and the checked mode's 256 bytes.
  p.num_splits = 3;
  p.checked = 1;
  plan = fs::plan(*s, p, h200);
  CHECK(plan.splits == 3);
  CHECK(plan.workspace_bytes == size_t(3 * 32 * 4 + 3 * 32 * 128 * 4) + fs::kDecodeCheckBytes);
  // GQA 64:1 at seqlen_q 16: 1024 packed rows, 64 row tiles per KV head.
  plan = fs::plan(*s, fs::make_decode_problem(2, 16, 1000, 64, 1, 64, fs::DType::fp16, true), h200);
  REQUIRE(plan.accepted());
  CHECK(plan.kernels[0].blocks == 2 * 64 * plan.splits);
  // The forward entry plans the decoding problem of a forward problem.
  const fs::Problem f = fs::make_problem(8, 1, 32768, 32, 8, 128, fs::DType::fp16, false);
  const fs::Plan fwd = fs::plan(*s, f, h200);
  REQUIRE(fwd.accepted());
  CHECK(fwd.splits == 4);
  CHECK(fwd.workspace_bytes == fs::plan(*s, fs::decode_of(f), h200).workspace_bytes);

  // Refusals: prefill, and keys past 32-bit tile arithmetic.
  CHECK(fs::static_refusal(*s, fs::make_problem(2, 2048, 2048, 16, 16, 128, fs::DType::fp16, false)) ==
        "seqlen_q is 2048; this step is the decoding kernel and runs up to 16 new tokens per sequence (prefill "
        "belongs to steps 07 and 08, whose tiles reuse each K/V tile for 128 query rows)");
  CHECK(fs::static_refusal(*s, fs::make_decode_problem(1, 17, 64, 1, 1, 64, fs::DType::fp16, false))
            .find("seqlen_q is 17") == 0);
  CHECK(fs::static_refusal(*s, fs::make_decode_problem(1, 1, INT32_MAX, 1, 1, 64, fs::DType::fp16, false))
            .find("seqlen_k is 2147483647; this step counts keys in 32-bit integers") == 0);
  // A GPU too small for the tile refuses with the numbers; an old one by compute capability.
  const std::string small = fs::plan(*s, p, fake_gpu(90, 48 * 1024)).refusal;
  CHECK(small == "head_dim 128 runs on 128-wide tiles, which need at least 69632 bytes of shared memory per block; "
                 "this GPU allows 49152");
  CHECK(fs::plan(*s, p, fake_gpu(75, kSm86)).refusal.find("needs compute capability 8.0") != std::string::npos);
  // A step without a decoding entry says so.
  const std::string none = fs::static_refusal(*fs::find_step("07g_flash_attention2"), p);
  CHECK(none.find("step 07g_flash_attention2 has no decoding entry") == 0);
}
