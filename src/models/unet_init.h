// From-scratch initialisation of the UNet (models/unet.h): conv and linear weights Normal(0, std),
// norm weights 1, biases 0, each value depending only on (seed, parameter name, element) (nn/init.h),
// so a rank fills its blocks alike at any world size.
#pragma once
#include <cstdint>

#include "models/unet.h"
#include "nn/parameter.h"

namespace zp::models {

void init_unet_random(UNet& m, uint64_t seed, double std);
// One block of init_unet_random: the ZeRO engine allocates and fills blocks one at a time.
void init_unet_block_random(nn::ParamBlock& b, uint64_t seed, double std, StreamHandle s);

}  // namespace zp::models
