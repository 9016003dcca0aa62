// Step 07: the kernels of the 96-wide tile configurations of traits.h, fp16 and bf16. One file
// per tile width, so that the instantiations compile in parallel.
#include "flash_attention2.cuh"

namespace fs::fa2 {

template void launch_config<kD96, __half>(const Problem&, const Tensors&, cudaStream_t);
template void launch_config<kD96, __nv_bfloat16>(const Problem&, const Tensors&, cudaStream_t);

}  // namespace fs::fa2
