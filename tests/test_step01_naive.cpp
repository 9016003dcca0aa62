// Step 01's index math (steps/01_naive/traits.h) against a brute-force enumeration: walking the
// tensors in their memory order with nested loops must meet the flat indices the kernels decompose,
// one after the other, and the counts must be the number of elements walked.
#include "catch.h"
#include "steps/01_naive/traits.h"

namespace {

// A small ragged problem: every extent different, so a swapped pair of indices cannot go unnoticed.
fs::Problem small_problem() {
  fs::Problem p{};
  p.batch = 2;
  p.heads_q = 3;
  p.heads_kv = 3;
  p.seqlen_q = 5;
  p.seqlen_k = 7;
  p.head_dim = 4;
  return p;
}

}  // namespace

TEST_CASE("step 01: element e of S is S[b, h, i, j] in row-major [batch, heads_q, seqlen_q, seqlen_k] order",
          "[step01]") {
  const fs::Problem p = small_problem();
  int64_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i)
        for (int64_t j = 0; j < p.seqlen_k; ++j, ++e) {
          CAPTURE(e);
          const fs::step01::ScoreCoord c = fs::step01::score_coord(e, p);
          CHECK(c.b == b);
          CHECK(c.h == h);
          CHECK(c.i == i);
          CHECK(c.j == j);
        }
  CHECK(fs::step01::score_elements(p) == e);
  CHECK(fs::step01::score_rows(p) == 2 * 3 * 5);  // one softmax row per (b, h, i)
}

TEST_CASE("step 01: element e of O is O[b, i, h, d] in its logical [batch, seqlen_q, heads_q, head_dim] order",
          "[step01]") {
  const fs::Problem p = small_problem();
  int64_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q; ++i)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t d = 0; d < p.head_dim; ++d, ++e) {
          CAPTURE(e);
          const fs::step01::OutputCoord c = fs::step01::output_coord(e, p);
          CHECK(c.b == b);
          CHECK(c.i == i);
          CHECK(c.h == h);
          CHECK(c.d == d);
        }
  CHECK(fs::step01::output_elements(p) == e);
}

TEST_CASE("step 01: the decompositions hold past 2^31 elements", "[step01]") {
  // S of batch 2, 16 heads, seqlen 32768: 2^35 elements. The last one is the last (b, h, i, j).
  fs::Problem p = small_problem();
  p.heads_q = p.heads_kv = 16;
  p.seqlen_q = p.seqlen_k = 32768;
  const int64_t last = fs::step01::score_elements(p) - 1;
  CHECK(last == (int64_t(1) << 35) - 1);
  const fs::step01::ScoreCoord c = fs::step01::score_coord(last, p);
  CHECK(c.b == 1);
  CHECK(c.h == 15);
  CHECK(c.i == 32767);
  CHECK(c.j == 32767);
}
