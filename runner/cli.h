// Command-line parsing for the runner `flash-steps`, kept apart from main() so the CPU tests can
// check every flag and every error message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backward/problem.h"
#include "decode/problem.h"
#include "forward/problem.h"
#include "forward/rules.h"

namespace fs {

enum class OutputFormat { table, json, csv };

struct RunnerOptions {
  std::string command = "run";  // "run", "list", "banks", "explain", "resources", "help"
  std::vector<std::string> steps;  // --step (repeatable, or comma-separated); empty = all
  int64_t batch = 2;
  int64_t seqlen_q = 2048;
  int64_t seqlen_k = 2048;
  int64_t heads = 16;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 128;
  DType dtype = DType::fp16;
  bool causal = false;
  float scale = 0;  // 0: 1/sqrt(head_dim)
  bool scale_given = false;
  float softcap = 0;  // 0: off
  bool window = false;  // --window L,R: a sliding window of window_left keys before the diagonal, window_right after
  int32_t window_left = 0, window_right = 0;
  // --varlen LENGTHS (and --varlen-k): a variable-length batch of these sequences; their offsets, from
  // which problem_from makes the problem (its cu_seqlens point at these host copies: fs::Workload puts
  // device copies in their place). Empty: a dense batch.
  std::vector<int32_t> varlen, varlen_k;
  Offsets cu;
  int iters = 20;
  int warmup = 2;
  bool flush_l2 = true;
  bool baseline = true;  // the unfused cuBLAS row
  uint64_t seed = 1;
  OutputFormat format = OutputFormat::table;
  bool decode = false;  // a decoding problem (--decode, or any of the flags below): seqlen_q 1 unless given
  int64_t page_size = 0;  // --page-size: 0 a contiguous cache
  bool ragged = false;    // --ragged: per-sequence lengths drawn from [1, seqlen_k]
  int splits = 0;         // --splits: 0 the step's heuristic
  bool checked = false;   // --checked: lengths and block table checked on the device first
  double hbm_tbs = 0;     // --hbm-tbs: the HBM read ceiling for the % column (0: not shown)
  bool backward = false;  // the backward pass (--backward, or --deterministic): dQ, dK, dV of every step with one
  bool deterministic = false;  // --deterministic: bitwise repeatable gradients (no floating-point atomics)
};

struct ParsedArgs {
  RunnerOptions options;
  std::string error;  // "" on success
};

// Parses argv[1..]. Flags take their value as the next argument or after '='.
ParsedArgs parse_runner_args(const std::vector<std::string>& args);

// The problem the options describe (contiguous tensors); with --varlen, a variable-length batch whose
// cu_seqlens point at o.cu's host arrays (valid while o is).
Problem problem_from(const RunnerOptions& o);

// The decoding problem (--decode), contiguous Q and O and a contiguous or paged cache.
DecodeProblem decode_problem_from(const RunnerOptions& o);
// The lengths of --ragged (seeded with --seed; see the usage); empty without it.
std::vector<int32_t> decode_lengths_from(const RunnerOptions& o);
// The backward problem (--backward): the problem's, with contiguous dO, dQ, dK, dV.
BackwardProblem backward_problem_from(const RunnerOptions& o);

std::string runner_usage();

}  // namespace fs
