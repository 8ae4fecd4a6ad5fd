// The identity of a LoRA run's frozen base weights, recorded in its checkpoints so that resuming the
// adapters on another base fails naming both (issue 14). A hash of every frozen parameter's name and
// shape and of a strided sample of its values, each rounded to bf16 first so the same weights loaded
// as f32 or bf16 give the same fingerprint. Parameters combine by XOR: the order blocks are filled in
// does not matter, and pipeline stages' parts combine the same way.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "nn/parameter.h"

namespace zp::runtime {

class BaseFingerprint {
 public:
  // Every `kStride`-th element of each parameter is sampled (and always the first and the last).
  static constexpr int64_t kStride = 251;
  // Adds `b`'s parameters (their values bound: during the engine's fill). Copies the block to the host.
  void add(const nn::ParamBlock& b, StreamHandle s);
  // Combines another part (another pipeline stage's).
  void combine(uint64_t other) { h_ ^= other; }
  // The whole base's from every pipeline stage's part: every rank's of `stages` (the pipeline group)
  // combined, on every rank. Collective over `stages`.
  BaseFingerprint combined_over(MPI_Comm stages) const;
  uint64_t value() const { return h_; }
  std::string hex() const;

 private:
  uint64_t h_ = 0;
};

}  // namespace zp::runtime
