#include "decode.h"

#include <sstream>

#include "checked.h"

namespace fs {

DecodeProblem make_decode_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                  int64_t heads_kv, int64_t head_dim, DType dtype, bool causal, int64_t page_size) {
  const Problem f = make_problem(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal);
  DecodeProblem p = decode_view(f);
  if (page_size != 0) {
    p.page_size = page_size;
    p.max_pages_per_seq = page_size > 0 && seqlen_k > 0 ? (seqlen_k + page_size - 1) / page_size : 1;
    const auto pages = checked_mul(batch, p.max_pages_per_seq);
    p.num_pages = pages ? *pages : -1;  // validate_decode names the sizes that overflow
    p.block_table_stride = p.max_pages_per_seq;
    p.k = p.v = contiguous_strides(page_size, heads_kv, head_dim);
  }
  return p;
}

namespace {

// The forward problem whose rules cover Q, O and the sizes shared with a decoding problem. For a
// paged cache its K and V are empty views: the cache is judged as (num_pages, page_size, ...) apart.
Problem shared_rules_view(const DecodeProblem& p) {
  Problem f = forward_view(p);
  if (is_paged(p)) {
    f.seqlen_k = 0;
    f.k = f.v = contiguous_strides(0, p.heads_kv, p.head_dim);
  }
  return f;
}

}  // namespace

std::string validate_decode(const DecodeProblem& p) {
  std::ostringstream m;
  // seqlen_k is checked here for a paged cache, whose shared-rules view leaves it out.
  if (is_paged(p) && (p.seqlen_k < 0 || p.seqlen_k > kMaxSeqlen)) {
    m << "seqlen_k is " << p.seqlen_k << "; it must be between 0 and " << kMaxSeqlen;
    return m.str();
  }
  if (std::string why = validate(shared_rules_view(p)); !why.empty()) return why;
  if (p.num_splits < 0 || p.num_splits > kMaxSplits) {
    m << "num_splits is " << p.num_splits << "; it must be 0 (the step's heuristic) or between 1 and " << kMaxSplits;
    return m.str();
  }
  if (p.checked != 0 && p.checked != 1) {
    m << "checked is " << p.checked << "; it must be 0 or 1";
    return m.str();
  }
  if (!is_paged(p)) {
    const struct { const char* name; int64_t value; } unused[] = {
        {"num_pages", p.num_pages}, {"max_pages_per_seq", p.max_pages_per_seq},
        {"block_table_stride", p.block_table_stride}};
    for (const auto& u : unused)
      if (u.value != 0) {
        m << u.name << " is " << u.value << " with a contiguous cache (page_size 0); it must be 0";
        return m.str();
      }
    return "";
  }
  if (p.page_size < kPageMultiple || p.page_size > kMaxSeqlen || p.page_size % kPageMultiple != 0) {
    m << "page_size is " << p.page_size << "; it must be 0 (a contiguous cache) or a multiple of " << kPageMultiple
      << " from " << kPageMultiple << " to " << kMaxSeqlen / kPageMultiple * kPageMultiple
      << ", so that every group of 16 keys starting at a multiple of 16 lies in one page";
    return m.str();
  }
  if (p.num_pages < 1 || p.num_pages > INT32_MAX) {
    m << "num_pages is " << p.num_pages << "; it must be between 1 and " << INT32_MAX
      << " (block table entries are int32)";
    return m.str();
  }
  if (p.max_pages_per_seq < 1 || p.max_pages_per_seq > kMaxSeqlen) {
    m << "max_pages_per_seq is " << p.max_pages_per_seq << "; it must be between 1 and " << kMaxSeqlen;
    return m.str();
  }
  if (p.block_table_stride < p.max_pages_per_seq) {
    m << "block_table_stride is " << p.block_table_stride << "; it must be at least max_pages_per_seq ("
      << p.max_pages_per_seq << ") so that the rows of the block table do not overlap";
    return m.str();
  }
  if (const auto n = checked_mul(p.batch, p.block_table_stride); !n || *n > kMaxTensorElements) {
    m << "the block table spans batch * block_table_stride = " << p.batch << " * " << p.block_table_stride;
    if (n) m << " = " << *n;
    m << " elements" << (n ? "" : ", which overflows 64 bits") << "; a tensor may span at most 2^58 ("
      << kMaxTensorElements << ")";
    return m.str();
  }
  if (const int64_t capacity = p.max_pages_per_seq * p.page_size; p.seqlen_k > capacity) {  // both <= 2^31
    m << "seqlen_k is " << p.seqlen_k << "; a sequence holds at most max_pages_per_seq * page_size = "
      << p.max_pages_per_seq << " * " << p.page_size << " = " << capacity << " keys";
    return m.str();
  }
  for (const auto& [name, st] : {std::pair<const char*, const Strides&>{"K", p.k}, {"V", p.v}})
    if (std::string why = validate_view("K and V", name, st, "num_pages", "page", p.num_pages, "page_size",
                                        p.page_size, "heads_kv", p.heads_kv, p.head_dim);
        !why.empty())
      return why;
  return "";
}

std::string validate_decode_tensors(const DecodeProblem& p, const DecodeTensors& t) {
  const bool work = p.seqlen_q > 0, reads_cache = work && p.seqlen_k > 0;
  const struct { const char* name; const void* ptr; bool needed; uintptr_t align; } ptrs[] = {
      {"Q", t.q, work, 16},
      {"the K cache", t.k_cache, reads_cache, 16},
      {"the V cache", t.v_cache, reads_cache, 16},
      {"O", t.o, work, 16},
      {"the block table", t.block_table, reads_cache && is_paged(p), 4},
      {"cache_seqlens", t.cache_seqlens, false, 4},
      {"LSE", t.lse, false, 4}};
  for (const auto& x : ptrs) {
    std::ostringstream m;
    if (x.needed && x.ptr == nullptr) {
      m << x.name << " is a null pointer";
      return m.str();
    }
    if (reinterpret_cast<uintptr_t>(x.ptr) % x.align != 0) {
      m << x.name << " pointer " << x.ptr << " is not " << x.align << "-byte aligned (address mod " << x.align
        << " = " << reinterpret_cast<uintptr_t>(x.ptr) % x.align << ")";
      return m.str();
    }
  }
  if (!is_paged(p) && t.block_table != nullptr) return "the block table is not null with a contiguous cache (page_size 0)";
  return "";
}

std::string validate_decode_data(const DecodeProblem& p, const std::vector<int32_t>& lengths,
                                 const std::vector<int32_t>& block_table) {
  std::ostringstream m;
  if (!lengths.empty() && int64_t(lengths.size()) != p.batch) {
    m << "there are " << lengths.size() << " lengths for batch " << p.batch;
    return m.str();
  }
  for (int64_t b = 0; b < int64_t(lengths.size()); ++b)
    if (lengths[size_t(b)] < 0 || lengths[size_t(b)] > p.seqlen_k) {
      m << "cache_seqlens[" << b << "] is " << lengths[size_t(b)] << "; it must be between 0 and seqlen_k ("
        << p.seqlen_k << "), the capacity of a sequence";
      return m.str();
    }
  if (!is_paged(p)) return "";
  if (int64_t(block_table.size()) < (p.batch - 1) * p.block_table_stride + p.max_pages_per_seq) {
    m << "the block table has " << block_table.size() << " entries; batch " << p.batch << " rows of stride "
      << p.block_table_stride << " need " << (p.batch - 1) * p.block_table_stride + p.max_pages_per_seq;
    return m.str();
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = lengths.empty() ? p.seqlen_k : lengths[size_t(b)];
    for (int64_t i = 0; i < (len + p.page_size - 1) / p.page_size; ++i)
      if (const int32_t page = block_table[size_t(b * p.block_table_stride + i)]; page < 0 || page >= p.num_pages) {
        m << "block_table[" << b << "][" << i << "] is " << page << ", which is not a page of the cache (num_pages is "
          << p.num_pages << ")";
        return m.str();
      }
  }
  return "";
}

Problem forward_view(const DecodeProblem& p) {
  Problem f = make_problem(p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
                           static_cast<DType>(p.dtype), p.causal != 0);
  f.dtype = p.dtype;    // kept as given, so that validate() names a bad one
  f.causal = p.causal;
  f.softmax_scale = p.softmax_scale;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.o = p.o;
  return f;
}

DecodeProblem decode_view(const Problem& f) {
  DecodeProblem p{};
  p.batch = f.batch;
  p.seqlen_q = f.seqlen_q;
  p.seqlen_k = f.seqlen_k;
  p.heads_q = f.heads_q;
  p.heads_kv = f.heads_kv;
  p.head_dim = f.head_dim;
  p.dtype = f.dtype;
  p.causal = f.causal;
  p.softmax_scale = f.softmax_scale;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.o = f.o;
  return p;
}

double decode_kv_bytes(const DecodeProblem& p, const std::vector<int32_t>& lengths) {
  double keys = lengths.empty() ? double(p.batch) * double(p.seqlen_k) : 0.0;
  for (const int32_t len : lengths) keys += double(len);
  return 2.0 * keys * double(p.heads_kv) * double(p.head_dim) * 2.0;
}

std::string describe(const DecodeProblem& p) {
  std::ostringstream m;
  m << "b" << p.batch << " h" << p.heads_q << "/" << p.heads_kv << " sq" << p.seqlen_q << " sk" << p.seqlen_k << " d"
    << p.head_dim << " " << dtype_name(p.dtype) << (p.causal ? " causal" : "");
  if (is_paged(p)) m << " paged" << p.page_size;
  if (p.num_splits) m << " splits" << p.num_splits;
  if (p.checked) m << " checked";
  return m.str();
}

}  // namespace fs
