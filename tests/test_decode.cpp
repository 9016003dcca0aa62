// Decoding problems in the harness (common/decode/rules.h) without a GPU: every rule of validate
// with its sentence, the pointers, the host check of lengths and block table, the forward view, the
// gather of a paged cache and the CPU reference per sequence, the C ABI's refusals, and every
// decoding step's plans of what it claims.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/check.h"
#include "common/decode/rules.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "common/forward/rules.h"
#include "common/harness/gpu.h"
#include "stub_step.h"

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

fs::DecodeProblem paged() { return fs::make_decode_problem(3, 2, 100, 8, 2, 64, fs::DType::bf16, true, 32); }

std::string message_after(const std::function<void(fs::DecodeProblem&)>& edit) {
  fs::DecodeProblem p = paged();
  edit(p);
  return fs::validate(p);
}

// Host inputs of a decoding problem, every element from `value(tensor, slot, row, head, dim)` where
// slot is the batch entry (Q, contiguous cache) or the page; padding stays NaN.
template <typename F>
fs::DecodeHostInputs host_inputs(const fs::DecodeProblem& p, F value) {
  fs::DecodeHostInputs in;
  const int64_t slots = fs::is_paged(p) ? p.num_pages : p.attention.batch, rows = fs::is_paged(p) ? p.page_size : p.attention.seqlen_k;
  auto fill = [&](std::vector<float>& out, int tensor, const fs::Strides& st, int64_t n0, int64_t n1, int64_t heads) {
    out.assign(size_t(fs::view_extent(st, n0, n1, heads, p.attention.head_dim)), std::numeric_limits<float>::quiet_NaN());
    for (int64_t a = 0; a < n0; ++a)
      for (int64_t r = 0; r < n1; ++r)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < p.attention.head_dim; ++d)
            out[size_t(a * st.batch + r * st.row + h * st.head + d)] = value(tensor, a, r, h, d);
  };
  fill(in.q, 0, p.attention.q, p.attention.batch, p.attention.seqlen_q, p.attention.heads_q);
  fill(in.k_cache, 1, p.attention.k, slots, rows, p.attention.heads_kv);
  fill(in.v_cache, 2, p.attention.v, slots, rows, p.attention.heads_kv);
  return in;
}

float pseudo(int tensor, int64_t slot, int64_t row, int64_t head, int64_t dim) {
  return std::sin(float(tensor * 7919 + slot * 104729 + row * 131 + head * 17) + 0.37f * float(dim));
}

}  // namespace

TEST_CASE("decode: make_decode_problem fills a contiguous or a paged cache", "[decode]") {
  const fs::DecodeProblem c = fs::make_decode_problem(2, 1, 1000, 32, 8, 128, fs::DType::fp16, false);
  CHECK(fs::validate(c).empty());
  CHECK((c.page_size == 0 && c.num_pages == 0 && c.max_pages_per_seq == 0 && c.block_table_stride == 0));
  CHECK(c.attention.k.batch == 1000 * 8 * 128);
  const fs::DecodeProblem p = fs::make_decode_problem(2, 1, 1000, 32, 8, 128, fs::DType::fp16, false, 64);
  CHECK(fs::validate(p).empty());
  CHECK((p.page_size == 64 && p.max_pages_per_seq == 16 && p.num_pages == 32 && p.block_table_stride == 16));
  CHECK((p.attention.k.batch == 64 * 8 * 128 && p.attention.k.row == 8 * 128 && p.attention.k.head == 128));
  CHECK(fs::describe(p) == "b2 h32/8 sq1 sk1000 d128 fp16 paged64");
  CHECK(fs::validate(fs::make_decode_problem(1, 0, 0, 1, 1, 8, fs::DType::fp16, false, 16)).empty());
  // The forward problem and back.
  const fs::Problem f = c.attention;
  CHECK(fs::describe(f) == "b2 h32/8 sq1 sk1000 d128 fp16");
  CHECK(std::memcmp(&f.k, &c.attention.k, sizeof f.k) == 0);
  const fs::DecodeProblem back = fs::decode_of(f);
  CHECK(std::memcmp(&back, &c, sizeof back) == 0);
  CHECK(fs::decode_kv_bytes(c, {}) == 2.0 * 2 * 1000 * 8 * 128 * 2);
  CHECK(fs::decode_kv_bytes(c, std::vector<int32_t>{10, 0}) == 2.0 * 10 * 8 * 128 * 2);
}

TEST_CASE("decode: validate names the value and the limit", "[decode]") {
  struct Case {
    std::function<void(fs::DecodeProblem&)> edit;
    std::string expected;
  };
  const Case cases[] = {
      {[](fs::DecodeProblem& p) { p.attention.batch = 0; }, "batch is 0; it must be at least 1"},
      {[](fs::DecodeProblem& p) { p.attention.head_dim = 12; }, "head_dim is 12; it must be a multiple of 8"},
      {[](fs::DecodeProblem& p) { p.attention.seqlen_k = -1; }, "seqlen_k is -1; it must be between 0 and 2147483647"},
      {[](fs::DecodeProblem& p) { p.attention.q.row = 12; }, "Q's row stride is 12 elements; it must be a multiple of 8"},
      {[](fs::DecodeProblem& p) { p.num_splits = 129; },
       "num_splits is 129; it must be 0 (the step's heuristic) or between 1 and 128"},
      {[](fs::DecodeProblem& p) { p.num_splits = -1; }, "num_splits is -1"},
      {[](fs::DecodeProblem& p) { p.checked = 2; }, "checked is 2; it must be 0 or 1"},
      {[](fs::DecodeProblem& p) { p.page_size = 24; },
       "page_size is 24; it must be 0 (a contiguous cache) or a multiple of 16 from 16 to 2147483632, so that every "
       "group of 16 keys starting at a multiple of 16 lies in one page"},
      {[](fs::DecodeProblem& p) { p.page_size = -16; }, "page_size is -16"},
      {[](fs::DecodeProblem& p) { p.num_pages = 0; }, "num_pages is 0; it must be between 1 and 2147483647"},
      {[](fs::DecodeProblem& p) { p.num_pages = int64_t(1) << 31; }, "num_pages is 2147483648"},
      {[](fs::DecodeProblem& p) { p.max_pages_per_seq = 0; }, "max_pages_per_seq is 0; it must be between 1 and"},
      {[](fs::DecodeProblem& p) { p.block_table_stride = 3; },
       "block_table_stride is 3; it must be at least max_pages_per_seq (4) so that the rows of the block table do "
       "not overlap"},
      {[](fs::DecodeProblem& p) { p.block_table_stride = int64_t(1) << 62; },
       "the block table spans batch * block_table_stride = 3 * 4611686018427387904 elements, which overflows 64 bits"},
      {[](fs::DecodeProblem& p) { p.attention.seqlen_k = 129; },
       "seqlen_k is 129; a sequence holds at most max_pages_per_seq * page_size = 4 * 32 = 128 keys"},
      {[](fs::DecodeProblem& p) { p.attention.k.batch = 12; }, "K's page stride is 12 elements; it must be a multiple of 8"},
      {[](fs::DecodeProblem& p) { p.attention.v.row = 8; }, "V's row stride 8 is smaller than head_dim 64; rows would overlap"},
      {[](fs::DecodeProblem& p) { p.attention.k.batch = int64_t(1) << 57; },
       "K's strides (page 144115188075855872, row 128, head 64) over num_pages 12, page_size 32, heads_kv 2 span"},
      {[](fs::DecodeProblem& p) { p.num_pages = int64_t(1) << 30, p.page_size = int64_t(1) << 22; },
       "K and V have num_pages * page_size * heads_kv * head_dim = 1073741824 * 4194304 * 2 * 64 = "
       "576460752303423488 elements; a tensor may hold at most 2^58"},
  };
  for (const Case& c : cases) {
    const std::string m = message_after(c.edit);
    CAPTURE(m, c.expected);
    CHECK(contains(m, c.expected));
  }
  // A contiguous cache has no pages: their fields must be 0.
  fs::DecodeProblem c = fs::make_decode_problem(1, 1, 64, 1, 1, 64, fs::DType::fp16, false);
  c.num_pages = 5;
  CHECK(fs::validate(c) == "num_pages is 5 with a contiguous cache (page_size 0); it must be 0");
  c = fs::make_decode_problem(1, 1, 64, 1, 1, 64, fs::DType::fp16, false);
  c.attention.k.batch = 12;
  CHECK(contains(fs::validate(c), "K's batch stride is 12 elements"));
}

TEST_CASE("decode: pointers and host data", "[decode]") {
  const fs::DecodeProblem p = paged();
  alignas(16) static char mem[256];
  const fs::DecodeTensors ok{mem, mem + 16, mem + 32, reinterpret_cast<const int32_t*>(mem + 48), nullptr, mem + 64,
                             nullptr};
  CHECK(fs::validate_tensors(p, ok).empty());
  fs::DecodeTensors t = ok;
  t.block_table = nullptr;
  CHECK(fs::validate_tensors(p, t) == "the block table is a null pointer");
  t = ok;
  t.cache_seqlens = reinterpret_cast<const int32_t*>(mem + 2);
  CHECK(contains(fs::validate_tensors(p, t), "cache_seqlens pointer"));
  CHECK(contains(fs::validate_tensors(p, t), "is not 4-byte aligned (address mod 4 = 2)"));
  t = ok;
  t.k_cache = mem + 8;
  CHECK(contains(fs::validate_tensors(p, t), "the K cache pointer"));
  const fs::DecodeProblem c = fs::make_decode_problem(1, 1, 64, 1, 1, 64, fs::DType::fp16, false);
  CHECK(fs::validate_tensors(c, ok) == "the block table is not null with a contiguous cache (page_size 0)");
  t = ok;
  t.block_table = nullptr;
  CHECK(fs::validate_tensors(c, t).empty());

  // Lengths and block table, when the host has them: 3 sequences of at most 100 keys, 4 pages of 32.
  std::vector<int32_t> table(12, -1);
  std::iota(table.begin(), table.begin() + 4, 0);  // sequence 0: pages 0-3
  table[4] = 7;                                    // sequence 1: one page
  CHECK(fs::validate_data(p, {100, 32, 0}, table).empty());
  CHECK(fs::validate_data(p, {100, 33, 0}, table) ==
        "block_table[1][1] is -1, which is not a page of the cache (num_pages is 12)");
  CHECK(fs::validate_data(p, {101, 0, 0}, table) ==
        "cache_seqlens[0] is 101; it must be between 0 and seqlen_k (100), the capacity of a sequence");
  CHECK(fs::validate_data(p, {-1, 0, 0}, table).find("cache_seqlens[0] is -1") == 0);
  table[1] = 12;
  CHECK(fs::validate_data(p, {100, 0, 0}, table) ==
        "block_table[0][1] is 12, which is not a page of the cache (num_pages is 12)");
  CHECK(fs::validate_data(p, {1, 2}, table) == "there are 2 lengths for batch 3");
}

TEST_CASE("decode: gather_sequence finds key j of sequence b at block_table[b][j / page_size]", "[decode]") {
  fs::DecodeProblem p = fs::make_decode_problem(2, 1, 40, 2, 2, 8, fs::DType::fp16, false, 16);
  p.num_pages = 7;
  p.attention.k.batch = p.attention.v.batch = 16 * 2 * 8 + 8;  // padded pages
  const fs::DecodeHostInputs in = host_inputs(p, pseudo);
  const std::vector<int32_t> table = {5, 0, 3, 6, 2, -1};  // sequence 0: pages 5, 0, 3; sequence 1: 6, 2
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t len = b == 0 ? 40 : 17;
    const std::vector<float> k = fs::gather_sequence(p, in.k_cache, p.attention.k, table, b, len);
    REQUIRE(k.size() == size_t(len * 2 * 8));
    for (int64_t j = 0; j < len; ++j)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 8; ++d)
          CHECK(k[size_t((j * 2 + h) * 8 + d)] == pseudo(1, table[size_t(b * 3 + j / 16)], j % 16, h, d));
  }
}

TEST_CASE("decode: the CPU reference is the forward reference of each sequence", "[decode]") {
  std::mt19937 rng(3);
  for (bool causal : {false, true})
    for (int64_t seqlen_q : {1, 4}) {
      // Three sequences of 37, 0 and 64 keys in pages of 16, shuffled; the same logical data contiguous.
      fs::DecodeProblem p = fs::make_decode_problem(3, seqlen_q, 64, 8, 2, 16, fs::DType::bf16, causal, 16);
      p.attention.softmax_scale = 0.3f;
      const std::vector<int32_t> lengths = {37, 0, 64};
      std::vector<int32_t> order(size_t(p.num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> table(order.begin(), order.end());  // every entry a page: 3 rows of 4
      auto logical = [](int tensor, int64_t b, int64_t j, int64_t h, int64_t d) {
        return 0.2f * std::cos(float(tensor * 31 + b * 1000 + j * 7 + h * 3) + 0.5f * float(d));
      };
      // Page data: page table[b][i] holds keys 16·i ... of sequence b.
      std::vector<std::pair<int64_t, int64_t>> owner(size_t(p.num_pages));  // page -> (b, i)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t i = 0; i < 4; ++i) owner[size_t(table[size_t(b * 4 + i)])] = {b, i};
      fs::DecodeHostInputs in = host_inputs(p, [&](int tensor, int64_t slot, int64_t row, int64_t h, int64_t d) {
        if (tensor == 0) return logical(0, slot, row, h, d);
        const auto [b, i] = owner[size_t(slot)];
        return logical(tensor, b, i * 16 + row, h, d);
      });
      in.lengths = lengths;
      in.block_table = table;
      const fs::Reference r = fs::reference_cpu(p, in);
      for (int64_t b = 0; b < 3; ++b) {
        // Sequence b alone, as a forward problem with seqlen_k = its length, filled from the same formula.
        const int64_t len = lengths[size_t(b)];
        fs::Problem f = fs::make_problem(1, seqlen_q, len, 8, 2, 16, fs::DType::bf16, causal);
        f.softmax_scale = 0.3f;
        fs::HostInputs hin;
        for (int tensor = 0; tensor < 3; ++tensor) {
          (tensor == 1 ? hin.k : tensor == 2 ? hin.v : hin.q) = int64_t(hin.data.size());
          const int64_t rows = tensor == 0 ? seqlen_q : len, heads = tensor == 0 ? 8 : 2;
          for (int64_t j = 0; j < rows; ++j)
            for (int64_t h = 0; h < heads; ++h)
              for (int64_t d = 0; d < 16; ++d) hin.data.push_back(logical(tensor, b, j, h, d));
        }
        const fs::Reference one = fs::reference_cpu(f, hin);
        CAPTURE(causal, seqlen_q, b);
        for (size_t i = 0; i < one.o.size(); ++i) CHECK(r.o[size_t(b * seqlen_q * 8 * 16) + i] == one.o[i]);
        for (size_t i = 0; i < one.lse.size(); ++i) CHECK(r.lse[size_t(b * 8 * seqlen_q) + i] == one.lse[i]);
      }
      // Sequence 1 has no key: O = 0 and LSE = -inf.
      CHECK(r.lse[size_t(1 * 8 * seqlen_q)] == -std::numeric_limits<double>::infinity());
    }
}

TEST_CASE("decode: the CPU reference of a contiguous uniform problem is the forward reference", "[decode]") {
  // Softcapped and windowed too: the runner checks a step's forward entry on such a problem against it.
  const std::pair<float, int32_t> features[] = {{0.0f, 0}, {2.0f, 0}, {0.0f, 1}, {2.0f, 1}};  // softcap, window
  for (const auto& [softcap, window] : features) {
    CAPTURE(softcap, window);
    fs::DecodeProblem p = fs::make_decode_problem(2, 3, 21, 4, 1, 24, fs::DType::fp16, true);
    p.attention.softcap = softcap;
    p.attention.window = window, p.attention.window_left = 5 * window, p.attention.window_right = 3 * window;
    const fs::DecodeHostInputs in = host_inputs(p, pseudo);
    fs::HostInputs f;
    f.data = in.q;
    f.k = int64_t(f.data.size());
    f.data.insert(f.data.end(), in.k_cache.begin(), in.k_cache.end());
    f.v = int64_t(f.data.size());
    f.data.insert(f.data.end(), in.v_cache.begin(), in.v_cache.end());
    const fs::Reference a = fs::reference_cpu(p, in), b = fs::reference_cpu(p.attention, f);
    CHECK(a.o == b.o);
    CHECK(a.lse == b.lse);
  }
}

TEST_CASE("decode: the C ABI refuses bad decoding problems before touching the GPU", "[decode][c_api]") {
  fs_decode_problem p;
  fs_decode_problem_init(&p, 2, 1, 4096, 32, 8, 128, FS_FP16, 0, 64);
  CHECK(p.page_size == 64);
  CHECK(p.max_pages_per_seq == 64);
  double kv = 0;
  CHECK(fs_decode_kv_bytes(&p, nullptr, 0, &kv) == FS_OK);
  CHECK(kv == 2.0 * 2 * 4096 * 8 * 128 * 2);
  const int32_t lengths[2] = {1, 3};
  CHECK(fs_decode_kv_bytes(&p, lengths, 2, &kv) == FS_OK);
  CHECK(kv == 2.0 * 4 * 8 * 128 * 2);
  CHECK(fs_decode_kv_bytes(nullptr, lengths, 2, &kv) == FS_ERR_INVALID);

  fs_decode_problem bad = p;
  bad.page_size = 40;
  CHECK(fs_decode_check("10_decoding", &bad) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "page_size is 40"));
  fs_decode_problem_init(&bad, 2, 17, 4096, 32, 8, 128, FS_FP16, 1, 64);
  CHECK(fs_decode_check("10_decoding", &bad) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "seqlen_q is 17"));
  uint64_t bytes = 7;
  CHECK(fs_decode_workspace_size("10_decoding", &bad, &bytes) == FS_ERR_INVALID);
  CHECK(bytes == 7);
  CHECK(fs_decode_workspace_size("10_decoding", &p, nullptr) == FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "bytes is a null pointer");
  CHECK(fs_decode_check("07g_flash_attention2", &p) == FS_ERR_INVALID);
  CHECK(contains(fs_last_error(), "has no decoding entry"));
  CHECK(fs_decode_check("no_such_step", &p) == FS_ERR_UNKNOWN_STEP);
  CHECK(fs_decode_check("10_decoding", nullptr) == FS_ERR_INVALID);
  // Pointers are checked before the device is looked at.
  alignas(16) static char mem[64];
  CHECK(fs_run_decode("10_decoding", &p, mem, mem, mem, nullptr, nullptr, mem, nullptr, nullptr, 0, nullptr) ==
        FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "the block table is a null pointer");
  CHECK(fs_run_decode("10_decoding", &p, nullptr, mem, mem, nullptr, nullptr, mem, nullptr, nullptr, 0, nullptr) ==
        FS_ERR_INVALID);
  CHECK(std::string(fs_last_error()) == "Q is a null pointer");

  // Which steps decode: 10_decoding does, 01_naive does not.
  int decoding = 0;
  for (int i = 0; i < fs_step_count(); ++i) {
    CHECK(fs_step_runs(i, FS_DECODE) == (std::string(fs_step_id(i)) == "10_decoding" ? 1 : 0));
    decoding += fs_step_runs(i, FS_DECODE);
  }
  CHECK(decoding == 1);
  CHECK(fs_step_runs(-1, FS_DECODE) == -1);

  // A problem every check without a device accepts: FS_OK on a GPU, FS_ERR_CUDA (with why) without one.
  const std::string no_gpu = fs::cuda_unavailable_reason();
  CHECK(fs_decode_check("10_decoding", &p) == (no_gpu.empty() ? FS_OK : FS_ERR_CUDA));
  fs_decode_problem_init(nullptr, 1, 1, 1, 1, 1, 8, FS_FP16, 0, 0);  // nothing to fill
}

TEST_CASE("registry: a decoding entry needs all four functions", "[decode][registry]") {
  fs::Registry r;
  fs::Step s{.id = "90_test",
             .name = "test",
             .lesson = "a test step",
             .forward = accept_everything_entry()};
  s.decode.limits = [](const fs::DecodeProblem&) { return std::string(); };
  CHECK_THROWS_AS(r.add(s), fs::Error);
  s.decode = {};
  r.add(s);
  CHECK_FALSE(r.steps().back().decode.present());
}

// What each decoding step documents it runs (DecodeEntry::claims), it plans: on every GPU family, for
// a spread of decoding problems. The GPU tests then fail on any refusal of a claimed problem.
TEST_CASE("registry: every decoding step plans every decoding problem it claims", "[decode][registry]") {
  struct Gpu {
    int cc;
    size_t smem_optin;
    int sms;
  };
  const Gpu gpus[] = {{80, 163 * 1024, 108}, {86, 99 * 1024, 84}, {89, 99 * 1024, 128}, {90, 227 * 1024, 132}};
  int claimed = 0;
  for (const Gpu& g : gpus) {
    fs::DeviceInfo dev;
    dev.compute_capability = g.cc;
    dev.sm_count = g.sms;
    dev.smem_per_block_optin = g.smem_optin;
    for (int64_t batch : {1, 7, 300})
      for (int64_t sq : {0, 1, 4, 16, 17})
        for (int64_t sk : {0, 1, 100, 70000})
          for (int64_t d : {8, 64, 72, 128, 200, 256})
            for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{1, 1}, {32, 8}, {64, 1}})
              for (int64_t page : {0, 16, 256})
                for (int splits : {0, 1, 5}) {
                  fs::DecodeProblem p = fs::make_decode_problem(batch, sq, sk, hq, hkv, d, fs::DType::fp16, sq > 1, page);
                  p.num_splits = splits;
                  for (const fs::Step& s : fs::steps()) {
                    if (!s.decode.present() || s.min_compute_capability > g.cc) continue;
                    if (!s.decode.claims(p, dev)) continue;
                    ++claimed;
                    const fs::Plan plan = fs::plan(s, p, dev);
                    INFO(s.id << " on sm_" << g.cc << ", " << fs::describe(p) << ": " << plan.refusal);
                    CHECK(plan.accepted());
                  }
                }
  }
  CHECK(claimed > 1000);
}
