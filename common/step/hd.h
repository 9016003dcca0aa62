// FS_HD marks the small index helpers that kernels and CPU code share (the CPU tests include them).
#pragma once

#ifdef __CUDACC__
#define FS_HD __host__ __device__
#else
#define FS_HD
#endif
