// What every module's forward and backward run with: the device, the stream and the compute dtype.
#pragma once
#include "core/tensor.h"

namespace zp::nn {

struct Ctx {
  Device dev;
  StreamHandle s = nullptr;
  DType dt = DType::F32;
  // Activation memory (tagged so the allocator's statistics show it apart from parameters).
  Tensor act(const Shape& shape) const { return Tensor::empty(shape, dt, dev, "activations", s); }
  Tensor act(const Shape& shape, DType t) const { return Tensor::empty(shape, t, dev, "activations", s); }
};

}  // namespace zp::nn
