// Variable-length batches (fs_problem::cu_seqlens_q, _k; flash_steps.h) without a device: the rules and
// their sentences, the offsets' contract, the FLOP count, the refusal of the steps without them, the fp64
// reference assembled per sequence against attention written out pair by pair, the C ABI and the runner.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "catch.h"
#include "common/backward/check.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "common/step/varlen.h"
#include "mask_definition.h"
#include "runner/cli.h"

namespace {

using fs::Offsets;
using fs::Problem;

// Three sequences of 5, 0 and 7 query rows against 3, 4 and 9 keys; GQA 4/2, head_dim 16, causal.
const std::vector<int32_t> kLengthsQ{5, 0, 7}, kLengthsK{3, 4, 9};

// Equal up to fp64 rounding (Catch2 v2 and v3 spell Approx differently).
bool near(double got, double want) { return std::fabs(got - want) <= 1e-12 * std::max(1.0, std::fabs(want)); }

Problem base() { return fs::make_problem(1, 1, 1, 4, 2, 16, fs::DType::fp16, true); }

// The message of validate for the varlen problem of `cu` changed by `edit`.
template <typename F>
std::string message_after(const Offsets& cu, F edit) {
  Problem p = fs::varlen_problem(base(), cu);
  edit(p);
  return fs::validate(p);
}

}  // namespace

TEST_CASE("varlen: a problem of offsets is packed, with the longest lengths as bounds", "[varlen][validation]") {
  const Offsets cu = fs::offsets_of(kLengthsQ, kLengthsK);
  CHECK(cu.q == std::vector<int32_t>{0, 5, 5, 12});
  CHECK(cu.k == std::vector<int32_t>{0, 3, 7, 16});
  CHECK(fs::offsets_of(kLengthsQ).k == cu.q);  // the key lengths default to the query lengths
  const Problem p = fs::varlen_problem(base(), cu);
  CHECK(fs::is_varlen(p));
  CHECK((p.batch == 3 && p.seqlen_q == 7 && p.seqlen_k == 9 && p.total_q == 12 && p.total_k == 16));
  CHECK((p.q.batch == 0 && p.k.batch == 0 && p.v.batch == 0 && p.o.batch == 0));
  CHECK((p.q.row == 4 * 16 && p.k.row == 2 * 16 && p.q.head == 16));
  CHECK(fs::validate(p).empty());
  CHECK(fs::validate_offsets(p, cu.q, cu.k).empty());
  CHECK(fs::describe(p) == "varlen b3 h4/2 sq<=7 sk<=9 tq12 tk16 d16 fp16 causal");
  const Problem d = fs::dense_view(p);
  CHECK((d.batch == 1 && d.seqlen_q == 12 && d.seqlen_k == 16 && !fs::is_varlen(d) && d.total_q == 0));
  CHECK(fs::dense_view(base()).seqlen_q == base().seqlen_q);  // a dense problem is its own view
  // Empty sequences and empty totals are allowed; so is a bound larger than every length.
  CHECK(fs::validate(fs::varlen_problem(base(), fs::offsets_of(std::vector<int32_t>{0, 0}))).empty());
  CHECK(message_after(cu, [](Problem& x) { x.seqlen_q = 1000; }).empty());
  CHECK_THROWS_WITH(fs::offsets_of(kLengthsQ, std::vector<int32_t>{1}),
                    "3 query lengths and 1 key lengths; a variable-length batch has one of each per sequence");
}

TEST_CASE("varlen: validate names the value and the limit", "[varlen][validation]") {
  const Offsets cu = fs::offsets_of(kLengthsQ, kLengthsK);
  int32_t device_array[4] = {};
  CHECK(message_after(cu, [&](Problem& p) { p.cu_seqlens_k = nullptr; }) ==
        "cu_seqlens_q is set but cu_seqlens_k is NULL; a variable-length batch needs both (NULL for both turns it off)");
  CHECK(message_after(cu, [&](Problem& p) { p.cu_seqlens_q = nullptr, p.cu_seqlens_k = device_array; }) ==
        "cu_seqlens_k is set but cu_seqlens_q is NULL; a variable-length batch needs both (NULL for both turns it off)");
  Problem dense = base();
  dense.total_k = 16;
  CHECK(fs::validate(dense) == "total_k is 16 but cu_seqlens_q and cu_seqlens_k are NULL; it must be 0 (the totals "
                               "count the rows of a variable-length batch)");
  CHECK(message_after(cu, [](Problem& p) { p.total_q = -1; }) ==
        "total_q is -1; it must be between 0 and 2147483647 (the kernels count the rows of the packed tensors in int32)");
  CHECK(message_after(cu, [](Problem& p) { p.total_k = int64_t(1) << 31; }) ==
        "total_k is 2147483648; it must be between 0 and 2147483647 (the kernels count the rows of the packed tensors "
        "in int32)");
  CHECK(message_after(cu, [](Problem& p) { p.total_q = 22; }) ==
        "total_q is 22, more than batch * seqlen_q = 3 * 7 = 21: 3 sequences of at most 7 rows cannot hold them "
        "(seqlen_q bounds every sequence's length)");
  CHECK(message_after(cu, [](Problem& p) { p.seqlen_k = -1; }) == "seqlen_k is -1; it must be between 0 and 2147483647");
  CHECK(message_after(cu, [](Problem& p) { p.batch = 0; }) == "batch is 0; it must be at least 1");
  CHECK(message_after(cu, [](Problem& p) { p.q.batch = 3 * 64; }) ==
        "with cu_seqlens the tensors are (total, heads, head_dim): q.batch is 192, it must be 0");
  CHECK(message_after(cu, [](Problem& p) { p.v.batch = 8; }) ==
        "with cu_seqlens the tensors are (total, heads, head_dim): v.batch is 8, it must be 0");
  // The packed views' rules, with the totals as their rows.
  CHECK(message_after(cu, [](Problem& p) { p.o.row = 8; }) ==
        "O's row stride 8 is smaller than head_dim 16; rows would overlap (the last dimension must be contiguous)");
  CHECK(message_after(cu, [](Problem& p) { p.k.row = int64_t(1) << 56; }) ==
        "K's strides (batch 0, row 72057594037927936, head 16) over batch 1, total_k 16, heads_kv 2 span "
        "1080863910568919072 elements; a tensor may span at most 2^58 (288230376151711744)");
  CHECK(message_after(cu, [](Problem& p) { p.o.head = 0; }).find("O's head stride 0 is smaller than head_dim") == 0);
  // Q, K, V may alias (a packed QKV buffer); O must not overlap itself.
  CHECK(message_after(cu, [](Problem& p) { p.q.row = p.k.row = p.v.row = 0; }).find("Q's row stride 0") == 0);
  CHECK(message_after(cu, [](Problem& p) { p.o.row = 16, p.o.head = 16; })
            .find("total_q 12, less than the 64 elements spanned by its head_dim and head dimensions: two elements of "
                  "O would share one address (O must not overlap itself; Q, K and V may)") != std::string::npos);
}

TEST_CASE("varlen: validate_tensors judges the pointers by the totals", "[varlen][validation]") {
  const Offsets none = fs::offsets_of(std::vector<int32_t>{0, 0}, std::vector<int32_t>{3, 1});
  const Problem p = fs::varlen_problem(base(), none);  // no query row: nothing is read or written
  CHECK(fs::validate_tensors(p, fs::Tensors{}).empty());
  const Problem q = fs::varlen_problem(base(), fs::offsets_of(kLengthsQ, kLengthsK));
  CHECK(fs::validate_tensors(q, fs::Tensors{}) == "Q is a null pointer");
}

TEST_CASE("varlen: the offsets' contract, each break named at its first index", "[varlen][validation]") {
  const Offsets cu = fs::offsets_of(kLengthsQ, kLengthsK);
  const Problem p = fs::varlen_problem(base(), cu);
  auto check = [&](std::vector<int32_t> q, std::vector<int32_t> k) { return fs::validate_offsets(p, q, k); };
  CHECK(check(cu.q, cu.k).empty());
  CHECK(check({5, 5, 5, 12}, cu.k) == "cu_seqlens_q[0] is 5; it must be 0");
  CHECK(check(cu.q, {0, 3, 2, 16}) == "cu_seqlens_k[2] is 2, below cu_seqlens_k[1] = 3: the offsets must not decrease");
  CHECK(check({0, 5, 5, 11}, cu.k) == "cu_seqlens_q[3] (the last) is 11; it must equal total_q (12)");
  CHECK(check({0, 8, 8, 12}, cu.k) ==
        "sequence 0 has 8 query rows (cu_seqlens_q[1] - cu_seqlens_q[0]); seqlen_q, the bound on every sequence's "
        "length, is 7");
  CHECK(check(cu.q, {0, 3, 3, 16}) ==
        "sequence 2 has 13 key rows (cu_seqlens_k[3] - cu_seqlens_k[2]); seqlen_k, the bound on every sequence's "
        "length, is 9");
  CHECK(check({0, 5, 12}, cu.k) == "cu_seqlens_q has 3 offsets; a batch of 3 sequences has batch + 1 = 4");
}

TEST_CASE("varlen: a step without it refuses with a sentence naming one that has it", "[varlen][registry]") {
  const Problem p = fs::varlen_problem(base(), fs::offsets_of(kLengthsQ, kLengthsK));
  const fs::BackwardProblem bp = fs::backward_of(p, 0);
  const fs::Step* newest = nullptr;
  for (const fs::Step& s : fs::steps())
    if (s.varlen && s.forward.present()) newest = &s;
  for (const fs::Step& s : fs::steps()) {
    if (s.varlen) continue;
    CAPTURE(s.id);
    const std::string sentence = "cu_seqlens_q is set (a variable-length batch of 3 sequences); step " + s.id +
                                 " has no variable-length batches (NULL turns it off)";
    if (s.forward.present())
      CHECK(fs::static_refusal(s, p) == sentence + (newest ? "; step " + newest->id + " has it" : std::string()));
    if (s.backward.present())  // the steps whose backward has them, if any, are named the same way
      CHECK(fs::static_refusal(s, bp).find(sentence) == 0);
  }
  // A decoding problem has lengths of its own.
  fs::DecodeProblem dp = fs::make_decode_problem(1, 1, 64, 2, 2, 64, fs::DType::fp16, false);
  dp.attention.cu_seqlens_q = dp.attention.cu_seqlens_k = kLengthsQ.data();
  CHECK(fs::validate(dp) == "cu_seqlens_q or cu_seqlens_k is set; a decoding problem has no variable-length batch "
                            "(its sequences' lengths are cache_seqlens): set both to NULL, or run a forward problem "
                            "(fs_run)");
}

// The kernels' grid (common/step/varlen.h): block w of tiles · batch · heads takes (tile j, sequence b,
// head h). Every triple exactly once, the tiles of one (sequence, head) neighbours (the order that lets the
// blocks running at once share that head's K and V in L2), and sequence_from keeps a broken pair in bounds.
TEST_CASE("varlen: the grid takes every (tile, sequence, head) once, one head's tiles together", "[varlen]") {
  for (const auto& [tiles, batch, heads] : {std::tuple{1, 1, 1}, std::tuple{64, 5, 16}, std::tuple{3, 7, 2},
                                            std::tuple{9, 64, 32}}) {
    std::vector<int> seen(size_t(tiles * batch * heads), 0);
    for (int64_t w = 0; w < int64_t(tiles) * batch * heads; ++w) {
      const fs::VarlenTile t = fs::varlen_tile(w, tiles, heads);
      REQUIRE(t.j >= 0);
      REQUIRE(t.j < tiles);
      REQUIRE(t.b >= 0);
      REQUIRE(t.b < batch);
      REQUIRE(t.h >= 0);
      REQUIRE(t.h < heads);
      seen[size_t((t.b * heads + t.h) * tiles + t.j)] += 1;
      if (w % tiles != 0) {  // the previous block: the same (sequence, head), the tile before
        const fs::VarlenTile prev = fs::varlen_tile(w - 1, tiles, heads);
        CHECK(prev.b == t.b);
        CHECK(prev.h == t.h);
        CHECK(prev.j + 1 == t.j);
      }
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == int64_t(seen.size()));
  }
  fs_problem p{};
  p.total_q = p.total_k = 100, p.seqlen_q = p.seqlen_k = 60;
  const fs::Sequence ok = fs::sequence_from(p, 10, 70, 0, 50);
  CHECK((ok.q_start == 10 && ok.q_len == 60 && ok.k_start == 0 && ok.k_len == 50));
  for (const auto& [begin, end] : {std::pair{-1, 10}, std::pair{50, 40}, std::pair{90, 101}, std::pair{0, 61}}) {
    const fs::Sequence bad = fs::sequence_from(p, begin, end, begin, end);
    CHECK(bad.q_len == 0);  // decreasing, negative, past the total or longer than the bound: empty
    CHECK(bad.k_len == 0);
  }
}

TEST_CASE("varlen: FLOPs are every sequence's own, by brute force over the pairs", "[varlen]") {
  std::mt19937_64 rng(25);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + int(rng() % 5);
    std::vector<int32_t> lq(batch), lk(batch);
    for (int b = 0; b < batch; ++b) lq[b] = int32_t(rng() % 40), lk[b] = int32_t(rng() % 40);
    Problem shape = base();
    shape.causal = int32_t(rng() % 2);
    shape.window = int32_t(rng() % 2);
    if (shape.window) shape.window_left = int32_t(rng() % 50) - 1, shape.window_right = int32_t(rng() % 50) - 1;
    const Offsets cu = fs::offsets_of(lq, lk);
    const Problem p = fs::varlen_problem(shape, cu);
    REQUIRE(fs::validate(p).empty());
    // Pairs pair by pair (flash_steps.h's definition), causal without a window counted halved as the dense rule does.
    double want = 0;
    for (int b = 0; b < batch; ++b) {
      Problem one = shape;
      one.seqlen_q = lq[b], one.seqlen_k = lk[b];
      double pairs = 0;
      for (int64_t i = 0; i < lq[b]; ++i)
        for (int64_t j = 0; j < lk[b]; ++j) pairs += fs::test::sees(one, i, j);
      if (shape.causal && !shape.window) pairs = double(lq[b]) * lk[b] / 2;
      want += 4.0 * shape.heads_q * shape.head_dim * pairs;
    }
    CAPTURE(trial, lq, lk, shape.causal, shape.window, shape.window_left, shape.window_right);
    CHECK(near(fs::varlen_flops(p, cu.q, cu.k), want));
    double got = -1;
    REQUIRE(fs_varlen_flops(&p, cu.q.data(), cu.k.data(), &got) == FS_OK);
    CHECK(got == fs::varlen_flops(p, cu.q, cu.k));
    CHECK(fs_problem_flops(&p) >= got);  // at the bounds: an upper bound
  }
}

TEST_CASE("varlen: fs_varlen_flops and fs_check_offsets refuse in sentences", "[varlen][c_api]") {
  const Offsets cu = fs::offsets_of(kLengthsQ, kLengthsK);
  const Problem p = fs::varlen_problem(base(), cu);
  double flops = 0;
  CHECK(fs_varlen_flops(nullptr, cu.q.data(), cu.k.data(), &flops) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "p and flops must not be null pointers");
  CHECK(fs_varlen_flops(&p, nullptr, cu.k.data(), &flops) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "cu_seqlens_q and cu_seqlens_k (the host copies of the offsets) must not be null pointers");
  const std::vector<int32_t> bad{0, 5, 4, 12};
  CHECK(fs_varlen_flops(&p, bad.data(), cu.k.data(), &flops) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "cu_seqlens_q[2] is 4, below cu_seqlens_q[1] = 5: the offsets must not decrease");
  const Problem dense = base();
  CHECK(fs_varlen_flops(&dense, cu.q.data(), cu.k.data(), &flops) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "the problem has no cu_seqlens (a dense batch: fs_problem_flops counts it exactly)");
  CHECK(fs_check_offsets(&dense, nullptr) == FS_OK);  // nothing to check, no device touched
  Problem broken = p;
  broken.q.batch = 8;
  CHECK(fs_check_offsets(&broken, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) ==
        "with cu_seqlens the tensors are (total, heads, head_dim): q.batch is 8, it must be 0");
  CHECK(fs_check_offsets(nullptr, nullptr) == FS_ERR_INVALID);
}

TEST_CASE("varlen: the fp64 reference per sequence equals attention written out pair by pair", "[varlen][reference]") {
  // Ragged lengths with empty and one-row sequences, len_q != len_k per sequence, GQA and MQA, causal, windows
  // (left only, right only, both, wider than a sequence, 0), softcapping tiny and huge.
  struct Case {
    std::vector<int32_t> lq, lk;
    int64_t heads_q, heads_kv;
    int32_t causal, window, left, right;
    float softcap;
  };
  const Case cases[] = {
      {{0, 1, 7, 3}, {0, 1, 7, 3}, 2, 2, 0, 0, 0, 0, 0.0f},
      {{5, 0, 7, 1}, {3, 4, 9, 0}, 4, 2, 1, 0, 0, 0, 0.0f},
      {{6, 2, 9}, {9, 2, 4}, 4, 1, 1, 1, 2, -1, 0.0f},
      {{6, 2, 9}, {9, 2, 4}, 2, 1, 0, 1, -1, 1, 0.0f},
      {{6, 4}, {3, 8}, 2, 2, 0, 1, 2, 3, 0.0f},
      {{6, 4}, {3, 8}, 2, 2, 0, 1, 100, 100, 0.0f},
      {{6, 4}, {3, 8}, 2, 2, 0, 1, 0, 0, 0.0f},
      {{5, 3}, {5, 6}, 2, 2, 1, 0, 0, 0, 0.05f},
      {{5, 3}, {5, 6}, 2, 2, 0, 0, 0, 0, 1e30f},
  };
  int seed = 0;
  for (const Case& c : cases) {
    Problem shape = fs::make_problem(1, 1, 1, c.heads_q, c.heads_kv, 8, fs::DType::bf16, c.causal);
    shape.window = c.window, shape.window_left = c.left, shape.window_right = c.right, shape.softcap = c.softcap;
    const Offsets cu = fs::offsets_of(c.lq, c.lk);
    const Problem p = fs::varlen_problem(shape, cu);
    REQUIRE(fs::validate(p).empty());
    // Packed inputs: Q (total_q, heads_q, 8), then K and V (total_k, heads_kv, 8), contiguous.
    fs::HostInputs in;
    const int64_t nq = p.total_q * p.heads_q * 8, nk = p.total_k * p.heads_kv * 8;
    std::mt19937 rng(++seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    in.data.resize(size_t(nq + 2 * nk));
    for (float& x : in.data) x = u(rng);
    in.q = 0, in.k = nq, in.v = nq + nk, in.cu = cu;
    const fs::Reference r = fs::reference_cpu(p, in);
    REQUIRE(r.o.size() == size_t(nq));
    REQUIRE(r.lse.size() == size_t(p.heads_q * p.total_q));
    // Written out here: row cu_q[b] + i of head h against rows cu_k[b] + j of its K/V head, for the j it sees.
    for (size_t b = 0; b < c.lq.size(); ++b) {
      Problem one = shape;  // the sequence on its own: what the masks read
      one.seqlen_q = c.lq[b], one.seqlen_k = c.lk[b];
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < c.lq[b]; ++i) {
          const int64_t row = cu.q[b] + i, hk = h / (p.heads_q / p.heads_kv);
          std::vector<double> logit;
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < c.lk[b]; ++j) {
            if (!fs::test::sees(one, i, j)) continue;
            double dot = 0;
            for (int d = 0; d < 8; ++d)
              dot += double(in.data[size_t((row * p.heads_q + h) * 8 + d)]) *
                     double(in.data[size_t(in.k + ((cu.k[b] + j) * p.heads_kv + hk) * 8 + d)]);
            const double s = dot * double(p.softmax_scale);
            logit.push_back(c.softcap > 0 ? double(c.softcap) * std::tanh(s / double(c.softcap)) : s);
            keys.push_back(cu.k[b] + j);
          }
          CAPTURE(b, h, i);
          const double lse = r.lse[size_t(h * p.total_q + row)];
          if (keys.empty()) {  // no key: O = 0, LSE = -inf
            CHECK(lse == -std::numeric_limits<double>::infinity());
            for (int d = 0; d < 8; ++d) CHECK(r.o[size_t((row * p.heads_q + h) * 8 + d)] == 0.0);
            continue;
          }
          const double m = *std::max_element(logit.begin(), logit.end());
          double sum = 0;
          for (double l : logit) sum += std::exp(l - m);
          CHECK(near(lse, m + std::log(sum)));
          for (int d = 0; d < 8; ++d) {
            double o = 0;
            for (size_t n = 0; n < keys.size(); ++n)
              o += std::exp(logit[n] - m) / sum * double(in.data[size_t(in.v + (keys[n] * p.heads_kv + hk) * 8 + d)]);
            CHECK(near(r.o[size_t((row * p.heads_q + h) * 8 + d)], o));
          }
        }
    }
    // compare() reads a variable-length batch as its packed rows: the reference against itself passes.
    std::vector<float> o(r.o.begin(), r.o.end()), lse(r.lse.begin(), r.lse.end());
    CHECK(fs::compare(p, o, lse, r, 2.0).pass());
    o[0] += 1.0f;
    CHECK(!fs::compare(p, o, lse, r, 2.0).pass());
  }
  // Offsets that break the contract are refused, not read.
  const Problem p = fs::varlen_problem(base(), fs::offsets_of(kLengthsQ, kLengthsK));
  fs::HostInputs in;
  in.cu = fs::offsets_of(kLengthsQ, kLengthsK);
  in.cu.q[1] = 6;
  CHECK_THROWS_WITH(fs::reference_cpu(p, in),
                    "reference: cu_seqlens_q[2] is 5, below cu_seqlens_q[1] = 6: the offsets must not decrease");
}

TEST_CASE("varlen: the fp64 backward reference is each sequence's dense one, packed", "[varlen][reference][backward]") {
  // Each sequence copied out into a dense problem of its own lengths (batch 1, contiguous): the packed
  // reference's rows of that sequence must be that problem's gradients exactly (the same sums in the same
  // order), keys no row sees 0 and rows that see no key 0; GQA sums within the sequence only.
  struct Case {
    std::vector<int32_t> lq, lk;
    int64_t heads_q, heads_kv;
    int32_t causal, window, left, right;
    float softcap;
  };
  const Case cases[] = {
      {{0, 1, 7, 3}, {0, 1, 7, 3}, 2, 2, 0, 0, 0, 0, 0.0f},
      {{5, 0, 7, 1}, {3, 4, 9, 0}, 4, 2, 1, 0, 0, 0, 0.0f},   // causal, 5 rows on 3 keys: rows with no key
      {{6, 2, 9}, {9, 2, 4}, 4, 1, 1, 1, 2, -1, 0.0f},       // MQA, left only
      {{6, 2, 9}, {9, 2, 4}, 2, 1, 0, 1, -1, 1, 0.0f},       // right only
      {{6, 4}, {3, 8}, 2, 2, 0, 1, 0, 0, 0.0f},              // the diagonal alone
      {{5, 3}, {5, 6}, 2, 2, 1, 0, 0, 0, 0.5f},              // softcapped
  };
  int seed = 100;
  for (const Case& c : cases) {
    const int64_t D = 8;
    Problem shape = fs::make_problem(1, 1, 1, c.heads_q, c.heads_kv, D, fs::DType::fp16, c.causal);
    shape.window = c.window, shape.window_left = c.left, shape.window_right = c.right, shape.softcap = c.softcap;
    const Offsets cu = fs::offsets_of(c.lq, c.lk);
    const fs::BackwardProblem p = fs::backward_of(fs::varlen_problem(shape, cu), 0);
    REQUIRE(fs::validate(p).empty());
    const int64_t Hq = p.attention.heads_q, Hkv = p.attention.heads_kv;
    const int64_t nq = p.attention.total_q * Hq * D, nk = p.attention.total_k * Hkv * D;
    fs::BackwardHostInputs in;
    std::mt19937 rng(++seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    in.qkv.data.resize(size_t(nq + 2 * nk));
    for (float& x : in.qkv.data) x = u(rng);
    in.qkv.q = 0, in.qkv.k = nq, in.qkv.v = nq + nk, in.qkv.cu = cu;
    in.d_o.resize(size_t(nq));
    for (float& x : in.d_o) x = u(rng);
    for (const bool rounded : {false, true}) {
      const fs::BackwardReference r = fs::reference_cpu(p, in, rounded);
      REQUIRE(r.dq.size() == size_t(nq));
      REQUIRE(r.dk.size() == size_t(nk));
      REQUIRE(r.dv.size() == size_t(nk));
      for (size_t b = 0; b < c.lq.size(); ++b) {
        CAPTURE(rounded, b);
        const int64_t lq = c.lq[b], lk = c.lk[b];
        fs::BackwardProblem one =
            fs::backward_of(fs::make_problem(1, lq, lk, Hq, Hkv, D, fs::DType::fp16, c.causal), 0);
        one.attention.window = c.window, one.attention.window_left = c.left, one.attention.window_right = c.right;
        one.attention.softcap = c.softcap;
        fs::BackwardHostInputs dense;  // the sequence's rows, contiguous: Q, then K, then V
        const float* x = in.qkv.data.data();
        dense.qkv.data.assign(x + cu.q[b] * Hq * D, x + cu.q[b + 1] * Hq * D);
        dense.qkv.k = int64_t(dense.qkv.data.size());
        dense.qkv.data.insert(dense.qkv.data.end(), x + nq + cu.k[b] * Hkv * D, x + nq + cu.k[b + 1] * Hkv * D);
        dense.qkv.v = int64_t(dense.qkv.data.size());
        dense.qkv.data.insert(dense.qkv.data.end(), x + nq + nk + cu.k[b] * Hkv * D,
                              x + nq + nk + cu.k[b + 1] * Hkv * D);
        dense.d_o.assign(in.d_o.begin() + cu.q[b] * Hq * D, in.d_o.begin() + cu.q[b + 1] * Hq * D);
        const fs::BackwardReference want = fs::reference_cpu(one, dense, rounded);
        for (int64_t e = 0; e < lq * Hq * D; ++e) CHECK(r.dq[size_t(cu.q[b] * Hq * D + e)] == want.dq[size_t(e)]);
        for (int64_t e = 0; e < lk * Hkv * D; ++e) {
          CHECK(r.dk[size_t(cu.k[b] * Hkv * D + e)] == want.dk[size_t(e)]);
          CHECK(r.dv[size_t(cu.k[b] * Hkv * D + e)] == want.dv[size_t(e)]);
        }
        if (lq == 0)  // keys that no row sees
          for (int64_t e = 0; e < lk * Hkv * D; ++e) CHECK(r.dk[size_t(cu.k[b] * Hkv * D + e)] == 0.0);
        if (lk == 0)  // rows that see no key
          for (int64_t e = 0; e < lq * Hq * D; ++e) CHECK(r.dq[size_t(cu.q[b] * Hq * D + e)] == 0.0);
      }
    }
    // compare_gradients reads a variable-length batch as its packed rows: the reference against itself passes.
    const fs::BackwardReferences refs{fs::reference_cpu(p, in, false), fs::reference_cpu(p, in, true)};
    const std::vector<float> dq(refs.exact.dq.begin(), refs.exact.dq.end()),
        dk(refs.exact.dk.begin(), refs.exact.dk.end()), dv(refs.exact.dv.begin(), refs.exact.dv.end());
    for (const fs::GradComparison& g : fs::compare_gradients(p, dq, dk, dv, refs)) CHECK(g.pass());
    std::vector<float> bad = dv;
    bad.back() += 1.0f;
    CHECK_FALSE(fs::compare_gradients(p, dq, dk, bad, refs)[2].pass());
  }
  // Offsets that break the contract are refused, not read.
  fs::BackwardHostInputs in;
  in.qkv.cu = fs::offsets_of(kLengthsQ, kLengthsK);
  in.qkv.cu.k[2] = 2;
  const fs::BackwardProblem p = fs::backward_of(fs::varlen_problem(base(), fs::offsets_of(kLengthsQ, kLengthsK)), 0);
  CHECK_THROWS_WITH(fs::reference_cpu(p, in, false), "backward reference: cu_seqlens_k[2] is 2, below "
                                                     "cu_seqlens_k[1] = 3: the offsets must not decrease");
}

TEST_CASE("cli: --varlen makes a variable-length batch", "[cli][varlen]") {
  auto parse = [](std::vector<std::string> args) { return fs::parse_runner_args(args); };
  const fs::ParsedArgs a = parse({"--varlen", "0,1,128,4096", "--heads", "8", "--causal"});
  REQUIRE(a.error.empty());
  CHECK(a.options.varlen == std::vector<int32_t>{0, 1, 128, 4096});
  CHECK(a.options.cu.q == std::vector<int32_t>{0, 0, 1, 129, 4225});
  CHECK(a.options.cu.k == a.options.cu.q);
  const Problem p = fs::problem_from(a.options);
  CHECK(fs::describe(p) == "varlen b4 h8/8 sq<=4096 sk<=4096 tq4225 tk4225 d128 fp16 causal");
  CHECK(fs::validate(p).empty());
  CHECK(fs::validate_offsets(p, a.options.cu.q, a.options.cu.k).empty());
  const fs::ParsedArgs k = parse({"--varlen=3,5", "--varlen-k=7,0"});
  REQUIRE(k.error.empty());
  const Problem pk = fs::problem_from(k.options);
  CHECK((pk.batch == 2 && pk.seqlen_q == 5 && pk.seqlen_k == 7 && pk.total_q == 8 && pk.total_k == 7));
  CHECK(parse({"resources", "--varlen", "64,64", "--backward"}).error.empty());
  // The backward of a variable-length batch: dO, dQ packed like Q, dK, dV like K (batch strides 0), the
  // sequences' own FLOPs 2.5 times.
  const fs::ParsedArgs b = parse({"--varlen", "0,1,7,300", "--varlen-k", "5,0,64,300", "--backward", "--deterministic",
                                  "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--window", "20,-1"});
  REQUIRE(b.error.empty());
  CHECK(b.options.backward);
  const fs::BackwardProblem bp = fs::backward_problem_from(b.options);
  CHECK(fs::describe(bp) ==
        "backward varlen b4 h4/2 sq<=300 sk<=300 tq308 tk369 d64 fp16 window 20,-1 deterministic");
  CHECK(fs::validate(bp).empty());
  CHECK((bp.d_o.batch == 0 && bp.dq.batch == 0 && bp.dk.batch == 0 && bp.dv.batch == 0));
  CHECK((bp.dq.row == 4 * 64 && bp.dk.row == 2 * 64));
  CHECK(near(fs::backward_varlen_flops(bp, b.options.cu.q, b.options.cu.k),
             2.5 * fs::varlen_flops(bp.attention, b.options.cu.q, b.options.cu.k)));
  CHECK(fs::backward_varlen_flops(bp, b.options.cu.q, b.options.cu.k) < fs::backward_flops(bp));  // at the bounds
  CHECK(fs::runner_usage().find("--varlen N,N,...") != std::string::npos);
  CHECK(fs::runner_usage().find("--varlen-k N,N,...") != std::string::npos);

  const std::string rule = "--varlen expects comma-separated sequence lengths, each an integer from 0 to 2147483647, got '";
  for (const std::string bad : {"", ",", "1,", ",1", "1,,2", "-1", "1;2", "2147483648", " 1", "x"}) {
    CAPTURE(bad);
    CHECK(parse({"--varlen", bad}).error == rule + bad + "'");
  }
  CHECK(parse({"--varlen-k", "1"}).error ==
        "--varlen-k gives the key lengths of a variable-length batch; give the query lengths with --varlen");
  CHECK(parse({"--varlen", "1,2", "--varlen-k", "1"}).error ==
        "--varlen-k gives 1 key lengths and --varlen 2 sequences; give one key length per sequence");
  CHECK(parse({"--varlen", "1", "--seqlen", "8"}).error ==
        "--seqlen does not apply with --varlen, whose lengths give the batch (one sequence each) and the sequences' "
        "lengths");
  CHECK(parse({"--batch", "2", "--varlen", "1"}).error.find("--batch does not apply with --varlen") == 0);
  CHECK(parse({"--varlen", "1", "--decode"}).error.find("--varlen and the decoding flags") == 0);
  CHECK(parse({"--varlen", "2147483647,1"}).error ==
        "--varlen lengths add up to 2147483648 rows; a packed tensor holds at most 2147483647 (the kernels count its "
        "rows in int32)");
  CHECK(parse({"list", "--varlen", "1"}).error.find("--varlen does not apply to 'list'") == 0);
}

TEST_CASE("C ABI: the structs' layout, the variable-length batch's fields last in fs_problem", "[c_api][varlen]") {
  // Two pointers and two int64 after the window: every earlier field keeps its offset.
  CHECK(offsetof(fs_problem, window_right) == 200);
  CHECK(offsetof(fs_problem, cu_seqlens_q) == 208);
  CHECK(offsetof(fs_problem, cu_seqlens_k) == 216);
  CHECK(offsetof(fs_problem, total_q) == 224);
  CHECK(offsetof(fs_problem, total_k) == 232);
  CHECK(sizeof(fs_problem) == 240);
  // Every init leaves them off, whatever the struct held before.
  fs_problem p;
  std::memset(&p, 0x5a, sizeof p);
  fs_problem_init(&p, 1, 64, 64, 2, 2, 64, FS_FP16, 1);
  CHECK((p.cu_seqlens_q == nullptr && p.cu_seqlens_k == nullptr && p.total_q == 0 && p.total_k == 0));
  fs_backward_problem bp;
  std::memset(&bp, 0x5a, sizeof bp);
  fs_backward_problem_init(&bp, 1, 64, 64, 2, 2, 64, FS_FP16, 1, 0);
  CHECK((bp.attention.cu_seqlens_q == nullptr && bp.attention.total_k == 0));
  fs_decode_problem dp;
  std::memset(&dp, 0x5a, sizeof dp);
  fs_decode_problem_init(&dp, 1, 1, 64, 2, 2, 64, FS_FP16, 0, 0);
  CHECK((dp.attention.cu_seqlens_k == nullptr && dp.attention.total_q == 0));
}
