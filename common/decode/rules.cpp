#include "decode/rules.h"

#include "step/overflow.h"

namespace fs {

DecodeProblem make_decode_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                  int64_t heads_kv, int64_t head_dim, DType dtype, int32_t causal, int64_t page_size) {
  DecodeProblem p = decode_of(make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal));
  if (page_size != 0) {
    p.page_size = page_size;
    // ceil(seqlen_k / page_size), without the overflow of seqlen_k + page_size - 1 near INT64_MAX
    p.max_pages_per_seq = page_size > 0 && seqlen_k > 0 ? seqlen_k / page_size + (seqlen_k % page_size != 0) : 1;
    const auto pages = checked_mul(batch, p.max_pages_per_seq);
    p.num_pages = pages ? *pages : -1;  // validate() names the sizes that overflow
    p.block_table_stride = p.max_pages_per_seq;
    p.attention.k = p.attention.v = contiguous_strides(page_size, heads_kv, head_dim);
  }
  return p;
}

std::string validate(const DecodeProblem& p) {
  const Problem& f = p.attention;
  // The forward rules cover Q, O and the shared sizes. For a paged cache its K and V are left out (an
  // empty view): the cache is judged as (num_pages, page_size, ...) below, and seqlen_k here.
  Problem shared = f;
  if (f.cu_seqlens_q || f.cu_seqlens_k)
    return sentence("cu_seqlens_q or cu_seqlens_k is set; a decoding problem has no variable-length batch (its "
                    "sequences' lengths are cache_seqlens): set both to NULL, or run a forward problem (fs_run)");
  if (is_paged(p)) {
    if (f.seqlen_k < 0 || f.seqlen_k > kMaxSeqlen)
      return sentence("seqlen_k is ", f.seqlen_k, "; it must be between 0 and ", kMaxSeqlen);
    shared.seqlen_k = 0;
    shared.k = shared.v = contiguous_strides(0, f.heads_kv, f.head_dim);
  }
  if (std::string why = validate(shared); !why.empty()) return why;
  if (p.num_splits < 0 || p.num_splits > kMaxSplits)
    return sentence("num_splits is ", p.num_splits, "; it must be 0 (the step's heuristic) or between 1 and ", kMaxSplits);
  if (p.checked != 0 && p.checked != 1) return sentence("checked is ", p.checked, "; it must be 0 or 1");
  if (!is_paged(p)) {
    for (const auto& [name, value] : {std::pair{"num_pages", p.num_pages}, std::pair{"max_pages_per_seq", p.max_pages_per_seq},
                                      std::pair{"block_table_stride", p.block_table_stride}})
      if (value != 0) return sentence(name, " is ", value, " with a contiguous cache (page_size 0); it must be 0");
    return "";
  }
  if (p.page_size < kPageMultiple || p.page_size > kMaxSeqlen || p.page_size % kPageMultiple != 0)
    return sentence("page_size is ", p.page_size, "; it must be 0 (a contiguous cache) or a multiple of ", kPageMultiple,
                    " from ", kPageMultiple, " to ", kMaxSeqlen / kPageMultiple * kPageMultiple,
                    ", so that every group of 16 keys starting at a multiple of 16 lies in one page");
  if (p.num_pages < 1 || p.num_pages > INT32_MAX)
    return sentence("num_pages is ", p.num_pages, "; it must be between 1 and ", INT32_MAX,
                    " (block table entries are int32)");
  if (p.max_pages_per_seq < 1 || p.max_pages_per_seq > kMaxSeqlen)
    return sentence("max_pages_per_seq is ", p.max_pages_per_seq, "; it must be between 1 and ", kMaxSeqlen);
  if (p.block_table_stride < p.max_pages_per_seq)
    return sentence("block_table_stride is ", p.block_table_stride, "; it must be at least max_pages_per_seq (",
                    p.max_pages_per_seq, ") so that the rows of the block table do not overlap");
  if (const auto n = checked_mul(f.batch, p.block_table_stride); !n || *n > kMaxTensorElements)
    return sentence("the block table spans batch * block_table_stride = ", f.batch, " * ", p.block_table_stride,
                    n ? " = " + std::to_string(*n) + " elements" : std::string(" elements, which overflows 64 bits"),
                    "; a tensor may span at most 2^58 (", kMaxTensorElements, ")");
  if (const int64_t capacity = p.max_pages_per_seq * p.page_size; f.seqlen_k > capacity)  // both <= 2^31
    return sentence("seqlen_k is ", f.seqlen_k, "; a sequence holds at most max_pages_per_seq * page_size = ",
                    p.max_pages_per_seq, " * ", p.page_size, " = ", capacity, " keys");
  for (const auto& [name, st] : {std::pair<const char*, const Strides&>{"K", f.k}, {"V", f.v}})
    if (std::string why = validate_view({name, "K and V", st, p.num_pages, p.page_size, f.heads_kv, f.head_dim,
                                         "page_size", "heads_kv", "num_pages", "page"});
        !why.empty())
      return why;
  return "";
}

std::string validate_tensors(const DecodeProblem& p, const DecodeTensors& t) {
  const bool work = p.attention.seqlen_q > 0, reads_cache = work && p.attention.seqlen_k > 0;
  std::string why = validate_pointers({{"Q", t.q, work}, {"the K cache", t.k_cache, reads_cache},
                                       {"the V cache", t.v_cache, reads_cache}, {"O", t.o, work},
                                       {"the block table", t.block_table, reads_cache && is_paged(p), 4},
                                       {"cache_seqlens", t.cache_seqlens, false, 4}, {"LSE", t.lse, false, 4}});
  if (why.empty() && !is_paged(p) && t.block_table != nullptr)
    why = "the block table is not null with a contiguous cache (page_size 0)";
  return why;
}

std::string validate_lengths(const DecodeProblem& p, std::span<const int32_t> lengths) {
  const int64_t batch = p.attention.batch, seqlen_k = p.attention.seqlen_k;
  if (!lengths.empty() && int64_t(lengths.size()) != batch)
    return sentence("there are ", lengths.size(), " lengths for batch ", batch);
  for (int64_t b = 0; b < int64_t(lengths.size()); ++b)
    if (lengths[size_t(b)] < 0 || lengths[size_t(b)] > seqlen_k)
      return sentence("cache_seqlens[", b, "] is ", lengths[size_t(b)], "; it must be between 0 and seqlen_k (",
                      seqlen_k, "), the capacity of a sequence");
  return "";
}

std::string validate_data(const DecodeProblem& p, const std::vector<int32_t>& lengths,
                          const std::vector<int32_t>& block_table) {
  const int64_t batch = p.attention.batch, seqlen_k = p.attention.seqlen_k;
  if (std::string why = validate_lengths(p, lengths); !why.empty() || !is_paged(p)) return why;
  if (int64_t(block_table.size()) < (batch - 1) * p.block_table_stride + p.max_pages_per_seq)
    return sentence("the block table has ", block_table.size(), " entries; batch ", batch, " rows of stride ",
                    p.block_table_stride, " need ", (batch - 1) * p.block_table_stride + p.max_pages_per_seq);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lengths.empty() ? seqlen_k : lengths[size_t(b)];
    for (int64_t i = 0; i < (len + p.page_size - 1) / p.page_size; ++i)
      if (const int32_t page = block_table[size_t(b * p.block_table_stride + i)]; page < 0 || page >= p.num_pages)
        return sentence("block_table[", b, "][", i, "] is ", page, ", which is not a page of the cache (num_pages is ",
                        p.num_pages, ")");
  }
  return "";
}

double decode_kv_bytes(const DecodeProblem& p, std::span<const int32_t> lengths) {
  const Problem& f = p.attention;
  double keys = lengths.empty() ? double(f.batch) * double(f.seqlen_k) : 0.0;
  for (const int32_t len : lengths) keys += double(len);
  return 2.0 * keys * double(f.heads_kv) * double(f.head_dim) * 2.0;
}

std::string describe(const DecodeProblem& p) {
  std::string s = describe(p.attention);
  if (is_paged(p)) s += " paged" + std::to_string(p.page_size);
  if (p.num_splits) s += " splits" + std::to_string(p.num_splits);
  if (p.checked) s += " checked";
  return s;
}

std::string Pass<DecodeProblem>::harness_launch(const DecodeProblem& p, const DecodeTensors& t, void* workspace,
                                                cudaStream_t stream, bool& done) {
  const Problem& f = p.attention;
  done = f.seqlen_q == 0 || f.seqlen_k == 0;
  if (f.seqlen_q > 0 && f.seqlen_k == 0) fill_empty_output(f, fs::Tensors{nullptr, nullptr, nullptr, t.o, t.lse}, stream);
  if (done || !p.checked) return "";
  const std::string why = validate_device_data(p, t, workspace, stream);
  return why.empty() ? "" : why + " (checked mode)";
}

}  // namespace fs
