// Command-line parsing for the runner `flash-steps`, kept apart from main() so the CPU tests can
// check every flag and every error message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"

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
  int iters = 20;
  int warmup = 2;
  bool flush_l2 = true;
  bool baseline = true;  // the unfused cuBLAS row
  uint64_t seed = 1;
  OutputFormat format = OutputFormat::table;
};

struct ParsedArgs {
  RunnerOptions options;
  std::string error;  // "" on success
};

// Parses argv[1..]. Flags take their value as the next argument or after '='.
ParsedArgs parse_runner_args(const std::vector<std::string>& args);

// The problem the options describe (contiguous tensors).
Problem problem_from(const RunnerOptions& o);

std::string runner_usage();

}  // namespace fs
