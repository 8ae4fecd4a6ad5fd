#include "models/unet_init.h"

#include "nn/init.h"

namespace zp::models {

void init_unet_block_random(nn::ParamBlock& b, uint64_t seed, double std, StreamHandle s) {
  for (auto& p : b.params()) {
    if (init_lora_parameter(*p, seed, s)) continue;  // LoRA's A and B: PEFT's start
    if (p->shape.size() == 1)  // every 1-d weight is a norm's scale; the rest are biases
      nn::init_constant(*p, p->name.ends_with(".weight") ? 1.f : 0.f, s);
    else
      nn::init_normal(*p, seed, std, s);
  }
}

void init_unet_random(UNet& m, uint64_t seed, double std) {
  for (nn::ParamBlock* b : m.blocks()) init_unet_block_random(*b, seed, std, m.ctx().s);
}

}  // namespace zp::models
