// Step 09 — the sub-steps 09a … 09f of the warp-specialized kernel (kernel.cuh): limits, the row of
// the tile table (traits.h) each picks for a problem, the four tensor maps, the launch; and
// explain(), which prints the schedule and the barrier protocol without a GPU.
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/step/dispatch.h"
#include "common/step/dtype.cuh"
#include "common/step/step.h"
#include "common/step/tensor_map.h"
#include "steps/09_warp_specialized/kernel.cuh"

namespace fs::step09 {
namespace {

// ---- limits, plan, claims ----------------------------------------------------------------------

std::string limits(const Problem& p) {
  std::string why;
  if (why.empty()) why = check_tma_strides("Q", p.q, p.seqlen_q, p.heads_q, p.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("K", p.k, p.seqlen_k, p.heads_kv, p.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("V", p.v, p.seqlen_k, p.heads_kv, p.batch, kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("O", p.o, p.seqlen_q, p.heads_q, p.batch, kMaxTmaStrideBytes);
  return why;
}

// The most shared memory any row of sub-step IDEAS needs.
constexpr int max_smem_bytes(int ideas) {
  int most = 0;
  for (int i = 0; i < kNumConfigs; ++i)
    if (has_config(ideas, i) && smem_bytes(kConfigs[i]) > most) most = smem_bytes(kConfigs[i]);
  return most;
}

// Documented support: every problem the harness accepts whose strides the TMA can address and whose
// grid fits in 2^31 - 1 blocks, on a GPU of compute capability 9.0 (H100, H200: 227 KiB per block).
template <int IDEAS>
bool claims(const Problem& p, const DeviceInfo& dev) {
  const int config = config_for(IDEAS, p);
  if (config < 0 || config >= kNumConfigs) return false;  // a head_dim the harness refuses anyway
  const int block_q = step09::block_q(kConfigs[config].consumers);
  return dev.compute_capability == 90 && dev.smem_per_block_optin >= size_t(max_smem_bytes(IDEAS)) &&
         limits(p).empty() && grid_blocks(p, block_q) <= INT32_MAX;
}

template <class Tr>
struct TraitsTag {
  using type = Tr;
};

// f(TraitsTag<Tr>) for the kernel sub-step IDEAS runs on row `config`: its own, except that from 09f
// with causal masking it is 09e's, a block per tile without the persistent loop (notes/09, Appendix L).
template <int IDEAS, class F>
void with_traits(const Problem& p, int config, F&& f) {
  with_config<kNumConfigs>(config, [&](auto c) {
    constexpr int CONFIG = decltype(c)::value;
    if constexpr (has_config(IDEAS, CONFIG)) {
      if constexpr (IDEAS >= kPersistent) {
        if (p.causal) return f(TraitsTag<TraitsOf<CONFIG, kThreeConsumers>>{});
      }
      f(TraitsTag<TraitsOf<CONFIG, IDEAS>>{});
    }
  });
}

template <int IDEAS>
Plan plan(const Problem& p, const DeviceInfo& dev) {
  Plan pl;
  pl.config = config_for(IDEAS, p);
  const int smem = smem_bytes(kConfigs[pl.config]), block_q = step09::block_q(kConfigs[pl.config].consumers);
  if (dev.smem_per_block_optin < size_t(smem)) {
    std::ostringstream m;
    m << "head_dim " << p.head_dim << " runs on " << padded_head_dim(p.head_dim) << "-wide tiles of "
      << kConfigs[pl.config].block_kv << " keys, which need " << smem
      << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const int64_t tiles = grid_blocks(p, block_q);
  if (tiles > INT32_MAX) {
    std::ostringstream m;
    m << "this step launches one block per " << block_q << " query rows per batch and head, " << tiles
      << " blocks here, more than the grid limit of " << INT32_MAX;
    pl.refusal = m.str();
    return pl;
  }
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_traits<IDEAS>(p, pl.config, [&](auto tr) {
      using Tr = typename decltype(tr)::type;
      const int64_t blocks = Tr::has(kPersistent) ? persistent_blocks(tiles, dev.sm_count > 0 ? dev.sm_count : 1) : tiles;
      pl.kernels = {KernelLaunch{reinterpret_cast<const void*>(&warp_specialized_kernel<T, Tr>), Tr::NUM_THREADS,
                                 size_t(Tr::SMEM_BYTES), blocks}};
    });
  });
  return pl;
}

// ---- launch ------------------------------------------------------------------------------------

template <int IDEAS>
void launch(const Problem& p, const Tensors& t, const Plan& plan, void*, cudaStream_t stream) {
  const float scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);  // scale · log2(e)
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const CUtensorMapDataType type =
        std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    with_traits<IDEAS>(p, plan.config, [&](auto tr) {
      using Tr = typename decltype(tr)::type;
      auto* kernel = warp_specialized_kernel<T, Tr>;
      // Q arrives in one tile of BLOCK_Q rows, K and V in tiles of BLOCK_KV; O leaves per consumer,
      // 64 rows at a time.
      const CUtensorMap q_map =
          make_tensor_map("Q", t.q, type, tensor_map_shape(p.q, p.seqlen_q, p.heads_q, p.batch, p.head_dim, Tr::BLOCK_Q));
      const CUtensorMap k_map = make_tensor_map(
          "K", t.k, type, tensor_map_shape(p.k, p.seqlen_k, p.heads_kv, p.batch, p.head_dim, Tr::BLOCK_KV));
      const CUtensorMap v_map = make_tensor_map(
          "V", t.v, type, tensor_map_shape(p.v, p.seqlen_k, p.heads_kv, p.batch, p.head_dim, Tr::BLOCK_KV));
      const CUtensorMap o_map = make_tensor_map(
          "O", t.o, type, tensor_map_shape(p.o, p.seqlen_q, p.heads_q, p.batch, p.head_dim, ROWS_PER_WARPGROUP));
      CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::SMEM_BYTES));
      kernel<<<unsigned(plan.kernels.front().blocks), Tr::NUM_THREADS, Tr::SMEM_BYTES, stream>>>(
          q_map, k_map, v_map, o_map, t.lse, p, scale_log2);
      CHECK_LAUNCH();
    });
  });
}

// ---- explain -----------------------------------------------------------------------------------

std::string load_name(const KvLoad& l) {
  std::string name = l.v ? "V" : "K";
  return name += std::to_string(l.visit);
}

// The block with `consumers` consumer warpgroups: its warpgroups and the register reallocation.
void explain_block(std::ostream& out, int consumers) {
  const int threads = num_threads(consumers), launch = launch_registers(threads), mine = consumer_registers(consumers);
  out << "With " << consumers << " consumers: " << threads << " threads a block. Warpgroup " << PRODUCER_WARPGROUP
      << " is the producer (one thread issues every TMA copy); warpgroups 1-" << consumers << " are consumers 0-"
      << consumers - 1 << ",\n64 query rows each of the block's " << block_q(consumers) << ".\n";
  out << "Registers (setmaxnreg): __launch_bounds__(" << threads << ", 1) caps a thread at 65536 / " << threads
      << " -> " << launch << " at launch, a pool of " << threads << " x " << launch << " = " << threads * launch
      << ".\n  producer:  setmaxnreg.dec " << PRODUCER_REGISTERS << "  (gives back 128 x " << launch - PRODUCER_REGISTERS
      << ")\n  consumers: setmaxnreg.inc " << mine << " (take " << consumers << " x 128 x " << mine - launch
      << ")\n  after: 128 x " << PRODUCER_REGISTERS << " + " << consumers * 128 << " x " << mine << " = "
      << registers_after_reallocation(consumers) << " of the pool's " << threads * launch << "\n\n";
}

// What sub-step IDEAS does, from the functions of traits.h the kernel calls: its tiles, the
// register reallocation, the producer's copies and the consumers' turns for a short query tile,
// and a drawing of the schedule.
template <int IDEAS>
void explain(std::ostream& out) {
  unsigned counts = 0;  // bit n: a row of this sub-step has n consumers
  for (int i = 0; i < kNumConfigs; ++i)
    if (has_config(IDEAS, i)) counts |= 1u << kConfigs[i].consumers;
  int most = 0;  // the most consumers a row has: the turns below are drawn for those
  for (int n = 1; n < 32; ++n)
    if (counts >> n & 1u) explain_block(out, most = n);

  out << "Tiles of this sub-step (registers per consumer thread: o_acc + s_acc + p_frag):\n";
  for (int i = 0; i < kNumConfigs; ++i) {
    if (!has_config(IDEAS, i)) continue;
    const Config& c = kConfigs[i];
    const bool n = choose_config(IDEAS, c.head_dim, false) == i, y = choose_config(IDEAS, c.head_dim, true) == i;
    out << "  HEAD_DIM " << c.head_dim << " BLOCK_Q " << block_q(c.consumers) << " BLOCK_KV " << c.block_kv << ", "
        << c.kv_stages << " stages: registers " << c.head_dim / 2 << " + " << c.block_kv / 2 << " + " << c.block_kv / 4
        << " = " << array_registers(c) << " of " << consumer_registers(c.consumers) << ", shared memory "
        << smem_bytes(c) << " bytes"
        << (n && y ? "" : n ? " (not causal)" : y ? " (causal)" : " (causal, where 192-row tiles pad too much)") << "\n";
  }

  constexpr int n = 4, stages = 2;
  out << "\nThe producer's copies for a query tile that visits " << n << " K/V tiles, " << stages
      << " stages (kv_load; fill f of a stage waits for the release of fill f - 1 on its empty barrier):\n";
  for (int i = 0; i < 2 * n; ++i) {
    const KvLoad l = kv_load(i, n);
    out << "  " << load_name(l) << ": stage " << kv_stage(l.visit, stages) << ", fill " << l.visit / stages;
    if (waits_for_release(l.visit, stages))
      out << ", waits " << (l.v ? "v" : "k") << "_empty[" << kv_stage(l.visit, stages) << "] parity "
          << release_parity(l.visit, stages);
    else
      out << ", first fill: no wait";
    out << "; the consumers wait " << (l.v ? "v" : "k") << "_full[" << kv_stage(l.visit, stages) << "] parity "
        << kv_parity(l.visit, stages) << "\n";
  }

  constexpr bool ping_pong = IDEAS >= kPingPong;
  out << "\nThe turns of the " << most << " consumers for the same tile";
  if (ping_pong) {
    out << " (ping-pong: named barriers";
    for (int c = 0; c < most; ++c) out << " " << turn_barrier(c);
    out << ", " << TURN_BARRIER_THREADS << " threads each)";
  }
  out << ":\n";
  for (int c = 0; c < most; ++c)
    if (ping_pong && grants_first_turn(c, most))
      out << "  consumer " << c << ", before its turns: bar.arrive " << turn_barrier(next_consumer(c, most))
          << " (consumer " << next_consumer(c, most) << " takes turn 0 first)\n";
  for (int k = 0; k < num_turns(n); ++k)
    for (int c = 0; c < most; ++c) {
      const bool has_s = turn_has_s(k, n), has_pv = turn_has_pv(k);
      out << "  consumer " << c << " turn " << k << ": wait";
      if (has_s) out << " K" << k;
      if (has_pv) out << " V" << k - 1;
      if (ping_pong) out << "; bar.sync " << turn_barrier(c);
      out << "; issue";
      if (has_s) out << " S" << k << " = Q.K" << k;
      if (has_pv) out << " O += P" << k - 1 << ".V" << k - 1;
      if (ping_pong && hands_over_after(c, k, n, most)) out << "; bar.arrive " << turn_barrier(next_consumer(c, most));
      const bool under = softmax_under_pv(IDEAS, has_s, has_pv);
      out << (under ? "; wait_group 1" : "; wait_group 0");
      if (has_pv && !under) out << ": release V" << k - 1;
      if (has_s) out << "; softmax S" << k << "; release K" << k;
      if (under) out << "; wait_group 0: release V" << k - 1;
      if (has_s) out << "; rescale O, round P" << k;
      out << "\n";
    }

  out << "\nThe schedule in steady state (time to the right, not to scale; [..] a turn: its products issued\n"
         "back to back; S/PV the tensor cores' work, sm the softmax):\n"
         "  producer    K3 V2 ... K4 V3 ... K5 V4 ...    (each copy once its stage is released)\n";
  if (IDEAS >= kThreeConsumers)
    out << "  consumer 0  [S3 PV2] sm S3 | O, P3 ............ [S4 PV3] sm S4 | O, P4 ...\n"
           "  consumer 1   ..... [S3 PV2] sm S3 | O, P3 ............ [S4 PV3] ...\n"
           "  consumer 2   .......... [S3 PV2] sm S3 | O, P3 ............ [S4 PV3] ...\n"
           "  tensor      S3 PV2 (c0) S3 PV2 (c1) S3 PV2 (c2) S4 PV3 (c0) S4 PV3 (c1) ...\n"
           "  (head_dim 64) Two consumers' softmaxes run under the third's products: the tensor cores wait\n"
           "  less where a softmax takes as long as the products, as at head_dim 64.\n";
  else if (IDEAS >= kIntraOverlap)
    out << "  consumer 0  [S3 PV2] sm S3 | O, P3 [S4 PV3] sm S4 | O, P4 [S5 PV4] ...\n"
           "  consumer 1   ..... [S3 PV2] sm S3 | O, P3 [S4 PV3] sm S4 | O, P4 ...\n"
           "  tensor      S3 PV2 (c0) S3 PV2 (c1) S4 PV3 (c0) S4 PV3 (c1) S5 PV4 (c0) ...\n"
           "  A consumer's softmax of S(k) runs under its own P.V(k-1) and under the other consumer's turn.\n";
  else if (IDEAS >= kPingPong)
    out << "  consumer 0  [S3 PV2] wait  sm S3, O, P3  [S4 PV3] wait  sm S4, O, P4 ...\n"
           "  consumer 1   ........ [S3 PV2] wait  sm S3, O, P3  [S4 PV3] wait ...\n"
           "  tensor      S3 PV2 (c0) S3 PV2 (c1) S4 PV3 (c0) S4 PV3 (c1) ...\n"
           "  One consumer's softmax runs under the other's products; its own products wait for it.\n";
  else
    out << "  consumer 0  [S3 PV2] wait  sm S3, O, P3  [S4 PV3] wait ...\n"
           "  consumer 1  [S3 PV2] wait  sm S3, O, P3  [S4 PV3] wait ...   (in no set order)\n"
           "  Both consumers may run their softmax at the same time, as in step 08, but no block\n"
           "  barrier holds either back and the producer keeps the ring full.\n";
}

template <int IDEAS>
Step sub_step(const char* id, const char* name, const char* lesson) {
  return {.id = id,
          .name = name,
          .lesson = lesson,
          .forward = {limits, plan<IDEAS>, launch<IDEAS>, claims<IDEAS>},
          .explain = explain<IDEAS>};
}

}  // namespace
}  // namespace fs::step09

namespace fs {

void register_step_09_warp_specialized(Registry& r) {
  using namespace step09;
  r.add(sub_step<kWarpSpecialization>(
      "09a_producer_consumer", "Hopper II: warp specialization",
      "step 08 with a producer warpgroup (TMA, setmaxnreg.dec 24) and two consumer warpgroups (setmaxnreg.inc "
      "240), full and empty mbarrier rings, no block barrier in the loop (sm_90a)"));
  r.add(sub_step<kPingPong>("09b_pingpong", "Hopper II: ping-pong",
                            "+ named barriers: the consumers take turns issuing their products, one's softmax under "
                            "the other's products"));
  r.add(sub_step<kIntraOverlap>("09c_intra_overlap", "Hopper II: intra-warpgroup overlap",
                                "+ S of tile k waited for alone: its softmax runs under P·V of tile k - 1"));
  r.add(sub_step<kTileSizes>("09d_tile_sizes", "Hopper II: FlashAttention-3 tiles",
                             "+ wider K/V tiles for the larger register budget (128 x 176 at head_dim 128)"));
  r.add(sub_step<kThreeConsumers>("09e_three_consumers", "Hopper II: three consumers",
                                  "+ three consumer warpgroups at head_dim 64 (192 x 128 tiles, setmaxnreg 160; two where a causal "
                                  "head's 192-row tiles would compute more than 5/4 of the products of 128-row ones)"));
  r.add(sub_step<kPersistent>("09f_persistent", "Hopper II: a persistent kernel",
                              "+ one block per SM works through the query tiles, the next tile's K and Q loading "
                              "during the previous one's epilogue: the FlashAttention-3 forward schedule (no fp8, "
                              "varlen or backward)"));
}

}  // namespace fs
