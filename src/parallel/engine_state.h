// How checkpoints (runtime/checkpoint.h) read and write a ZeRO engine's state without knowing how it
// is sharded or where it lives: the engine visits its blocks, and for each one says which elements
// of the block's flat buffer this rank keeps state for and copies that state to and from host
// memory through the optimizer's state store, whatever its tier.
#pragma once
#include <cstdint>
#include <functional>

#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

// The compute weights of a range where they lag the master weights (the delayed update,
// parallel/delayed_update.h: the next step computes with the weights of one update before), widened
// to fp32 on the way out and rounded to the compute dtype on the way in; offsets relative to the range.
class LaggingWeights {
 public:
  virtual ~LaggingWeights() = default;
  virtual void read(size_t range, int64_t offset, int64_t count, float* host) = 0;
  virtual void write(size_t range, int64_t offset, int64_t count, const float* host) = 0;
};

class BlockState {
 public:
  BlockState(const OwnedRange& owned, int64_t shard_begin, int64_t shard_end, OptimizerStateStore& store,
             size_t range, StreamHandle s, LaggingWeights* lagging = nullptr)
      : owned_(owned), shard_begin_(shard_begin), shard_end_(shard_end), store_(store), range_(range), s_(s),
        lagging_(lagging) {}

  // The block: its parameters (names, shapes, offsets in the flat buffer) and padded size.
  const nn::ParamBlock& block() const { return *owned_.block; }
  // The elements [begin, end) of the block's flat buffer whose optimizer state this rank keeps (all
  // of them when the optimizer state is not sharded).
  int64_t owned_begin() const { return owned_.begin; }
  int64_t owned_end() const { return owned_.end; }
  // This rank's 1/N of the block: inside the owned elements at every stage, and the ranks' shards
  // partition the block, so writing only these writes every element exactly once.
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }

  // Elements [begin, begin + count) of the block's flat buffer, which must be owned, copied from or
  // into `host`; `host` may be reused when the call returns. Writing master weights makes the engine
  // rewrite the compute weights from them after the visit.
  void read(OptimizerState which, int64_t begin, int64_t count, float* host) const {
    check(begin, count);
    store_.read(range_, which, begin - owned_.begin, count, host, s_);
  }
  void write(OptimizerState which, int64_t begin, int64_t count, const float* host) {
    check(begin, count);
    store_.write(range_, which, begin - owned_.begin, count, host, s_);
    written_ = written_ || which == OptimizerState::Master;
  }
  bool master_written() const { return written_; }

  // With the delayed update: the weights the next step computes with, which are not the master
  // weights' (see LaggingWeights), read and written like the states above. Writing them keeps
  // them as the compute weights after a master-weight write, instead of the master weights'.
  bool has_lagging_weights() const { return lagging_ != nullptr; }
  void read_lagging_weights(int64_t begin, int64_t count, float* host) const {
    check(begin, count);
    ZP_CHECK(lagging_, "block ", owned_.block->name(), ": no lagging weights (no delayed update)");
    lagging_->read(range_, begin - owned_.begin, count, host);
  }
  void write_lagging_weights(int64_t begin, int64_t count, const float* host) {
    check(begin, count);
    ZP_CHECK(lagging_, "block ", owned_.block->name(), ": no lagging weights (no delayed update)");
    lagging_->write(range_, begin - owned_.begin, count, host);
    lagging_written_ = true;
  }
  bool lagging_written() const { return lagging_written_; }

 private:
  void check(int64_t begin, int64_t count) const {
    ZP_CHECK(begin >= owned_.begin && count >= 0 && begin + count <= owned_.end, "block ", owned_.block->name(),
             ": elements [", begin, ", ", begin + count, ") are not inside the owned [", owned_.begin, ", ",
             owned_.end, ")");
  }
  OwnedRange owned_;
  int64_t shard_begin_, shard_end_;
  OptimizerStateStore& store_;
  size_t range_;
  StreamHandle s_;
  LaggingWeights* lagging_;
  bool written_ = false, lagging_written_ = false;
};

// Called once per block, in block order.
using EngineStateVisitor = std::function<void(BlockState&)>;

}  // namespace zp::parallel
