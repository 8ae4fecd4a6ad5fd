// `zeropipe parity`: runs a reference folder (hub config + weights + io.safetensors with expected
// outputs, gradients and a short AdamW trajectory) and reports the relative error of every tensor.
#pragma once
#include <string>

namespace zp::app {

struct ParityOptions {
  std::string model_dir;
  std::string device = "cpu";  // cpu | cuda
  std::string dtype = "fp32";  // fp32 | bf16
};

// Returns the process exit code: 0 when every tensor is within tolerance, 1 when one is not.
// Throws zp::Error for a folder it cannot run.
int run_parity(const ParityOptions& opt);

}  // namespace zp::app
