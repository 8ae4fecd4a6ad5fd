// Conventions shared by every op family (see kernels/README.md).
//
// Each op is declared once, in kernels/<family>.h, inside ZP_KERNEL(...): that one declaration
// produces zp::kernels::cpu::op (defined in kernels/cpu/<family>.cpp, the plain readable reference)
// and zp::kernels::cuda::op (kernels/cuda/<family>.cu, the fast version). Both take the same
// arguments; the CPU version ignores the stream. Callers pick one with ZP_KERNEL_CALL(device, op, ...).
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/host_ops.h"

#ifdef ZP_WITH_CUDA
#define ZP_KERNEL(...)   \
  namespace cpu {        \
  __VA_ARGS__;           \
  }                      \
  namespace cuda {       \
  __VA_ARGS__;           \
  }
#else
// A CPU-only build has no CUDA kernels, but code that names them (the GPU tests, which skip without a
// device) still links: each cuda::op is defined to fail if it is ever called.
#define ZP_KERNEL(...)                                                                \
  namespace cpu {                                                                     \
  __VA_ARGS__;                                                                        \
  }                                                                                   \
  namespace cuda {                                                                    \
  [[noreturn]] inline __VA_ARGS__ { ZP_FATAL("a CUDA kernel called in a CPU-only build"); } \
  }
#endif

#ifdef ZP_WITH_CUDA
// ZP_HOST_OPS (core/host_ops.h) may send a CUDA run's op to its CPU reference, to bisect a GPU-only
// numerical difference; unset, that test is a call that reads one flag.
#define ZP_KERNEL_CALL(dev, op, ...)                                                   \
  ((dev).is_cuda() && !::zp::runs_on_host(#op) ? ::zp::kernels::cuda::op(__VA_ARGS__) \
                                              : ::zp::kernels::cpu::op(__VA_ARGS__))
#else
#define ZP_KERNEL_CALL(dev, op, ...) \
  ((dev).is_cuda() ? ZP_FATAL("CUDA op " #op " in a CPU-only build") : ::zp::kernels::cpu::op(__VA_ARGS__))
#endif

// Dispatch a floating dtype to a C++ element type T (host types: double, float, zp::bf16, zp::f16).
#define ZP_DISPATCH_FLOAT(dt, T, ...)                                          \
  [&] {                                                                        \
    switch (dt) {                                                              \
      case ::zp::DType::F64: { using T = double; return __VA_ARGS__(); }       \
      case ::zp::DType::F32: { using T = float; return __VA_ARGS__(); }        \
      case ::zp::DType::BF16: { using T = ::zp::bf16; return __VA_ARGS__(); }  \
      case ::zp::DType::F16: { using T = ::zp::f16; return __VA_ARGS__(); }    \
      default: ZP_FATAL("unsupported dtype ", ::zp::dtype_name(dt), " for a float op"); \
    }                                                                          \
  }()
