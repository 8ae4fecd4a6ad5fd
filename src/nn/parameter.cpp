#include "nn/parameter.h"

#include <algorithm>

namespace zp::nn {

Parameter* ParamBlock::add(const std::string& name, Shape shape, bool decay, bool packed) {
  ZP_CHECK(!values_.defined(), "block ", name_, ": parameter ", name, " added after allocate()");
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->shape = std::move(shape);
  p->decay = decay;
  p->frozen = frozen_;
  p->offset = packed ? numel_ : (numel_ + kAlign - 1) / kAlign * kAlign;
  numel_ = p->offset + p->numel();
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamBlock::freeze() {
  frozen_ = true;
  for (auto& p : params_) p->frozen = true;
}

void ParamBlock::layout(Device dev, DType dt, int64_t pad_multiple) {
  const int64_t m = std::max<int64_t>(kAlign, pad_multiple);
  padded_ = (numel_ + m - 1) / m * m;
  dev_ = dev;
  dt_ = dt;
}

void ParamBlock::allocate(Device dev, DType dt, StreamHandle s, int64_t pad_multiple) {
  layout(dev, dt, pad_multiple);
  bind_values(Tensor::zeros({padded_}, dt, dev, "params", s));
  bind_grads(Tensor::zeros({padded_}, DType::F32, dev, "grads", s));
}

void ParamBlock::bind_values(Tensor full) {
  ZP_CHECK(!full.defined() || (full.numel() == padded_ && full.dtype() == dt_), "block ", name_, ": binding ",
           full.str(), " as values of ", padded_, " ", dtype_name(dt_));
  values_ = std::move(full);
  for (auto& p : params_) p->value = values_.defined() ? values_.flat(p->offset, p->numel()).view(p->shape) : Tensor();
}

void ParamBlock::bind_grads(Tensor full) {
  ZP_CHECK(!full.defined() || (full.numel() == padded_ && full.dtype() == DType::F32), "block ", name_,
           ": binding ", full.str(), " as gradients of ", padded_);
  grads_ = std::move(full);
  for (auto& p : params_) p->grad = grads_.defined() ? grads_.flat(p->offset, p->numel()).view(p->shape) : Tensor();
}

std::vector<Parameter*> parameters_of(const std::vector<ParamBlock*>& blocks) {
  std::vector<Parameter*> ps;
  for (ParamBlock* b : blocks)
    for (const auto& p : b->params()) ps.push_back(p.get());
  return ps;
}

Parameter* find_parameter(const std::vector<ParamBlock*>& blocks, const std::string& name) {
  for (ParamBlock* b : blocks)
    for (const auto& p : b->params())
      if (p->name == name) return p.get();
  return nullptr;
}

}  // namespace zp::nn
