// The runner's command line: every flag, and a clear error for every mistake.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "catch.h"
#include "common/backward/rules.h"
#include "common/decode/rules.h"
#include "runner/cli.h"

namespace {
fs::ParsedArgs parse(std::vector<std::string> args) { return fs::parse_runner_args(args); }
}  // namespace

TEST_CASE("cli: defaults are the documented default shape", "[cli]") {
  const fs::ParsedArgs a = parse({});
  REQUIRE(a.error.empty());
  const fs::Problem p = fs::problem_from(a.options);
  CHECK(fs::describe(p) == "b2 h16/16 sq2048 sk2048 d128 fp16");
  CHECK(a.options.command == "run");
  CHECK(a.options.iters == 20);
  CHECK(a.options.flush_l2);
  CHECK(a.options.format == fs::OutputFormat::table);
}

TEST_CASE("cli: every flag is parsed", "[cli]") {
  const fs::ParsedArgs a = parse({"--batch", "4", "--seqlen=512", "--seqlen-k", "1000", "--heads", "32", "--kv-heads=8",
                                  "--head-dim", "64", "--dtype", "bf16", "--causal", "--scale", "0.2", "--iters", "7",
                                  "--warmup", "0", "--seed", "42", "--no-flush", "--no-baseline", "--json", "--step",
                                  "01_naive,02_online_softmax", "--step=03_smem_tiling"});
  REQUIRE(a.error.empty());
  const fs::RunnerOptions& o = a.options;
  const fs::Problem p = fs::problem_from(o);
  CHECK(fs::describe(p) == "b4 h32/8 sq512 sk1000 d64 bf16 causal");
  CHECK(p.softmax_scale == 0.2f);
  CHECK(o.iters == 7);
  CHECK(o.warmup == 0);
  CHECK(o.seed == 42);
  CHECK_FALSE(o.flush_l2);
  CHECK_FALSE(o.baseline);
  CHECK(o.format == fs::OutputFormat::json);
  CHECK(o.steps == std::vector<std::string>{"01_naive", "02_online_softmax", "03_smem_tiling"});
  CHECK(parse({"--csv"}).options.format == fs::OutputFormat::csv);
  CHECK(parse({"--list"}).options.command == "list");
  CHECK(parse({"list"}).options.command == "list");
  CHECK(parse({"banks"}).options.command == "banks");
  const fs::RunnerOptions r = parse({"resources", "--head-dim", "64", "--json"}).options;
  CHECK(r.command == "resources");
  CHECK(r.head_dim == 64);
  CHECK(r.format == fs::OutputFormat::json);
  CHECK(parse({"--help"}).options.command == "help");
  CHECK(parse({"-h"}).options.command == "help");
  // --help anywhere asks for the usage, whatever else is given: nothing else is parsed or run.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"run", "--help"}, {"--decode", "--help"}, {"--backward", "-h"}, {"--json", "--help"}, {"--help", "-h"},
           {"list", "--help"}, {"explain", "--step", "nope", "-h"}, {"--batch", "x", "--help"}}) {
    CAPTURE(args);
    const fs::ParsedArgs h = parse(args);
    CHECK(h.error.empty());
    CHECK(h.options.command == "help");
  }
  // --seqlen-q / --seqlen-k win over --seqlen whatever the order.
  const fs::RunnerOptions o2 = parse({"--seqlen-q", "3", "--seqlen", "9"}).options;
  CHECK(o2.seqlen_q == 3);
  CHECK(o2.seqlen_k == 9);
  const fs::RunnerOptions o3 = parse({"--seqlen", "9", "--seqlen-k", "3", "--seqlen", "5"}).options;
  CHECK(o3.seqlen_q == 5);
  CHECK(o3.seqlen_k == 3);
  // --step is cumulative: an empty list is refused only when no step is given at all.
  CHECK(parse({"--step", "01_naive", "--step", ","}).options.steps == std::vector<std::string>{"01_naive"});
}

TEST_CASE("cli: mistakes give one clear message", "[cli]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--bacth", "2"}, "unknown argument '--bacth' (see --help)"},
      {{"extra"}, "unknown argument 'extra' (see --help)"},
      {{"--batch"}, "--batch needs a value"},
      {{"--batch", "two"}, "--batch expects an integer between 1 and 2147483647, got 'two'"},
      {{"--batch", "0"}, "--batch expects an integer between 1 and 2147483647, got '0'"},
      {{"--seqlen", "12x"}, "--seqlen expects an integer between 0 and 2147483647, got '12x'"},
      {{"--seqlen", "99999999999"}, "--seqlen expects an integer between 0 and 2147483647, got '99999999999'"},
      {{"--head-dim="}, "--head-dim expects a multiple of 8 from 8 to 256, got ''"},
      {{"--iters", "-1"}, "--iters expects an integer between 1 and 100000, got '-1'"},
      {{"--dtype", "fp32"}, "--dtype expects fp16 or bf16, got 'fp32'"},
      {{"--scale", "0"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '0'"},
      {{"--scale", "nan"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got 'nan'"},
      {{"--scale", "inf"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got 'inf'"},
      {{"--causal=1"}, "--causal takes no value"},
      {{"--step", ","}, "--step expects a step id (see --list), got ','"},
      // Issue 11: numbers are digits only, and every message states the real rule.
      {{"--seqlen", " 12"}, "--seqlen expects an integer between 0 and 2147483647, got ' 12'"},
      {{"--seqlen", "+12"}, "--seqlen expects an integer between 0 and 2147483647, got '+12'"},
      {{"--seqlen", "12 "}, "--seqlen expects an integer between 0 and 2147483647, got '12 '"},
      {{"--batch", "-0"}, "--batch expects an integer between 1 and 2147483647, got '-0'"},
      {{"--seed", "99999999999999999999"}, "--seed expects an integer between 0 and 9223372036854775807, got '99999999999999999999'"},
      {{"--iters", "0x10"}, "--iters expects an integer between 1 and 100000, got '0x10'"},
      {{"--head-dim", "0"}, "--head-dim expects a multiple of 8 from 8 to 256, got '0'"},
      {{"--head-dim", "12"}, "--head-dim expects a multiple of 8 from 8 to 256, got '12'"},
      {{"--head-dim", "264"}, "--head-dim expects a multiple of 8 from 8 to 256, got '264'"},
      {{"--scale", " 0.5"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got ' 0.5'"},
      {{"--scale", "+0.5"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '+0.5'"},
      {{"--scale", "0x1p-3"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '0x1p-3'"},
      {{"--scale", "1e39"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '1e39'"},
      {{"--scale", "."}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '.'"},
      // Problem and run options with a command they do not apply to: refused, not ignored.
      {{"--list", "--head-dim", "64"}, "--head-dim does not apply to '--list' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"list", "--causal"}, "--causal does not apply to 'list' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"banks", "--seqlen", "64"}, "--seqlen does not apply to 'banks' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"resources", "--iters", "3"}, "--iters does not apply to 'resources' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"explain", "--seqlen", "64"}, "--seqlen does not apply to 'explain' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"explain", "--list"}, "'explain' and '--list' are two commands; give one"},
      {{"list", "--help=1"}, "'list' and '--help' are two commands; give one"},  // before its value
      {{"--list=1"}, "--list takes no value"},
      {{"-h=1"}, "unknown argument '-h=1' (see --help)"},  // only --flags take a value after '='
      {{"help"}, "unknown argument 'help' (see --help)"},  // the command is --help or -h
      {{"--step", ",", "--bacth"}, "--step expects a step id (see --list), got ','"},  // the first mistake
      {{"--scale", "1e-50"}, "--scale expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '1e-50'"},
  };
  for (const Case& c : cases) {
    const fs::ParsedArgs a = parse(c.args);
    CAPTURE(c.args[0], c.args.size() > 1 ? c.args[1] : "");
    CHECK(a.error == c.message);
  }
}

TEST_CASE("cli: a flag that applies is applied, and numbers in every plain form are read", "[cli]") {
  CHECK(parse({"explain", "--step", "03_smem_tiling"}).options.steps == std::vector<std::string>{"03_smem_tiling"});
  // explain and banks take the ids alone too; other commands still refuse a bare word
  CHECK(parse({"explain", "03_smem_tiling"}).options.steps == std::vector<std::string>{"03_smem_tiling"});
  CHECK(parse({"banks", "04_pad,05_cp_async", "06_ldmatrix_mma"}).options.steps ==
        std::vector<std::string>{"04_pad", "05_cp_async", "06_ldmatrix_mma"});
  CHECK(parse({"run", "03_smem_tiling"}).error == "unknown argument '03_smem_tiling' (see --help)");
  CHECK(parse({"explain", "-x"}).error == "unknown argument '-x' (see --help)");
  CHECK(parse({"explain", ","}).error == "--step expects a step id (see --list), got ','");  // as --step , is
  CHECK(parse({"run", "--head-dim", "256", "--seqlen", "0"}).error.empty());
  CHECK(parse({"--seqlen", "007"}).options.seqlen_q == 7);  // leading zeros are still digits
  for (const char* scale : {"0.5", ".5", "5e-1", "5E-1", "0.05e+1", "05.e-1"}) {
    CAPTURE(scale);
    const fs::ParsedArgs a = parse({"--scale", scale});
    CHECK(a.error.empty());
    CHECK(a.options.scale == 0.5f);
  }
}

TEST_CASE("cli: the usage text documents every flag", "[cli]") {
  const std::string usage = fs::runner_usage();
  for (const char* flag : {"--list", "--step", "--batch", "--seqlen", "--seqlen-q", "--seqlen-k", "--heads", "--kv-heads",
                           "--head-dim", "--dtype", "--causal", "--scale", "--softcap", "--window", "--iters",
                           "--warmup", "--no-flush",
                           "--no-baseline", "--seed", "--json", "--csv", "--help", "--decode", "--page-size",
                           "--ragged", "--splits", "--checked", "--hbm-tbs", "--backward", "--deterministic",
                           "-h"}) {
    CAPTURE(flag);
    CHECK(usage.find(flag) != std::string::npos);
  }
}

TEST_CASE("cli: decoding flags make a decoding problem", "[cli][decode]") {
  // A typical decode: one new token against 32k keys, GQA 32/8, pages of 64, ragged lengths.
  const fs::ParsedArgs a = parse({"--seqlen-k", "32768", "--heads", "32", "--kv-heads", "8", "--page-size", "64",
                                  "--ragged", "--splits", "4", "--checked", "--hbm-tbs", "4.64", "--seed", "3"});
  REQUIRE(a.error.empty());
  const fs::RunnerOptions& o = a.options;
  CHECK(o.decode);
  CHECK(o.seqlen_q == 1);  // decoding: one new token unless told
  const fs::DecodeProblem p = fs::decode_problem_from(o);
  CHECK(fs::describe(p) == "b2 h32/8 sq1 sk32768 d128 fp16 paged64 splits4 checked");
  CHECK(fs::validate(p).empty());
  CHECK(std::fabs(o.hbm_tbs - 4.64) < 1e-6);  // parsed as a float
  const std::vector<int32_t> lengths = fs::decode_lengths_from(o);
  REQUIRE(lengths.size() == 2);
  CHECK(lengths[0] == 32768);
  CHECK((lengths[1] >= 1 && lengths[1] <= 32768));
  CHECK(fs::decode_lengths_from(o) == lengths);  // seeded
  CHECK(fs::decode_lengths_from(parse({"--decode"}).options).empty());
  // --decode alone; seqlen_q as given; --seqlen gives both.
  CHECK(parse({"--decode"}).options.seqlen_q == 1);
  CHECK(parse({"--decode", "--seqlen-q", "4"}).options.seqlen_q == 4);
  CHECK(parse({"--decode", "--seqlen", "64"}).options.seqlen_q == 64);
  CHECK_FALSE(parse({"--seqlen-k", "100"}).options.decode);
  const struct {
    std::vector<std::string> args;
    std::string message;
  } bad[] = {
      {{"--page-size", "24"}, "--page-size expects 0 (a contiguous cache) or a multiple of 16, got '24'"},
      {{"--page-size", "-16"}, "--page-size expects 0 (a contiguous cache) or a multiple of 16, got '-16'"},
      {{"--splits", "129"}, "--splits expects an integer between 0 and 128, got '129'"},
      {{"--ragged=1"}, "--ragged takes no value"},
      {{"--hbm-tbs", "0"}, "--hbm-tbs expects a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float), got '0'"},
      {{"--hbm-tbs", "4.6"}, "--hbm-tbs applies to decoding problems (--decode, --page-size, --ragged, --splits, --checked)"},
      {{"resources", "--page-size", "16"}, "--page-size does not apply to 'resources' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.args[0]);
    CHECK(parse(c.args).error == c.message);
  }
}

TEST_CASE("cli: --backward runs the backward pass of the problem the flags describe", "[cli][backward]") {
  const fs::ParsedArgs a = parse({"--backward", "--seqlen", "512", "--heads", "8", "--kv-heads", "2", "--causal"});
  REQUIRE(a.error.empty());
  CHECK(a.options.backward);
  CHECK_FALSE(a.options.deterministic);
  const fs::BackwardProblem p = fs::backward_problem_from(a.options);
  CHECK(fs::describe(p) == "backward b2 h8/2 sq512 sk512 d128 fp16 causal");
  CHECK(fs::validate(p).empty());
  CHECK(p.dq.row == p.attention.q.row);
  // --deterministic asks for the backward pass too.
  const fs::RunnerOptions d = parse({"--deterministic"}).options;
  CHECK(d.backward);
  CHECK(fs::backward_problem_from(d).deterministic == 1);
  CHECK_FALSE(parse({}).options.backward);
  const fs::RunnerOptions r = parse({"resources", "--backward", "--head-dim", "64"}).options;
  CHECK(r.command == "resources");
  CHECK(r.backward);
  const struct {
    std::vector<std::string> args;
    std::string message;
  } bad[] = {
      {{"--backward=1"}, "--backward takes no value"},
      {{"--backward", "--decode"}, "--backward (or --deterministic) and the decoding flags (--decode, --page-size, "
                                   "--ragged, --splits, --checked) ask for two kinds of run; give one"},
      {{"--page-size", "16", "--deterministic"}, "--backward (or --deterministic) and the decoding flags (--decode, "
                                                  "--page-size, --ragged, --splits, --checked) ask for two kinds of "
                                                  "run; give one"},
      {{"--backward", "--no-baseline"}, "--no-baseline applies to forward and decoding runs; the backward run has no "
                                        "baseline row"},
      {{"--list", "--backward"}, "--backward does not apply to '--list' (problem, timing and output options belong to "
                                 "'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)"},
      {{"explain", "--deterministic"}, "--deterministic does not apply to 'explain' (problem, timing and output options "
                                       "belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, "
                                       "--backward and --json)"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.args);
    CHECK(parse(c.args).error == c.message);
  }
}

TEST_CASE("cli: --window L,R gives the problem a sliding window, on every kind of run", "[cli][window]") {
  const fs::ParsedArgs a = parse({"--window", "128,0", "--seqlen", "512"});
  REQUIRE(a.error.empty());
  const fs::Problem p = fs::problem_from(a.options);
  CHECK((p.window == 1 && p.window_left == 128 && p.window_right == 0));
  CHECK(fs::describe(p) == "b2 h16/16 sq512 sk512 d128 fp16 window 128,0");
  CHECK(fs::validate(p).empty());
  const fs::Problem none = fs::problem_from(parse({}).options);
  CHECK((none.window == 0 && none.window_left == 0 && none.window_right == 0));  // off without the flag
  // -1 is unbounded on its side; the largest bound is fs_problem's int32 limit.
  const std::tuple<const char*, int32_t, int32_t> bands[] = {
      {"-1,5", -1, 5}, {"7,-1", 7, -1}, {"-1,-1", -1, -1}, {"0,0", 0, 0}, {"2147483647,007", INT32_MAX, 7}};
  for (const auto& [text, left, right] : bands) {
    CAPTURE(text);
    const fs::ParsedArgs w = parse({std::string("--window=") + text, "--causal"});
    REQUIRE(w.error.empty());
    const fs::Problem q = fs::problem_from(w.options);
    CHECK((q.window == 1 && q.window_left == left && q.window_right == right && q.causal == 1));
  }
  // The backward and decoding problems carry it too: a step without windows refuses it with its sentence.
  const fs::BackwardProblem bp = fs::backward_problem_from(parse({"--backward", "--window", "64,64"}).options);
  CHECK((bp.attention.window == 1 && bp.attention.window_left == 64 && bp.attention.window_right == 64));
  CHECK(fs::describe(bp) == "backward b2 h16/16 sq2048 sk2048 d128 fp16 window 64,64");
  const fs::DecodeProblem dp = fs::decode_problem_from(parse({"--decode", "--window", "256,0"}).options);
  CHECK((dp.attention.window == 1 && dp.attention.window_left == 256 && dp.attention.window_right == 0));
  CHECK(parse({"resources", "--window", "1,1"}).error.empty());

  const std::string rule = "--window expects L,R: two integers from -1 to 2147483647 (-1: unbounded on that side), got '";
  for (const char* bad : {"128", "128,", ",0", "a,b", "-2,0", "0,-2", "+1,0", " 1,0", "1, 0", "1,0 ", "1,0,0",
                          "2147483648,0", "0,99999999999999999999", "0x10,0", "-0,0", "-1", "", "1.5,0", "1;0"}) {
    CAPTURE(bad);
    CHECK(parse({"--window", bad}).error == rule + bad + "'");
  }
  CHECK(parse({"--window"}).error == "--window needs a value");
  CHECK(parse({"list", "--window", "1,1"}).error ==
        "--window does not apply to 'list' (problem, timing and output options belong to 'run'; 'explain' takes --step; "
        "'resources' the problem, --step, --backward and --json)");
}
