// The bank-conflict model (common/model/bank_model.h) on textbook cases, the shared-memory accesses of
// steps 03-05 replayed through it (common/model/bank_report.h) from the kernels' own index functions and
// layouts (steps/NN_name/traits.h), and those layouts as bijections onto their storage.
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "common/forward/rules.h"
#include "common/model/bank_model.h"
#include "common/model/bank_report.h"
#include "steps/03_smem_tiling/traits.h"
#include "steps/04_bank_conflicts/traits.h"
#include "steps/05_cp_async/traits.h"

namespace {

using fs::bank::Coord;
using fs::bank::WarpAccess;

// Lane l touches byte address f(l), `width` bytes.
template <class F>
constexpr WarpAccess access(int width, F f) {
  WarpAccess a{};
  a.width = width;
  for (int l = 0; l < 32; ++l) a.addr[l] = f(l);
  return a;
}

constexpr WarpAccess consecutive_words = access(4, [](int l) { return uint32_t(4 * l); });
constexpr WarpAccess column_128_stride = access(4, [](int l) { return uint32_t(128 * l); });
constexpr WarpAccess broadcast = access(4, [](int) { return uint32_t(260); });
constexpr WarpAccess consecutive_16 = access(16, [](int l) { return uint32_t(16 * l); });

// The textbook cases hold at compile time, too.
static_assert(fs::bank::wavefronts(consecutive_words) == 1, "32 consecutive words: one wavefront");
static_assert(fs::bank::wavefronts(column_128_stride) == 32, "a column of 128-byte rows: 32-way conflict");
static_assert(fs::bank::wavefronts(broadcast) == 1, "one word for all lanes: a broadcast");
static_assert(fs::bank::wavefronts(consecutive_16) == 4, "512 consecutive bytes: 4 wavefronts");
static_assert(fs::bank::ideal_wavefronts(consecutive_16) == 4, "16-byte accesses: 4 phases");

}  // namespace

TEST_CASE("bank model: textbook cases", "[bank]") {
  using fs::bank::ideal_wavefronts;
  using fs::bank::wavefronts;
  CHECK(fs::bank::bank_of(0) == 0);
  CHECK(fs::bank::bank_of(4) == 1);
  CHECK(fs::bank::bank_of(127) == 31);
  CHECK(fs::bank::bank_of(128) == 0);

  CHECK(wavefronts(consecutive_words) == 1);
  CHECK(ideal_wavefronts(consecutive_words) == 1);
  CHECK(wavefronts(column_128_stride) == 32);
  CHECK(ideal_wavefronts(column_128_stride) == 1);
  CHECK(wavefronts(broadcast) == 1);
  CHECK(wavefronts(consecutive_16) == 4);  // 512 bytes
  CHECK(wavefronts(access(8, [](int l) { return uint32_t(8 * l); })) == 2);  // 256 bytes, two half-warps
  // Stride of 2 words: lanes l and l + 16 share a bank, different words: 2-way.
  CHECK(wavefronts(access(4, [](int l) { return uint32_t(8 * l); })) == 2);
  // Stride of 33 words (a row of 32 floats padded by one): conflict-free.
  CHECK(wavefronts(access(4, [](int l) { return uint32_t(132 * l); })) == 1);
  // Pairs of lanes on the same word, all 32 banks used: broadcast within the pair, no conflict.
  CHECK(wavefronts(access(4, [](int l) { return uint32_t(4 * (l / 2)); })) == 1);
  // All lanes in one bank but only two distinct words: 2 wavefronts.
  CHECK(wavefronts(access(4, [](int l) { return uint32_t(128 * (l % 2)); })) == 2);
}

TEST_CASE("bank model: 8- and 16-byte accesses are served in half- and quarter-warp phases", "[bank]") {
  using fs::bank::phase_wavefronts;
  using fs::bank::wavefronts;
  // 16 bytes: each quarter-warp reads 128 contiguous bytes of its own 1 KiB row. Lanes of different
  // phases share banks, yet there is no conflict: 4 phases, 1 wavefront each.
  CHECK(wavefronts(access(16, [](int l) { return uint32_t(16 * (l % 8) + 1024 * (l / 8)); })) == 4);
  // 16 bytes: the 8 lanes of each phase read the first chunk of 8 rows of 256 bytes: 8-way in every phase.
  const WarpAccess column_chunks = access(16, [](int l) { return uint32_t(256 * l); });
  for (int phase = 0; phase < 4; ++phase) CHECK(phase_wavefronts(column_chunks, phase) == 8);
  CHECK(wavefronts(column_chunks) == 32);
  // 16 bytes at a stride of 32 bytes: each phase spans 256 bytes, every bank twice: 2-way.
  CHECK(wavefronts(access(16, [](int l) { return uint32_t(32 * l); })) == 8);
  // 8 bytes: a half-warp reading 16 consecutive 8-byte words is conflict-free; with a 256-byte row
  // stride between lanes, 16 words per bank pair.
  CHECK(wavefronts(access(8, [](int l) { return uint32_t(8 * l); })) == 2);
  CHECK(wavefronts(access(8, [](int l) { return uint32_t(256 * l); })) == 32);
  // Inactive lanes cost nothing; a phase with none costs nothing either.
  WarpAccess half = column_128_stride;
  half.active = 0x0000ffffu;
  CHECK(fs::bank::wavefronts(half) == 16);
  WarpAccess one_phase = consecutive_16;
  one_phase.active = 0x000000ffu;
  CHECK(fs::bank::wavefronts(one_phase) == 1);
  CHECK(fs::bank::ideal_wavefronts(one_phase) == 1);
}

TEST_CASE("bank model: bad accesses are reported, not counted", "[bank]") {
  CHECK(fs::bank::wavefronts(access(2, [](int l) { return uint32_t(2 * l); })) == -1);     // 2-byte width
  CHECK(fs::bank::wavefronts(access(16, [](int l) { return uint32_t(8 + 16 * l); })) == -1);  // misaligned
  CHECK(fs::bank::ideal_wavefronts(access(8, [](int l) { return uint32_t(4 * l); })) == -1);
}

namespace {

// Every tile layout of steps 03-05, for a [ROWS, COLS] tile.
template <class Layout, int ROWS>
void check_layout(bool padded) {
  constexpr int COLS = Layout::kCols;
  CAPTURE(COLS, padded);
  const int size = Layout::size(ROWS);
  std::vector<int> owner(size_t(size), -1);
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      const int off = Layout::offset(r, c);
      REQUIRE(off >= 0);
      REQUIRE(off < size);
      CHECK(owner[size_t(off)] == -1);  // no two elements share a slot
      owner[size_t(off)] = r * COLS + c;
    }
  int used = 0;
  for (int slot = 0; slot < size; ++slot) {
    if (owner[size_t(slot)] >= 0) {
      ++used;
    } else {
      CHECK(padded);                                // only padding may be left unused ...
      CHECK(slot % Layout::kRowStride >= COLS);     // ... and it is the tail of a row
    }
  }
  CHECK(used == ROWS * COLS);
  if (!padded) CHECK(size == ROWS * COLS);  // a bijection onto its storage
  // The kernels move 8 elements (16 bytes) starting at a column that is a multiple of 8 (and 4
  // elements at a multiple of 4): each such chunk must stay contiguous and 16-byte aligned.
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; c += 8) {
      CHECK(Layout::offset(r, c) % 8 == 0);
      for (int e = 0; e < 8; ++e) CHECK(Layout::offset(r, c + e) == Layout::offset(r, c) + e);
    }
}

}  // namespace

TEST_CASE("tile layouts are bijections onto their storage, with contiguous 16-byte chunks", "[bank]") {
  check_layout<fs::step03::RowMajorLayout<64>, 64>(false);
  check_layout<fs::step03::RowMajorLayout<128>, 64>(false);
  check_layout<fs::step04::Swizzled128Layout<64>, 64>(false);
  check_layout<fs::step04::Swizzled128Layout<128>, 64>(false);
  check_layout<fs::step04::Padded16Layout<64>, 64>(true);
  check_layout<fs::step04::Padded16Layout<128>, 64>(true);
  check_layout<fs::step05::Swizzled128Layout<64>, 64>(false);
  check_layout<fs::step05::Swizzled128Layout<128>, 64>(false);
}

TEST_CASE("step 03: a quarter-warp reading K hits one bank group 8 times (row-major)", "[bank]") {
  // Warp 0's first K read, built from each kernel's own index functions (traits.h).
  using Tr = fs::step03::Traits<128>;
  using Tr04 = fs::step04::Traits<128>;
  const WarpAccess k_read = fs::bank::tile_access<fs::step03::RowMajorLayout<128>>(
      16, 2, 0, [](int lane) { return Coord{Tr::key(lane, 0), 0}; });
  for (int phase = 0; phase < 4; ++phase) CHECK(fs::bank::phase_wavefronts(k_read, phase) == 8);
  CHECK(fs::bank::wavefronts(k_read) == 32);
  const WarpAccess padded = fs::bank::tile_access<fs::step04::Padded16Layout<128>>(
      16, 2, 0, [](int lane) { return Coord{Tr04::key(lane, 0), 0}; });
  CHECK(fs::bank::wavefronts(padded) == 4);
  const WarpAccess swizzled = fs::bank::tile_access<fs::step04::Swizzled128Layout<128>>(
      16, 2, 0, [](int lane) { return Coord{Tr04::key(lane, 0), 0}; });
  CHECK(fs::bank::wavefronts(swizzled) == 4);
}

namespace {

// The kernels of steps 03-05, as their step.cu describes them to the report.
const fs::bank::TilingKernel k03{"03_smem_tiling", "row-major", "steps/03_smem_tiling/traits.h"};
const fs::bank::TilingKernel k04_pad{"04_pad", "padded +16 B per row", "steps/04_bank_conflicts/traits.h"};
const fs::bank::TilingKernel k04_swizzle{"04_swizzle", "XOR-swizzled, chunk ^ row % 8", "steps/04_bank_conflicts/traits.h"};
const fs::bank::TilingKernel k05{"05_cp_async", "XOR-swizzled, chunk ^ row % 8", "steps/05_cp_async/traits.h", 2, true};

// Every shared access of one kernel: only the row-major K read conflicts (8-way in each phase).
template <template <int> class Traits, template <int> class Layout>
void check_counts(const fs::bank::TilingKernel& kernel, bool row_major) {
  for (int head_dim : {64, 128}) {
    const int chunks = head_dim / 8;
    CAPTURE(head_dim, kernel.step);
    const std::vector<fs::bank::AccessCount> counts = fs::bank::tiling_access_counts<Traits, Layout>(head_dim, kernel);
    REQUIRE(counts.size() == 5);
    for (const fs::bank::AccessCount& c : counts) {
      CAPTURE(c.what);
      CHECK(c.instructions > 0);
      CHECK(c.ideal == c.instructions * (c.width / 4));  // one wavefront per phase: width/4 phases
      const bool k_read = c.what == "S = Q·Kᵀ: read K";
      if (k_read) CHECK(c.instructions == 8 * chunks * 4);  // 8 warps × head_dim/8 chunks × 4 keys
      if (k_read && row_major) {
        // The prediction of notes/03 and notes/04: every K read is 8-way in each of its 4 phases.
        CHECK(c.worst == 32);
        CHECK(c.wavefronts == 32 * c.instructions);
        CHECK(c.conflicts() == 28 * c.instructions);
      } else {
        // Everything else, and everything under padding and swizzling, is conflict-free.
        CHECK(c.conflicts() == 0);
        CHECK(c.worst == c.width / 4);
      }
    }
  }
}

}  // namespace

TEST_CASE("steps 03-05: the conflicts of every shared access, per layout", "[bank]") {
  check_counts<fs::step03::Traits, fs::step03::RowMajorLayout>(k03, true);
  check_counts<fs::step04::Traits, fs::step04::Padded16Layout>(k04_pad, false);
  check_counts<fs::step04::Traits, fs::step04::Swizzled128Layout>(k04_swizzle, false);
  check_counts<fs::step05::Traits, fs::step05::Swizzled128Layout>(k05, false);
  CHECK_THROWS(fs::bank::tiling_access_counts<fs::step03::Traits, fs::step03::RowMajorLayout>(40, k03));
}

TEST_CASE("steps 03-05: predicted ncu counters at the default shape", "[bank]") {
  const fs::Problem p = fs::make_problem(2, 2048, 2048, 16, 16, 128, fs::DType::fp16, false);
  const fs::bank::LaunchPrediction row_major =
      fs::bank::predict_launch<fs::step03::Traits, fs::step03::RowMajorLayout>(p, k03);
  CHECK(row_major.blocks == 32 * 32);
  CHECK(row_major.tiles == 32 * 32 * 32);
  // 32768 block-tiles × 8 warps × 64 K reads × 28 extra wavefronts.
  CHECK(row_major.ld_conflicts == int64_t(32768) * 8 * 64 * 28);
  CHECK(row_major.st_conflicts == 0);
  for (const fs::bank::LaunchPrediction& r :
       {fs::bank::predict_launch<fs::step04::Traits, fs::step04::Padded16Layout>(p, k04_pad),
        fs::bank::predict_launch<fs::step04::Traits, fs::step04::Swizzled128Layout>(p, k04_swizzle)}) {
    CHECK(r.ld_conflicts == 0);
    CHECK(r.st_conflicts == 0);
    CHECK(r.ld_wavefronts == row_major.ld_wavefronts - row_major.ld_conflicts);
    CHECK(r.st_wavefronts == row_major.st_wavefronts);
  }
  // Step 05 reads shared memory as 04_swizzle does; its copies are cp.async, which ncu's _op_st
  // counters do not see (0 measured in bench/results/ncu-05_cp_async-f562aa8199a8.txt).
  const fs::bank::LaunchPrediction r05 = fs::bank::predict_launch<fs::step05::Traits, fs::step05::Swizzled128Layout>(p, k05);
  CHECK(r05.ld_wavefronts == row_major.ld_wavefronts - row_major.ld_conflicts);
  CHECK(r05.ld_conflicts == 0);
  CHECK(r05.st_wavefronts == 0);
  CHECK(r05.st_conflicts == 0);
  // Causal: the tiles above the diagonal are skipped, (32·33/2) of 32·32 per (b, h).
  fs::Problem causal = p;
  causal.causal = 1;
  CHECK(fs::bank::predict_launch<fs::step03::Traits, fs::step03::RowMajorLayout>(causal, k03).tiles == 32 * 528);
}

TEST_CASE("flash-steps banks prints the maps and the counts", "[bank]") {
  // What `flash-steps banks` (= explain) prints: the explanations of the registered steps, in order.
  std::ostringstream captured;
  for (const char* id : {"03_smem_tiling", "04_pad", "04_swizzle", "05_cp_async"}) {
    CAPTURE(id);
    const fs::Step* s = fs::find_step(id);
    REQUIRE(s != nullptr);
    REQUIRE(s->explain);
  }
  for (const fs::Step& s : fs::steps())
    if (s.explain) s.explain(captured);
  const std::string out = captured.str();
  for (const char* s : {"03_smem_tiling", "04_pad", "04_swizzle", "05_cp_async", "S = Q·Kᵀ: read K",
                        "l1tex__data_bank_conflicts"}) {
    CAPTURE(s);
    CHECK(out.find(s) != std::string::npos);
  }
  CHECK(out.find("469,762,048") != std::string::npos);  // the row-major load conflicts at the default shape
}
