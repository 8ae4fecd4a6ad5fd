// Pointwise activations: GELU (tanh or erf form), SiLU, and the gated units SwiGLU and GEGLU.
// n is an element count; the packed gated variants read a fused projection output x[rows, 2*D].
// Every op may run in place (an output may alias an input of the same shape): each element is read
// before it is written, by the same thread.
#pragma once
#include "kernels/kernel.h"

namespace zp::kernels {

// Tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (GPT-2 "gelu_new", PyTorch approximate="tanh")
// Erf:  0.5 x (1 + erf(x / sqrt(2)))                     (PyTorch default, diffusers GEGLU)
enum class GeluKind { Tanh, Erf };

ZP_KERNEL(void gelu_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t n, GeluKind kind))
// dx = dy * gelu'(x)
ZP_KERNEL(void gelu_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t n,
                             GeluKind kind))

// y = x * sigmoid(x)
ZP_KERNEL(void silu_forward(StreamHandle s, DType dt, void* y, const void* x, int64_t n))
// dx = dy * silu'(x)
ZP_KERNEL(void silu_backward(StreamHandle s, DType dt, void* dx, const void* dy, const void* x, int64_t n))

// SwiGLU with the two halves in separate arrays (Llama: gate_proj and up_proj are separate weights):
// y = silu(gate) * up.
ZP_KERNEL(void swiglu_forward(StreamHandle s, DType dt, void* y, const void* gate, const void* up, int64_t n))
// dgate = dy * up * silu'(gate), dup = dy * silu(gate)  (both written)
ZP_KERNEL(void swiglu_backward(StreamHandle s, DType dt, void* dgate, void* dup, const void* dy,
                               const void* gate, const void* up, int64_t n))

// SwiGLU on a fused [gate | up] projection: x[rows, 2D] holds gate in columns [0, D) and up in
// columns [D, 2D) of each row; y[rows, D] = silu(gate) * up.
ZP_KERNEL(void swiglu_forward_packed(StreamHandle s, DType dt, void* y, const void* x, int64_t rows, int64_t D))
// dx[rows, 2D] = [dgate | dup]  (written)
ZP_KERNEL(void swiglu_backward_packed(StreamHandle s, DType dt, void* dx, const void* dy, const void* x,
                                      int64_t rows, int64_t D))

// GEGLU as diffusers computes it: `hidden, gate = proj(x).chunk(2, dim=-1); y = hidden * gelu(gate)`
// with the erf GELU. x[rows, 2D] holds hidden in columns [0, D) and gate in columns [D, 2D)
// (note: the gated half comes second here, unlike the packed SwiGLU above).
ZP_KERNEL(void geglu_forward_packed(StreamHandle s, DType dt, void* y, const void* x, int64_t rows, int64_t D))
// dx[rows, 2D] = [dhidden | dgate]  (written)
ZP_KERNEL(void geglu_backward_packed(StreamHandle s, DType dt, void* dx, const void* dy, const void* x,
                                     int64_t rows, int64_t D))

}  // namespace zp::kernels
