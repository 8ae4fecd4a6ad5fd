// What every module's forward and backward run with: the device, the stream and the compute dtype.
#pragma once
#include "core/tensor.h"

namespace zp::nn {

struct Ctx {
  Device dev;
  StreamHandle s = nullptr;
  DType dt = DType::F32;
  // The allocator tag of what a module's forward keeps in its Saved for the backward. By default it
  // is activation memory like any other; a model whose forward keeps Saved past the call (for a later
  // backward) names it apart (models/transformer.h: "saved_activations"), so the allocator's
  // per-tag statistics show what a forward keeps separately from transient memory.
  const char* saved_tag = "activations";
  // Activation memory (tagged so the allocator's statistics show it apart from parameters).
  Tensor act(const Shape& shape) const { return Tensor::empty(shape, dt, dev, "activations", s); }
  Tensor act(const Shape& shape, DType t) const { return Tensor::empty(shape, t, dev, "activations", s); }
  // Memory of a module's Saved (tagged saved_tag).
  Tensor saved(const Shape& shape) const { return Tensor::empty(shape, dt, dev, saved_tag, s); }
  Tensor saved(const Shape& shape, DType t) const { return Tensor::empty(shape, t, dev, saved_tag, s); }
};

}  // namespace zp::nn
