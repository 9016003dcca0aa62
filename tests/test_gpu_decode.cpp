// Every step with a decoding entry on decoding problems, against the reference: ragged lengths (0 and
// 1 included, not multiples of a page or a split), contiguous and paged caches (pages of 16, 64, 256,
// one page), seqlen_q 1-16 causal, GQA 1:1 to 64:1 and MQA, every head_dim width, padded strides,
// forced and heuristic splits; the checked mode catching a bad page and a bad length; the C ABI.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "common/decode/check.h"
#include "common/flash_steps.h"
#include "common/forward/check.h"
#include "gpu_test_config.h"

namespace {

struct DecodeCase {
  fs::DecodeProblem problem;
  std::vector<int32_t> lengths;  // empty: seqlen_k each
  uint64_t seed;
};

// Lengths in [0, seqlen_k], the first ones 0, 1 and seqlen_k, the rest drawn (seeded).
std::vector<int32_t> ragged(int64_t batch, int64_t seqlen_k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    out[size_t(b)] = b == 0 ? 0 : b == 1 ? 1 : b == 2 ? int32_t(seqlen_k) : int32_t(rng() % uint64_t(seqlen_k + 1));
  return out;
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  auto add = [&](int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, fs::DType dt, bool causal,
                 int64_t page, std::vector<int32_t> lengths, int splits = 0) {
    fs::DecodeProblem p = fs::make_decode_problem(b, sq, sk, hq, hkv, d, dt, causal, page);
    p.num_splits = splits;
    cases.push_back({p, std::move(lengths), uint64_t(2000 + cases.size())});
  };
  // Ragged lengths with every cache kind, both dtypes, one and four new tokens, heuristic and forced splits.
  for (int64_t page : {0, 16, 64, 256})
    for (int64_t sq : {1, 4})
      for (int splits : {0, 1, 3})
        add(6, sq, 1000, 32, 8, 128, page % 32 ? fs::DType::bf16 : fs::DType::fp16, sq > 1, page,
            ragged(6, 1000, uint64_t(page + sq + splits)), splits);
  // One page per sequence; a long sequence that is no multiple of a page, a tile or a split.
  add(2, 1, 16, 8, 2, 64, fs::DType::fp16, false, 16, {16, 5});
  for (int64_t page : {0, 16, 256}) add(2, 1, 4099, 8, 1, 64, fs::DType::bf16, false, page, {4099, 4097});
  // seqlen_q 1-16, causal per sequence: lengths below seqlen_q leave the first tokens without a key.
  for (int64_t sq : {2, 3, 5, 8, 16})
    add(4, sq, 300, 8, 2, 64, fs::DType::fp16, true, sq % 2 ? 64 : 0, {0, 3, 16, 300});
  // GQA 1:1, 4:1, 8:1, MQA; 64 query heads on one KV head at seqlen_q 16 (1024 packed rows, 64 row tiles).
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}, {64, 8}, {16, 1}})
    add(3, 1, 2000, hq, hkv, 128, fs::DType::bf16, false, 64, ragged(3, 2000, uint64_t(hq * 10 + hkv)));
  add(2, 16, 500, 64, 1, 64, fs::DType::fp16, true, 32, {500, 77});
  // Every tile width, head_dims that pad (8, 40, 72, 136, 200).
  for (int64_t d : {8, 40, 64, 72, 128, 136, 200, 256})
    add(3, 2, 700, 4, 2, d, d % 16 ? fs::DType::bf16 : fs::DType::fp16, true, d % 3 ? 16 : 0, ragged(3, 700, uint64_t(d)));
  // Uniform lengths (cache_seqlens NULL), contiguous and paged; many splits over few keys (empty splits).
  add(2, 1, 513, 16, 4, 128, fs::DType::fp16, false, 0, {});
  add(2, 1, 513, 16, 4, 128, fs::DType::fp16, false, 64, {});
  add(3, 1, 200, 8, 2, 128, fs::DType::bf16, false, 16, {200, 1, 64}, 128);
  // Long enough for the GPU reference (more than 2^27 multiply-adds).
  add(2, 1, 20000, 32, 8, 128, fs::DType::fp16, false, 256, {20000, 19000});
  // Padded strides: Q and O rows, a cache whose pages and heads are padded.
  {
    fs::DecodeProblem p = fs::make_decode_problem(3, 3, 400, 8, 2, 64, fs::DType::bf16, true, 32);
    p.attention.q = p.attention.o = fs::Strides{3 * 8 * 72, 8 * 72, 72, 1};
    p.attention.k = p.attention.v = fs::Strides{32 * 2 * 80 + 64, 2 * 80, 80, 1};
    p.num_pages += 5;  // a larger pool than the sequences use
    cases.push_back({p, ragged(3, 400, 9), 2999});
  }
  // One contiguous cache for every sequence: K and V broadcast over the batch (batch stride 0).
  {
    fs::DecodeProblem p = fs::make_decode_problem(3, 2, 300, 8, 2, 64, fs::DType::fp16, true, 0);
    p.attention.k.batch = p.attention.v.batch = 0;
    cases.push_back({p, {300, 7, 129}, 2998});
  }
  return cases;
}

bool all_nan(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return v != v; });
}

void check_case(const DecodeCase& c) {
  const fs::DeviceInfo dev = fs::current_device();
  fs::DecodeWorkload w(c.problem, c.lengths, c.seed);
  fs::GpuReference gpu;
  const fs::Reference ref = fs::make_reference(w, gpu);
  int ran = 0;
  for (const fs::Step& s : fs::steps()) {
    if (!s.decode.present() || !fs::test::step_selected(s.id)) continue;
    INFO("step " << s.id << " on " << fs::describe(w.problem()) << (c.lengths.empty() ? ", uniform" : ", ragged"));
    const fs::Plan plan = fs::plan(s, w.problem(), dev);
    if (!plan.accepted()) {
      INFO("refusal: " << plan.refusal);
      CHECK_FALSE(s.decode.claims(w.problem(), dev));
      continue;
    }
    ++ran;
    const fs::Prepared prepared(s, w.problem(), dev);
    const fs::DecodeTensors t = w.tensors();
    const fs::Comparison cmp = fs::launch_and_compare([&](cudaStream_t st) { prepared.launch(t, st); }, w, ref);
    INFO("splits " << plan.splits << ": " << cmp.summary());
    CHECK(cmp.pass());
  }
  CHECK(ran > 0);
}

}  // namespace

TEST_CASE("every decoding step matches the reference on the decoding shapes", "[decode]") {
  static const std::vector<DecodeCase> cases = decode_cases();
  check_case(cases[size_t(GENERATE(range(size_t(0), cases.size())))]);
}

TEST_CASE("decoding: the GPU reference gathers paged caches as the CPU one does", "[decode]") {
  fs::DecodeWorkload w(fs::make_decode_problem(3, 4, 300, 8, 2, 64, fs::DType::bf16, true, 16), {300, 0, 47}, 5);
  fs::GpuReference gpu;
  const fs::Reference cpu = fs::reference_cpu(w.problem(), w.download_inputs());
  const fs::Reference g = fs::gpu_reference(w, gpu);
  REQUIRE(g.o.size() == cpu.o.size());
  for (size_t i = 0; i < cpu.o.size(); ++i) CHECK(std::fabs(g.o[i] - cpu.o[i]) <= 1e-4 * (1 + std::fabs(cpu.o[i])));
  for (size_t i = 0; i < cpu.lse.size(); ++i)
    CHECK((std::isinf(cpu.lse[i]) ? g.lse[i] == cpu.lse[i] : std::fabs(g.lse[i] - cpu.lse[i]) <= 1e-4 * (1 + std::fabs(cpu.lse[i]))));
}

TEST_CASE("decoding: the checked mode reports a bad page or length instead of reading it", "[decode]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const fs::Step& s : fs::steps()) {
    if (!s.decode.present() || !fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    fs::DecodeProblem p = fs::make_decode_problem(3, 1, 1000, 32, 8, 128, fs::DType::fp16, false, 64);
    p.checked = 1;
    fs::DecodeWorkload w(p, {1000, 130, 0}, 31);
    fs::GpuReference gpu;
    const fs::Reference ref = fs::make_reference(w, gpu);
    const fs::Prepared prepared(s, p, dev);
    // Good data: the check passes and the result is right.
    const fs::Comparison good = fs::launch_and_compare([&](cudaStream_t st) { prepared.launch(w.tensors(), st); }, w, ref);
    INFO(good.summary());
    CHECK(good.pass());
    // A page in use outside the cache: refused with its index and value, nothing launched (O keeps its poison).
    w.set_block_table_entry(1, 2, 4096);
    w.poison();
    try {
      prepared.launch(w.tensors(), nullptr);
      FAIL("the checked mode did not report block_table[1][2]");
    } catch (const fs::Error& e) {
      CHECK(std::string(e.what()).find("block_table[1][2] is 4096, which is not a page of the cache (num_pages is 48)") !=
            std::string::npos);
      CHECK(std::string(e.what()).find("(checked mode)") != std::string::npos);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK(all_nan(w.download_o()));
    // The entry past the pages a sequence uses is never read: -1 there is fine.
    w.set_block_table_entry(1, 2, -1);
    w.set_length(1, 128);  // two pages: entry [1][2] is no longer in use
    CHECK_NOTHROW(prepared.launch(w.tensors(), nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    // A length past the capacity.
    w.set_length(2, 1001);
    try {
      prepared.launch(w.tensors(), nullptr);
      FAIL("the checked mode did not report cache_seqlens[2]");
    } catch (const fs::Error& e) {
      CHECK(std::string(e.what()).find("cache_seqlens[2] is 1001; it must be between 0 and seqlen_k (1000)") !=
            std::string::npos);
    }
    // Unchecked, the same bad data is read as the contract says: a clamped length, a bad page as zeros;
    // no fault, no NaN (tests/sanitize.sh runs memcheck over the paged shapes of sanitize_steps).
    p.checked = 0;
    w.set_block_table_entry(0, 3, -7);
    const fs::Prepared unchecked(s, p, dev);
    w.poison();
    unchecked.launch(w.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (float x : w.download_o()) CHECK(std::isfinite(x));
  }
}

TEST_CASE("decoding: empty work, and runs that are bitwise identical", "[decode]") {
  const fs::DeviceInfo dev = fs::current_device();
  for (const fs::Step& s : fs::steps()) {
    if (!s.decode.present() || !fs::test::step_selected(s.id)) continue;
    CAPTURE(s.id);
    // seqlen_k == 0: O = 0, LSE = -inf; seqlen_q == 0: nothing.
    fs::DecodeWorkload e(fs::make_decode_problem(2, 3, 0, 4, 2, 64, fs::DType::fp16, true, 16), {}, 3);
    e.poison();
    fs::Prepared(s, e.problem(), dev).launch(e.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (float x : e.download_o()) CHECK(x == 0.0f);
    for (float x : e.download_lse()) CHECK(x == -INFINITY);
    fs::DecodeWorkload none(fs::make_decode_problem(2, 0, 64, 4, 2, 64, fs::DType::bf16, false), {}, 3);
    fs::Prepared(s, none.problem(), dev).launch(none.tensors(), nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    // Split keys, combined: the same bits twice.
    fs::DecodeWorkload w(fs::make_decode_problem(2, 4, 5000, 32, 8, 128, fs::DType::bf16, true, 64), {5000, 2222}, 4);
    const fs::Prepared prepared(s, w.problem(), dev);
    CHECK(prepared.plan().splits > 1);
    std::vector<float> o[2], lse[2];
    for (int run = 0; run < 2; ++run) {
      w.poison();
      prepared.launch(w.tensors(), nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      o[run] = w.download_o();
      lse[run] = w.download_lse();
    }
    CHECK(std::memcmp(o[0].data(), o[1].data(), o[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("decoding: the C ABI runs a decoding step on device pointers", "[decode]") {
  fs::DecodeProblem p = fs::make_decode_problem(4, 2, 3000, 32, 8, 64, fs::DType::fp16, true, 16);
  fs::DecodeWorkload w(p, ragged(4, 3000, 17), 41);
  fs::GpuReference gpu;
  const fs::Reference ref = fs::make_reference(w, gpu);
  int ran = 0;
  for (const fs::Step& s : fs::steps()) {
    if (!s.decode.present()) {
      CHECK(fs_decode_check(s.id.c_str(), &p) == FS_ERR_INVALID);
      continue;
    }
    CAPTURE(s.id);
    REQUIRE(fs_decode_check(s.id.c_str(), &p) == FS_OK);
    uint64_t bytes = 0;
    REQUIRE(fs_decode_workspace_size(s.id.c_str(), &p, &bytes) == FS_OK);
    const fs::DeviceBuffer workspace{size_t(bytes)};
    const fs::DecodeTensors t = w.tensors();
    const fs::Comparison c = fs::launch_and_compare(
        [&](cudaStream_t st) {
          REQUIRE(fs_run_decode(s.id.c_str(), &p, t.q, t.k_cache, t.v_cache, t.block_table, t.cache_seqlens, t.o,
                                t.lse, workspace.get(), bytes, st) == FS_OK);
        },
        w, ref);
    INFO(c.summary());
    CHECK(c.pass());
    ++ran;
    // Too small a workspace is a sentence.
    if (bytes > 0) {
      CHECK(fs_run_decode(s.id.c_str(), &p, t.q, t.k_cache, t.v_cache, t.block_table, t.cache_seqlens, t.o, t.lse,
                          workspace.get(), bytes - 1, nullptr) == FS_ERR_INVALID);
      CHECK(std::string(fs_last_error()).find("(see fs_decode_workspace_size)") != std::string::npos);
    }
  }
  CHECK(ran > 0);
}
