// Step 07: the kernels of the 128-wide tile configurations of traits.h, fp16 and bf16. One file
// per tile width, so that the instantiations compile in parallel.
#include "flash_attention2.cuh"

namespace fs::fa2 {

template void launch_config<kD128_S2, __half>(const Problem&, const Tensors&, cudaStream_t);
template void launch_config<kD128_S2, __nv_bfloat16>(const Problem&, const Tensors&, cudaStream_t);
template void launch_config<kD128_S1, __half>(const Problem&, const Tensors&, cudaStream_t);
template void launch_config<kD128_S1, __nv_bfloat16>(const Problem&, const Tensors&, cudaStream_t);

}  // namespace fs::fa2
