// The UNet's training FLOPs, for the progress line's MFU and the benchmarks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/unet.h"

namespace zp::models {

// FLOPs of one training step per sample of H x W latents with L text tokens: every conv and linear
// weight times the positions it slides over (twice: multiply and add) for the forward, as much again
// for the input gradient and, unless the weight is frozen (a LoRA run's base), as much again for its
// weight gradient; LoRA's adapters are weights like any other, on their module's positions (A has
// the base's kernel and stride, B is 1x1 on the output). Attention's scores and weighted values
// count three times (forward and backward). Norms and elementwise ops are not counted, nor what the
// backward recomputes (checkpointed layers, the adapters' u).
double unet_train_flops_per_sample(UNet& m, int64_t H, int64_t W, int64_t L);
// The same for some of the model's parameters (one block's: a pipeline chunk's cost).
double unet_train_flops_per_sample(const UNetConfig& cfg, const std::vector<nn::Parameter*>& params, int64_t H,
                                   int64_t W, int64_t L);

// The positions (pixels, or 1 for the per-sample embeddings) weight `name` slides over for H x W
// latents: its resolution level's size.
double unet_weight_positions(const UNetConfig& cfg, const std::string& name, int64_t H, int64_t W);

}  // namespace zp::models
