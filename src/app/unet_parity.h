// `zeropipe parity` for a diffusers UNet folder (config.json with "_class_name":
// "UNet2DConditionModel", diffusion_pytorch_model.safetensors, io.safetensors): one forward on the
// reference inputs and one backward of sum(output * grad_output), compared tensor by tensor.
#pragma once
#include <string>

#include "app/parity_report.h"
#include "core/device.h"
#include "core/dtype.h"

namespace zp::app {

// Checks output.sample, grad_input.sample and every grad.<param> (tolerance 3e-2 in bf16, else 1e-4),
// printing as it goes when `print`. Throws zp::Error for a folder it cannot run.
ParityReport run_unet_parity(const std::string& dir, Device dev, DType dt, bool print = true);

}  // namespace zp::app
