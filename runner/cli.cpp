#include "runner/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "backward/rules.h"
#include "decode/rules.h"

namespace fs {

namespace {

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Whole-string decimal integer in [lo, hi] (digits only: no sign, no space, no overflow), else an
// error naming the flag, the rule and the text. `rule` replaces "an integer between lo and hi".
bool parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi, int64_t& out,
               std::string& error, const std::string& rule = "") {
  errno = 0;
  const long long v = all_digits(text) ? std::strtoll(text.c_str(), nullptr, 10) : -1;
  if (!all_digits(text) || errno == ERANGE || v < lo || v > hi) {
    std::ostringstream m;
    m << flag << " expects ";
    if (rule.empty()) m << "an integer between " << lo << " and " << hi;
    else m << rule;
    m << ", got '" << text << "'";
    error = m.str();
    return false;
  }
  out = v;
  return true;
}

// A plain decimal number: digits with at most one '.', and an optional exponent (e.g. 0.125, 1e-3).
// No sign, no space, no hexadecimal, no "inf" or "nan".
bool plain_decimal(const std::string& text) {
  size_t i = 0, digits = 0;
  auto skip_digits = [&] {
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++digits;
  };
  skip_digits();
  if (i < text.size() && text[i] == '.') ++i, skip_digits();
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    const size_t before = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    if (i == before) return false;
  }
  return i == text.size();
}

bool parse_float(const std::string& flag, const std::string& text, float& out, std::string& error) {
  errno = 0;
  const float v = plain_decimal(text) ? std::strtof(text.c_str(), nullptr) : 0.0f;
  if (!plain_decimal(text) || errno == ERANGE || !std::isfinite(v) || v <= 0) {
    error = flag + " expects a finite number greater than 0, got '" + text + "'";
    return false;
  }
  out = v;
  return true;
}

// The flags that make a decoding problem (they apply to `run` only).
bool is_decode_flag(const std::string& flag) {
  return flag == "--decode" || flag == "--page-size" || flag == "--ragged" || flag == "--splits" ||
         flag == "--checked" || flag == "--hbm-tbs";
}

// The flags that mean something for `command` besides its own. Every other flag is refused with it:
// a flag is applied or refused, never ignored.
bool applies_to(const std::string& flag, const std::string& command) {
  if (command == "run") return true;
  if (command == "explain" || command == "banks") return flag == "--step";
  if (command == "resources")  // the problem, the steps and --json; nothing is timed or checked
    return flag != "--iters" && flag != "--warmup" && flag != "--no-flush" && flag != "--no-baseline" &&
           flag != "--seed" && flag != "--csv" && !is_decode_flag(flag);
  return false;  // list, help
}

}  // namespace

ParsedArgs parse_runner_args(const std::vector<std::string>& args) {
  ParsedArgs r;
  RunnerOptions& o = r.options;
  size_t i = 0;
  std::string command_word;  // how the command was given: "list", "--list", "--help", ...
  if (!args.empty() && (args[0] == "list" || args[0] == "run" || args[0] == "banks" || args[0] == "explain" ||
                        args[0] == "resources")) {
    o.command = args[i++];
    command_word = o.command;
  }
  std::vector<std::string> given;  // every option flag, to refuse those that do not apply to the command
  bool seqlen_q_set = false, seqlen_k_set = false, seqlen_set = false;
  for (; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool has_value = false;
    const size_t eq = flag.find('=');
    if (flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto need_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= args.size()) {
        r.error = flag + " needs a value";
        return false;
      }
      value = args[++i];
      return true;
    };
    auto int_flag = [&](int64_t lo, int64_t hi, int64_t& out) {
      return need_value() && parse_int(flag, value, lo, hi, out, r.error);
    };
    auto no_value = [&]() {
      if (has_value) r.error = flag + " takes no value";
      return !has_value;
    };
    auto set_command = [&](const char* command) {
      if (!command_word.empty() && command_word != flag) {
        r.error = "'" + command_word + "' and '" + flag + "' are two commands; give one";
        return false;
      }
      o.command = command;
      command_word = flag;
      return no_value();
    };
    int64_t n = 0;
    bool ok = true;
    if (flag == "--help" || flag == "-h") {
      ok = set_command("help");
    } else if (flag == "--list") {
      ok = set_command("list");
    } else if (flag == "--step") {
      ok = need_value();
      if (ok) {
        std::stringstream ss(value);
        std::string id;
        while (std::getline(ss, id, ','))
          if (!id.empty()) o.steps.push_back(id);
        if (o.steps.empty()) {
          r.error = "--step expects a step id (see --list), got '" + value + "'";
          ok = false;
        }
      }
    } else if (flag == "--batch") {
      ok = int_flag(1, INT32_MAX, o.batch);
    } else if (flag == "--seqlen") {
      ok = int_flag(0, INT32_MAX, n);
      seqlen_set = true;
      if (ok) {
        if (!seqlen_q_set) o.seqlen_q = n;
        if (!seqlen_k_set) o.seqlen_k = n;
      }
    } else if (flag == "--seqlen-q") {
      ok = int_flag(0, INT32_MAX, o.seqlen_q);
      seqlen_q_set = true;
    } else if (flag == "--seqlen-k") {
      ok = int_flag(0, INT32_MAX, o.seqlen_k);
      seqlen_k_set = true;
    } else if (flag == "--heads") {
      ok = int_flag(1, INT32_MAX, o.heads);
    } else if (flag == "--kv-heads") {
      ok = int_flag(1, INT32_MAX, o.kv_heads);
    } else if (flag == "--head-dim") {
      ok = need_value() && parse_int(flag, value, kHeadDimMultiple, kMaxHeadDim, o.head_dim, r.error,
                                     "a multiple of " + std::to_string(kHeadDimMultiple) + " from " +
                                         std::to_string(kHeadDimMultiple) + " to " + std::to_string(kMaxHeadDim));
      if (ok && o.head_dim % kHeadDimMultiple != 0) {
        r.error = "--head-dim expects a multiple of " + std::to_string(kHeadDimMultiple) + " from " +
                  std::to_string(kHeadDimMultiple) + " to " + std::to_string(kMaxHeadDim) + ", got '" + value + "'";
        ok = false;
      }
    } else if (flag == "--dtype") {
      ok = need_value();
      if (ok) {
        if (value == "fp16") o.dtype = DType::fp16;
        else if (value == "bf16") o.dtype = DType::bf16;
        else {
          r.error = "--dtype expects fp16 or bf16, got '" + value + "'";
          ok = false;
        }
      }
    } else if (flag == "--causal") {
      ok = no_value();
      o.causal = true;
    } else if (flag == "--scale") {
      ok = need_value() && parse_float(flag, value, o.scale, r.error);
      o.scale_given = ok;
    } else if (flag == "--iters") {
      ok = int_flag(1, 100000, n);
      o.iters = int(n);
    } else if (flag == "--warmup") {
      ok = int_flag(0, 100000, n);
      o.warmup = int(n);
    } else if (flag == "--seed") {
      ok = int_flag(0, INT64_MAX, n);
      o.seed = uint64_t(n);
    } else if (flag == "--no-flush") {
      ok = no_value();
      o.flush_l2 = false;
    } else if (flag == "--no-baseline") {
      ok = no_value();
      o.baseline = false;
    } else if (flag == "--decode") {
      ok = no_value();
      o.decode = true;
    } else if (flag == "--page-size") {
      ok = need_value() && parse_int(flag, value, 0, kMaxSeqlen, o.page_size, r.error,
                                     "0 (a contiguous cache) or a multiple of 16");
      if (ok && o.page_size % kPageMultiple != 0) {
        r.error = "--page-size expects 0 (a contiguous cache) or a multiple of 16, got '" + value + "'";
        ok = false;
      }
      o.decode = true;
    } else if (flag == "--ragged") {
      ok = no_value();
      o.ragged = o.decode = true;
    } else if (flag == "--splits") {
      ok = int_flag(0, kMaxSplits, n);
      o.splits = int(n);
      o.decode = true;
    } else if (flag == "--checked") {
      ok = no_value();
      o.checked = o.decode = true;
    } else if (flag == "--hbm-tbs") {
      float tbs = 0;
      ok = need_value() && parse_float(flag, value, tbs, r.error);
      o.hbm_tbs = tbs;
    } else if (flag == "--backward") {
      ok = no_value();
      o.backward = true;
    } else if (flag == "--deterministic") {
      ok = no_value();
      o.deterministic = o.backward = true;
    } else if (flag == "--json") {
      ok = no_value();
      o.format = OutputFormat::json;
    } else if (flag == "--csv") {
      ok = no_value();
      o.format = OutputFormat::csv;
    } else {
      r.error = "unknown argument '" + args[i] + "' (see --help)";
      ok = false;
    }
    if (!ok) {
      if (r.error.empty()) r.error = "bad argument '" + args[i] + "'";
      return r;
    }
    if (flag != "--help" && flag != "-h" && flag != "--list") given.push_back(flag);
  }
  for (const std::string& flag : given)
    if (!applies_to(flag, o.command)) {
      r.error = flag + " does not apply to '" + (command_word.empty() ? o.command : command_word) +
                "' (problem, timing and output options belong to 'run'; 'explain' takes --step; 'resources' the problem, --step, --backward and --json)";
      return r;
    }
  if (o.hbm_tbs > 0 && !o.decode) {
    r.error = "--hbm-tbs applies to decoding problems (--decode, --page-size, --ragged, --splits, --checked)";
    return r;
  }
  if (o.backward && o.decode) {
    r.error = "--backward (or --deterministic) and the decoding flags (--decode, --page-size, --ragged, --splits, "
              "--checked) ask for two kinds of run; give one";
    return r;
  }
  if (o.backward && !o.baseline) {
    r.error = "--no-baseline applies to forward and decoding runs; the backward run has no baseline row";
    return r;
  }
  if (o.decode && !seqlen_q_set && !seqlen_set) o.seqlen_q = 1;  // decoding: one new token unless told
  return r;
}

Problem problem_from(const RunnerOptions& o) {
  Problem p = make_problem(o.batch, o.seqlen_q, o.seqlen_k, o.heads, o.kv_heads ? o.kv_heads : o.heads,
                           o.head_dim, o.dtype, o.causal);
  if (o.scale_given) p.softmax_scale = o.scale;
  return p;
}

DecodeProblem decode_problem_from(const RunnerOptions& o) {
  DecodeProblem p = make_decode_problem(o.batch, o.seqlen_q, o.seqlen_k, o.heads, o.kv_heads ? o.kv_heads : o.heads,
                                        o.head_dim, o.dtype, o.causal, o.page_size);
  if (o.scale_given) p.attention.softmax_scale = o.scale;
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
       flash-steps explain [--step ID] what each step's index math predicts, from a model of the hardware
                                       (no GPU needed): steps 03-05 print their shared-memory bank maps,
                                       the wavefronts of every shared access and the ncu counters to expect
       flash-steps banks [--step ID]   the same as explain
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

Numbers are plain decimals (digits only). Problem and run options apply to `run` only; given with
--list, banks or --help they are refused. `explain` takes --step.

Exit status: 0 every checked step passed; 1 a step failed, nothing was checked (every selected step
refused the problem) or no GPU; 2 bad arguments.
)";
}

}  // namespace fs
