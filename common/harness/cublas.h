// Checking cuBLAS calls: CHECK_CUBLAS(cublasSgemm(...)) throws fs::CudaError naming the call.
#pragma once

#include <cublas_v2.h>

#include "step/device.h"

namespace fs {

inline void check_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(sentence(file, ":", line, ": ", expr, " failed: ", cublasGetStatusName(st), " (",
                           cublasGetStatusString(st), ")"));
}

}  // namespace fs

#define CHECK_CUBLAS(expr) ::fs::check_cublas((expr), #expr, __FILE__, __LINE__)
