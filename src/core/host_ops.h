// ZP_HOST_OPS: a diagnostic for a difference that only a GPU run shows. It names op families
// ("groupnorm_backward,gemm", or "all") whose CPU reference runs in place of the CUDA kernel inside a
// CUDA run, so one run per family tells which kernel makes the GPU's numbers differ from the CPU's.
// The CPU reference reads and writes the run's device buffers in place, so while ZP_HOST_OPS is set
// the device allocator hands out managed memory (readable from the host), and each host op waits for
// the device first. Slow, never for training; a CUDA graph cannot be captured while it is set.
#pragma once

namespace zp {

// Whether ZP_HOST_OPS is set at all (the device allocator then allocates managed memory).
bool host_ops_enabled();
// Whether `op` (its name in kernels/<family>.h) runs its CPU reference in a CUDA run. When it does,
// the device has finished everything enqueued before this returns.
bool runs_on_host(const char* op);

}  // namespace zp
