// The tensor-core (FlashAttention-2) path of attention_forward / attention_backward, used by
// kernels/cuda/attention.cu when attention_uses_flash() (kernels/attention.h) says it applies and every
// pointer is 16-byte aligned. Same arguments and results as the general kernels, with the row strides
// already resolved (never 0), and segments (packed sequences) as kernels/attention.h describes them.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "core/device.h"
#include "core/dtype.h"

namespace zp::kernels::cuda {

// Every pointer 16-byte aligned (cp.async and the vector stores move 16 bytes at a time).
bool flash_attention_aligned(std::initializer_list<const void*> ptrs);

void flash_attention_forward(StreamHandle s, DType dt, void* out, float* lse, const void* q, const void* k,
                             const void* v, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                             int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale,
                             bool causal, const int32_t* segments);

void flash_attention_backward(StreamHandle s, DType dt, void* dq, void* dk, void* dv, const void* dout,
                              const void* q, const void* k, const void* v, const void* out, const float* lse,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                              int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t o_stride, float scale,
                              bool causal, const int32_t* segments);

}  // namespace zp::kernels::cuda
