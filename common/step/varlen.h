// Variable-length batches (fs_problem::cu_seqlens_q and cu_seqlens_k, note 13c): sequences of different
// lengths packed one after another into one tensor, FlashAttention's varlen layout. Sequence b is rows
// cu_seqlens_q[b] … cu_seqlens_q[b + 1] - 1 of Q and O and rows cu_seqlens_k[b] … of K and V; every mask
// (causal, the window) is the sequence's own, bottom-right aligned on its own lengths.
//
// The kernels of 13c keep the dense kernel's tiles: a tile never spans two sequences, because the grid
// enumerates (tile, sequence, head) over a padded batch of `batch` sequences of the longest length
// (seqlen_q, FlashAttention's max_seqlen_q), and a block whose tile lies past its sequence's end exits
// before it loads anything. A short sequence costs its own tiles and, for each tile it lacks, one empty
// block.
#pragma once

#include <stdint.h>

#include "forward/problem.h"
#include "step/hd.h"

namespace fs {

FS_HD constexpr bool is_varlen(const fs_problem& p) { return p.cu_seqlens_q != nullptr; }

// One sequence of a packed batch: its rows of Q and O start at q_start, its rows of K and V at k_start.
struct Sequence {
  int64_t q_start = 0, q_len = 0, k_start = 0, k_len = 0;
};

// Sequence b from its offsets q_begin = cu_seqlens_q[b], q_end = cu_seqlens_q[b + 1] (and k_begin, k_end),
// as read from the arrays. A side whose offsets break the contract (0 <= begin <= end <= total and
// end - begin <= the length bound) reads as empty, so that no kernel reads or writes outside the packed
// tensors whatever the arrays hold; the checked mode reports such offsets instead (flash_steps.h).
FS_HD constexpr Sequence sequence_from(const fs_problem& p, int64_t q_begin, int64_t q_end, int64_t k_begin,
                                       int64_t k_end) {
  Sequence s;
  if (0 <= q_begin && q_begin <= q_end && q_end <= p.total_q && q_end - q_begin <= p.seqlen_q)
    s.q_start = q_begin, s.q_len = q_end - q_begin;
  if (0 <= k_begin && k_begin <= k_end && k_end <= p.total_k && k_end - k_begin <= p.seqlen_k)
    s.k_start = k_begin, s.k_len = k_end - k_begin;
  return s;
}

// The problem one sequence poses on its own (batch 1, its own lengths): what the masks read (band_of,
// kv_span, q_span and the causal helpers all take their lengths from it).
FS_HD constexpr fs_problem one_sequence(fs_problem p, const Sequence& s) {
  p.batch = 1, p.seqlen_q = s.q_len, p.seqlen_k = s.k_len;
  p.cu_seqlens_q = p.cu_seqlens_k = nullptr, p.total_q = p.total_k = 0;
  return p;
}

// The dense problem whose tensors are p's: p itself, or for a packed batch, batch 1 of total_q query rows
// and total_k key rows, Q, K, V, O and LSE as they lie in memory (its masks mean nothing: they are the
// sequences'). What sizes, allocates, fills and compares the tensors, and what 13c's tensor maps see.
FS_HD constexpr fs_problem dense_view(fs_problem p) {
  if (!is_varlen(p)) return p;
  p.batch = 1, p.seqlen_q = p.total_q, p.seqlen_k = p.total_k;
  p.cu_seqlens_q = p.cu_seqlens_k = nullptr, p.total_q = p.total_k = 0;
  return p;
}

// ---- the grid: one block per (tile, sequence, head) of the padded batch ---------------------------
// tiles · batch · heads blocks, tiles = tiles_of(the length bound, block). As in the dense kernels, the
// tiles of one (sequence, head) are neighbours: block w takes tile j = w % tiles of sequence
// b = w / (tiles · heads) and head h = (w / tiles) % heads, so that the blocks running at once share
// a few heads' K and V in L2 (ordered (tile, sequence, head) instead, 132 blocks read 132 different
// heads' K and V, far more than L2 holds, and every block reads them from HBM again). Tile j exists
// when j < tiles_of(length, block); a block past its sequence's tiles exits at once. The forward counts
// its query tiles from the sequence's end (under causal masking the last sees the most keys, so the
// longest work of each head starts first), the backward its K/V tiles from the start (the first ones
// are seen by the most queries).
struct VarlenTile {
  int64_t j, b, h;
};
FS_HD constexpr VarlenTile varlen_tile(int64_t w, int64_t tiles, int64_t heads) {
  return {w % tiles, w / (tiles * heads), (w / tiles) % heads};
}
FS_HD constexpr int64_t tiles_of(int64_t len, int64_t block) { return (len + block - 1) / block; }

#ifdef __CUDACC__
// Sequence b, read from the device arrays of p (through the read-only cache: every block of the
// sequence reads the same four offsets).
__device__ inline Sequence load_sequence(const fs_problem& p, int64_t b) {
  return sequence_from(p, __ldg(p.cu_seqlens_q + b), __ldg(p.cu_seqlens_q + b + 1), __ldg(p.cu_seqlens_k + b),
                       __ldg(p.cu_seqlens_k + b + 1));
}
#endif

}  // namespace fs
