// Seeded random problems and command lines, drawn to hit the extremes: 0, 1, powers of two ± 1,
// INT32/INT64 limits, negatives, NaN and infinite scales, odd strides, output strides that overlap.
// The invariant: a problem that validate() accepts has every size representable (checked here with
// 128-bit arithmetic, independently of common/step/overflow.h) and an output that never overlaps itself;
// so does a backward problem that validate() accepts, for dO and its gradients dQ, dK, dV, and a
// decoding problem for its cache and block table; every refusal is a sentence. CI runs this file in
// the AddressSanitizer + UBSan build too, where any overflow or bad access aborts the run
// (FLASH_STEPS_SANITIZE, .ci/run). Each test prints one summary line, which tests/README.md quotes:
// report() checks that it does, so the README's figures are the tests' own.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/flash_steps.h"
#include "common/forward/rules.h"
#include "runner/cli.h"

namespace {

using i128 = __int128;
constexpr i128 kInt64Max = INT64_MAX;
constexpr i128 kMaxElements = i128(1) << 58;

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  uint64_t next() { return rng_(); }
  bool coin(int one_in) { return rng_() % uint64_t(one_in) == 0; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[rng_() % v.size()]; }

  // An integer near the edges: 0, 1, 2^k - 1, 2^k, 2^k + 1, the int32/int64 limits, negatives, or
  // a small value.
  int64_t extreme() {
    static const std::vector<int64_t> edges = {0,        1,         -1,        -8,        2,        7,        8,
                                               9,        INT32_MAX, int64_t(INT32_MAX) + 1, UINT32_MAX,
                                               int64_t(UINT32_MAX) + 1, INT64_MAX, INT64_MAX - 7, INT64_MIN,
                                               INT64_MIN + 8};
    switch (rng_() % 4) {
      case 0: return pick(edges);
      case 1: {
        const int64_t power = int64_t(1) << (rng_() % 63);
        return power + int64_t(rng_() % 3) - 1;
      }
      case 2: return int64_t(rng_() % 300) - 2;
      default: return int64_t(rng_() % 64) * 8;
    }
  }
  // A size for one dimension: mostly sensible, sometimes extreme.
  int64_t size(int64_t typical) { return coin(8) ? extreme() : int64_t(rng_() % uint64_t(typical)) + 1; }

 private:
  std::mt19937_64 rng_;  // its output sequence is fixed by the C++ standard, so the draws are the same everywhere
};

// x, or the nearest int64_t: the test's own arithmetic must not overflow either (UBSan would stop it).
int64_t clamp64(i128 x) { return int64_t(std::max<i128>(INT64_MIN, std::min<i128>(INT64_MAX, x))); }

float draw_scale(Draw& d, int32_t dtype, int64_t head_dim) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const double bound = head_dim > 0 && head_dim <= 256 ? fs::max_softmax_scale(dtype, head_dim) : 1.0;
  switch (d.next() % 6) {
    case 0: return d.pick(std::vector<float>{nan, inf, -inf, 0.0f, -0.0f, FLT_MAX, -FLT_MAX, FLT_MIN,
                                             std::numeric_limits<float>::denorm_min(), 1.0f, -1.0f});
    case 1: return float(bound);
    case 2: return std::nextafter(float(bound), inf);
    case 3: return std::nextafter(float(bound), 0.0f);
    default: return std::pow(10.0f, float(int(d.next() % 80)) - 40.0f);  // 1e-40 ... 1e39 (inf beyond)
  }
}

fs::Strides draw_strides(Draw& d, const fs::Strides& contiguous, int64_t head_dim) {
  fs::Strides s = contiguous;
  switch (d.next() % 5) {
    case 0: return s;                                                         // contiguous
    case 1: s.batch = d.extreme(); break;                                     // one extreme stride
    case 2: s.row = d.extreme(); break;
    case 3: s.head = d.extreme(); break;
    default: {                                                                // a permuted or aliasing layout
      const std::vector<int64_t> choices = {0, 8, head_dim, clamp64(i128(2) * head_dim), contiguous.row,
                                            contiguous.batch, clamp64(i128(contiguous.row) + 8), contiguous.batch / 2,
                                            d.extreme()};
      s.batch = d.pick(choices);
      s.row = d.pick(choices);
      s.head = d.pick(choices);
    }
  }
  if (d.coin(20)) s.dim = d.extreme();
  return s;
}

// A problem; `strides_drawn` says whether any stride differs from make_problem's contiguous ones.
fs::Problem draw_problem(Draw& d, bool& strides_drawn) {
  const int64_t b = d.size(4), sq = d.size(d.coin(2) ? 8 : 300), sk = d.size(300), hkv = d.size(4);
  int64_t hq = d.size(16);
  if (d.coin(3) && __builtin_mul_overflow(hkv, d.size(4), &hq)) hq = hkv;  // a GQA group, when it fits
  const int64_t head_dim = d.coin(4) ? d.extreme() : 8 * (int64_t(d.next() % 32) + 1);
  const fs::DType dt = d.coin(2) ? fs::DType::fp16 : fs::DType::bf16;
  fs::Problem p = fs::make_problem(b, sq, sk, hq, hkv, head_dim, dt, d.coin(2));
  if (d.coin(20)) p.dtype = int32_t(d.extreme());
  if (d.coin(20)) p.causal = int32_t(d.extreme());
  if (d.coin(3)) p.softmax_scale = draw_scale(d, p.dtype, p.head_dim);
  strides_drawn = false;
  for (fs::Strides* s : {&p.q, &p.k, &p.v, &p.o})
    if (d.coin(3)) {
      *s = draw_strides(d, *s, p.head_dim);
      strides_drawn = true;
    }
  return p;
}

// The largest offset + 1 of a view, in 128 bits (0 when empty).
i128 extent128(const fs::Strides& s, int64_t b, int64_t seqlen, int64_t heads, int64_t head_dim) {
  if (b == 0 || seqlen == 0 || heads == 0 || head_dim == 0) return 0;
  return i128(b - 1) * s.batch + i128(seqlen - 1) * s.row + i128(heads - 1) * s.head + head_dim;
}

// Every element of a view at its own address, by enumeration (small views only).
bool view_is_injective(const fs::Strides& s, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim) {
  std::vector<int64_t> offsets;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < head_dim; ++c) offsets.push_back(b * s.batch + i * s.row + h * s.head + c);
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end();
}

bool output_is_injective(const fs::Problem& p) {
  return view_is_injective(p.o, p.batch, p.seqlen_q, p.heads_q, p.head_dim);
}

// The invariant of an accepted problem, each part checked in 128 bits.
void check_accepted(const fs::Problem& p, int64_t& enumerated) {
  REQUIRE((p.dtype == FS_FP16 || p.dtype == FS_BF16));
  REQUIRE((p.causal == 0 || p.causal == 1));
  REQUIRE(p.batch >= 1);
  REQUIRE((p.seqlen_q >= 0 && p.seqlen_q <= INT32_MAX && p.seqlen_k >= 0 && p.seqlen_k <= INT32_MAX));
  REQUIRE((p.heads_kv >= 1 && p.heads_q >= p.heads_kv && p.heads_q % p.heads_kv == 0));
  REQUIRE(i128(p.batch) * p.heads_q <= INT32_MAX);
  REQUIRE((p.head_dim >= 8 && p.head_dim <= 256 && p.head_dim % 8 == 0));
  REQUIRE((std::isfinite(p.softmax_scale) && p.softmax_scale > 0));
  // The kernels' scale·log2(e) is finite, and for fp16 so is the largest logit any input can give.
  REQUIRE(std::isfinite(p.softmax_scale * float(fs::kLog2e)));
  if (p.dtype == FS_FP16)
    REQUIRE(std::isfinite(float(double(p.head_dim) * 65504.0 * 65504.0) * (p.softmax_scale * float(fs::kLog2e))));

  struct View {
    const fs::Strides& s;
    int64_t seqlen, heads;
  };
  const View views[] = {{p.q, p.seqlen_q, p.heads_q}, {p.k, p.seqlen_k, p.heads_kv}, {p.v, p.seqlen_k, p.heads_kv},
                        {p.o, p.seqlen_q, p.heads_q}};
  i128 inputs = 0;
  for (const View& v : views) {
    const i128 logical = i128(p.batch) * v.seqlen * v.heads * p.head_dim;
    const i128 extent = extent128(v.s, p.batch, v.seqlen, v.heads, p.head_dim);
    REQUIRE(logical <= kMaxElements);
    REQUIRE((extent >= 0 && extent <= kMaxElements));
    REQUIRE(i128(fs::view_extent(v.s, p.batch, v.seqlen, v.heads, p.head_dim)) == extent);
    REQUIRE(extent * 8 <= kInt64Max);  // bytes as fp64
    REQUIRE(logical * 8 <= kInt64Max);
    if (&v.s != &p.o) inputs += (extent + 7) / 8 * 8;
  }
  REQUIRE(inputs * 8 <= kInt64Max);  // Q, K and V in one buffer, even as fp64
  REQUIRE(i128(p.batch) * p.heads_q * p.seqlen_q * 8 <= kInt64Max);  // LSE

  const i128 o_elems = i128(p.batch) * p.seqlen_q * p.heads_q * p.head_dim;
  if (o_elems > 0 && o_elems <= (1 << 15)) {
    ++enumerated;
    REQUIRE(output_is_injective(p));
  }
}

// A decoding problem: a drawn forward problem's sizes, dtype, scale and Q/O strides, and a cache that is
// contiguous or paged (fs_decode_problem_init's, then fields drawn at the edges), num_splits, checked.
fs::DecodeProblem draw_decode_problem(Draw& d) {
  bool strides_drawn = false;
  const fs::Problem f = draw_problem(d, strides_drawn);
  const int64_t page = d.coin(3) ? 0 : d.coin(4) ? d.extreme() : 16 * int64_t(d.next() % 8 + 1);
  const int64_t seqlen_k = d.coin(10) ? d.extreme() : f.seqlen_k;
  fs::DecodeProblem p = fs::make_decode_problem(f.batch, f.seqlen_q, seqlen_k, f.heads_q, f.heads_kv, f.head_dim,
                                                fs::DType::fp16, false, page);
  p.attention.dtype = f.dtype, p.attention.causal = f.causal, p.attention.softmax_scale = f.softmax_scale;
  p.attention.q = f.q, p.attention.o = f.o;
  if (d.coin(4)) p.attention.k = p.attention.v = draw_strides(d, p.attention.k, f.head_dim);
  p.num_splits = d.coin(6) ? int32_t(d.extreme()) : int32_t(d.next() % 130);
  if (d.coin(10)) p.checked = d.coin(2) ? 1 : int32_t(d.extreme());
  for (int64_t* field : {&p.num_pages, &p.max_pages_per_seq, &p.block_table_stride})
    if (d.coin(8)) *field = d.extreme();
  return p;
}

// The invariant of an accepted decoding problem, in 128 bits: its fields in their ranges, and the
// cache (as a (batch, seqlen_k, ...) or a (num_pages, page_size, ...) view) and the block table
// representable; what a kernel reads of them lies within.
void check_accepted(const fs::DecodeProblem& p, int64_t& enumerated) {
  const fs::Problem& f = p.attention;
  REQUIRE((p.num_splits >= 0 && p.num_splits <= 128 && (p.checked == 0 || p.checked == 1)));
  fs::Problem shared = f;  // Q, O and the shared sizes, as check_accepted judges a forward problem
  if (fs::is_paged(p)) shared.seqlen_k = 0, shared.k = shared.v = fs::contiguous_strides(0, f.heads_kv, f.head_dim);
  check_accepted(shared, enumerated);
  if (!fs::is_paged(p)) {
    REQUIRE((p.num_pages == 0 && p.max_pages_per_seq == 0 && p.block_table_stride == 0));
    REQUIRE(f.seqlen_k <= INT32_MAX);
    return;
  }
  REQUIRE((p.page_size >= 16 && p.page_size % 16 == 0 && p.page_size <= INT32_MAX));
  REQUIRE((p.num_pages >= 1 && p.num_pages <= INT32_MAX));
  REQUIRE((p.max_pages_per_seq >= 1 && p.block_table_stride >= p.max_pages_per_seq));
  REQUIRE(i128(f.batch) * p.block_table_stride <= kMaxElements);
  REQUIRE(i128(f.seqlen_k) <= i128(p.max_pages_per_seq) * p.page_size);  // every key has a page
  for (const fs::Strides* s : {&f.k, &f.v}) {
    REQUIRE(s->dim == 1);
    REQUIRE(i128(p.num_pages) * p.page_size * f.heads_kv * f.head_dim <= kMaxElements);
    REQUIRE(extent128(*s, p.num_pages, p.page_size, f.heads_kv, f.head_dim) <= kMaxElements);
  }
}

// The summary line of a fuzz test: printed, then looked for in tests/README.md, which quotes it.
void report(const std::ostringstream& line) {
  std::cout << line.str() << "\n";
  std::ifstream readme(FLASH_STEPS_SOURCE_DIR "/tests/README.md");
  const std::string text((std::istreambuf_iterator<char>(readme)), std::istreambuf_iterator<char>());
  INFO("tests/README.md must quote this line, as the test prints it: " << line.str());
  CHECK(text.find(line.str()) != std::string::npos);
}

fs::DeviceInfo fake_h100() {
  fs::DeviceInfo d;
  d.name = "fake";
  d.compute_capability = 90;
  d.sm_count = 132;
  d.smem_per_block_optin = 227 * 1024;
  d.l2_bytes = 50 << 20;
  d.free_bytes = d.total_bytes = size_t(80) << 30;
  return d;
}

// A step that does not say it reads free memory (Step::reads_free_memory) must plan the same on a
// device reporting none: the C ABI asks the driver for free memory only for the steps that say so.
template <typename Problem>
void check_blind_plan(const fs::Step& s, const Problem& p, const fs::Plan& plan, const fs::DeviceInfo& dev) {
  if (s.reads_free_memory) return;
  fs::DeviceInfo blind_dev = dev;
  blind_dev.free_bytes = 0;
  const fs::Plan blind = fs::plan(s, p, blind_dev);
  CAPTURE(s.id);
  REQUIRE(blind.refusal == plan.refusal);
  REQUIRE(blind.workspace_bytes == plan.workspace_bytes);
  REQUIRE(blind.config == plan.config);
  REQUIRE(blind.splits == plan.splits);
  REQUIRE(blind.kernels.size() == plan.kernels.size());
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    REQUIRE(blind.kernels[k].function == plan.kernels[k].function);
    REQUIRE(blind.kernels[k].threads == plan.kernels[k].threads);
    REQUIRE(blind.kernels[k].smem_bytes == plan.kernels[k].smem_bytes);
    REQUIRE(blind.kernels[k].blocks == plan.kernels[k].blocks);
  }
}

}  // namespace

TEST_CASE("fuzz: every accepted problem has representable sizes and a non-overlapping output", "[fuzz]") {
  constexpr int kProblems = 200000;
  Draw d(20240611);
  const fs::DeviceInfo dev = fake_h100();
  int64_t accepted = 0, refused = 0, enumerated = 0, planned = 0, step_refusals = 0;
  for (int n = 0; n < kProblems; ++n) {
    bool strides_drawn = false;
    const fs::Problem p = draw_problem(d, strides_drawn);
    const std::string why = fs::validate(p);
    if (!why.empty()) {
      INFO(why);
      REQUIRE(why.size() > 15);  // a sentence, naming the value
      // Contiguous strides are derived from the sizes: a refusal then speaks of the sizes given.
      if (!strides_drawn) REQUIRE(why.find("stride") == std::string::npos);
      ++refused;
      continue;
    }
    ++accepted;
    CAPTURE(fs::describe(p), p.softmax_scale, p.q.batch, p.q.row, p.q.head, p.o.batch, p.o.row, p.o.head);
    check_accepted(p, enumerated);
    // Every step's device-free limits and its plan, on a made-up H100, on every accepted problem; a
    // step that does not say it reads free memory plans the same without it (the C ABI's device).
    for (const fs::Step& s : fs::steps()) {
      const fs::Plan plan = fs::plan(s, p, dev);
      ++planned;
      if (n % 16 == 0) check_blind_plan(s, p, plan, dev);
      if (!plan.accepted()) {
        REQUIRE(plan.refusal.size() > 15);
        ++step_refusals;
      } else if (s.id == "01_naive") {
        REQUIRE(i128(plan.workspace_bytes) == i128(p.batch) * p.heads_q * p.seqlen_q * p.seqlen_k * 4);
      }
    }
  }
  std::ostringstream line;
  line << "fuzz: " << kProblems << " problems drawn: " << accepted << " accepted (invariants hold; " << enumerated
       << " outputs enumerated element by element), " << refused << " refused by validate() with a sentence; "
       << planned << " step plans, " << step_refusals << " of them refusals with a sentence";
  report(line);
  CHECK(accepted > kProblems / 10);
  CHECK(refused > kProblems / 10);
  CHECK(enumerated > 1000);
}

TEST_CASE("fuzz: every accepted backward problem has representable gradients that never overlap", "[fuzz]") {
  constexpr int kProblems = 100000;
  Draw d(20261130);
  const fs::DeviceInfo dev = fake_h100();
  int64_t accepted = 0, refused = 0, enumerated = 0;
  for (int n = 0; n < kProblems; ++n) {
    bool strides_drawn = false;
    fs::BackwardProblem p = fs::backward_of(draw_problem(d, strides_drawn), d.coin(2));
    if (d.coin(20)) p.deterministic = int32_t(d.extreme());
    for (fs::Strides* s : {&p.d_o, &p.dq, &p.dk, &p.dv})
      if (d.coin(6)) *s = draw_strides(d, *s, p.attention.head_dim);
    const std::string why = fs::validate(p);
    if (!why.empty()) {
      INFO(why);
      REQUIRE(why.size() > 15);
      // The forward problem's rules come first, with their own sentence.
      if (const std::string forward = fs::validate(p.attention); !forward.empty()) REQUIRE(why == forward);
      ++refused;
      continue;
    }
    ++accepted;
    const fs::Problem& f = p.attention;
    CAPTURE(fs::describe(f), p.deterministic, p.dq.batch, p.dq.row, p.dq.head, p.dk.batch, p.dk.row, p.dk.head);
    REQUIRE(fs::validate(f).empty());
    REQUIRE((p.deterministic == 0 || p.deterministic == 1));
    struct View {
      const fs::Strides& s;
      int64_t rows, heads;
      bool written;
    };
    const View views[] = {{p.d_o, f.seqlen_q, f.heads_q, false}, {p.dq, f.seqlen_q, f.heads_q, true},
                          {p.dk, f.seqlen_k, f.heads_kv, true}, {p.dv, f.seqlen_k, f.heads_kv, true}};
    for (const View& v : views) {
      REQUIRE(v.s.dim == 1);
      const i128 extent = extent128(v.s, f.batch, v.rows, v.heads, f.head_dim);
      REQUIRE((extent >= 0 && extent <= kMaxElements));
      REQUIRE(i128(fs::view_extent(v.s, f.batch, v.rows, v.heads, f.head_dim)) == extent);
      const i128 elems = i128(f.batch) * v.rows * v.heads * f.head_dim;
      if (v.written && elems > 0 && elems <= (1 << 15)) {
        ++enumerated;
        REQUIRE(view_is_injective(v.s, f.batch, v.rows, v.heads, f.head_dim));
      }
    }
    if (accepted % 16 == 0)
      for (const fs::Step& s : fs::steps())
        if (s.backward.present()) check_blind_plan(s, p, fs::plan(s, p, dev), dev);
  }
  std::ostringstream line;
  line << "fuzz: " << kProblems << " backward problems drawn: " << accepted << " accepted (" << enumerated
       << " gradients enumerated element by element), " << refused << " refused by validate()";
  report(line);
  CHECK(accepted > kProblems / 20);  // fewer than forward problems: four more views may break a rule
  CHECK(refused > kProblems / 10);
  CHECK(enumerated > 1000);
}

TEST_CASE("fuzz: every accepted decoding problem has a representable cache and block table", "[fuzz][decode]") {
  constexpr int kProblems = 100000;
  Draw d(20261201);
  const fs::DeviceInfo dev = fake_h100();
  int64_t accepted = 0, paged = 0, refused = 0, enumerated = 0, planned = 0, step_refusals = 0;
  for (int n = 0; n < kProblems; ++n) {
    const fs::DecodeProblem p = draw_decode_problem(d);
    const std::string why = fs::validate(p);
    double bytes = -1;
    if (!why.empty()) {
      INFO(why);
      REQUIRE(why.size() > 15);
      REQUIRE(fs_decode_kv_bytes(&p, nullptr, 0, &bytes) == FS_ERR_INVALID);  // the helper applies the same rules
      ++refused;
      continue;
    }
    ++accepted;
    paged += fs::is_paged(p) ? 1 : 0;
    CAPTURE(fs::describe(p), p.num_pages, p.max_pages_per_seq, p.block_table_stride, p.attention.k.batch,
            p.attention.k.row, p.attention.k.head);
    check_accepted(p, enumerated);
    REQUIRE(fs_decode_kv_bytes(&p, nullptr, 0, &bytes) == FS_OK);
    REQUIRE((std::isfinite(bytes) && bytes >= 0));
    for (const fs::Step& s : fs::steps()) {
      if (!s.decode.present()) continue;
      const fs::Plan plan = fs::plan(s, p, dev);
      ++planned;
      if (n % 16 == 0) check_blind_plan(s, p, plan, dev);
      if (!plan.accepted()) {
        REQUIRE(plan.refusal.size() > 15);
        ++step_refusals;
      }
    }
  }
  std::ostringstream line;
  line << "fuzz: " << kProblems << " decoding problems drawn: " << accepted << " accepted (" << paged
       << " of them paged; invariants hold, " << enumerated << " outputs enumerated element by element), " << refused
       << " refused by validate() with a sentence; " << planned << " decoding plans, " << step_refusals
       << " of them refusals with a sentence";
  report(line);
  CHECK(accepted > kProblems / 20);
  CHECK(paged > accepted / 10);
  CHECK(refused > kProblems / 10);
}

TEST_CASE("fuzz: random command lines are parsed or refused with a sentence", "[fuzz]") {
  constexpr int kCommandLines = 100000;
  const std::vector<std::string> flags = {
      "--batch", "--seqlen", "--seqlen-q", "--seqlen-k", "--heads", "--kv-heads", "--head-dim", "--dtype", "--causal",
      "--scale", "--iters", "--warmup", "--seed", "--no-flush", "--no-baseline", "--json", "--csv", "--step",
      "--list", "--help", "-h", "list", "run", "banks", "explain", "resources", "--bacth", "-", "--", "=", "",
      "--decode", "--page-size", "--ragged", "--splits", "--checked", "--hbm-tbs", "--backward", "--deterministic"};
  const std::vector<std::string> values = {
      "", " ", "0", "1", "-1", "+1", " 12", "12 ", "007", "8", "40", "64", "256", "264", "2147483647", "2147483648",
      "4294967296", "9223372036854775807", "9223372036854775808", "99999999999999999999", "0x10", "1e3", "nan", "inf",
      "-inf", "0.5", ".5", "5.", "1e-50", "1e39", "3.4e38", "fp16", "bf16", "fp32", "01_naive", "03_smem_tiling,07_flash_attention2",
      ",", "=", "--batch", "1,2", "\t8", "16", "48", "128", "129", "1e-45", "4.64"};
  Draw d(77);
  int64_t parsed = 0, refused = 0, valid_problems = 0, decode_runs = 0, backward_runs = 0;
  for (int n = 0; n < kCommandLines; ++n) {
    std::vector<std::string> args;
    const int count = int(d.next() % 9);
    for (int i = 0; i < count; ++i) {
      std::string a = d.pick(d.coin(2) ? flags : values);
      if (d.coin(4) && a.rfind("--", 0) == 0) a += "=" + d.pick(values);
      if (d.coin(50)) a.push_back(char(d.next() % 256));  // a stray byte
      args.push_back(a);
    }
    const fs::ParsedArgs r = fs::parse_runner_args(args);
    if (!r.error.empty()) {
      ++refused;
      continue;
    }
    ++parsed;
    const fs::RunnerOptions& o = r.options;
    CAPTURE(args);
    // Every value that got through is within its flag's documented rule.
    REQUIRE((o.batch >= 1 && o.batch <= INT32_MAX));
    REQUIRE((o.seqlen_q >= 0 && o.seqlen_q <= INT32_MAX && o.seqlen_k >= 0 && o.seqlen_k <= INT32_MAX));
    REQUIRE((o.heads >= 1 && o.heads <= INT32_MAX && o.kv_heads >= 0 && o.kv_heads <= INT32_MAX));
    REQUIRE((o.head_dim >= 8 && o.head_dim <= 256 && o.head_dim % 8 == 0));
    REQUIRE((o.iters >= 1 && o.iters <= 100000 && o.warmup >= 0 && o.warmup <= 100000));
    if (o.scale_given) REQUIRE((std::isfinite(o.scale) && o.scale > 0));
    // A command other than run took no option that does not apply to it: resources takes the
    // problem, --step and --json; explain and banks --step only; list and help nothing.
    const fs::RunnerOptions defaults;
    if (o.command != "run") {
      REQUIRE(o.iters == defaults.iters);
      REQUIRE(o.flush_l2 == defaults.flush_l2);
    }
    if (o.command != "run" && o.command != "resources") {
      REQUIRE(o.batch == defaults.batch);
      REQUIRE(o.head_dim == defaults.head_dim);
      REQUIRE(o.causal == defaults.causal);
      if (o.command != "explain" && o.command != "banks") REQUIRE(o.steps.empty());
    }
    // The decoding and backward modes: their flags within their rules, one kind of run, and the
    // problem they make refused (if at all) for what a flag gave: the CLI has no num_pages.
    REQUIRE((o.splits >= 0 && o.splits <= 128 && o.page_size >= 0 && o.page_size % 16 == 0));
    REQUIRE(!(o.decode && o.backward));
    if (o.hbm_tbs != 0) REQUIRE((o.decode && std::isfinite(o.hbm_tbs) && o.hbm_tbs > 0));
    std::string why;
    if (o.decode) {
      const fs::DecodeProblem p = fs::decode_problem_from(o);
      why = fs::validate(p);
      INFO(why);
      REQUIRE(why.find("num_pages") == std::string::npos);
      if (why.empty() && o.ragged && o.batch <= 4096) REQUIRE(fs::validate_lengths(p, fs::decode_lengths_from(o)).empty());
      decode_runs += 1;
    } else if (o.backward) {
      why = fs::validate(fs::backward_problem_from(o));
      backward_runs += 1;
    } else {
      why = fs::validate(fs::problem_from(o));
    }
    valid_problems += why.empty() ? 1 : 0;
  }
  std::ostringstream line;
  line << "fuzz: " << kCommandLines << " command lines drawn: " << parsed << " parsed (" << decode_runs
       << " decoding and " << backward_runs << " backward runs; " << valid_problems << " valid problems), " << refused
       << " refused with a message";
  report(line);
  CHECK(parsed > 100);
  CHECK(refused > kCommandLines / 2);
}
