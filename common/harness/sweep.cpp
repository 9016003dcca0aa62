#include "harness/sweep.h"

namespace fs {

Sweep sweep(bool quick) {
  if (quick) return Sweep{{1024, 2048, 4096}, {128}, {DType::fp16}};
  return Sweep{{512, 1024, 2048, 4096, 8192, 16384}, {128, 64}, {DType::fp16, DType::bf16}};
}

std::string sweep_shape(int64_t tokens, int64_t seqlen, int64_t head_dim, int64_t& batch, int64_t& heads) {
  if (tokens <= 0) return "tokens is " + std::to_string(tokens) + "; it must be greater than 0";
  if (seqlen <= 0 || tokens % seqlen != 0)
    return "seqlen is " + std::to_string(seqlen) + "; it must divide the " + std::to_string(tokens) +
           " tokens (batch · seqlen) of every sweep shape";
  if (head_dim <= 0 || kSweepWidth % head_dim != 0)
    return "head_dim is " + std::to_string(head_dim) + "; it must divide the sweep's width of " +
           std::to_string(kSweepWidth) + " (heads · head_dim)";
  batch = tokens / seqlen;
  heads = kSweepWidth / head_dim;
  return "";
}

}  // namespace fs
