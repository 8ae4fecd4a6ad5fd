// Checked CUDA-family calls (CUDA runtime, cuBLAS/cuBLASLt, cuDNN, NCCL). Only for .cu files and
// CUDA-aware .cpp files compiled with ZP_WITH_CUDA.
#pragma once
#include <cuda_runtime.h>
#include "core/error.h"

#define ZP_CUDA_CHECK(call)                                                        \
  do {                                                                             \
    cudaError_t zp_e_ = (call);                                                    \
    if (zp_e_ != cudaSuccess) ZP_FATAL(#call ": ", cudaGetErrorName(zp_e_), ": ", cudaGetErrorString(zp_e_)); \
  } while (0)
#define ZP_CUDA_LAUNCH_CHECK() ZP_CUDA_CHECK(cudaGetLastError())

#define ZP_CUBLAS_CHECK(call)                                                      \
  do {                                                                             \
    int zp_s_ = int(call);                                                         \
    if (zp_s_ != 0) ZP_FATAL(#call ": cuBLAS status ", zp_s_, " (", ::zp::cublas_status_string(zp_s_), ")"); \
  } while (0)
#define ZP_CUDNN_CHECK(call)                                                       \
  do {                                                                             \
    int zp_s_ = int(call);                                                         \
    if (zp_s_ != 0) ZP_FATAL(#call ": cuDNN: ", ::zp::cudnn_status_string(zp_s_)); \
  } while (0)
#define ZP_NCCL_CHECK(call)                                                        \
  do {                                                                             \
    int zp_s_ = int(call);                                                         \
    if (zp_s_ != 0) ZP_FATAL(#call ": NCCL: ", ::zp::nccl_status_string(zp_s_));   \
  } while (0)

namespace zp {
const char* cublas_status_string(int s);
const char* cudnn_status_string(int s);
const char* nccl_status_string(int s);
}  // namespace zp
