// Step 01 — the compile-time choice and the index math of the three naive kernels (kernel.cuh).
//
// Each kernel gives one thread one element of its output and finds which element from a flat index
// e = 0, 1, 2, ... (in a grid-stride loop). The decompositions of e below are what the kernels run;
// the CPU tests (tests/test_step01_naive.cpp) check them against a brute-force enumeration.
#pragma once

#include <cstdint>

#include "common/forward/problem.h"  // FS_HD, Problem

namespace fs::step01 {

// Threads per block, for all three kernels.
constexpr int THREADS = 256;

// S [batch, heads_q, seqlen_q, seqlen_k] fp32: the scores, one thread per element (kernel 1).
FS_HD constexpr int64_t score_elements(const Problem& p) { return p.batch * p.heads_q * p.seqlen_q * p.seqlen_k; }

// Rows of S, one thread per row (kernel 2). Row r = (b·H + h)·Sq + i: LSE's own order.
FS_HD constexpr int64_t score_rows(const Problem& p) { return p.batch * p.heads_q * p.seqlen_q; }

// O in its logical (batch, seqlen_q, heads_q, head_dim) order, one thread per element (kernel 3).
FS_HD constexpr int64_t output_elements(const Problem& p) { return p.batch * p.seqlen_q * p.heads_q * p.head_dim; }

// Element e of S is S[b, h, i, j]: query row i of head h of batch b, key j.
struct ScoreCoord {
  int64_t b, h, i, j;
};
FS_HD constexpr ScoreCoord score_coord(int64_t e, const Problem& p) {
  const int64_t j = e % p.seqlen_k;
  const int64_t i = (e / p.seqlen_k) % p.seqlen_q;
  const int64_t h = (e / (p.seqlen_k * p.seqlen_q)) % p.heads_q;
  const int64_t b = e / (p.seqlen_k * p.seqlen_q * p.heads_q);
  return {b, h, i, j};
}

// Element e of O, in its logical order, is O[b, i, h, d]: column d of query row i of head h of batch b.
struct OutputCoord {
  int64_t b, i, h, d;
};
FS_HD constexpr OutputCoord output_coord(int64_t e, const Problem& p) {
  const int64_t d = e % p.head_dim;
  const int64_t h = (e / p.head_dim) % p.heads_q;
  const int64_t i = (e / (p.head_dim * p.heads_q)) % p.seqlen_q;
  const int64_t b = e / (p.head_dim * p.heads_q * p.seqlen_q);
  return {b, i, h, d};
}

}  // namespace fs::step01
