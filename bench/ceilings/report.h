// What flash_steps_ceilings prints and writes, and its command line, kept apart from the GPU code so
// the CPU tests (tests/test_ceilings.cpp) can check them without a device.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace fs::ceilings {

struct Options {
  bool quick = false;      // fewer repetitions, shorter launches
  bool help = false;
  bool json = false;       // write the JSON document
  std::string json_path;   // where; "" = standard output (the table then goes to standard error)
};

struct ParsedArgs {
  Options options;
  std::string error;  // "" on success, else one sentence naming the argument
};

// Parses argv[1..]: --quick, --json [FILE] (also --json=FILE; without FILE, or with "-", standard
// output), --help / -h.
ParsedArgs parse_args(const std::vector<std::string>& args);

std::string usage();

// One measured ceiling. `best` is the value: the fastest repetition, the unit's peak; `median` is the
// typical repetition.
struct Ceiling {
  std::string id;      // "mma_sync_f16", "wgmma_bf16", "fma_f32", "ex2_approx", "hbm_read", "d2d_copy", ...
  std::string what;    // the instruction or operation measured
  std::string unit;    // "TFLOP/s", "Tex2/s" or "TB/s"
  std::string method;  // one phrase: launch shape and what is counted
  bool available = false;
  std::string reason;  // when not available: why ("not available: ..." or "failed: ...")
  double best = 0, median = 0;
  double launch_ms = 0;  // the median time of one launch
  int repetitions = 0;   // timed launches
};

struct Header {
  std::string commit;       // FLASH_STEPS_COMMIT
  std::string date;         // UTC, ISO 8601
  std::string device;       // fs::describe(fs::current_device())
  int compute_capability = 0;
  int sm_count = 0;
  int max_sm_clock_mhz = 0;  // cudaDevAttrClockRate: the clock the peaks are reached at, at most
  bool quick = false;
};

// The JSON document:
//   {"tool": "flash_steps_ceilings", "commit", "date", "device", "compute_capability", "sm_count",
//    "max_sm_clock_mhz", "quick",
//    "ceilings": [{"id", "what", "value", "unit", "best", "median", "launch_ms", "repetitions",
//                  "available", "reason", "method"}, ...]}
// value = best; a number that is not finite is written as null.
void write_json(std::ostream& out, const Header& h, const std::vector<Ceiling>& ceilings);

// The table: id, value (best), median, unit, method; or the reason a ceiling is not available.
void print_table(std::ostream& out, const Header& h, const std::vector<Ceiling>& ceilings);

}  // namespace fs::ceilings
