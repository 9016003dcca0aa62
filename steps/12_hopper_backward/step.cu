// Step 12 — the Hopper backward (kernel.cuh): what it accepts, its workspace (step 11's), the row of the
// table (traits.h), the tensor maps and the launch. A backward-only step like step 11, whose
// preprocessing, dQ conversion and deterministic dQ kernel it launches around its own main kernel.
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/backward/problem.h"
#include "common/step/dispatch.h"
#include "common/step/overflow.h"
#include "common/step/step.h"
#include "common/step/tensor_map.h"
#include "steps/12_hopper_backward/kernel.cuh"

namespace fs::step12 {
namespace {

constexpr int64_t kMaxSeqlen = INT32_MAX - 127;  // 32-bit rows, rounded up to whole tiles (step 11)
constexpr double kLog2e = 1.4426950408889634;
using step11::Workspace;                         // step 11's workspace, and its rule
using step11::workspace_of;
using DqTr = step11::DqTraits<128, 1, 64, 64>;   // step 11's deterministic dQ kernel, 128-wide tiles
using DqTr64 = step11::DqTraits<64, 1, 64, 64>;  // ... and 64-wide

std::string limits(const BackwardProblem& p) {
  const Problem& f = p.attention;
  if (config_for(f.head_dim) < 0) {
    std::ostringstream m;
    m << "head_dim " << f.head_dim << " is above 128: this step keeps dK and dV of 64 keys × head_dim in each "
      << "warpgroup's registers, which hold up to 128 columns (step 11_backward runs every head_dim up to 256)";
    return m.str();
  }
  for (const auto& [name, len] : {std::pair{"seqlen_q", f.seqlen_q}, std::pair{"seqlen_k", f.seqlen_k}})
    if (len > kMaxSeqlen) {
      std::ostringstream m;
      m << name << " is " << len << "; this step counts rows in 32-bit integers, rounded up to whole tiles, and runs "
        << "seqlens up to " << kMaxSeqlen;
      return m.str();
    }
  std::string why = check_tma_strides("Q", f.q, f.seqlen_q, f.heads_q, f.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("K", f.k, f.seqlen_k, f.heads_kv, f.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("V", f.v, f.seqlen_k, f.heads_kv, f.batch, step08::kMaxTmaStrideBytes);
  if (why.empty()) why = check_tma_strides("dO", p.d_o, f.seqlen_q, f.heads_q, f.batch, step08::kMaxTmaStrideBytes);
  return why;
}

template <int IDEAS>
constexpr int max_smem_bytes() {
  int most = 0;
  for (const Config& c : kConfigs) most = smem_bytes(c, IDEAS) > most ? smem_bytes(c, IDEAS) : most;
  return most > DqTr::SMEM_BYTES ? most : DqTr::SMEM_BYTES;
}

// The kernel that turns the fp32 dQ accumulator into dQ: 12c's reads its dq_slot order, step 11's the rows.
template <typename T, int CONFIG, int IDEAS>
constexpr auto convert_dq_of() {
  constexpr Config c = kConfigs[CONFIG];
  if constexpr (Traits<c.head_dim, c.block_q, IDEAS>::has(kBulkDq))
    return &convert_dq_tiles_kernel<T, c.head_dim, c.block_q>;
  else
    return &step11::convert_dq_kernel<T, c.head_dim>;
}

template <typename T, int CONFIG, int IDEAS>
std::vector<KernelLaunch> kernels_of(const BackwardProblem& p, const Workspace& w) {
  constexpr Config c = kConfigs[CONFIG];
  using Dq = std::conditional_t<c.head_dim == 64, DqTr64, DqTr>;
  const Problem& f = p.attention;
  std::vector<KernelLaunch> k;
  k.push_back({reinterpret_cast<const void*>(&step11::preprocess_kernel<T>), step11::kPreprocessWarps * 32, 0,
               step11::tiles(w.rows, step11::kPreprocessWarps)});
  const void* main = p.deterministic
                         ? reinterpret_cast<const void*>(&hopper_backward_kernel<T, c.head_dim, c.block_q, IDEAS, false>)
                         : reinterpret_cast<const void*>(&hopper_backward_kernel<T, c.head_dim, c.block_q, IDEAS, true>);
  k.push_back({main, NUM_THREADS, size_t(smem_bytes(c, IDEAS)), grid_blocks(f)});
  if (p.deterministic)
    k.push_back({reinterpret_cast<const void*>(&step11::dq_kernel<T, Dq>), Dq::NUM_THREADS, size_t(Dq::SMEM_BYTES),
                 step11::tiles(f.seqlen_q, Dq::BLOCK_Q) * f.batch * f.heads_q});
  else  // 12c's covers every padded row of the accumulator, step 11's the rows of dQ
    k.push_back({reinterpret_cast<const void*>(convert_dq_of<T, CONFIG, IDEAS>()), step11::kConvertThreads, 0,
                 step11::tiles(Traits<c.head_dim, c.block_q, IDEAS>::has(kBulkDq)
                                   ? w.rows * (c.head_dim / 8)
                                   : f.batch * f.heads_q * f.seqlen_q * (f.head_dim / 8),
                               step11::kConvertThreads)});
  return k;
}

template <int IDEAS>
Plan plan(const BackwardProblem& p, const DeviceInfo& dev) {
  Plan pl;
  std::ostringstream m;
  pl.config = config_for(p.attention.head_dim);
  const int smem = smem_bytes(kConfigs[pl.config], IDEAS);
  if (dev.smem_per_block_optin < size_t(max_smem_bytes<IDEAS>())) {
    m << "head_dim " << p.attention.head_dim << " runs on " << kConfigs[pl.config].head_dim
      << "-wide tiles, which need " << (smem > DqTr::SMEM_BYTES ? smem : DqTr::SMEM_BYTES)
      << " bytes of shared memory per block; this GPU allows " << dev.smem_per_block_optin;
    pl.refusal = m.str();
    return pl;
  }
  const std::optional<Workspace> w = workspace_of(p.attention, p.deterministic, kConfigs[pl.config].head_dim);
  if (!w) {
    m << "the workspace of batch " << p.attention.batch << " · heads_q " << p.attention.heads_q << " · seqlen_q "
      << p.attention.seqlen_q << " rows does not fit in 64-bit byte counts";
    pl.refusal = m.str();
    return pl;
  }
  pl.workspace_bytes = size_t(w->bytes);
  dispatch_dtype(p.attention.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_config<kNumConfigs>(pl.config, [&](auto c) { pl.kernels = kernels_of<T, decltype(c)::value, IDEAS>(p, *w); });
  });
  for (const KernelLaunch& k : pl.kernels)
    if (k.blocks > INT32_MAX) {
      m << "this problem needs " << k.blocks << " blocks in one of the backward's grids, more than the grid limit of "
        << INT32_MAX;
      pl.refusal = m.str();
      pl.kernels.clear();
      return pl;
    }
  return pl;
}

// Documented support: head_dim up to 128, seqlens up to kMaxSeqlen, strides the TMA addresses, on a GPU
// of compute capability 9.0 whose blocks may opt in to the table's shared memory (every H100 and H200),
// with every grid within 2^31 - 1 blocks (step 11's bounds: at most 2^33 padded query rows, 2^31 / 4
// K/V blocks).
template <int IDEAS>
bool claims(const BackwardProblem& p, const DeviceInfo& dev) {
  const Problem& f = p.attention;
  return dev.compute_capability == 90 && dev.smem_per_block_optin >= size_t(max_smem_bytes<IDEAS>()) && limits(p).empty() &&
         f.batch * f.heads_q <= (int64_t(1) << 33) / step11::padded_rows(f.seqlen_q) &&
         f.batch * f.heads_kv <= INT32_MAX / 4 / step11::tiles(f.seqlen_k, 64);
}

// ---- launch ------------------------------------------------------------------------------------
template <typename T, int CONFIG, int IDEAS>
void launch_config(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, const Workspace& w,
                   char* base, cudaStream_t stream) {
  constexpr Config c = kConfigs[CONFIG];
  using Dq = std::conditional_t<c.head_dim == 64, DqTr64, DqTr>;
  const Problem& f = p.attention;
  float* lse2 = reinterpret_cast<float*>(base + w.lse2);
  float* d_rows = reinterpret_cast<float*>(base + w.d_rows);
  float* dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
  const float scale_log2 = float(double(f.softmax_scale) * kLog2e);
  const KernelLaunch& pre = plan.kernels.at(0);
  const KernelLaunch& main = plan.kernels.at(1);
  const KernelLaunch& dq = plan.kernels.at(2);
  const T* q = static_cast<const T*>(t.q);
  const T* k = static_cast<const T*>(t.k);
  const T* v = static_cast<const T*>(t.v);
  const T* d_o = static_cast<const T*>(t.d_o);

  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap q_map = make_tensor_map(
      "Q", q, type, step08::tensor_map_shape(f.q, f.seqlen_q, f.heads_q, f.batch, f.head_dim, c.block_q));
  const CUtensorMap do_map = make_tensor_map(
      "dO", d_o, type, step08::tensor_map_shape(p.d_o, f.seqlen_q, f.heads_q, f.batch, f.head_dim, c.block_q));
  const CUtensorMap k_map = make_tensor_map(
      "K", k, type, step08::tensor_map_shape(f.k, f.seqlen_k, f.heads_kv, f.batch, f.head_dim, BLOCK_KV));
  const CUtensorMap v_map = make_tensor_map(
      "V", v, type, step08::tensor_map_shape(f.v, f.seqlen_k, f.heads_kv, f.batch, f.head_dim, BLOCK_KV));

  if (!p.deterministic) CHECK_CUDA(cudaMemsetAsync(dq_accum, 0, size_t(w.bytes - w.dq_accum), stream));
  step11::preprocess_kernel<T><<<unsigned(pre.blocks), pre.threads, 0, stream>>>(static_cast<const T*>(t.o), d_o,
                                                                                 t.lse, lse2, d_rows, p);
  CHECK_LAUNCH();
  auto run_main = [&](auto atomic) {
    auto* kernel = hopper_backward_kernel<T, c.head_dim, c.block_q, IDEAS, decltype(atomic)::value>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(main.smem_bytes)));
    kernel<<<unsigned(main.blocks), main.threads, main.smem_bytes, stream>>>(
        q_map, k_map, v_map, do_map, static_cast<T*>(t.dk), static_cast<T*>(t.dv), dq_accum, lse2, d_rows, p,
        scale_log2);
    CHECK_LAUNCH();
  };
  if (p.deterministic) {
    run_main(std::false_type{});
    auto* kernel = step11::dq_kernel<T, Dq>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq.smem_bytes)));
    kernel<<<unsigned(dq.blocks), dq.threads, dq.smem_bytes, stream>>>(q, k, v, d_o, static_cast<T*>(t.dq), lse2,
                                                                       d_rows, p, scale_log2, Softcap{});
    CHECK_LAUNCH();
  } else {
    run_main(std::true_type{});
    convert_dq_of<T, CONFIG, IDEAS>()<<<unsigned(dq.blocks), dq.threads, 0, stream>>>(dq_accum, static_cast<T*>(t.dq), p);
    CHECK_LAUNCH();
  }
}

template <int IDEAS>
void launch(const BackwardProblem& p, const BackwardTensors& t, const Plan& plan, void* workspace,
            cudaStream_t stream) {
  const Workspace w = *workspace_of(p.attention, p.deterministic, kConfigs[plan.config].head_dim);
  dispatch_dtype(p.attention.dtype, [&](auto tag) {
    with_config<kNumConfigs>(plan.config, [&](auto c) {
      launch_config<typename decltype(tag)::type, decltype(c)::value, IDEAS>(p, t, plan, w, static_cast<char*>(workspace),
                                                                       stream);
    });
  });
}

// ---- explain -----------------------------------------------------------------------------------
template <int IDEAS>
void explain(std::ostream& out) {
  out << "Tile table (a block: " << BLOCK_KV << " keys, " << NUM_WARPGROUPS << " warpgroups of " << KEYS_PER_WARPGROUP
      << " keys; head_dim padded to HEAD_DIM):\n";
  for (const Config& c : kConfigs)
    out << "  HEAD_DIM " << c.head_dim << ": BLOCK_Q " << c.block_q << ", shared memory " << smem_bytes(c, IDEAS)
        << " bytes; dQ tiles: warpgroup 0 rows " << DQ_TILE * dq_tile_of(0, c.block_q).row_tile << "+, cols "
        << DQ_TILE * dq_tile_of(0, c.block_q).col_block << "+; warpgroup 1 rows "
        << DQ_TILE * dq_tile_of(1, c.block_q).row_tile << "+, cols " << DQ_TILE * dq_tile_of(1, c.block_q).col_block
        << "+\n";
  out << "\nThe five products of one query tile, per warpgroup (keys as rows: computed transposed):\n"
         "  S^T  = K.Q^T    A: K   smem K-major           B: Q   smem K-major\n"
         "  dP^T = V.dO^T   A: V   smem K-major           B: dO  smem K-major\n"
         "  dV  += P^T.dO   A: P^T registers (= S^T acc)  B: dO  smem MN-major (imm-trans-b 1)\n"
         "  dK  += dS^T.Q   A: dS^T registers (= dP^T acc) B: Q  smem MN-major (imm-trans-b 1)\n"
         "  dQ   = dS.K     A: dS  smem MN-major (dS^T stored [key][query], imm-trans-a 1)\n"
         "                  B: K   smem MN-major (imm-trans-b 1)\n";
  using Tr = Traits<128, 64>;
  out << "\nAt HEAD_DIM 128 (bytes from the 1024-byte-aligned base): K +" << Tr::K_OFFSET << ", V +" << Tr::V_OFFSET
      << ", Q +" << Tr::Q_OFFSET << " (2 x " << Tr::Q_BYTES << "), dO +" << Tr::DO_OFFSET << ", dS^T +" << Tr::DS_OFFSET
      << " (" << Tr::DS_BYTES << "), LSE2 +" << Tr::LSE_OFFSET << ", D +" << Tr::D_OFFSET << ", mbarriers +"
      << Tr::BARRIER_OFFSET << "\n";
  out << "Descriptor start offsets (bytes into each tile):\n";
  for (int wg = 0; wg < 2; ++wg)
    out << "  K rows of warpgroup " << wg << ", k16 steps 0, 1, 4: +" << kv_rows_step(wg, 0) << ", +"
        << kv_rows_step(wg, 1) << ", +" << kv_rows_step(wg, 4) << "\n";
  out << "  Q (K-major B), k16 steps 0, 1, 4: +" << q_k_major_step(64, 0) << ", +" << q_k_major_step(64, 1) << ", +"
      << q_k_major_step(64, 4) << "\n"
      << "  Q (MN-major B), queries 0, 16, 48: +" << q_mn_major_step(0) << ", +" << q_mn_major_step(1) << ", +"
      << q_mn_major_step(3) << " (LBO " << mn_major_lbo(64) << ")\n"
      << "  dS^T (MN-major A), keys 0, 16, 112: +" << ds_step(0, 0) << ", +" << ds_step(0, 1) << ", +" << ds_step(0, 7)
      << "\n"
      << "  K (MN-major B of dQ), warpgroup 1's columns, keys 0, 16: +" << k_mn_major_step(1, 0) << ", +"
      << k_mn_major_step(1, 1) << " (LBO " << mn_major_lbo(BLOCK_KV) << ")\n";
  out << "dS^T element (key, query) stored at: (0, 0) +" << ds_offset(0, 0) << ", (0, 2) +" << ds_offset(0, 2)
      << ", (1, 0) +" << ds_offset(1, 0) << ", (9, 17) +" << ds_offset(9, 17) << "\n";
  out << "\nOne query tile, per warpgroup ([...]: one wgmma commit group; wait N: wgmma.wait_group N):\n";
  if constexpr (Traits<128, 64, IDEAS>::has(kBulkDq))
    out << "  [S^T] [dP^T] wait 1  P^T  [dV] wait 1  dS^T  sync  [dQ] [dK] wait 1  dQ -> smem  wait 0  sync  "
           "one bulk reduce-add\n"
           "  as 12b, with the query tile's dQ staged in shared memory and added by thread 0's cp.reduce.async.bulk,\n"
           "  which runs under the next tile's products.\n";
  else if constexpr (Traits<128, 64, IDEAS>::has(kAsyncWgmma))
    out << "  [S^T] [dP^T] wait 1  P^T  [dV] wait 1  dS^T  sync  [dQ] [dK] wait 1  atomics  wait 0\n"
           "  P^T is computed under dP^T's products, dS^T under dV's, the dQ atomics under dK's.\n";
  else
    out << "  [S^T dP^T] wait 0  P^T, dS^T  [dV dK]  sync  [dQ] wait 0  atomics\n"
           "  every group is waited for in full: the tensor cores idle while the threads work.\n";
}

template <int IDEAS>
Step sub_step(const char* id, const char* name, const char* lesson) {
  return {.id = id, .name = name, .lesson = lesson, .backward = {limits, plan<IDEAS>, launch<IDEAS>, claims<IDEAS>},
          .explain = explain<IDEAS>};
}

}  // namespace
}  // namespace fs::step12

namespace fs {

void register_step_12_hopper_backward(Registry& r) {
  using namespace step12;
  r.add(sub_step<kDataPath>("12a_hopper_data_path", "Hopper backward: the data path",
                            "the backward on the TMA and wgmma: Q, dO, LSE and D streamed into an mbarrier ring, all "
                            "five products on wgmma, Pᵀ and dSᵀ as register operands straight from their accumulators "
                            "(sm_90a)"));
  r.add(sub_step<kAsyncWgmma>("12b_async_wgmma", "Hopper backward: asynchronous wgmma",
                              "+ each wait covers only what the next instructions read: Pᵀ under dPᵀ's products, dSᵀ "
                              "under dV's, the dQ atomics under dK's"));
  r.add(sub_step<kBulkDq>("12c_bulk_dq", "Hopper backward: dQ by bulk reduce-add",
                          "+ dQ through shared memory: both warpgroups store their tiles, one thread adds the query "
                          "tile to the fp32 accumulator with one bulk reduce-add (cp.reduce.async.bulk) in place of 16 "
                          "atomics per thread"));
}

}  // namespace fs
