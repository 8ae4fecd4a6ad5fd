#ifdef ZP_WITH_CUDA
#include "core/cuda_check.h"

#include <cublas_api.h>
#include <cudnn.h>
#include <nccl.h>

namespace zp {
const char* cublas_status_string(int s) { return cublasGetStatusString(cublasStatus_t(s)); }
const char* cudnn_status_string(int s) { return cudnnGetErrorString(cudnnStatus_t(s)); }
const char* nccl_status_string(int s) { return ncclGetErrorString(ncclResult_t(s)); }
}  // namespace zp
#endif
