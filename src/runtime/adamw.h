// AdamW over a model's parameter blocks on one rank: fp32 master weights (a separate copy when the
// compute dtype is not fp32, else the compute buffer itself) and fp32 moments, one fused multi-tensor
// kernel launch per step. The ZeRO stages shard exactly this state across ranks (src/parallel).
#pragma once
#include <vector>

#include "kernels/adamw.h"
#include "nn/parameter.h"

namespace zp::runtime {

struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decay_all = false;  // apply weight decay to every parameter, not only those marked `decay`
};

class AdamW {
 public:
  AdamW(std::vector<nn::ParamBlock*> blocks, const AdamWHyper& h, StreamHandle s = nullptr);
  // One update from the blocks' gradients, multiplied by grad_scale first; lr overrides the base rate
  // (schedules) when >= 0. Copies the new weights into the compute buffers.
  void step(float grad_scale = 1.f, double lr = -1.0);
  int64_t steps() const { return step_; }
  AdamWHyper& hyper() { return h_; }

 private:
  struct BlockState {
    nn::ParamBlock* block;
    Tensor master, m, v;  // fp32, the block's flat size; master undefined when compute is fp32
  };
  std::vector<BlockState> state_;
  std::vector<kernels::AdamWTensor> tensors_;
  AdamWHyper h_;
  StreamHandle s_;
  int64_t step_ = 0;
};

}  // namespace zp::runtime
