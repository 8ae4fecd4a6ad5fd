// `zeropipe parity`: runs a reference folder (hub config + weights + io.safetensors with expected
// outputs, gradients and a short AdamW trajectory) and reports the relative error of every tensor.
#pragma once
#include <string>

#include "app/parity_report.h"

namespace zp::app {

struct ParityOptions {
  std::string model_dir;
  std::string device = "cpu";  // cpu | cuda
  std::string dtype = "fp32";  // fp32 | bf16 (| fp64 on the cpu)
  AlterResult alter_result;    // for tests: see ParityReport::alter_results
};

// Runs the folder and returns the per-tensor report (printed as it goes when `print`), each tensor
// held by the parity criterion (ParityCriterion::for_dump) and every result the dump holds counted;
// its finish() gives the exit code. Throws zp::Error for a folder it cannot run.
ParityReport run_parity(const ParityOptions& opt, bool print = true);

}  // namespace zp::app
