// Token embedding lookup, optionally plus learned absolute positions (GPT-2's wte + wpe).
//
// ids[N] are the tokens of N = B * T rows laid out batch-major, so row r is at position
// pos_offset + r % T (pos_offset > 0 when generating with a KV cache: the rows are the new tokens).
// pos_table may be nullptr (Llama, Qwen2: positions come from RoPE); then T and pos_offset are unused.
// `positions` (int32 [N], optional) gives each row's position instead (packed sequences whose
// positions restart at each record); each must lie below pos_table's rows, which the kernels do not know.
//
// Token ids must lie in [0, V). The CPU version checks them (ZP_CHECK); the CUDA version trusts the
// caller (the data loader and the sampler produce ids below the vocabulary size) and an id out of
// range there reads or writes out of bounds.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// y[N, C] = table[ids[r], :] (+ pos_table[pos_offset + r % T, :])
ZP_KERNEL(void embedding_forward(StreamHandle s, DType dt, void* y, const int32_t* ids, const void* table,
                                 int64_t N, int64_t C, int64_t V, const void* pos_table, int64_t T,
                                 int64_t pos_offset, const int32_t* positions = nullptr))

// dtable[V, C] += scatter of dy[N, C] by ids; dpos_table[., C] += dy summed over rows of one
// position (skipped when dpos_table is nullptr). Both gradients are fp32 and accumulate.
// CUDA: dtable is accumulated with fp32 atomics, so its bits may vary from run to run when a token
// repeats (order of the additions); dpos_table is reduced without atomics and is deterministic.
ZP_KERNEL(void embedding_backward(StreamHandle s, DType dt, float* dtable, float* dpos_table, const void* dy,
                                  const int32_t* ids, int64_t N, int64_t C, int64_t V, int64_t T,
                                  int64_t pos_offset, const int32_t* positions = nullptr))

}  // namespace zp::kernels
