// Host memory for the offload tiers (DeepSpeed's pin_memory): page-locked when asked and possible, so
// that copies to and from the GPU run asynchronously at full PCIe speed; pageable otherwise. Pinning
// can fail (a locked-memory limit, RAM the kernel will not lock): then the tiers still work, slower,
// and the first refusal warns once and turns `pinned` false so later buffers do not ask again.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace zp::parallel {

// A host buffer of `n` zeroed elements of `dt`. `what` names it in the warning ("the optimizer state").
Tensor host_buffer(int64_t n, DType dt, bool& pinned, const char* tag, const char* what);

}  // namespace zp::parallel
