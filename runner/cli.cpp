#include "runner/cli.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string_view>

#include "backward/rules.h"
#include "decode/rules.h"

namespace fs {
namespace {

// What a flag's value must be, and what it expects, for the message "<flag> expects <expects>, got '<value>'".
struct Rule {
  enum Kind { none, integer, decimal, word } kind;  // none: a switch, which takes no value; word: checked by set
  std::string expects = "";
  int64_t lo = 0, hi = 0, multiple = 1;  // integer: in [lo, hi], a multiple of `multiple`
};
// A decimal is read as a float, as softmax_scale is: the C ABI takes every positive finite float, the
// subnormal ones included, so the flag does too.
const Rule kSwitch{Rule::none},
    kDecimal{Rule::decimal, "a plain decimal number from 1e-45 to 3.4028235e+38 (positive and finite as a float)"};
Rule integer(int64_t lo, int64_t hi, int64_t multiple = 1, std::string expects = "") {
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (expects.empty() && multiple == 1) expects = "an integer between " + s(lo) + " and " + s(hi);
  if (expects.empty()) expects = "a multiple of " + s(multiple) + " from " + s(lo) + " to " + s(hi);
  return {Rule::integer, expects, lo, hi, multiple};
}

// A whole-string decimal integer: digits only (no sign, no space, no overflow).
bool read_integer(const Rule& rule, const std::string& text, int64_t& n) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  n = int64_t(v);  // used only if the rule holds
  return ec == std::errc() && end == text.data() + text.size() && v >= uint64_t(rule.lo) &&
         v <= uint64_t(rule.hi) && v % rule.multiple == 0;
}

// A plain decimal number: digits with at most one '.', and an optional exponent (e.g. 0.125, 1e-3).
// No sign, no space, no hexadecimal, no "inf" or "nan"; its nearest float finite and greater than 0
// (strtof's ERANGE for a subnormal result is no refusal; 0 or inf, from a value beyond, is).
bool read_decimal(const std::string& text, float& x) {
  static const std::regex plain("([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?");
  x = std::regex_match(text, plain) ? std::strtof(text.c_str(), nullptr) : 0;  // 0: refused
  return std::isfinite(x) && x > 0;
}

// One bound of --window: -1 (unbounded on that side) or digits, at most INT32_MAX (fs_problem's int32).
bool read_bound(std::string_view text, int32_t& bound) {
  if (text == "-1") {
    bound = -1;
    return true;
  }
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bound = int32_t(v);  // used only if it is in range
  return ec == std::errc() && end == text.data() + text.size() && v <= uint32_t(INT32_MAX);
}

// --varlen LENGTHS: comma-separated integers from 0 to INT32_MAX, at least one.
bool read_lengths(std::string_view text, std::vector<int32_t>& lengths) {
  lengths.clear();
  for (size_t start = 0;;) {
    const size_t comma = std::min(text.find(',', start), text.size());
    uint32_t v = 0;
    const auto [end, ec] = std::from_chars(text.data() + start, text.data() + comma, v);
    if (ec != std::errc() || end != text.data() + comma || v > uint32_t(INT32_MAX)) return false;
    lengths.push_back(int32_t(v));
    if (comma == text.size()) return true;
    start = comma + 1;
  }
}

// --window L,R: window 1 and its bounds (without the flag the problem's window stays off).
void set_window(Problem& p, const RunnerOptions& o) {
  if (!o.window) return;
  p.window = 1;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
}

// kCommand: --help (as "--help=...": alone it is answered first) and --list. An option applies to run, a kResources
// one to resources too, kSteps (--step) to explain and banks as well: applied or refused, never ignored.
enum Scope { kCommand, kRun, kResources, kSteps };
bool applies(Scope scope, const std::string& command) {
  return command == "run" || (command == "resources" && scope != kRun) ||
         ((command == "explain" || command == "banks") && scope == kSteps);
}

// The parse so far, and the flag being read: its value as given, and as read by an integer or decimal rule.
struct Parse {
  RunnerOptions o;
  std::string text;
  int64_t n = 0;
  float x = 0;
  bool refused = false;  // a word flag's value that breaks its rule
  std::optional<int64_t> seqlen, seqlen_q, seqlen_k;  // resolved once every flag is read
};

struct Flag {
  const char* name;
  Scope scope;
  Rule rule;
  void (*set)(Parse&);  // what it sets, once its value is read
};

const Flag kFlags[] = {
    {"--help", kCommand, kSwitch, [](Parse& p) { p.o.command = "help"; }},
    {"--list", kCommand, kSwitch, [](Parse& p) { p.o.command = "list"; }},
    {"--step", kSteps, {Rule::word, "a step id (see --list)"}, [](Parse& p) {  // repeatable, or comma-separated
       std::stringstream ids(p.text);
       for (std::string id; std::getline(ids, id, ',');) if (!id.empty()) p.o.steps.push_back(id);
       p.refused = p.o.steps.empty();
     }},
    {"--batch", kResources, integer(1, INT32_MAX), [](Parse& p) { p.o.batch = p.n; }},
    {"--seqlen", kResources, integer(0, INT32_MAX), [](Parse& p) { p.seqlen = p.n; }},
    {"--seqlen-q", kResources, integer(0, INT32_MAX), [](Parse& p) { p.seqlen_q = p.n; }},
    {"--seqlen-k", kResources, integer(0, INT32_MAX), [](Parse& p) { p.seqlen_k = p.n; }},
    {"--heads", kResources, integer(1, INT32_MAX), [](Parse& p) { p.o.heads = p.n; }},
    {"--kv-heads", kResources, integer(1, INT32_MAX), [](Parse& p) { p.o.kv_heads = p.n; }},
    {"--head-dim", kResources, integer(kHeadDimMultiple, kMaxHeadDim, kHeadDimMultiple),
     [](Parse& p) { p.o.head_dim = p.n; }},
    {"--dtype", kResources, {Rule::word, "fp16 or bf16"}, [](Parse& p) {
       p.refused = p.text != "fp16" && p.text != "bf16";
       p.o.dtype = p.text == "bf16" ? DType::bf16 : DType::fp16;
     }},
    {"--causal", kResources, kSwitch, [](Parse& p) { p.o.causal = true; }},
    {"--scale", kResources, kDecimal, [](Parse& p) { p.o.scale = p.x; p.o.scale_given = true; }},
    {"--softcap", kResources, kDecimal, [](Parse& p) { p.o.softcap = p.x; }},
    {"--window", kResources, {Rule::word, "L,R: two integers from -1 to 2147483647 (-1: unbounded on that side)"},
     [](Parse& p) {
       const size_t comma = p.text.find(',');
       const std::string_view text = p.text;
       p.refused = comma == std::string::npos || !read_bound(text.substr(0, comma), p.o.window_left) ||
                   !read_bound(text.substr(comma + 1), p.o.window_right);
       p.o.window = true;
     }},
    {"--varlen", kResources, {Rule::word, "comma-separated sequence lengths, each an integer from 0 to 2147483647"},
     [](Parse& p) { p.refused = !read_lengths(p.text, p.o.varlen); }},
    {"--varlen-k", kResources, {Rule::word, "comma-separated key lengths, each an integer from 0 to 2147483647"},
     [](Parse& p) { p.refused = !read_lengths(p.text, p.o.varlen_k); }},
    {"--iters", kRun, integer(1, 100000), [](Parse& p) { p.o.iters = int(p.n); }},
    {"--warmup", kRun, integer(0, 100000), [](Parse& p) { p.o.warmup = int(p.n); }},
    {"--seed", kRun, integer(0, INT64_MAX), [](Parse& p) { p.o.seed = uint64_t(p.n); }},
    {"--no-flush", kRun, kSwitch, [](Parse& p) { p.o.flush_l2 = false; }},
    {"--no-baseline", kRun, kSwitch, [](Parse& p) { p.o.baseline = false; }},
    // The decoding flags: each but --hbm-tbs makes the problem a decoding one.
    {"--decode", kRun, kSwitch, [](Parse& p) { p.o.decode = true; }},
    {"--page-size", kRun, integer(0, kMaxSeqlen, kPageMultiple, "0 (a contiguous cache) or a multiple of 16"),
     [](Parse& p) { p.o.page_size = p.n; p.o.decode = true; }},
    {"--ragged", kRun, kSwitch, [](Parse& p) { p.o.ragged = p.o.decode = true; }},
    {"--splits", kRun, integer(0, kMaxSplits), [](Parse& p) { p.o.splits = int(p.n); p.o.decode = true; }},
    {"--checked", kRun, kSwitch, [](Parse& p) { p.o.checked = p.o.decode = true; }},
    {"--hbm-tbs", kRun, kDecimal, [](Parse& p) { p.o.hbm_tbs = p.x; }},
    {"--backward", kResources, kSwitch, [](Parse& p) { p.o.backward = true; }},
    {"--deterministic", kResources, kSwitch, [](Parse& p) { p.o.deterministic = p.o.backward = true; }},
    {"--json", kResources, kSwitch, [](Parse& p) { p.o.format = OutputFormat::json; }},
    {"--csv", kRun, kSwitch, [](Parse& p) { p.o.format = OutputFormat::csv; }},
};

}  // namespace

ParsedArgs parse_runner_args(const std::vector<std::string>& args) {
  Parse p;
  RunnerOptions& o = p.o;
  // --help or -h anywhere asks for the usage ("--decode --help", "run --help"): nothing else is run.
  if (std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    o.command = "help";
    return {o, ""};
  }
  auto fail = [&o](std::string error) { return ParsedArgs{o, std::move(error)}; };
  size_t i = 0;
  std::string command_word;  // how the command was given: "list", "--list", "--help", ...
  static const std::regex commands("list|run|banks|explain|resources");  // help: --help or -h only
  if (!args.empty() && std::regex_match(args[0], commands)) command_word = o.command = args[i++];
  std::vector<const Flag*> given;  // every option, to refuse those that do not apply to the command
  for (; i < args.size(); ++i) {
    const size_t eq = args[i].rfind("--", 0) == 0 ? args[i].find('=') : std::string::npos;
    const std::string flag = args[i].substr(0, eq);
    const Flag* f = std::find_if(std::begin(kFlags), std::end(kFlags), [&](const Flag& g) { return flag == g.name; });
    // explain and banks read a bare word as a step id: `explain 07a_rows32` is `explain --step 07a_rows32`.
    const bool bare_id = f == std::end(kFlags) && (o.command == "explain" || o.command == "banks") &&
                         args[i].rfind('-', 0) != 0;
    if (bare_id) f = std::find_if(std::begin(kFlags), std::end(kFlags), [](const Flag& g) { return g.name == std::string_view("--step"); });
    if (f == std::end(kFlags)) return fail("unknown argument '" + args[i] + "' (see --help)");
    const Rule::Kind kind = f->rule.kind;
    if (f->scope == kCommand && !command_word.empty() && command_word != flag)
      return fail("'" + command_word + "' and '" + flag + "' are two commands; give one");
    if (kind == Rule::none && eq != std::string::npos) return fail(flag + " takes no value");
    if (!bare_id && kind != Rule::none && eq == std::string::npos && i + 1 == args.size()) return fail(flag + " needs a value");
    p.text = bare_id ? args[i] : eq != std::string::npos ? args[i].substr(eq + 1) : kind != Rule::none ? args[++i] : "";
    const bool read = kind == Rule::integer ? read_integer(f->rule, p.text, p.n)
                                            : kind != Rule::decimal || read_decimal(p.text, p.x);
    if (read) f->set(p);
    if (!read || p.refused) return fail(std::string(f->name) + " expects " + f->rule.expects + ", got '" + p.text + "'");
    if (f->scope == kCommand) command_word = flag;
    else given.push_back(f);
  }
  const auto named = [&given](std::string_view name) {
    return std::any_of(given.begin(), given.end(), [&](const Flag* f) { return f->name == name; });
  };
  if (named("--json") && named("--csv")) return fail("--json and --csv ask for two output formats; give one");
  for (const Flag* f : given)  // the command is known once every argument is read
    if (!applies(f->scope, o.command))
      return fail(std::string(f->name) + " does not apply to '" + command_word +
                  "' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)");
  if (o.hbm_tbs > 0 && !o.decode)
    return fail("--hbm-tbs applies to decoding problems (--decode, --page-size, --ragged, --splits, --checked)");
  if (o.backward && o.decode)
    return fail("--backward (or --deterministic) and the decoding flags (--decode, --page-size, --ragged, --splits, "
                "--checked) ask for two kinds of run; give one");
  if (o.backward && !o.baseline)
    return fail("--no-baseline applies to forward and decoding runs; the backward run has no baseline row");
  if (named("--varlen-k") && !named("--varlen"))
    return fail("--varlen-k gives the key lengths of a variable-length batch; give the query lengths with --varlen");
  if (named("--varlen")) {
    for (const char* flag : {"--batch", "--seqlen", "--seqlen-q", "--seqlen-k"})
      if (named(flag))
        return fail(std::string(flag) + " does not apply with --varlen, whose lengths give the batch (one sequence "
                    "each) and the sequences' lengths");
    if (o.decode)
      return fail("--varlen and the decoding flags (--decode, --page-size, --ragged, --splits, --checked) ask for two "
                  "kinds of run; give one");
    if (!o.varlen_k.empty() && o.varlen_k.size() != o.varlen.size())
      return fail("--varlen-k gives " + std::to_string(o.varlen_k.size()) + " key lengths and --varlen " +
                  std::to_string(o.varlen.size()) + " sequences; give one key length per sequence");
    for (const auto& [flag, lengths] : {std::pair{"--varlen", &o.varlen}, std::pair{"--varlen-k", &o.varlen_k}}) {
      int64_t total = 0;
      for (const int32_t n : *lengths) total += n;
      if (total > kMaxSeqlen)
        return fail(std::string(flag) + " lengths add up to " + std::to_string(total) +
                    " rows; a packed tensor holds at most " + std::to_string(kMaxSeqlen) +
                    " (the kernels count its rows in int32)");
    }
    o.cu = offsets_of(o.varlen, o.varlen_k);
  }
  // --seqlen-q and --seqlen-k win over --seqlen whatever the order; decoding: one new token unless told.
  o.seqlen_q = p.seqlen_q.value_or(p.seqlen.value_or(o.decode ? 1 : o.seqlen_q));
  o.seqlen_k = p.seqlen_k.value_or(p.seqlen.value_or(o.seqlen_k));
  // The paged cache the flags make has num_pages = batch · ceil(seqlen_k / page_size) pages, named by
  // int32 block-table entries: a count past that is said with the flags, which have no num_pages (no
  // overflow: batch < 2^31, pages per sequence < 2^28).
  if (const int64_t pages = o.page_size > 0 ? decode_problem_from(o).num_pages : 0; pages > INT32_MAX)
    return fail("--batch " + std::to_string(o.batch) + " sequences of --seqlen-k " + std::to_string(o.seqlen_k) +
                " keys in pages of --page-size " + std::to_string(o.page_size) + " make " + std::to_string(pages) +
                " pages; the cache may hold at most " + std::to_string(INT32_MAX) +
                " (block table entries are int32)");
  return {o, ""};
}

Problem problem_from(const RunnerOptions& o) {
  Problem p = make_problem(o.batch, o.seqlen_q, o.seqlen_k, o.heads, o.kv_heads ? o.kv_heads : o.heads,
                           o.head_dim, o.dtype, o.causal);
  if (o.scale_given) p.softmax_scale = o.scale;
  p.softcap = o.softcap;
  set_window(p, o);
  return o.varlen.empty() ? p : varlen_problem(p, o.cu);
}

DecodeProblem decode_problem_from(const RunnerOptions& o) {
  DecodeProblem p = make_decode_problem(o.batch, o.seqlen_q, o.seqlen_k, o.heads, o.kv_heads ? o.kv_heads : o.heads,
                                        o.head_dim, o.dtype, o.causal, o.page_size);
  if (o.scale_given) p.attention.softmax_scale = o.scale;
  p.attention.softcap = o.softcap;
  set_window(p.attention, o);
  p.num_splits = o.splits;
  p.checked = o.checked ? 1 : 0;
  return p;
}

std::vector<int32_t> decode_lengths_from(const RunnerOptions& o) {
  if (!o.ragged) return {};
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> lengths(static_cast<size_t>(o.batch));
  for (size_t b = 0; b < lengths.size(); ++b)
    lengths[b] = b == 0 || o.seqlen_k == 0 ? int32_t(o.seqlen_k) : int32_t(1 + rng() % uint64_t(o.seqlen_k));
  return lengths;
}

BackwardProblem backward_problem_from(const RunnerOptions& o) {
  return backward_of(problem_from(o), o.deterministic);
}

std::string runner_usage() {
  return R"(flash-steps — run, check and time every step of the FlashAttention ladder

usage: flash-steps [run] [options]     check every step against the reference, time it, print a table
       flash-steps --list              list the registered steps (no GPU needed)
       flash-steps explain [[--step] ID]
                                       what each step's index math predicts, from models of the hardware
                                       (no GPU needed): 03-05 their shared-memory bank maps, the wavefronts
                                       of every shared access and the ncu counters to expect; 06 the
                                       mma.sync fragment maps; 08 and 09 the tile table, shared-memory
                                       layout and register split; 10 the split-KV heuristic; 12 the five
                                       products' operand views and each sub-step's wgmma schedule; 13
                                       softcapping's factors, the window's tile maps and the packed
                                       batch's grid. The steps without a model (01, 02, 07, 11) are
                                       named as such
       flash-steps banks [[--step] ID] the same as explain
       flash-steps ... --help          this text, whatever else is given (-h too)
       flash-steps resources [options] [--backward] [--json]
                                       registers, shared memory and occupancy of every kernel each step
                                       launches for the problem (with --backward: for its backward pass),
                                       asked of the CUDA runtime (GPU needed)

problem (defaults: batch 2, heads 16, seqlen 2048, head_dim 128, fp16, not causal):
  --batch N            batch size
  --seqlen N           query and key length
  --seqlen-q N         query length (overrides --seqlen)
  --seqlen-k N         key/value length (overrides --seqlen)
  --heads N            query heads
  --kv-heads N         key/value heads (GQA/MQA; must divide --heads; default: --heads)
  --head-dim N         head dimension (a multiple of 8 from 8 to 256)
  --dtype fp16|bf16    element type of Q, K, V, O
  --causal             causal mask, bottom-right aligned
  --scale X            softmax scale (default 1/sqrt(head_dim))
  --softcap X          logit softcapping: softcap * tanh(s / softcap) before the softmax (default: off)
  --window L,R         sliding window: query i sees keys i+d-L ... i+d+R, d = seqlen_k - seqlen_q (-1: unbounded
                       on that side; with --causal the right bound is 0; default: no window)
  --varlen N,N,...     a variable-length batch: one sequence of each length, packed (total, heads, head_dim)
                       with cu_seqlens offsets (FlashAttention's varlen layout); the batch is their count,
                       seqlen_q and seqlen_k the longest; causal and the window are per sequence. TFLOP/s count
                       the real pairs of every sequence. Replaces --batch and --seqlen*; with --backward
                       too (dO, dQ packed like Q, dK, dV like K)
  --varlen-k N,N,...   the key lengths of those sequences (default: --varlen's)

decoding (a few new tokens against a KV cache; any of these flags makes the problem a decoding one):
  --decode             a decoding problem: seqlen_q 1 unless --seqlen-q says otherwise, a KV cache of
                       seqlen_k keys per sequence; the table reports GB/s of K and V read
  --page-size N        a paged cache, N keys per page (a multiple of 16; 0: contiguous, the default)
  --ragged             per-sequence lengths: sequence 0 at seqlen_k, the others drawn from [1, seqlen_k]
  --splits N           cut the keys of a sequence into N parts (1-128; default 0: the step's heuristic)
  --checked            check the lengths and the block table on the device before the kernels read them
                       (each launch then also synchronizes: the times include it)
  --hbm-tbs X          the HBM read ceiling in TB/s, for the "% HBM" column (flash_steps_ceilings'
                       hbm_read, e.g. 4.64 in bench/results/ceilings-20261130-212215.json for the H200)
  Steps without a decoding entry run the problem where it is an ordinary forward one (a contiguous
  cache, no --ragged); otherwise they are listed as refused.

backward pass (dQ, dK, dV from Q, K, V, O, LSE and dO; the problem flags above give its shape):
  --backward           run the backward pass of every step that has one (--step: only these), check
                       each gradient against the reference by the acceptance rule (common/backward/check.h:
                       max |err| <= 2·(error of the same computation in the dtype) + u·max |exact|),
                       time it; TFLOP/s count 2.5 × the forward's FLOPs
  --deterministic      bitwise repeatable gradients (no floating-point atomics); implies --backward

run:
  --step ID[,ID...]    only these steps (repeatable; see --list)
  --iters N            timed launches per step (default 20; the median is reported)
  --warmup N           untimed launches first (default 2)
  --no-flush           do not flush the L2 cache between timed launches
  --no-baseline        leave out the unfused cuBLAS row (forward and decoding runs)
  --seed N             seed of the random inputs (default 1)
  --json | --csv       machine-readable output on stdout instead of the table
  -h, --help           this text

N: digits only; X: a positive decimal (0.125, 1e-3); --window's bounds: digits or -1. Problem options
apply to `run` and `resources`, run options to `run` only; given elsewhere they are refused. `explain`
and `banks` take --step, or the step ids alone (flash-steps explain 07a_rows32).

Exit status: 0 every checked step passed; 1 a step failed, nothing was checked (every selected step
refused the problem), no GPU, or the output could not be written; 2 bad arguments.
)";
}

}  // namespace fs
