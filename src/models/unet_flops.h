// The UNet's training FLOPs, for the progress line's MFU and the benchmarks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/unet.h"

namespace zp::models {

// FLOPs of one training step (forward + backward = 3 x forward) per sample of H x W latents with L
// text tokens: every conv and linear weight times the positions it slides over (twice: multiply and
// add), plus attention's scores and weighted values. Norms and elementwise ops are not counted.
double unet_train_flops_per_sample(UNet& m, int64_t H, int64_t W, int64_t L);
// The same for some of the model's parameters (one block's: a pipeline chunk's cost).
double unet_train_flops_per_sample(const UNetConfig& cfg, const std::vector<nn::Parameter*>& params, int64_t H,
                                   int64_t W, int64_t L);

// The positions (pixels, or 1 for the per-sample embeddings) weight `name` slides over for H x W
// latents: its resolution level's size.
double unet_weight_positions(const UNetConfig& cfg, const std::string& name, int64_t H, int64_t W);

}  // namespace zp::models
