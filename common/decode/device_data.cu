// The checked mode of a decoding launch (fs_decode_problem.checked): the device data a kernel would
// trust, the lengths and the block-table entries in use, checked on the device before any kernel
// reads them; the first bad one is reported in a sentence.
#include "decode/rules.h"

namespace fs {

namespace {

// record[0]: the smallest b whose length is outside [0, seqlen_k]; record[1]: the smallest
// b · max_pages_per_seq + i whose entry block_table[b][i] is in use and outside [0, num_pages).
// Both start at ~0 (none). One thread per (b, i) of the block table (per b for a contiguous cache).
__global__ void check_decode_data_kernel(const int32_t* lengths, const int32_t* block_table, DecodeProblem p,
                                         unsigned long long* record) {
  const int64_t per_seq = is_paged(p) ? p.max_pages_per_seq : 1, seqlen_k = p.attention.seqlen_k;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < p.attention.batch * per_seq;
       x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = x / per_seq, i = x % per_seq;
    const int64_t len = lengths ? lengths[b] : seqlen_k;
    if (len < 0 || len > seqlen_k) {
      if (i == 0) atomicMin(&record[0], static_cast<unsigned long long>(b));
      continue;
    }
    if (!is_paged(p) || i >= (len + p.page_size - 1) / p.page_size) continue;  // an entry not in use
    const int32_t page = block_table[b * p.block_table_stride + i];
    if (page < 0 || page >= p.num_pages) atomicMin(&record[1], static_cast<unsigned long long>(x));
  }
}

constexpr unsigned long long kNone = ~0ull;

int32_t read_int(const int32_t* device_ptr) {
  int32_t v = 0;
  CHECK_CUDA(cudaMemcpy(&v, device_ptr, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

std::string validate_device_data(const DecodeProblem& p, const DecodeTensors& t, void* record, cudaStream_t stream) {
  static_assert(kDecodeCheckBytes >= 2 * sizeof(unsigned long long), "the report fits in the checked mode's bytes");
  auto* rec = static_cast<unsigned long long*>(record);
  CHECK_CUDA(cudaMemsetAsync(rec, 0xFF, 2 * sizeof(unsigned long long), stream));
  const int64_t items = p.attention.batch * (is_paged(p) ? p.max_pages_per_seq : 1);
  check_decode_data_kernel<<<grid_stride_blocks(items, 256), 256, 0, stream>>>(t.cache_seqlens, t.block_table, p, rec);
  CHECK_LAUNCH();
  unsigned long long found[2];
  CHECK_CUDA(cudaMemcpyAsync(found, rec, sizeof found, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  if (found[0] != kNone) {
    const int64_t b = int64_t(found[0]);
    return sentence("cache_seqlens[", b, "] is ", read_int(t.cache_seqlens + b), "; it must be between 0 and seqlen_k (",
                    p.attention.seqlen_k, "), the capacity of a sequence");
  }
  if (found[1] != kNone) {
    const int64_t b = int64_t(found[1]) / p.max_pages_per_seq, i = int64_t(found[1]) % p.max_pages_per_seq;
    return sentence("block_table[", b, "][", i, "] is ", read_int(t.block_table + b * p.block_table_stride + i),
                    ", which is not a page of the cache (num_pages is ", p.num_pages, ")");
  }
  return "";
}

}  // namespace fs
