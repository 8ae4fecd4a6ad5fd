// How a model tells the parallel engine that it is about to use a parameter block, and when it is
// done with it (DESIGN decision 1: explicit forward/backward, so the model knows exactly when a
// block starts and ends). Calls nest: acquire/release are reference counted by the implementation,
// so a block used twice (a tied embedding, used by the input lookup and by the output head) stays
// available until its last release. The default does nothing: every block is always resident.
#pragma once
#include <optional>

#include "nn/parameter.h"

namespace zp::nn {

class BlockAccess {
 public:
  virtual ~BlockAccess() = default;
  // The block's values are needed (ZeRO-3 gathers them).
  virtual void acquire_params(ParamBlock&) {}
  virtual void release_params(ParamBlock&) {}
  // Gradients are about to accumulate into the block (ZeRO-2/3 provide a full-size buffer), and are
  // complete (ZeRO-2/3 reduce-scatter them into the owner's shard and free the buffer).
  virtual void acquire_grads(ParamBlock&) {}
  virtual void release_grads(ParamBlock&) {}
};

// Acquires on construction, releases on destruction.
class ParamsInUse {
 public:
  ParamsInUse(BlockAccess* a, ParamBlock& b) : a_(a), b_(b) { if (a_) a_->acquire_params(b_); }
  ~ParamsInUse() { if (a_) a_->release_params(b_); }
  ParamsInUse(const ParamsInUse&) = delete;
  ParamsInUse& operator=(const ParamsInUse&) = delete;

 private:
  BlockAccess* a_;
  ParamBlock& b_;
};

class GradsInUse {
 public:
  GradsInUse(BlockAccess* a, ParamBlock& b) : a_(a), b_(b) { if (a_) a_->acquire_grads(b_); }
  ~GradsInUse() { if (a_) a_->release_grads(b_); }
  GradsInUse(const GradsInUse&) = delete;
  GradsInUse& operator=(const GradsInUse&) = delete;

 private:
  BlockAccess* a_;
  ParamBlock& b_;
};

// A layer's block and, with LoRA, its adapter block (nullptr without), in use together for a forward;
// with `grads`, for a backward too: the adapters' gradients, and the block's unless it is frozen (a
// LoRA base takes none). Acquired adapters first, released in the reverse order.
class AdaptedBlockInUse {
 public:
  AdaptedBlockInUse(BlockAccess* a, ParamBlock& block, ParamBlock* adapters, bool grads = false)
      : block_(a, block) {
    if (adapters) {
      adapters_.emplace(a, *adapters);
      if (grads) adapter_grads_.emplace(a, *adapters);
    }
    if (grads && !block.frozen()) grads_.emplace(a, block);
  }

 private:
  ParamsInUse block_;
  std::optional<ParamsInUse> adapters_;
  std::optional<GradsInUse> grads_, adapter_grads_;  // released adapters' first, as declared last
};

}  // namespace zp::nn
