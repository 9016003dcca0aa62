// common/step/window.h, the sliding window's index math that the kernels of step 13b use, against brute
// force over every (row, key) pair by flash_steps.h's definition (tests/mask_definition.h), and its rows
// against the references' reference_keys (common/forward/check.h): each written apart from the others.
// The keys of a row, the K/V tiles a query tile visits and which of them need the mask, the keys of a
// masked tile, the query tiles of a K/V tile (the backward) and tile_needs_mask; on the edge cases by
// name and on random bands and sizes, for every tile size the kernels use.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "common/forward/check.h"
#include "common/step/window.h"
#include "mask_definition.h"

namespace {

constexpr int kBlocks[] = {64, 80, 112, 128, 176, 192};  // query and K/V tile sizes of steps 08-13

// A problem of one head whose only fields that matter here are the lengths, causal and the window.
fs::Problem banded(int64_t seqlen_q, int64_t seqlen_k, bool causal, int32_t window, int32_t left, int32_t right) {
  fs::Problem p = fs::make_problem(1, seqlen_q, seqlen_k, 1, 1, 64, fs::DType::fp16, causal);
  p.window = window, p.window_left = left, p.window_right = right;
  return p;
}

// The first few disagreements with brute force: one CHECK per problem and tile size, not one per pair.
struct Mismatches {
  std::vector<std::string> first;
  int64_t count = 0;
  template <typename Say>
  void expect(bool ok, const Say& say) {
    if (!ok && count++ < 6) first.push_back(say());
  }
};

int64_t tiles(int64_t n, int block) { return (n + block - 1) / block; }

// [first, first + count) is exactly the set of indices where has[] is true (count 0: none is).
bool is_span(const std::vector<bool>& has, int64_t first, int64_t count) {
  for (int64_t t = 0; t < int64_t(has.size()); ++t)
    if (has[size_t(t)] != (t >= first && t < first + count)) return false;
  return true;
}

// (i) first_key and end_key against reference_keys, and sees against the definition, for every real row.
void check_rows(const fs::Problem& p, const fs::Band& b, Mismatches& m) {
  for (int64_t i = 0; i < p.seqlen_q; ++i) {
    const fs::KeyRange r = fs::reference_keys(p, i);
    const int64_t first = fs::first_key(b, i), end = fs::end_key(b, i);
    const bool none = r.end <= r.first;
    m.expect(none == (end <= first) && (none || (first == r.first && end == r.end)), [&] {
      return fs::sentence("row ", i, ": first_key, end_key = ", first, ", ", end, "; reference_keys [", r.first, ", ",
                          r.end, ")");
    });
    for (int64_t j = -1; j <= p.seqlen_k; ++j)
      m.expect(fs::sees(b, i, j) == (j >= 0 && j < p.seqlen_k && fs::test::sees(p, i, j)),
               [&] { return fs::sentence("sees(row ", i, ", key ", j, ") is ", fs::sees(b, i, j)); });
    // The backward's per-score form: the diagonals in 32 bits, keys below seqlen_k checked apart.
    for (int64_t j = 0; j < p.seqlen_k; ++j)
      m.expect(fs::sees(fs::diagonals_of(b), int(i), int(j)) == fs::test::sees(p, i, j), [&] {
        return fs::sentence("sees(diagonals, row ", i, ", key ", j, ") is ", fs::sees(fs::diagonals_of(b), int(i), int(j)));
      });
  }
}

// (ii) kv_span of every query tile of block_q rows, with K/V tiles of block_kv keys, and (iii) tile_keys
// of each of its rows in every K/V tile.
void check_forward(const fs::Problem& p, const fs::Band& b, int block_q, int block_kv, Mismatches& m) {
  const int64_t kv_tiles = tiles(p.seqlen_k, block_kv);
  for (int64_t q0 = 0; q0 < p.seqlen_q; q0 += block_q) {
    const int64_t q_rows = std::min<int64_t>(block_q, p.seqlen_q - q0);  // the real rows
    // Per K/V tile: does a real row see one of its keys; does every real row see every one of its keys
    // (each below seqlen_k: sees() is false past it)?
    std::vector<bool> has(size_t(kv_tiles + 1), false), full(size_t(kv_tiles + 1), true);
    for (int64_t t = 0; t <= kv_tiles; ++t)
      for (int64_t i = q0; i < q0 + q_rows; ++i)
        for (int64_t j = t * block_kv; j < (t + 1) * block_kv; ++j) {
          const bool v = fs::test::sees(p, i, j);
          has[size_t(t)] = has[size_t(t)] || v;
          full[size_t(t)] = full[size_t(t)] && v;
        }
    const fs::KvSpan s = fs::kv_span(b, q0, q_rows, block_kv);
    const auto said = [&] {
      return fs::sentence("kv_span(q0 ", q0, ", q_rows ", q_rows, ", block_kv ", block_kv, ") = {first ", s.first,
                          ", count ", s.count, ", masked_top ", s.masked_top, ", masked_bottom ", s.masked_bottom, "}");
    };
    m.expect(is_span(has, s.first, s.count), [&] { return said() + ": not the tiles holding a key some row sees"; });
    m.expect(s.count >= 0 && s.masked_top >= 0 && s.masked_bottom >= 0 && s.masked_top + s.masked_bottom <= s.count,
             [&] { return said() + ": a negative count, or more masked visits than visits"; });
    // The kernel's loops rely on it: some visit is unmasked, or every one is masked from the top (turn 0
    // then masked, and no masked_bottom turn past the last tile).
    m.expect(s.masked_bottom == 0 || s.count - s.masked_bottom > s.masked_top,
             [&] { return said() + ": masked_bottom without an unmasked visit between it and masked_top"; });
    // Visited from the last tile down: the first masked_top visits and the last masked_bottom ones are
    // masked. A tile goes unmasked where every pair is visible, and only there (none masked in vain).
    for (int64_t t = s.first; t < s.first + s.count; ++t) {
      const bool masked = t >= s.first + s.count - s.masked_top || t < s.first + s.masked_bottom;
      m.expect(masked != full[size_t(t)], [&] {
        return said() + fs::sentence(": tile ", t, masked ? " is masked, but every row sees every key of it"
                                                          : " is not masked, but some row does not see some key of it");
      });
    }
    for (int64_t i = q0; i < q0 + q_rows; ++i)
      for (int64_t t = 0; t < kv_tiles; ++t) {
        const fs::TileKeys k = fs::tile_keys(b, i, t * block_kv, block_kv);
        m.expect(k.lo >= 0 && k.end <= block_kv, [&] { return fs::sentence("tile_keys: [", k.lo, ", ", k.end, ")"); });
        for (int o = 0; o < block_kv; ++o)
          m.expect((k.lo <= o && o < k.end) == fs::test::sees(p, i, t * block_kv + o), [&] {
            return fs::sentence("tile_keys(row ", i, ", kv0 ", t * block_kv, ") = [", k.lo, ", ", k.end, ") at key ",
                                t * block_kv + o);
          });
      }
  }
}

// (iv) q_span of every K/V tile, and (v) tile_needs_mask of every pair of tiles (query tiles whole: their
// rows past seqlen_q count).
void check_backward_and_masks(const fs::Problem& p, const fs::Band& b, int block_q, int block_kv, Mismatches& m) {
  const int64_t q_tiles = tiles(p.seqlen_q, block_q);
  for (int64_t kv0 = 0; kv0 < p.seqlen_k; kv0 += block_kv) {
    std::vector<bool> has(size_t(q_tiles), false);
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t j = kv0; j < kv0 + block_kv; ++j)
        if (fs::test::sees(p, i, j)) has[size_t(i / block_q)] = true;
    const fs::QSpan s = fs::q_span(b, kv0, block_kv, block_q, p.seqlen_q);
    m.expect(s.count >= 0 && is_span(has, s.first, s.count), [&] {
      return fs::sentence("q_span(kv0 ", kv0, ", block_kv ", block_kv, ", block_q ", block_q, ") = {first ", s.first,
                          ", count ", s.count, "}: not the query tiles holding a row that sees a key of it");
    });
    for (int64_t q0 = 0; q0 < q_tiles * block_q; q0 += block_q) {
      bool hidden = false;  // some pair of the two tiles is not visible (a key past seqlen_k never is)
      for (int64_t i = q0; i < q0 + block_q && !hidden; ++i)
        for (int64_t j = kv0; j < kv0 + block_kv && !hidden; ++j) hidden = !fs::test::sees(p, i, j);
      const bool mask = fs::tile_needs_mask(fs::diagonals_of(b), int(q0), block_q, int(kv0), block_kv, int(p.seqlen_k));
      m.expect(mask == hidden, [&] {
        return fs::sentence("tile_needs_mask(q0 ", q0, ", block_q ", block_q, ", kv0 ", kv0, ", block_kv ", block_kv,
                            ") is ", mask, ", but by brute force ", hidden ? "some pair is" : "no pair is", " hidden");
      });
    }
  }
}

// Every check of this file on one problem, for the given (block_q, block_kv) pairs.
void check_problem(const fs::Problem& p, const std::vector<std::pair<int, int>>& blocks) {
  const fs::Band b = fs::band_of(p);
  Mismatches m;
  check_rows(p, b, m);
  for (const auto& [block_q, block_kv] : blocks) {
    check_forward(p, b, block_q, block_kv, m);
    check_backward_and_masks(p, b, block_q, block_kv, m);
  }
  std::string said = fs::describe(p) + (p.window ? "" : " (no window)") + ": " + std::to_string(m.count) +
                     " mismatches";
  for (const std::string& s : m.first) said += "\n  " + s;
  INFO(said);
  CHECK(m.count == 0);
}

// Every K/V tile size, each with another query tile size.
std::vector<std::pair<int, int>> every_block() {
  std::vector<std::pair<int, int>> blocks;
  for (size_t k = 0; k < std::size(kBlocks); ++k) blocks.push_back({kBlocks[(k + 3) % std::size(kBlocks)], kBlocks[k]});
  return blocks;
}

}  // namespace

TEST_CASE("window: the band of a problem is its window, causal's right bound 0 on top", "[window]") {
  const fs::Band off = fs::band_of(banded(100, 300, false, 0, 0, 0));
  CHECK((off.left == -1 && off.right == -1 && off.shift == 200 && off.seqlen_k == 300));
  const fs::Band causal = fs::band_of(banded(300, 100, true, 0, -1, -1));
  CHECK((causal.left == -1 && causal.right == 0 && causal.shift == -200));
  const fs::Band both = fs::band_of(banded(64, 64, true, 1, 16, 8));  // causal's 0 is the tighter right bound
  CHECK((both.left == 16 && both.right == 0));
  const fs::Band window = fs::band_of(banded(64, 64, false, 1, -1, 8));
  CHECK((window.left == -1 && window.right == 8));
}

TEST_CASE("window: the index math agrees with brute force on the edge cases", "[window]") {
  struct Case {
    int64_t seqlen_q, seqlen_k;
    bool causal;
    int32_t left, right;
    const char* what;
  };
  const Case cases[] = {
      {300, 300, false, 1000, 1000, "a window wider than the sequence: full attention"},
      {300, 300, false, INT32_MAX, INT32_MAX, "the widest window"},
      {257, 257, false, 0, 0, "window (0, 0): the diagonal only"},
      {200, 333, false, 0, 0, "the diagonal only, shifted"},
      {400, 400, false, 100, -1, "left-only: from 100 keys before the diagonal to the last key"},
      {400, 400, false, -1, 100, "right-only: from the first key to 100 keys past the diagonal"},
      {400, 400, false, -1, -1, "(-1, -1): full attention"},
      {400, 400, false, -1, 0, "(-1, 0): causal"},
      {333, 517, true, 64, 5, "causal with a window: the right bound is 0"},
      {517, 333, true, 127, -1, "causal with a left-only window, seqlen_q > seqlen_k"},
      {700, 100, false, 10, 0, "seqlen_q > seqlen_k: the first 600 rows see no key"},
      {700, 100, false, 0, 10, "seqlen_q > seqlen_k, the band after the diagonal"},
      {700, 1, true, 0, 0, "one key"},
      {1, 700, false, 128, 0, "one row against many keys (decoding's shape)"},
      {129, 700, false, 3, 200, "a band wider on the right"},
      {700, 129, false, 200, 3, "a band wider on the left"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    check_problem(banded(c.seqlen_q, c.seqlen_k, c.causal, 1, c.left, c.right), every_block());
  }
  // No window: causal and full attention are bands too.
  check_problem(banded(300, 200, true, 0, 0, 0), every_block());
  check_problem(banded(200, 300, false, 0, 0, 0), every_block());
}

TEST_CASE("window: the index math agrees with brute force on random bands and sizes", "[window]") {
  std::mt19937_64 rng(1313);
  auto below = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };  // 0 … n-1
  // Half of the lengths small (a tile or two), half anywhere up to 700.
  auto length = [&] { return 1 + below(below(2) ? 130 : 700); };
  // A bound: unbounded, 0, a few keys, up to the sequence, past it, or the largest.
  auto bound = [&](int64_t seqlen) -> int32_t {
    switch (below(6)) {
      case 0: return -1;
      case 1: return 0;
      case 2: return int32_t(1 + below(8));
      case 3: return int32_t(1 + below(seqlen));
      case 4: return int32_t(seqlen + 1 + below(1000));
      default: return INT32_MAX;
    }
  };
  for (int n = 0; n < 400; ++n) {
    const int64_t sq = length(), sk = length();
    fs::Problem p = banded(sq, sk, below(3) == 0, below(8) != 0, 0, 0);  // a window 7 times in 8
    if (p.window) p.window_left = bound(std::max(sq, sk)), p.window_right = bound(std::max(sq, sk));
    const int block_q = kBlocks[below(6)], block_kv = kBlocks[below(6)];
    CAPTURE(n, block_q, block_kv);
    check_problem(p, {{block_q, block_kv}, {block_kv, block_q}});
  }
}

TEST_CASE("window: the 32-bit diagonals keep every pair's answer at the ends of int32", "[window]") {
  // Rows and keys below 2^31, bounds and shifts as large as fs_problem allows: j - i stays inside int32, and
  // lo, hi clamp to it without changing an answer.
  constexpr int64_t kMax = INT32_MAX - 1;  // the longest sequence whose rows and keys are int32
  const int64_t lengths[][2] = {{kMax, 1}, {1, kMax}, {kMax, kMax}, {kMax, kMax / 2}};
  const int32_t bounds[] = {-1, 0, 1, 1000, INT32_MAX - 1, INT32_MAX};
  for (const auto& len : lengths)
    for (int32_t left : bounds)
      for (int32_t right : bounds)
        for (bool causal : {false, true}) {
          const fs::Problem p = banded(len[0], len[1], causal, 1, left, right);
          const fs::Band b = fs::band_of(p);
          const fs::Diagonals d = fs::diagonals_of(b);
          for (int64_t i : {int64_t(0), int64_t(1), len[0] / 2, len[0] - 1})
            for (int64_t j : {int64_t(0), int64_t(1), len[1] / 2, len[1] - 2, len[1] - 1}) {
              if (j < 0 || j >= len[1]) continue;  // keys past seqlen_k are the caller's test
              CAPTURE(len[0], len[1], left, right, causal, i, j);
              CHECK(fs::sees(d, int(i), int(j)) == fs::test::sees(p, i, j));
            }
        }
}

