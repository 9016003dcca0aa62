// flash_steps_ceilings without a GPU: the wgmma matrix descriptor and operand layout against the PTX
// ISA (bit patterns worked out by hand from "Matrix Descriptor Format" and its examples), the command
// line, and the JSON document.
#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "bench/ceilings/report.h"
#include "bench/ceilings/wgmma_desc.h"

namespace fc = fs::ceilings;

TEST_CASE("wgmma matrix descriptor: the PTX ISA's bit fields", "[ceilings]") {
  // ISA example "K-Major, no-swizzling and tf32 type": LBO = 64·4 = 256 bytes (encoded 16), SBO =
  // 32·4 = 128 bytes (encoded 8), start address 0: 16 in bits 16-29, 8 in bits 32-45.
  CHECK(fc::matrix_descriptor(0, 256, 128) == 0x0000000800100000ull);
  // ISA example "MN-Major, 64B swizzling and bf16 type": LBO 256·2 = 512 (32), SBO 512·2 = 1024 (64),
  // swizzle mode 2 (64-byte) in bits 62-63.
  CHECK(fc::matrix_descriptor(0, 512, 1024, 0, 2) == 0x8000004000200000ull);
  // The ceiling's own operands: start 0x400 (encoded 0x40), LBO 128 (8), SBO 256 (16).
  CHECK(fc::matrix_descriptor(0x400, fc::kLeadingByteOffset, fc::kStrideByteOffset) == 0x0000001000080040ull);
  // matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4: 14 bits of 16-byte units.
  CHECK(fc::descriptor_encode(0x3FFF0) == 0x3FFF);
  CHECK(fc::descriptor_encode(0x40010) == 0x1);
  CHECK(fc::matrix_descriptor(0x3FFF0, 0, 0) == 0x3FFFull);
  // Base offset in bits 49-51, 128-byte swizzle (mode 1) in bits 62-63, 32-byte (mode 3).
  CHECK(fc::matrix_descriptor(0, 0, 0, 5) == 0x000A000000000000ull);
  CHECK(fc::matrix_descriptor(0, 0, 0, 0, 1) == 0x4000000000000000ull);
  CHECK(fc::matrix_descriptor(0, 0, 0, 0, 3) == 0xC000000000000000ull);
}

TEST_CASE("wgmma operand layout: K-major core matrices inside the tile", "[ceilings]") {
  // The ISA's terms for K-major without swizzling: a core matrix is 8 rows of 16 bytes stored as 128
  // contiguous bytes; LBO is the distance between the two core matrices of a k16 slice along K, SBO
  // the distance between core matrices 8 rows apart.
  for (const int rows : {64, 256}) {  // A of m64, B of n256
    std::set<uint32_t> offsets;
    for (int row = 0; row < rows; ++row)
      for (int k = 0; k < 16; ++k) {
        const uint32_t o = fc::kmajor_offset_bytes(row, k);
        CHECK(o % 2 == 0);
        CHECK(o < fc::kmajor_tile_bytes(rows));  // inside the shared memory the kernel allocates
        offsets.insert(o);
        // Row r of a core matrix is its bytes 16·r .. 16·r + 15.
        const uint32_t core = fc::kCoreMatrixBytes * uint32_t(2 * (row / 8) + k / 8);
        CHECK(o == core + 16 * uint32_t(row % 8) + 2 * uint32_t(k % 8));
        if (k < 8) CHECK(fc::kmajor_offset_bytes(row, k + 8) - o == fc::kLeadingByteOffset);
        if (row + 8 < rows) CHECK(fc::kmajor_offset_bytes(row + 8, k) - o == fc::kStrideByteOffset);
      }
    CHECK(offsets.size() == size_t(rows) * 16);  // one element per 2 bytes: the tile exactly
  }
  CHECK(fc::kmajor_tile_bytes(64) == 2048);
  CHECK(fc::kmajor_tile_bytes(256) == 8192);
}

TEST_CASE("flash_steps_ceilings command line", "[ceilings]") {
  using V = std::vector<std::string>;
  auto r = fc::parse_args(V{});
  CHECK(r.error.empty());
  CHECK_FALSE(r.options.quick);
  CHECK_FALSE(r.options.json);

  r = fc::parse_args(V{"--quick", "--json", "out.json"});
  CHECK(r.error.empty());
  CHECK(r.options.quick);
  CHECK(r.options.json);
  CHECK(r.options.json_path == "out.json");

  r = fc::parse_args(V{"--json"});
  CHECK(r.options.json);
  CHECK(r.options.json_path.empty());

  r = fc::parse_args(V{"--json", "--quick"});  // the next flag is not a file name
  CHECK(r.error.empty());
  CHECK(r.options.json_path.empty());
  CHECK(r.options.quick);

  r = fc::parse_args(V{"--json", "-"});
  CHECK(r.options.json);
  CHECK(r.options.json_path.empty());

  r = fc::parse_args(V{"--json=x.json"});
  CHECK(r.options.json_path == "x.json");

  CHECK_FALSE(fc::parse_args(V{"--json="}).error.empty());
  CHECK(fc::parse_args(V{"--help"}).options.help);
  CHECK(fc::parse_args(V{"-h"}).options.help);
  r = fc::parse_args(V{"--quik"});
  CHECK(r.error.find("'--quik'") != std::string::npos);
  CHECK(fc::usage().find("usage: flash_steps_ceilings") != std::string::npos);
}

TEST_CASE("flash_steps_ceilings JSON document", "[ceilings]") {
  fc::Header h;
  h.commit = "abc123";
  h.date = "2026-01-01T00:00:00Z";
  h.device = "GPU \"X\" (sm_89)";
  h.compute_capability = 89;
  h.sm_count = 10;
  h.max_sm_clock_mhz = 1500;
  fc::Ceiling a;
  a.id = "mma_sync_f16";
  a.what = "mma";
  a.unit = "TFLOP/s";
  a.method = "m";
  a.available = true;
  a.best = 645.125;
  a.median = 640.5;
  a.launch_ms = 50;
  a.repetitions = 20;
  fc::Ceiling b;
  b.id = "wgmma_f16";
  b.unit = "TFLOP/s";
  b.reason = "not available: wgmma needs sm_90a (this GPU is 8.9)";
  b.best = std::nan("");
  std::ostringstream out;
  fc::write_json(out, h, {a, b});
  const std::string s = out.str();
  CHECK(s.find("\"tool\": \"flash_steps_ceilings\"") != std::string::npos);
  CHECK(s.find("\"device\": \"GPU \\\"X\\\" (sm_89)\"") != std::string::npos);
  CHECK(s.find("\"compute_capability\": 89") != std::string::npos);
  CHECK(s.find("\"quick\": false") != std::string::npos);
  CHECK(s.find("{\"id\": \"mma_sync_f16\", \"what\": \"mma\", \"value\": 645.125, \"unit\": \"TFLOP/s\", "
               "\"best\": 645.125, \"median\": 640.5, \"launch_ms\": 50, \"repetitions\": 20, "
               "\"available\": true, \"reason\": \"\", \"method\": \"m\"}") != std::string::npos);
  CHECK(s.find("\"value\": null") != std::string::npos);  // NaN is not JSON
  CHECK(s.find("\"available\": false, \"reason\": \"not available: wgmma needs sm_90a (this GPU is 8.9)\"") !=
        std::string::npos);

  std::ostringstream table;
  fc::print_table(table, h, {a, b});
  CHECK(table.str().find("645.1") != std::string::npos);
  CHECK(table.str().find("not available: wgmma needs sm_90a") != std::string::npos);
}
