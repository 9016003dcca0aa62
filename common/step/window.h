// Sliding-window attention (fs_problem::window, note 13b): which keys a query row sees, and which K/V
// tiles a query tile (or query tiles a K/V tile) must visit, and which of those need the mask.
//
// Row i sees key j iff   i + shift - left <= j <= i + shift + right,   shift = seqlen_k - seqlen_q
// (bottom-right aligned, as causal), within 0 <= j < seqlen_k; a bound < 0 is unbounded on its side.
// Causal is the band (-1, 0), full attention (-1, -1). Both ends of a row's interval grow with i, so a
// tile of rows sees one interval of keys and a tile of keys is seen by one interval of rows: the tile
// loop visits only those, and masks only the tiles that straddle an end of some row's interval.
#pragma once

#include <stdint.h>

#include "forward/problem.h"
#include "step/hd.h"

namespace fs {

struct Band {
  int64_t left = -1, right = -1;  // < 0: unbounded
  int64_t shift = 0;              // seqlen_k - seqlen_q
  int64_t seqlen_k = 0;
};

// The band of a problem: its window if it has one, causal's right bound 0 on top of it.
FS_HD constexpr Band band_of(const fs_problem& p) {
  Band b{-1, -1, p.seqlen_k - p.seqlen_q, p.seqlen_k};
  if (p.window) b.left = p.window_left, b.right = p.window_right;
  if (p.causal) b.right = 0;  // a right bound >= 0 and causal: causal's 0 is the tighter
  return b;
}

// The keys row i sees: [first_key, end_key), empty when end_key <= first_key.
FS_HD constexpr int64_t first_key(const Band& b, int64_t i) {
  const int64_t j = b.left < 0 ? 0 : i + b.shift - b.left;
  return j < 0 ? 0 : j;
}
FS_HD constexpr int64_t end_key(const Band& b, int64_t i) {
  const int64_t j = b.right < 0 ? b.seqlen_k : i + b.shift + b.right + 1;
  return j < 0 ? 0 : j > b.seqlen_k ? b.seqlen_k : j;
}
FS_HD constexpr bool sees(const Band& b, int64_t i, int64_t j) { return first_key(b, i) <= j && j < end_key(b, i); }

// ---- the forward: the K/V tiles of query rows [q0, q0 + q_rows) (q_rows real rows) ---------------
// Tiles [first, first + count) hold a key some row sees. Visited from the last down (step 08's order):
// the first masked_top visits and the last masked_bottom visits need the mask, those between none.
struct KvSpan {
  int first, count, masked_top, masked_bottom;
};
FS_HD constexpr KvSpan kv_span(const Band& b, int64_t q0, int64_t q_rows, int block_kv) {
  const int64_t last = q0 + q_rows - 1;
  // The rows that see any key: those whose interval starts before seqlen_k and ends after 0.
  int64_t r0 = q0, r1 = last;
  if (b.right >= 0 && r0 < -b.shift - b.right) r0 = -b.shift - b.right;
  if (b.left >= 0 && r1 > b.seqlen_k - 1 - b.shift + b.left) r1 = b.seqlen_k - 1 - b.shift + b.left;
  if (q_rows <= 0 || r0 > r1 || b.seqlen_k <= 0) return {0, 0, 0, 0};
  const int64_t lo = first_key(b, r0), end = end_key(b, r1);
  const int first = int(lo / block_kv), stop = int((end + block_kv - 1) / block_kv);
  // The keys every row of the tile sees: [first_key(last), end_key(q0)); the tiles inside it need no mask.
  const int64_t full_lo = first_key(b, last), full_end = end_key(b, q0);
  int u_lo = int((full_lo + block_kv - 1) / block_kv), u_hi = int(full_end / block_kv);
  if (u_lo < first) u_lo = first;
  if (u_hi > stop) u_hi = stop;
  if (full_end <= full_lo || u_hi <= u_lo) return {first, stop - first, stop - first, 0};
  return {first, stop - first, stop - u_hi, u_lo - first};
}

// In a masked K/V tile from kv0: the keys [lo, end) of it, counted from kv0, that row i sees.
struct TileKeys {
  int lo, end;
};
FS_HD constexpr TileKeys tile_keys(const Band& b, int64_t i, int64_t kv0, int block_kv) {
  int64_t lo = first_key(b, i) - kv0, end = end_key(b, i) - kv0;
  lo = lo < 0 ? 0 : lo > block_kv ? block_kv : lo;
  end = end < 0 ? 0 : end > block_kv ? block_kv : end;
  return {int(lo), int(end)};
}

// ---- the backward: the query tiles that see K/V tile [kv0, kv0 + block_kv) ------------------------
// Query tiles [first, first + count) of block_q rows (seqlen_q rows in all) hold a row that sees one of
// the tile's keys.
struct QSpan {
  int first, count;
};
FS_HD constexpr QSpan q_span(const Band& b, int64_t kv0, int block_kv, int block_q, int64_t seqlen_q) {
  const int64_t k_last = (kv0 + block_kv < b.seqlen_k ? kv0 + block_kv : b.seqlen_k) - 1;
  int64_t r0 = 0, r1 = seqlen_q - 1;
  if (b.right >= 0 && r0 < kv0 - b.shift - b.right) r0 = kv0 - b.shift - b.right;
  if (b.left >= 0 && r1 > k_last - b.shift + b.left) r1 = k_last - b.shift + b.left;
  if (k_last < kv0 || r0 > r1) return {0, 0};
  return {int(r0 / block_q), int(r1 / block_q) - int(r0 / block_q) + 1};
}

// ---- a kernel's per-element mask, in 32-bit registers ---------------------------------------------
// The band as a range of diagonals: row i sees key j (0 <= j < seqlen_k) iff lo <= j - i <= hi. Rows and
// keys are below 2^31, so j - i lies strictly inside int32 and clamping lo and hi to int32 changes no
// pair's answer: two registers and two 32-bit compares per score, where Band's 64-bit fields would hold
// eight registers through the backward's loop.
struct Diagonals {
  int lo, hi;
};
FS_HD constexpr int clamp_int32(int64_t x) { return int(x < INT32_MIN ? INT32_MIN : x > INT32_MAX ? INT32_MAX : x); }
FS_HD constexpr Diagonals diagonals_of(const Band& b) {
  return {b.left < 0 ? INT32_MIN : clamp_int32(b.shift - b.left), b.right < 0 ? INT32_MAX : clamp_int32(b.shift + b.right)};
}
FS_HD constexpr bool sees(const Diagonals& d, int row, int key) { return key - row >= d.lo && key - row <= d.hi; }

// Does the pair (query rows [q0, q0 + block_q), keys [kv0, kv0 + block_kv)) need the mask: is some key
// past seqlen_k, or some (row, key) off the band? The tile's diagonals run from kv0 - (q0 + block_q - 1)
// to kv0 + block_kv - 1 - q0. (Rows past seqlen_q count as rows: they mask more, never less.)
FS_HD constexpr bool tile_needs_mask(const Diagonals& d, int q0, int block_q, int kv0, int block_kv, int seqlen_k) {
  return kv0 + block_kv > seqlen_k || kv0 - (q0 + block_q - 1) < d.lo || kv0 + block_kv - 1 - q0 > d.hi;
}

// ---- the work: the (row, key) pairs of one head the band lets attend ------------------------------
// n(i) = end_key(i) - first_key(i), clamped at 0, is linear between the rows where a clamp starts or
// stops (first_key leaves 0 or reaches seqlen_k, end_key leaves 0 or reaches seqlen_k); on each such run
// of rows the sum is the run's length times the mean of its two ends. Cuts outside [0, seqlen_q] are
// clamped to its ends, where they cut nothing. fs_problem_flops counts 4·batch·heads_q·head_dim per pair.
FS_HD constexpr double visible_pairs(const Band& b, int64_t seqlen_q) {
  int64_t cuts[6] = {0, seqlen_q, b.left - b.shift, b.seqlen_k - b.shift + b.left, -b.shift - b.right,
                     b.seqlen_k - b.shift - b.right};
  for (int64_t& c : cuts) c = c < 0 ? 0 : c > seqlen_q ? seqlen_q : c;
  for (int i = 1; i < 6; ++i)  // insertion sort of six
    for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; --j) {
      const int64_t t = cuts[j];
      cuts[j] = cuts[j - 1], cuts[j - 1] = t;
    }
  auto keys = [&](int64_t i) {
    const int64_t k = end_key(b, i) - first_key(b, i);
    return double(k > 0 ? k : 0);
  };
  double pairs = 0;
  for (int c = 0; c + 1 < 6; ++c) {
    const int64_t from = cuts[c], to = cuts[c + 1] - 1;  // rows [from, to], one linear piece
    if (to >= from) pairs += double(to - from + 1) * (keys(from) + keys(to)) / 2;
  }
  return pairs;
}

}  // namespace fs
