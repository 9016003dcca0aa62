// Step 13 — what production kernels carry beyond the dense, causal-or-not problem, one feature per
// lettered sub-step, each entering the tile loop where it costs least. Extends step 12 (12c's backward)
// and step 09 (09f's forward, which this file includes):
//
//   13a kSoftcap   logit softcapping (Gemma 2): softcap·tanh(s / softcap) before the softmax, fused where
//                  the scores are in registers. The forward (step 09f's kernel) turns each raw score s into
//                  t = tanh(s·pre) before the row max and is given softcap·log2(e) as the exponent's
//                  factor in place of scale·log2(e) (common/step/softcap.h), so its online softmax, masks
//                  and LSE are unchanged; the backward (step 12c's) does the same before P and multiplies
//                  dSᵀ by the slope 1 - t², which it keeps in place of P once P is packed for dV. Each
//                  costs one FMUL and one MUFU.TANH per score beside the one MUFU.EX2.
//   13b kWindow    sliding window (Mistral, Gemma): row i sees the keys of a band around its diagonal
//                  (common/step/window.h). Both ends of a row's band grow with i, so a query tile sees one
//                  run of K/V tiles: the forward visits only those (kv_span), the last down as before, and
//                  masks only the visits at either end of the run, where a tile straddles an edge of some
//                  row's band (tile_keys); the backward's K/V tile visits only the query tiles that see it
//                  (q_span). With WINDOW, causal masking is the band (-1, 0); without it, step 09f's
//                  causal tile skip runs unchanged.
//   13c kVarlen    variable-length batches (FlashAttention's varlen layout): sequences packed one after
//                  another, cut by cu_seqlens offsets (common/step/varlen.h). The grid is the padded
//                  batch's, a block per (tile, sequence, head), and a block whose sequence has no such
//                  tile exits at once; inside, the tile loop is 13b's on the sequence's own lengths and
//                  band, its rows offset in the packed tensors. The forward stores the rows of O a TMA box
//                  would spill into the next sequence with its threads; the backward's workspace keeps
//                  the padded batch's rows.
//
// Both kernels are copies of their steps' final sub-steps (notes/substeps/09f_persistent.cuh and
// 12c_bulk_dq.cuh: diff them against this file), with a template flag for each feature: SOFTCAP for
// 13a's. With every flag false the forward compiles to 09f's PTX, instruction for instruction; the
// backward differs from 12c's by a second copy of its masked exp2 loop
// (bench/results/ptx-13-off-vs-09f-12c.txt). The rest is reused: step 09's and step 12's index math and
// instructions, step 11's preprocessing, dQ conversion and deterministic dQ kernel (with their own flags).
// From 13b: WINDOW is 13b's flag.
// From 13c: VARLEN is 13c's flag.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/step/softcap.h"
#include "common/step/varlen.h"
#include "common/step/window.h"
#include "steps/09_warp_specialized/kernel.cuh"
#include "steps/12_hopper_backward/kernel.cuh"
#include "steps/13_features/traits.h"

namespace fs::step13 {

// ==== the forward: step 09f's kernel =============================================================
namespace forward_pass {
using namespace step09;

// One block = BLOCK_Q = 64 · CONSUMERS query rows of one (batch, head), 128 · (1 + CONSUMERS) threads:
// warpgroup 0 the producer, warpgroups 1 … CONSUMERS the consumers; consumer c = warpgroup - 1 owns
// rows 64·c … 64·c + 63. In thread t of a consumer, row state r (0, 1) belongs to the row
// wgmma_acc(t, 2r).row of its 64: rows g and g + 8 of its warp's 16 (g = lane / 4).
// __launch_bounds__(NUM_THREADS, 1) caps the registers at launch (168 a thread with two consumers,
// 128 with three), which setmaxnreg needs.
// From 13c: VARLEN, a packed batch (common/step/varlen.h). Its tiles take the band's code (a sequence's causal
// mask is the band (-1, 0), no mask at all (-1, -1)) and one block each; the tensor maps see one packed
// tensor (batch 1, total rows), and `o` (used by VARLEN alone) takes the rows of O a TMA box may not write.
template <typename T, class Tr, bool SOFTCAP, bool WINDOW, bool VARLEN = false>
__global__ void __launch_bounds__(Tr::NUM_THREADS, 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, const Problem p, const float scale_log2,
                   const Softcap cap, T* __restrict__ o) {
  constexpr int HEAD_DIM = Tr::HEAD_DIM, BLOCK_KV = Tr::BLOCK_KV, KV_STAGES = Tr::KV_STAGES;
  constexpr int BLOCK_Q = Tr::BLOCK_Q, CONSUMERS = Tr::CONSUMERS;
  static_assert(!VARLEN || (WINDOW && !Tr::has(kPersistent)), "13c: a packed batch runs the band's code, a block per tile");

  // The swizzle repeats every 1024 bytes from an aligned address, and TMA and wgmma both assume
  // tiles that start on it: round the base up (SMEM_BYTES includes the 1024 bytes of slack).
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw);
  const uint32_t base = (raw + SWIZZLE_ATOM - 1) & ~(SWIZZLE_ATOM - 1);
  unsigned char* const smem = smem_raw + (base - raw);
  const uint32_t q_smem = base + Tr::Q_OFFSET;  // [BLOCK_Q, HEAD_DIM] as COL_BLOCKS boxes [BLOCK_Q, 64], swizzled; O at the end
  const uint32_t k_smem = base + Tr::K_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  const uint32_t v_smem = base + Tr::V_OFFSET;  // [KV_STAGES][BLOCK_KV, HEAD_DIM], the same layout
  // mbarriers, 8 bytes each (barrier_offset): Q's two, then KV_STAGES of each: K full, V full, K empty, V empty.
  const uint32_t barriers = base + Tr::BARRIER_OFFSET;
  const uint32_t q_full = barriers + barrier_offset(kQFull, 0, KV_STAGES);
  const uint32_t q_empty = barriers + barrier_offset(kQEmpty, 0, KV_STAGES);
  auto k_full = [&](int stage) { return barriers + barrier_offset(kKFull, stage, KV_STAGES); };
  auto v_full = [&](int stage) { return barriers + barrier_offset(kVFull, stage, KV_STAGES); };
  auto k_empty = [&](int stage) { return barriers + barrier_offset(kKEmpty, stage, KV_STAGES); };
  auto v_empty = [&](int stage) { return barriers + barrier_offset(kVEmpty, stage, KV_STAGES); };

  // Tile and head indices are below 2^31 (plan() checks the tiles): 32-bit divisions do.
  const int seqlen_q = int(p.seqlen_q), seqlen_k = int(p.seqlen_k);
  const unsigned q_tiles = (unsigned(seqlen_q) + BLOCK_Q - 1) / BLOCK_Q;
  const unsigned heads = unsigned(p.batch * p.heads_q), num_tiles = q_tiles * heads;
  // The tiles of this block, by round n: tile blockIdx.x alone, or from 09f the persistent schedule's
  // position (persistent_position; a position past the last tile ends the loop). With causal masking
  // 09f's plan launches 09e's instantiation, one block per tile.
  // From 13b: so it does with a window.
  const bool causal = p.causal != 0;
  const Band band = band_of(p);  // From 13b: the keys each row sees (causal's band too)
  auto position = [&](const unsigned n) {
    return Tr::has(kPersistent) ? persistent_position(n, blockIdx.x, gridDim.x) : (n == 0 ? blockIdx.x : num_tiles);
  };
  // From 13b: the K/V tiles of a work item are kv_first … kv_first + kv_tiles - 1, visited from the last
  // down; the first masked_tiles visits need the mask, and the last masked_bottom.
  // From 13c: rows q0 … of the tile and kv0 … of a K/V tile count from the sequence's first row, which is row
  // q_start of the packed Q and O and row k_start of K and V; `tb` is the tensor maps' batch coordinate.
  struct Work {
    uint32_t bh;
    int h, b, h_kv, q0, q_rows, kv_first, kv_tiles, masked_tiles, masked_bottom;
    int q_start, k_start, tb;
    Band band;  // the band of these rows' sequence
  };
  auto work_of = [&](const unsigned w) {
    Work x;
    x.q_start = 0, x.k_start = 0;
    if constexpr (VARLEN) {
      // Tile j from the end of sequence b, head h; a sequence with fewer tiles leaves q_rows <= 0.
      const VarlenTile tile = varlen_tile(w, q_tiles, p.heads_q);
      const Sequence seq = load_sequence(p, tile.b);
      x.h = int(tile.h), x.b = int(tile.b), x.tb = 0, x.bh = 0;
      x.q_start = int(seq.q_start), x.k_start = int(seq.k_start);
      x.q0 = int(tiles_of(seq.q_len, BLOCK_Q) - 1 - tile.j) * BLOCK_Q;
      x.q_rows = x.q0 < 0 ? 0 : min(BLOCK_Q, int(seq.q_len) - x.q0);
      x.band = band_of(one_sequence(p, seq));
    } else {
      const BlockTile tile = block_tile(w, q_tiles);
      x.bh = tile.bh;
      x.h = int(tile.bh % unsigned(p.heads_q)), x.b = int(tile.bh / unsigned(p.heads_q)), x.tb = x.b;
      x.q0 = tile.q_tile * BLOCK_Q;
      x.q_rows = min(BLOCK_Q, seqlen_q - x.q0);  // real query rows in this tile
      x.band = band;
    }
    x.h_kv = int(unsigned(x.h) / (unsigned(p.heads_q) / unsigned(p.heads_kv)));  // GQA: kv_head_of(p, h)
    x.kv_first = 0, x.masked_bottom = 0;
    if constexpr (WINDOW) {
      // The run of K/V tiles the band of these rows touches, masked at both ends.
      const KvSpan kv = kv_span(x.band, x.q0, x.q_rows, BLOCK_KV);
      x.kv_first = kv.first, x.kv_tiles = kv.count, x.masked_tiles = kv.masked_top, x.masked_bottom = kv.masked_bottom;
    } else {
      const KvTiles kv = kv_tiles_for(x.q0, x.q_rows, BLOCK_KV, seqlen_q, seqlen_k, causal);
      x.kv_tiles = kv.count, x.masked_tiles = kv.count - kv.unmasked;
    }
    return x;
  };

  // From 13c: a block whose tile lies past its sequence's end (or whose sequence is empty) has nothing to do.
  if constexpr (VARLEN) {
    if (work_of(blockIdx.x).q_rows <= 0) return;
  }

  // Full barriers: one arrival per phase (the producer's arrive.expect_tx), completed by the TMA's
  // bytes. Empty barriers: one arrival per consumer warp. mbarrier.init writes through the generic
  // proxy and the TMA's complete-tx reaches the barrier through the async proxy, so the fence orders
  // the one before the other; the block barrier then publishes the barriers to every thread. It is
  // the kernel's only block-wide barrier.
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(q_full, 1);
    sm90::mbarrier_init(q_empty, CONSUMERS);
    for (int s = 0; s < KV_STAGES; ++s) {
      sm90::mbarrier_init(k_full(s), 1);
      sm90::mbarrier_init(v_full(s), 1);
      sm90::mbarrier_init(k_empty(s), Tr::NUM_CONSUMER_WARPS);
      sm90::mbarrier_init(v_empty(s), Tr::NUM_CONSUMER_WARPS);
    }
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();

  // The warpgroup, the same in every lane of a warp: the shuffle lets the compiler see that, so the
  // branch below is uniform and Q's descriptors can live in uniform registers, as wgmma wants them.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);

  // Each role is one branch of this if/else, the same in the 4 warps of a warpgroup: setmaxnreg must be
  // executed by every warp of the warpgroup (PTX ISA), and each branch starts with its own.
  if (wg == PRODUCER_WARPGROUP) {
    // ======== producer ===========================================================================
    // The whole warpgroup gives its registers back (every warp must execute setmaxnreg); then one
    // thread issues every copy, and the other 127 are done.
    sm90::setmaxnreg_dec<PRODUCER_REGISTERS>();
    if (threadIdx.x == 0) {
      int visits = 0;  // K/V visits of this block's earlier tiles: where the rings stand
      for (unsigned n = 0, w = position(0); w < num_tiles; w = position(++n)) {
        const Work x = work_of(w);
        // A tile is COL_BLOCKS boxes [rows, 64]; rows past seqlen and columns past head_dim come in as
        // zeros, and count in the bytes the barrier expects all the same.
        auto load_tile = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int rows, int row0, int head) {
#pragma unroll
          for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
            const BoxCoord c = tma_box(cb, row0, head, x.tb);
            sm90::tma_load_4d(dst + box_offset(rows, cb), &map, bar, c.col, c.row, c.head, c.batch);
          }
        };
        // ---- load Q, once the consumers have stored the previous tile's O from q_smem. A tile whose
        // rows see no key at all (causal, seqlen_q > seqlen_k) loads nothing, and its phase of
        // q_full completes on the arrival alone.
        auto load_q = [&] {
          if (n > 0) sm90::mbarrier_wait(q_empty, (n - 1) & 1u);
          if (x.kv_tiles > 0) {
            sm90::mbarrier_arrive_expect_tx(q_full, Tr::Q_BYTES);
            load_tile(q_map, q_smem, q_full, BLOCK_Q, x.q_start + x.q0, x.h);
          } else {
            sm90::mbarrier_arrive(q_full);
          }
        };

        // ---- load K and V, in the order the consumers' turns need them (kv_load): K0, K1 V0, K2 V1, …,
        // Q among them at q_load_position. Visit t reads tile count - 1 - t from its stage
        // (visits + t) % KV_STAGES; a stage's fill n ≥ 1 waits until every consumer warp has released
        // fill n - 1.
        const int q_at = q_load_position(Tr::IDEAS, x.kv_tiles, n);
        for (int i = 0; i <= 2 * x.kv_tiles; ++i) {
          if (i == q_at) {
            load_q();
            continue;
          }
          const KvLoad l = kv_load(i - (i > q_at), x.kv_tiles);
          const int visit = visits + l.visit, s = kv_stage(visit, KV_STAGES);
          const uint32_t full = l.v ? v_full(s) : k_full(s), empty = l.v ? v_empty(s) : k_empty(s);
          if (waits_for_release(visit, KV_STAGES)) sm90::mbarrier_wait(empty, release_parity(visit, KV_STAGES));
          sm90::mbarrier_arrive_expect_tx(full, Tr::KV_BYTES);
          load_tile(l.v ? v_map : k_map, (l.v ? v_smem : k_smem) + uint32_t(s * Tr::KV_BYTES), full, BLOCK_KV,
                    x.k_start + (x.kv_first + x.kv_tiles - 1 - l.visit) * BLOCK_KV, x.h_kv);
        }
        visits += x.kv_tiles;
      }
    }
  } else {
    // ======== consumers ==========================================================================
    sm90::setmaxnreg_inc<Tr::CONSUMER_REGISTERS>();
    const int c = consumer_of(wg), t = threadIdx.x % 128, lane = threadIdx.x % 32;

    // Descriptors: this consumer's 64 rows of Q (rows 64·c …: 64 rows of 128 bytes into each column
    // block), and stage 0 of K and V; the kernel moves them with advance(). K-major: Q and K; V N-major.
    const uint64_t q_desc = matrix_descriptor(q_smem + uint32_t(c * ROWS_PER_WARPGROUP) * ROW_BYTES, K_MAJOR_LBO, SBO_8_ROWS);
    const uint64_t k_desc0 = matrix_descriptor(k_smem, K_MAJOR_LBO, SBO_8_ROWS);
    const uint64_t v_desc0 = matrix_descriptor(v_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);

    // A warp releases a stage once its own wgmma that read it has completed: one arrival, by lane 0.
    // `after` is always true; a release given the row sums as `after` depends on every exponential of
    // the softmax, which keeps ptxas from moving the wait for P·V above them (without it, ptxas put
    // that wait after the first 16 of the 90 MUFU.EX2 of a turn at HEAD_DIM 128, BLOCK_KV 176, and
    // the softmax no longer ran under P·V; with it, all 90 come first).
    auto release = [&](uint32_t empty, bool after) {
      if (lane == 0 && after) sm90::mbarrier_arrive(empty);
    };

    int visits = 0;  // K/V visits of this block's earlier tiles, as the producer counts them
    for (unsigned n = 0, w = position(0); w < num_tiles; w = position(++n)) {
      const Work x = work_of(w);
      float o_acc[Tr::O_REGS] = {};  // [64 rows, HEAD_DIM] fp32 of this consumer, wgmma_acc layout
      float s_acc[Tr::S_REGS];       // [64 rows, BLOCK_KV] fp32: S(k), then P(k) before rounding
      uint32_t p_frag[Tr::PV_K_STEPS][4];  // [64 rows, BLOCK_KV] fp16/bf16: P(k-1), wgmma_a layout per k16 step
      float row_max[2] = {-INFINITY, -INFINITY};  // raw-score max (scale not applied) of rows r = 0, 1
      float row_sum[2] = {0.0f, 0.0f};            // this thread's part of the row sums

      // Turn k (traits.h, "the turns of a consumer"): S(k) if HAS_S, P·V(k-1) if HAS_PV, the softmax of
      // S(k). MASKED (a compile-time constant) is true for the first masked_tiles visits only.
      // From 13b: and for the last masked_bottom.
      auto turn = [&](const int k, auto has_s, auto has_pv, auto masked) {
        constexpr bool HAS_S = decltype(has_s)::value, HAS_PV = decltype(has_pv)::value;
        constexpr bool MASKED = decltype(masked)::value;
        constexpr bool SOFTMAX_UNDER_PV = HAS_S && HAS_PV;
        const int ks_stage = kv_stage(visits + k, KV_STAGES), pv_stage = kv_stage(visits + k + KV_STAGES - 1, KV_STAGES);

        // ---- wait for K(k) and V(k-1), then (ping-pong) for this consumer's turn
        if constexpr (HAS_S) sm90::mbarrier_wait(k_full(ks_stage), kv_parity(visits + k, KV_STAGES));
        if constexpr (HAS_PV) sm90::mbarrier_wait(v_full(pv_stage), kv_parity(visits + k - 1, KV_STAGES));
        sm90::named_barrier_sync(turn_barrier(c), TURN_BARRIER_THREADS);

        // ---- S = Q·Kᵀ, then O += P·V: both issued, neither waited for yet
        // S(k): QK_K_STEPS wgmma m64nBLOCK_KVk16, each reading 64 rows × 16 head dims of Q and BLOCK_KV
        // keys × 16 head dims of K from shared memory; the first overwrites s_acc, the others accumulate.
        // P·V(k-1): PV_K_STEPS wgmma m64nHEAD_DIMk16, A = P(k-1) from registers (p_frag), B = 16 keys ×
        // HEAD_DIM of V, N-major. One commit group each, S first.
        if constexpr (HAS_PV) {  // the O rescale and P's rounding stay above wgmma.fence
          sm90::fence_operands(o_acc);
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk) sm90::fence_operands(p_frag[kk]);
        }
        sm90::wgmma_fence();
        if constexpr (HAS_S) {
          const uint64_t k_desc = advance(k_desc0, uint32_t(ks_stage * Tr::KV_BYTES));
#pragma unroll
          for (int ks = 0; ks < Tr::QK_K_STEPS; ++ks)
            sm90::Wgmma<BLOCK_KV, T>::ss(s_acc, advance(q_desc, k_major_step_offset(BLOCK_Q, ks)),
                                         advance(k_desc, k_major_step_offset(BLOCK_KV, ks)), ks > 0);
          sm90::wgmma_commit();
        }
        if constexpr (HAS_PV) {
          const uint64_t v_desc = advance(v_desc0, uint32_t(pv_stage * Tr::KV_BYTES));
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
            sm90::Wgmma<HEAD_DIM, T>::rs(o_acc, p_frag[kk], advance(v_desc, mn_major_step_offset(kk)));
          sm90::wgmma_commit();
        }
        // Ping-pong: the products are in the tensor cores' queue; the next consumer may issue its own.
        if (hands_over_after(c, k, x.kv_tiles, CONSUMERS))
                    sm90::named_barrier_arrive(turn_barrier(next_consumer(c, CONSUMERS)), TURN_BARRIER_THREADS);

        // ---- wait for S(k) (and, unless the softmax runs under it, for P·V(k-1) too)
        sm90::wgmma_wait<SOFTMAX_UNDER_PV ? 1 : 0>();
        sm90::fence_operands(s_acc);
        if constexpr (HAS_PV && !SOFTMAX_UNDER_PV) release(v_empty(pv_stage), true);

        float correction[2];
        bool max_grew = false;
        if constexpr (HAS_S) {
          // 13a: softcapping. Each raw score s becomes t = tanh(s·pre), one FMUL and one MUFU.TANH; the
          // host passed scale_log2 = softcap·log2(e), so t·scale_log2 is the capped logit softcap·t in
          // base 2: the masks and the online softmax below are step 09f's, unchanged. P·V(k-1) still runs.
          if constexpr (SOFTCAP) {
#pragma unroll
            for (int i = 0; i < Tr::S_REGS; ++i) s_acc[i] = tanh_approx(s_acc[i] * cap.pre);
          }

          // Keys past seqlen_k (zero-filled rows of K) and, with causal, keys after the diagonal get -inf.
          // Column of register i = this thread's first column + acc_col_offset(i), a constant.
          // From 13b: keys outside the row's band get -inf too.
          if constexpr (MASKED) {
            const int kv0 = (x.kv_first + x.kv_tiles - 1 - k) * BLOCK_KV;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int64_t row = int64_t(x.q0) + c * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;
              if constexpr (WINDOW) {
                // The keys lo … end - 1 of this tile that the row sees, counted from the thread's first column.
                const TileKeys keys = tile_keys(x.band, row, kv0, BLOCK_KV);
                const int lo = keys.lo - wgmma_acc(t, 0).col, end = keys.end - wgmma_acc(t, 0).col;
#pragma unroll
                for (int i = 2 * r; i < Tr::S_REGS; i += 4)
#pragma unroll
                  for (int e = 0; e < 2; ++e)
                    if (acc_col_offset(i + e) < lo || acc_col_offset(i + e) >= end) s_acc[i + e] = -INFINITY;
              } else {
                const int last = last_visible_key(row, kv0, BLOCK_KV, seqlen_q, seqlen_k, p.causal != 0) -
                                 wgmma_acc(t, 0).col;
#pragma unroll
                for (int i = 2 * r; i < Tr::S_REGS; i += 4)
#pragma unroll
                  for (int e = 0; e < 2; ++e)
                    if (acc_col_offset(i + e) > last) s_acc[i + e] = -INFINITY;
              }
            }
          }

          // ---- online softmax
          // As step 08: exp(scale·(s - m)) = exp2(s·scale·log2(e) - m·scale·log2(e)), one FFMA and one
          // MUFU ex2 per score; each row's 4 threads (lanes 4g … 4g + 3) combine their maxima with
          // shuffles. Only s_acc and the row state are touched here: with the overlap, P·V(k-1) is still
          // reading p_frag and writing o_acc.
          float max_scaled[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float tile_max = row_max[r];
#pragma unroll
            for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
              tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * nt + 2 * r], s_acc[4 * nt + 2 * r + 1]));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
            // A row that has seen no key yet keeps max -inf and subtracts 0, never -inf - (-inf).
            max_scaled[r] = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
            correction[r] = exp2_approx(row_max[r] * scale_log2 - max_scaled[r]);
            max_grew |= tile_max > row_max[r];
            row_max[r] = tile_max;
            row_sum[r] *= correction[r];
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < BLOCK_KV / 8; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float& score = s_acc[4 * nt + 2 * r + e];
                score = exp2_approx(fmaf(score, scale_log2, -max_scaled[r]));
                row_sum[r] += score;
              }
          // The exponentials stay above the wait below: the compiler may not sink them past the fence,
          // and ptxas may not hoist the wait above the release, which needs them (a row sum is never
          // negative, and NaN < 0 is false, so the release always happens).
          sm90::fence_operands(s_acc);
          release(k_empty(ks_stage), !(row_sum[0] + row_sum[1] < 0.0f));
        }

        // ---- wait for P·V(k-1), then rescale O and round P(k)
        if constexpr (SOFTMAX_UNDER_PV) {
          sm90::wgmma_wait<0>();
          sm90::fence_operands(s_acc);
          release(v_empty(pv_stage), true);
        }
        sm90::fence_operands(o_acc);
        if constexpr (HAS_S) {
          // The O rescale is skipped by a warp none of whose row maxima grew (every correction is 1).
          if (__any_sync(0xffffffffu, max_grew)) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int nt = 0; nt < HEAD_DIM / 8; ++nt) {
                o_acc[4 * nt + 2 * r] *= correction[r];
                o_acc[4 * nt + 2 * r + 1] *= correction[r];
              }
          }
          // P for keys 16·kk … 16·kk + 15 is s_acc[8kk … 8kk + 7] rounded pairwise (traits.h, p_source):
          // exactly wgmma's register-A fragment, for P·V(k) in the next turn.
#pragma unroll
          for (int kk = 0; kk < Tr::PV_K_STEPS; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              p_frag[kk][r] = pack2<T>(s_acc[p_source(kk, r)], s_acc[p_source(kk, r) + 1]);
        }
      };

      sm90::mbarrier_wait(q_full, n & 1u);  // Q has landed, or (no key to see) there is none
      if (x.kv_tiles > 0) {
        if (grants_first_turn(c, CONSUMERS))
                    sm90::named_barrier_arrive(turn_barrier(next_consumer(c, CONSUMERS)), TURN_BARRIER_THREADS);
        // Turn 0 (S only), turns 1 … count - 1 (both; the masked visits first), turn count (P·V only).
        // From 13b: visits [masked_tiles, unmasked_end) need no mask, the masked visits last too; kv_span
        // leaves at least one unmasked visit unless it masks every visit from the top (masked_bottom 0), so
        // unmasked_end >= 1.
        const int unmasked_end = x.kv_tiles - x.masked_bottom;
        if (x.masked_tiles > 0)
          turn(0, std::true_type{}, std::false_type{}, std::true_type{});
        else
          turn(0, std::true_type{}, std::false_type{}, std::false_type{});
        for (int k = 1; k < x.masked_tiles; ++k) turn(k, std::true_type{}, std::true_type{}, std::true_type{});
        for (int k = max(x.masked_tiles, 1); k < unmasked_end; ++k)
          turn(k, std::true_type{}, std::true_type{}, std::false_type{});
        if constexpr (WINDOW) {
          for (int k = unmasked_end; k < x.kv_tiles; ++k)
            turn(k, std::true_type{}, std::true_type{}, std::true_type{});
        }
        turn(x.kv_tiles, std::false_type{}, std::true_type{}, std::false_type{});
      }

      // ---- epilogue
      // The row sums over each row's 4 threads; a row that saw no key has sum 0: O = 0, LSE = -inf.
      float inv_sum[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        inv_sum[r] = sum > 0.0f ? __fdividef(1.0f, sum) : 0.0f;
        const int row = c * ROWS_PER_WARPGROUP + wgmma_acc(t, 2 * r).row;  // inside the tile
        // From 13c: LSE is packed (heads_q, total_q).
        const int64_t lse_at = VARLEN ? int64_t(x.h) * p.total_q + x.q_start : int64_t(x.bh) * seqlen_q;
        if (lse && t % 4 == 0 && row < x.q_rows)
          lse[lse_at + x.q0 + row] = sum > 0.0f ? row_max[r] * logit_scale<SOFTCAP>(p) + logf(sum) : -INFINITY;
      }

      // O, normalized and rounded, into this consumer's own rows of q_smem, in the layout the TMA reads
      // back (tile_offset): a warp's 4-byte stores cover 8 rows × 16 bytes of 8 different chunks, one
      // wavefront. Those rows were last read by this consumer's wgmma, complete since its last wait
      // (whose completion the ISA follows with an implicit generic-async proxy fence), and written by
      // the TMA before the wait on q_full: ordinary stores may overwrite them. The other consumers
      // read only their own rows.
#pragma unroll
      for (int nt = 0; nt < HEAD_DIM / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const frag::Coord e = wgmma_acc(t, 4 * nt + 2 * r);
          *reinterpret_cast<uint32_t*>(smem + Tr::Q_OFFSET + tile_offset(BLOCK_Q, c * ROWS_PER_WARPGROUP + e.row, e.col)) =
              pack2<T>(o_acc[4 * nt + 2 * r] * inv_sum[r], o_acc[4 * nt + 2 * r + 1] * inv_sum[r]);
        }
      // The TMA store reads them through the async proxy: each thread fences its ordinary stores
      // towards it, then the consumer's own named barrier (its 128 threads, not the block) makes all
      // of them precede the store its first thread issues.
      sm90::fence_proxy_async_shared();
      sm90::named_barrier_sync(epilogue_barrier(c, CONSUMERS), EPILOGUE_BARRIER_THREADS);
      // A consumer whose rows all lie past seqlen_q (a short last query tile) stores nothing.
      bool by_box = c * ROWS_PER_WARPGROUP < x.q_rows;
      if constexpr (VARLEN) {
        const int own_rows = x.q_rows - c * ROWS_PER_WARPGROUP;  // this consumer's real rows of the tile
        // In a packed batch the rows past a sequence's end are the next sequence's, and a TMA box
        // clips only at the tensor's end: a consumer whose rows end inside the sequence stores them with
        // its threads, 16 bytes at a time, from the staged tile.
        by_box = own_rows >= ROWS_PER_WARPGROUP;
        if (own_rows > 0 && !by_box) {
          const int chunks = int(p.head_dim) / 8;  // 16-byte pieces of a row; the tile's padding columns stay
          for (int i = t; i < own_rows * chunks; i += 128) {
            const int r = i / chunks, col = (i % chunks) * 8;
            const int64_t row = int64_t(x.q_start) + x.q0 + c * ROWS_PER_WARPGROUP + r;
            *reinterpret_cast<uint4*>(o + offset_of(p.o, 0, row, x.h) + col) = *reinterpret_cast<const uint4*>(
                smem + Tr::Q_OFFSET + tile_offset(BLOCK_Q, c * ROWS_PER_WARPGROUP + r, col));
          }
        }
      }
      if (t == 0 && by_box) {
#pragma unroll
        for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
          // past seqlen_q, head_dim: not written
          const BoxCoord e = tma_box(cb, x.q_start + x.q0 + c * ROWS_PER_WARPGROUP, x.h, x.tb);
          sm90::tma_store_4d(&o_map, q_smem + o_box_offset(c, cb, BLOCK_Q), e.col, e.row, e.head, e.batch);
        }
        sm90::tma_store_commit();
        // The block's shared memory must outlive the store's reads of it; the writes to global memory
        // complete on their own and are visible when the kernel has finished.
        sm90::tma_store_wait_read();
      }
      // q_smem is free again.
      // From 09f: the next tile's Q is loaded into it.
      if (t == 0) sm90::mbarrier_arrive(q_empty);
      visits += x.kv_tiles;
    }
  }
}

}  // namespace forward_pass

// ==== the backward: step 12c's kernel ============================================================
namespace backward_pass {
using namespace step12;

// One block: K/V head bh_kv, keys kv0 … kv0 + 127; warpgroup wg the keys 64·wg …. In thread t of a
// warpgroup, accumulator register i of Sᵀ, dPᵀ, dK, dV is (key, column) = wgmma_acc(t, i). ATOMIC_DQ:
// the dQ part (off in the deterministic mode, where step 11's dq_kernel computes dQ).
// From 13c: VARLEN, a packed batch; the block's K/V tile is tile j of sequence b (varlen_tile over the padded
// batch), and the workspace keeps the padded batch's layout (rows of each (sequence, head) from 0).
template <typename T, int HEAD_DIM, int BLOCK_Q, bool ATOMIC_DQ, bool SOFTCAP, bool WINDOW, bool VARLEN = false>
__global__ void __launch_bounds__(NUM_THREADS, 1)
    backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                           T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dq_accum,
                    const float* __restrict__ lse2, const float* __restrict__ d_rows, const BackwardProblem p,
                    const float scale_log2, const Softcap cap) {
  using Tr = Traits<HEAD_DIM, BLOCK_Q, kBackwardIdeas>;
  const Problem& f = p.attention;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw);
  const uint32_t base = (raw + SWIZZLE_ATOM - 1) & ~(SWIZZLE_ATOM - 1);
  unsigned char* const smem = smem_raw + (base - raw);
  const uint32_t k_smem = base + Tr::K_OFFSET, v_smem = base + Tr::V_OFFSET;
  auto q_smem = [&](int s) { return base + uint32_t(Tr::Q_OFFSET + s * Tr::Q_BYTES); };
  auto do_smem = [&](int s) { return base + uint32_t(Tr::DO_OFFSET + s * Tr::Q_BYTES); };
  const uint32_t ds_smem = base + Tr::DS_OFFSET;
  const float* lse_smem = reinterpret_cast<const float*>(smem + Tr::LSE_OFFSET);  // [Q_STAGES][BLOCK_Q]
  const float* dd_smem = reinterpret_cast<const float*>(smem + Tr::D_OFFSET);     // [Q_STAGES][BLOCK_Q]
  const uint32_t kv_full = base + Tr::BARRIER_OFFSET;
  auto q_full = [&](int s) { return kv_full + 8u * uint32_t(1 + s); };

  static_assert(!VARLEN || WINDOW, "13c: a packed batch runs the band's code");
  int seqlen_q = int(f.seqlen_q), seqlen_k = int(f.seqlen_k), kv0, b, h_kv;
  const int head_dim = int(f.head_dim);
  const bool causal = f.causal != 0;
  int q_start = 0, k_start = 0;  // From 13c: the sequence's first rows in the packed tensors
  Band band = band_of(f);
  if constexpr (VARLEN) {
    // K/V tile j of sequence b, counted from its first (under causal masking the first keys are
    // seen by the most queries); a tile past the sequence's end has nothing to do.
    const VarlenTile tile = varlen_tile(blockIdx.x, step11::tiles(f.seqlen_k, BLOCK_KV), f.heads_kv);
    const Sequence seq = load_sequence(f, tile.b);
    b = int(tile.b), h_kv = int(tile.h);
    seqlen_q = int(seq.q_len), seqlen_k = int(seq.k_len), q_start = int(seq.q_start), k_start = int(seq.k_start);
    kv0 = int(tile.j) * BLOCK_KV;
    if (kv0 >= seqlen_k) return;
    band = band_of(one_sequence(f, seq));
  } else {
    const uint32_t kv_tiles = uint32_t(step11::tiles(seqlen_k, BLOCK_KV));
    const uint32_t bh_kv = blockIdx.x / kv_tiles;
    kv0 = int(blockIdx.x % kv_tiles) * BLOCK_KV;
    b = int(bh_kv / uint32_t(f.heads_kv)), h_kv = int(bh_kv % uint32_t(f.heads_kv));
  }
  const int group = int(f.heads_q / f.heads_kv);
  const int64_t rows_per_head = step11::padded_rows(f.seqlen_q);
  const int tb = VARLEN ? 0 : b;  // the tensor maps' batch coordinate

  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0), t = threadIdx.x % 128;

  // The visits, as step 11: every query tile from the first that sees these keys, per query head.
  // From 13b: the run of query tiles whose band touches them.
  const Diagonals diagonals = diagonals_of(band);  // From 13b: the per-score mask, in two registers
  int first_tile = step11::first_query_tile(kv0, BLOCK_Q, seqlen_q, seqlen_k, causal);
  int tiles_per_head = int(step11::tiles(seqlen_q, BLOCK_Q)) - first_tile;
  if constexpr (WINDOW) {
    const QSpan span = q_span(band, kv0, BLOCK_KV, BLOCK_Q, seqlen_q);
    first_tile = span.first, tiles_per_head = span.count;
  }
  const int visits = tiles_per_head > 0 ? group * tiles_per_head : 0;
  auto head_of = [&](int v) { return h_kv * group + v / tiles_per_head; };
  auto q0_of = [&](int v) { return (first_tile + v % tiles_per_head) * BLOCK_Q; };

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(kv_full, 1);
    for (int s = 0; s < Q_STAGES; ++s) sm90::mbarrier_init(q_full(s), 1);
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();

  // The copies, thread 0 only: a tile is COL_BLOCKS boxes [rows, 64] (zeros past the tensor's ends).
  auto load_tile = [&](const CUtensorMap& map, uint32_t dst, uint32_t bar, int rows, int row0, int head) {
#pragma unroll
    for (int cb = 0; cb < Tr::COL_BLOCKS; ++cb) {
      const step08::BoxCoord c = step08::tma_box(cb, row0, head, tb);
      sm90::tma_load_4d(dst + box_offset(rows, cb), &map, bar, c.col, c.row, c.head, c.batch);
    }
  };
  auto load_visit = [&](int v) {
    const int s = v % Q_STAGES, h = head_of(v), q0 = q0_of(v);
    const int64_t row0 = (int64_t(b) * f.heads_q + h) * rows_per_head + q0;
    sm90::mbarrier_arrive_expect_tx(q_full(s), Tr::VISIT_BYTES);
    load_tile(q_map, q_smem(s), q_full(s), BLOCK_Q, q_start + q0, h);
    load_tile(do_map, do_smem(s), q_full(s), BLOCK_Q, q_start + q0, h);
    bulk_load(base + uint32_t(Tr::LSE_OFFSET + s * Tr::ROWS_BYTES), lse2 + row0, Tr::ROWS_BYTES, q_full(s));
    bulk_load(base + uint32_t(Tr::D_OFFSET + s * Tr::ROWS_BYTES), d_rows + row0, Tr::ROWS_BYTES, q_full(s));
  };
  if (threadIdx.x == 0 && visits > 0) {
    sm90::mbarrier_arrive_expect_tx(kv_full, 2 * Tr::KV_BYTES);
    load_tile(k_map, k_smem, kv_full, BLOCK_KV, k_start + kv0, h_kv);
    load_tile(v_map, v_smem, kv_full, BLOCK_KV, k_start + kv0, h_kv);
    for (int v = 0; v < visits && v < Q_STAGES; ++v) load_visit(v);
  }

  float dv_acc[Tr::KV_REGS] = {};  // [64 keys, HEAD_DIM] fp32, wgmma_acc layout
  float dk_acc[Tr::KV_REGS] = {};

  // Descriptors (step 08's): K-major A of Sᵀ, dPᵀ (this warpgroup's keys of K and V) and B (Q, dO);
  // MN-major B of dV, dK (dO, Q) and of dQ (K), MN-major A of dQ (dSᵀ).
  const uint64_t k_rows_desc = matrix_descriptor(k_smem, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t v_rows_desc = matrix_descriptor(v_smem, K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t q_k_desc = matrix_descriptor(q_smem(0), K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t do_k_desc = matrix_descriptor(do_smem(0), K_MAJOR_LBO, SBO_8_ROWS);
  const uint64_t q_mn_desc = matrix_descriptor(q_smem(0), mn_major_lbo(BLOCK_Q), SBO_8_ROWS);
  const uint64_t do_mn_desc = matrix_descriptor(do_smem(0), mn_major_lbo(BLOCK_Q), SBO_8_ROWS);
  const uint64_t ds_desc = matrix_descriptor(ds_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);
  const uint64_t k_mn_desc = matrix_descriptor(k_smem, mn_major_lbo(BLOCK_KV), SBO_8_ROWS);
  const DqTile dq_tile = dq_tile_of(wg, BLOCK_Q);

  if (visits > 0) sm90::mbarrier_wait(kv_full, 0);

  for (int v = 0; v < visits; ++v) {
    const int s = v % Q_STAGES, h = head_of(v), q0 = q0_of(v);
    const uint32_t stage_bytes = uint32_t(s * Tr::Q_BYTES);
    sm90::mbarrier_wait(q_full(s), uint32_t(v / Q_STAGES) & 1u);

    // The register operands of dV and dK: Pᵀ, dSᵀ packed to fp16/bf16 (queries 16·kk … are
    // accumulators 8kk … 8kk + 7, step 08's p_source).
    uint32_t p_frag[Tr::Q_K_STEPS][4], ds_frag[Tr::Q_K_STEPS][4];
    // dV += Pᵀ·dO and dK += dSᵀ·Q   [64 keys, HEAD_DIM], Q_K_STEPS k16 steps over the queries; each
    // is one commit group.
    auto issue_dv = [&] {
      sm90::fence_operands(dv_acc);
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk) sm90::fence_operands(p_frag[kk]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
        sm90::Wgmma<HEAD_DIM, T>::rs(dv_acc, p_frag[kk], advance(do_mn_desc, stage_bytes + q_mn_major_step(kk)));
      sm90::wgmma_commit();
    };
    auto issue_dk = [&] {
      sm90::fence_operands(dk_acc);
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk) sm90::fence_operands(ds_frag[kk]);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
        sm90::Wgmma<HEAD_DIM, T>::rs(dk_acc, ds_frag[kk], advance(q_mn_desc, stage_bytes + q_mn_major_step(kk)));
      sm90::wgmma_commit();
    };

    // ---- Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ   [64 keys, BLOCK_Q] each, D_K_STEPS k16 steps over head dims
    float s_acc[Tr::S_REGS], dp_acc[Tr::S_REGS];
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks)
      sm90::Wgmma<BLOCK_Q, T>::ss(s_acc, advance(k_rows_desc, kv_rows_step(wg, ks)),
                                  advance(q_k_desc, stage_bytes + q_k_major_step(BLOCK_Q, ks)), ks > 0);
    // From 12b: Sᵀ is a commit group of its own, waited for alone.
    sm90::wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < Tr::D_K_STEPS; ++ks)
      sm90::Wgmma<BLOCK_Q, T>::ss(dp_acc, advance(v_rows_desc, kv_rows_step(wg, ks)),
                                  advance(do_k_desc, stage_bytes + q_k_major_step(BLOCK_Q, ks)), ks > 0);
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // Sᵀ is in; dPᵀ's products still run
    sm90::fence_operands(s_acc);

    // ---- Pᵀ = exp2(Sᵀ·scale·log2(e) - LSE₂), as step 11: masked pairs (a key past seqlen_k or after
    // the row's diagonal) get P = 0; rows past seqlen_q have LSE₂ = +inf, P = 0.
    // From 13b: so do pairs outside the row's band.
    const float* lse_tile = lse_smem + s * BLOCK_Q;
    const float* dd_tile = dd_smem + s * BLOCK_Q;
    bool masked = step11::tile_needs_mask(q0, kv0, BLOCK_KV, seqlen_q, seqlen_k, causal);
    if constexpr (WINDOW) masked = fs::tile_needs_mask(diagonals, q0, BLOCK_Q, kv0, BLOCK_KV, seqlen_k);
    auto probability = [&](int i, float score) {
      const step08::frag::Coord c = wgmma_acc(t, i);  // (key in the warpgroup's 64, query in the tile)
      float pv = step11::exp2_fast(fmaf(score, scale_log2, -lse_tile[c.col]));
      if (masked) {
        const int key = kv0 + wg * KEYS_PER_WARPGROUP + c.row, row = q0 + c.col;
        if constexpr (WINDOW) {
          if (key >= seqlen_k || !sees(diagonals, row, key)) pv = 0.0f;
        } else {
          if (key >= seqlen_k || (causal && key > row + seqlen_k - seqlen_q)) pv = 0.0f;
        }
      }
      return pv;
    };
    if constexpr (SOFTCAP) {
      // 13a: softcapping. The score becomes t = tanh(s·pre) before P, as in the forward, and dSᵀ needs
      // the slope 1 - tanh² beside P: P goes straight into p_frag, pair by pair, and s_acc keeps
      // P·(1 - tanh²), all that dSᵀ = Pᵀ ∘ (dPᵀ - D) ∘ (1 - tanh²) reads of it below. No register more.
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = p_source(kk, r);
          float pv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float tc = tanh_approx(s_acc[i + e] * cap.pre);
            pv[e] = probability(i + e, tc);
            s_acc[i + e] = pv[e] * (1.0f - tc * tc);
          }
          p_frag[kk][r] = step11::pack2<T>(pv[0], pv[1]);
        }
    } else {
#pragma unroll
      for (int i = 0; i < Tr::S_REGS; ++i) s_acc[i] = probability(i, s_acc[i]);
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          p_frag[kk][r] = step11::pack2<T>(s_acc[p_source(kk, r)], s_acc[p_source(kk, r) + 1]);
    }
    issue_dv();             // dV's products run while the threads compute dSᵀ
    sm90::wgmma_wait<1>();  // dPᵀ is in; dV's products still run
    sm90::fence_operands(dp_acc);

    // ---- dSᵀ = Pᵀ ∘ (dPᵀ - D)   (13a: s_acc holds P·(1 - tanh²))
#pragma unroll
    for (int i = 0; i < Tr::S_REGS; ++i) dp_acc[i] = s_acc[i] * (dp_acc[i] - dd_tile[wgmma_acc(t, i).col]);
#pragma unroll
    for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        ds_frag[kk][r] = step11::pack2<T>(dp_acc[p_source(kk, r)], dp_acc[p_source(kk, r) + 1]);

    // dSᵀ into shared memory for dQ: register r of step kk holds (key, query), (key, query + 1).
    if constexpr (ATOMIC_DQ) {
#pragma unroll
      for (int kk = 0; kk < Tr::Q_K_STEPS; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const step08::frag::Coord c = wgmma_a(t, r, 0);
          *reinterpret_cast<uint32_t*>(smem + Tr::DS_OFFSET + ds_offset(wg * KEYS_PER_WARPGROUP + c.row, 16 * kk + c.col)) =
              ds_frag[kk][r];
        }
      sm90::fence_proxy_async_shared();  // the generic stores, before wgmma reads them (async proxy)
    }

    // From 12b: dV's products are issued already; dK's come after dQ's, under the dQ atomics.
    // From 12c: under dQ's staging and bulk reduce-add instead of its atomics.
    if constexpr (!ATOMIC_DQ) issue_dk();

    if constexpr (ATOMIC_DQ) {
      // The last visit's bulk reduce-add has read the staged tile before this barrier lets it be
      // overwritten (it had this visit's first products to do so).
      if (threadIdx.x == 0) sm90::tma_store_wait_read();
      __syncthreads();  // both warpgroups' dSᵀ are in

      // ---- dQ[tile] = dS·K   [64 queries, 64 dims], KV_K_STEPS k16 steps over all 128 keys
      float dq_acc[Tr::DQ_REGS];
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Tr::KV_K_STEPS; ++kk)
        wgmma_m64n64_ss_mn<T>(dq_acc, advance(ds_desc, ds_step(dq_tile.row_tile, kk)),
                              advance(k_mn_desc, k_mn_major_step(dq_tile.col_block, kk)), kk > 0);
      sm90::wgmma_commit();
      issue_dk();             // dK's products run under dQ's staging stores and bulk reduce
      sm90::wgmma_wait<1>();  // dQ is in (and dV); dK's products still run
      sm90::fence_operands(dq_acc);

      // The tile into shared memory, in the accumulators' order; thread 0 adds the block's whole
      // query tile after the barrier that ends this visit.
      float* stage = reinterpret_cast<float*>(smem + Tr::DQ_OFFSET) + wg * DQ_TILE * DQ_TILE;
#pragma unroll
      for (int i = 0; i < Tr::DQ_REGS; i += 2)
        *reinterpret_cast<float2*>(stage + dq_slot(t, i)) = make_float2(dq_acc[i], dq_acc[i + 1]);
      sm90::fence_proxy_async_shared();  // the stores, before the bulk copy reads them (async proxy)
    }
    sm90::wgmma_wait<0>();
    sm90::fence_operands(dv_acc);
    sm90::fence_operands(dk_acc);

    // Every thread's wgmma have read stage s (and dSᵀ): thread 0 refills it with visit v + Q_STAGES.
    __syncthreads();
    if (threadIdx.x == 0 && v + Q_STAGES < visits) load_visit(v + Q_STAGES);
    // Every block of this head adds to the same dQ tiles: one bulk reduce-add of the whole tile.
    if (ATOMIC_DQ && threadIdx.x == 0) {
      bulk_reduce_add_f32(dq_accum + ((int64_t(b) * f.heads_q + h) * rows_per_head + q0) * HEAD_DIM,
                          base + uint32_t(Tr::DQ_OFFSET), Tr::DQ_TILE_BYTES);
      sm90::tma_store_commit();
    }
  }

  // This block's bulk reduce-adds are complete before it exits (dQ's conversion reads them).
  if (ATOMIC_DQ && threadIdx.x == 0) bulk_wait_all();

  // ---- epilogue: dK = scale·dK_acc and dV, this warpgroup's keys, columns < head_dim
  // From 13c: the sequence's rows of the packed dK and dV, from its offsets read again: k_start kept live through
  // the loop made the softcapped kernels spill (bench/results/ptxas-13c-spills.txt).
  const int64_t k_row0 = VARLEN ? load_sequence(f, b).k_start : 0;
  T* dk_rows = dk + offset_of(p.dk, tb, k_row0, h_kv);
  T* dv_rows = dv + offset_of(p.dv, tb, k_row0, h_kv);
#pragma unroll
  for (int i = 0; i < Tr::KV_REGS; i += 2) {
    const step08::frag::Coord c = wgmma_acc(t, i);
    const int key = kv0 + wg * KEYS_PER_WARPGROUP + c.row;
    if (key >= seqlen_k || c.col >= head_dim) continue;
    *reinterpret_cast<uint32_t*>(dk_rows + int64_t(key) * p.dk.row + c.col) =
        step11::pack2<T>(dk_acc[i] * f.softmax_scale, dk_acc[i + 1] * f.softmax_scale);
    *reinterpret_cast<uint32_t*>(dv_rows + int64_t(key) * p.dv.row + c.col) = step11::pack2<T>(dv_acc[i], dv_acc[i + 1]);
  }
}

}  // namespace backward_pass

}  // namespace fs::step13
