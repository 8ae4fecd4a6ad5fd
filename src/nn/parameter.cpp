#include "nn/parameter.h"

namespace zp::nn {

Parameter* ParamBlock::add(const std::string& name, Shape shape, bool decay, bool packed) {
  ZP_CHECK(!values_.defined(), "block ", name_, ": parameter ", name, " added after allocate()");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->shape = std::move(shape);
  p->decay = decay;
  p->offset = packed ? numel_ : (numel_ + kAlign - 1) / kAlign * kAlign;
  numel_ = p->offset + p->numel();
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamBlock::allocate(Device dev, DType dt, StreamHandle s) {
  int64_t n = (numel_ + kAlign - 1) / kAlign * kAlign;
  values_ = Tensor::zeros({n}, dt, dev, "params", s);
  grads_ = Tensor::zeros({n}, DType::F32, dev, "grads", s);
  for (auto& p : params_) {
    p->value = values_.flat(p->offset, p->numel()).view(p->shape);
    p->grad = grads_.flat(p->offset, p->numel()).view(p->shape);
  }
}

}  // namespace zp::nn
