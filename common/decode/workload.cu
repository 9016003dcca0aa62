#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "decode/check.h"
#include "harness/tensors.h"

namespace fs {

namespace {

// The cache as a view: (batch, seqlen_k, ...) or, paged, (num_pages, page_size, ...).
DeviceTensor cache(const DecodeProblem& p, const Strides& st) {
  const Problem& f = p.attention;
  return is_paged(p) ? DeviceTensor(st, p.num_pages, p.page_size, f.heads_kv, f.head_dim, f.dtype)
                     : DeviceTensor(st, f.batch, f.seqlen_k, f.heads_kv, f.head_dim, f.dtype);
}

void upload(DeviceBuffer& dst, const std::vector<int32_t>& src) {
  dst = DeviceBuffer(src.size() * sizeof(int32_t));
  if (!src.empty()) CHECK_CUDA(cudaMemcpy(dst.get(), src.data(), dst.bytes(), cudaMemcpyHostToDevice));
}

// The problem, validated: the workload builds nothing for one that breaks a rule.
const DecodeProblem& checked(const DecodeProblem& p) {
  if (const std::string why = validate(p); !why.empty()) throw Error("decode workload: " + why);
  return p;
}

}  // namespace

DecodeWorkload::DecodeWorkload(const DecodeProblem& shape, std::vector<int32_t> lengths, uint64_t seed)
    : p_(checked(shape)),
      lengths_(std::move(lengths)),
      q_(p_.attention.q, p_.attention.batch, p_.attention.seqlen_q, p_.attention.heads_q, p_.attention.head_dim,
         p_.attention.dtype),
      k_(cache(p_, p_.attention.k)),
      v_(cache(p_, p_.attention.v)),
      out_(p_.attention) {
  const Problem& f = p_.attention;
  if (!lengths_.empty() && int64_t(lengths_.size()) != f.batch)
    throw Error("decode workload: " + std::to_string(lengths_.size()) + " lengths for batch " + std::to_string(f.batch));
  if (is_paged(p_)) {
    // Each sequence's pages, in order, from a seeded shuffle of the whole cache: neighbouring keys of
    // a sequence are far apart in memory, as in a serving system's page pool.
    std::vector<int32_t> pages(size_t(p_.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
    block_table_.assign(size_t(f.batch * p_.block_table_stride), -1);
    size_t next = 0;
    for (int64_t b = 0; b < f.batch; ++b) {
      const int64_t len = lengths_.empty() ? f.seqlen_k : lengths_[size_t(b)];
      for (int64_t i = 0; i < (len + p_.page_size - 1) / p_.page_size; ++i) {
        if (next == pages.size())
          throw Error("decode workload: the sequences use more than the cache's " + std::to_string(p_.num_pages) +
                      " pages");
        block_table_[size_t(b * p_.block_table_stride + i)] = pages[next++];
      }
    }
  }
  if (const std::string why = validate_data(p_, lengths_, block_table_); !why.empty())
    throw Error("decode workload: " + why);
  q_.randomize(seed);
  k_.randomize(seed + 1);
  v_.randomize(seed + 2);
  max_abs_v_ = max_abs(v_.get(), v_.elems(), f.dtype);  // the whole cache: an upper bound for the keys read
  upload(lengths_dev_, lengths_);
  upload(table_dev_, block_table_);
}

DecodeTensors DecodeWorkload::tensors() const {
  return DecodeTensors{q_.get(), k_.get(), v_.get(), is_paged(p_) ? table_dev_.as<int32_t>() : nullptr,
                       lengths_.empty() ? nullptr : lengths_dev_.as<int32_t>(), out_.o.get(), out_.lse.as<float>()};
}

void DecodeWorkload::set_length(int64_t b, int32_t length) {
  if (lengths_.empty() || b < 0 || b >= p_.attention.batch) throw Error("decode workload: no length " + std::to_string(b));
  lengths_[size_t(b)] = length;
  CHECK_CUDA(cudaMemcpy(lengths_dev_.as<int32_t>() + b, &length, sizeof length, cudaMemcpyHostToDevice));
}

void DecodeWorkload::set_block_table_entry(int64_t b, int64_t i, int32_t page) {
  if (!is_paged(p_) || b < 0 || b >= p_.attention.batch || i < 0 || i >= p_.max_pages_per_seq)
    throw Error("decode workload: no block-table entry [" + std::to_string(b) + "][" + std::to_string(i) + "]");
  block_table_[size_t(b * p_.block_table_stride + i)] = page;
  upload(table_dev_, block_table_);
}

DecodeHostInputs DecodeWorkload::download_inputs() const {
  return DecodeHostInputs{q_.download(), k_.download(), v_.download(), lengths_, block_table_};
}

Reference make_reference(const DecodeWorkload& w, GpuReference& gpu) {
  if (reference_cpu_cost(w.problem(), w.lengths()) <= kCpuReferenceMaxCost)
    return reference_cpu(w.problem(), w.download_inputs());
  return gpu_reference(w, gpu);
}

}  // namespace fs
