// Which of a model's blocks train. A LoRA run freezes its base blocks (ParamBlock::freeze: no
// gradients, master weights or optimizer state) and trains its adapter blocks; a full run trains
// every block. The models' block lists, the ZeRO engine and the run's counts select through these.
#pragma once
#include <algorithm>
#include <vector>

#include "nn/parameter.h"

namespace zp::nn {

// The blocks of `blocks` whose frozen() is `frozen`, in order.
inline std::vector<ParamBlock*> blocks_frozen_or_not(const std::vector<ParamBlock*>& blocks, bool frozen) {
  std::vector<ParamBlock*> out;
  std::copy_if(blocks.begin(), blocks.end(), std::back_inserter(out),
               [frozen](const ParamBlock* b) { return b->frozen() == frozen; });
  return out;
}
// Those that train, and those that do not.
inline std::vector<ParamBlock*> trained_blocks(const std::vector<ParamBlock*>& blocks) {
  return blocks_frozen_or_not(blocks, false);
}
inline std::vector<ParamBlock*> frozen_blocks(const std::vector<ParamBlock*>& blocks) {
  return blocks_frozen_or_not(blocks, true);
}

}  // namespace zp::nn
