// `zeropipe parity` for a diffusers UNet folder (config.json with "_class_name":
// "UNet2DConditionModel", diffusion_pytorch_model.safetensors, io.safetensors): one forward on the
// reference inputs and one backward of sum(output * grad_output), compared tensor by tensor.
#pragma once
#include <string>

#include "app/parity_report.h"
#include "core/device.h"
#include "core/dtype.h"

namespace zp::app {

// Checks output.sample, grad_input.sample and every grad.<param> by the parity criterion
// (ParityCriterion::for_dump), every result the dump holds counted, printing as it goes when `print`;
// `alter_result` is for tests (ParityReport::alter_results). Throws zp::Error for a folder it cannot run.
ParityReport run_unet_parity(const std::string& dir, Device dev, DType dt, bool print = true,
                             const AlterResult& alter_result = {});
// The same with LoRA: `lora_dir` (<dir>/lora, tests/reference/lora_golden_reference.py) holds the
// LoRA settings (lora.json), the adapters' values and the expected output, input gradient and
// adapter gradients on `dir`'s inputs; the base is frozen.
ParityReport run_unet_parity(const std::string& dir, const std::string& lora_dir, Device dev, DType dt,
                             bool print = true, const AlterResult& alter_result = {});

}  // namespace zp::app
