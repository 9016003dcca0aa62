// How the C ABI (common/harness/c_api.cpp) answers an exception: one status and one sentence. Declared here so
// that the CPU tests can check the mapping without a GPU.
#pragma once

#include <string>

#include "flash_steps.h"

namespace fs {

// Call inside a catch block: the status of the exception being handled and its message.
//   fs::OutOfMemory, std::bad_alloc   FS_ERR_OUT_OF_MEMORY (device memory: the bytes asked)
//   fs::CudaError                     FS_ERR_CUDA
//   fs::Error (a refusal)             FS_ERR_INVALID
//   anything else                     FS_ERR_INTERNAL
fs_status status_of_current_exception(std::string& message);

}  // namespace fs
