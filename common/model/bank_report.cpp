#include "model/bank_report.h"

#include <algorithm>
#include <iomanip>

#include "forward/rules.h"

namespace fs::bank {

namespace {

// `s` padded with spaces to `width` characters (UTF-8 aware: "Q·Kᵀ" is 4 characters, not 7 bytes).
std::string padded(const std::string& s, size_t width) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80 ? 1 : 0;
  return chars >= width ? s : s + std::string(width - chars, ' ');
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void add(AccessCount& count, const WarpAccess& a) {
  const int w = wavefronts(a);
  if (w < 0) throw std::logic_error("bank model: invalid access in " + count.what);
  count.instructions += 1;
  count.wavefronts += w;
  count.ideal += ideal_wavefronts(a);
  count.worst = std::max(count.worst, w);
}

LaunchPrediction predict_launch(const Problem& p, int block_q, int block_kv, const std::vector<AccessCount>& counts) {
  LaunchPrediction r;
  const int64_t batch_heads = p.batch * p.heads_q;
  const int64_t q_tiles = (p.seqlen_q + block_q - 1) / block_q;
  for (int64_t qt = 0; qt < q_tiles; ++qt) {  // the K/V tiles of each query tile, as the kernel loops
    const int64_t last_row = std::min((qt + 1) * block_q, p.seqlen_q) - 1;
    const int64_t kv_end = p.causal ? std::min(p.seqlen_k, last_row + p.seqlen_k - p.seqlen_q + 1) : p.seqlen_k;
    r.tiles += kv_end > 0 ? (kv_end + block_kv - 1) / block_kv : 0;
  }
  r.tiles *= batch_heads;
  r.blocks = q_tiles * batch_heads;
  for (const AccessCount& c : counts) {
    if (c.counter == Counter::none) continue;
    const int64_t times = c.once_per_block ? r.blocks : r.tiles;
    const bool store = c.counter == Counter::st;
    (store ? r.st_wavefronts : r.ld_wavefronts) += times * c.wavefronts;
    (store ? r.st_conflicts : r.ld_conflicts) += times * c.conflicts();
  }
  return r;
}

Problem default_shape() { return make_problem(2, 2048, 2048, 16, 16, 128, DType::fp16, false); }

void print_model(std::ostream& out, const TilingKernel& kernel) {
  out << "Shared-memory bank conflicts of " << kernel.step << ", from the bank model (common/model/bank_model.h)\n"
      << "replaying the kernel's own index functions and tile layout; no GPU needed.\n"
      << "  tile layout: " << kernel.layout << "\n"
      << "  replayed:    " << kernel.traits_file << "\n\n"
      << "32 banks of 4 bytes; one wavefront delivers one 4-byte word per bank. Accesses of 4, 8 or 16\n"
         "bytes per lane are served in phases of 32, 16 or 8 lanes (128 bytes each); a phase takes as\n"
         "many wavefronts as its busiest bank has distinct words. Ideal: 1 wavefront per phase.\n\n";
}

void print_bank_map(std::ostream& out, int block_kv, int head_dim, const std::vector<std::vector<int>>& banks) {
  out << "Bank map of a K tile [" << block_kv << " keys, " << head_dim << "] fp16, first " << banks.size()
      << " keys: the first bank of each 16-byte\n"
         "chunk (8 elements, banks b..b+3). In S = Q·Kᵀ a quarter-warp reads one chunk (a column of this\n"
         "table) of 8 consecutive keys: the 8 cells must all differ for the read to take 1 wavefront.\n\n";
  out << "  key \\ chunk";
  for (size_t c = 0; c < (banks.empty() ? 0 : banks[0].size()); ++c) out << std::setw(4) << c;
  out << "\n";
  for (size_t r = 0; r < banks.size(); ++r) {
    out << "  " << std::setw(9) << r << "  ";
    for (int bank : banks[r]) out << std::setw(4) << bank;
    out << "\n";
  }
  out << "\n";
}

void print_counts(std::ostream& out, int head_dim, const std::vector<AccessCount>& counts) {
  out << "  head_dim " << head_dim << "\n";
  out << "    " << padded("access", 38) << std::setw(7) << "bytes" << std::setw(9) << "instr" << std::setw(12)
      << "wavefronts" << std::setw(9) << "ideal" << std::setw(11) << "conflicts" << std::setw(13) << "worst/instr"
      << "\n";
  for (const AccessCount& c : counts)
    out << "    " << padded(c.what, 38) << std::setw(7) << c.width << std::setw(9) << c.instructions << std::setw(12)
        << c.wavefronts << std::setw(9) << c.ideal << std::setw(11) << c.conflicts() << std::setw(13) << c.worst
        << "\n";
  out << "\n";
}

void print_prediction(std::ostream& out, const TilingKernel& kernel, const Problem& p, const LaunchPrediction& r) {
  out << "Predicted Nsight Compute counters for one launch at " << describe(p) << " (" << r.blocks << " blocks, "
      << r.tiles << " K/V tiles):\n";
  out << "  " << std::left << std::setw(16) << "step" << std::right << std::setw(16) << "ld wavefronts"
      << std::setw(16) << "ld conflicts" << std::setw(16) << "st wavefronts" << std::setw(16) << "st conflicts"
      << "\n";
  out << "  " << std::left << std::setw(16) << kernel.step << std::right << std::setw(16)
      << with_commas(r.ld_wavefronts) << std::setw(16) << with_commas(r.ld_conflicts) << std::setw(16)
      << with_commas(r.st_wavefronts) << std::setw(16) << with_commas(r.st_conflicts) << "\n";
  out << "  (ld/st wavefronts: l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld/_op_st.sum; conflicts:\n"
         "   l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld/_op_st.sum)\n";
  if (kernel.cp_async)
    out << "  The tile copies are cp.async, which writes shared memory without an STS instruction: the\n"
           "  _op_st counters do not count them, so the st columns are 0.\n";
}

}  // namespace fs::bank
