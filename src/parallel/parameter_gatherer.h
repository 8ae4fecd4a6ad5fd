// ZeRO-3's parameter side (DESIGN decision 2): each rank keeps only its contiguous 1/N slice of every
// block's compute weights; acquiring a block all-gathers it into a temporary full buffer bound to
// the block, and the last release frees it. The next block's gather is issued as soon as the
// current one is acquired, on the communication stream (so it overlaps the current block's
// compute), in the order blocks were acquired in the previous step; a prefetch is dropped when the
// weights change (drop_prefetches(): before an update, at the start of a step).
//
// It implements nn::BlockAccess's parameter half by itself, so a pipeline stage or an inference run
// can serve a model's forward from sharded weights without the rest of the ZeRO engine; the
// engine composes it with the gradient reducer and the optimizer.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "nn/block_access.h"
#include "parallel/collective_stream.h"

namespace zp::parallel {

class ParameterGatherer : public nn::BlockAccess {
 public:
  // `dp` may be nullptr (a single rank: acquiring copies the one shard). `comm` orders the gathers
  // and must outlive the gatherer.
  ParameterGatherer(comm::Communicator* dp, CollectiveStream& comm);
  ~ParameterGatherer() override;

  // Shards `b`: keeps this rank's slice of its current values (bound, padded to a multiple of
  // shard_pad_multiple(world)) and unbinds the full buffer, which frees it. Blocks are numbered in
  // the order they are added.
  void add(nn::ParamBlock& b);
  size_t size() const { return blocks_.size(); }
  // Block i's owned slice of the compute weights: where its optimizer writes the updated weights.
  Tensor& shard(size_t i) { return blocks_.at(i).shard; }

  void acquire_params(nn::ParamBlock& b) override;
  void release_params(nn::ParamBlock& b) override;

  // The block order of the last step (forward, backward, any evaluation) predicts this one's.
  void begin_step();
  // Waits (on the compute stream) for every gather in flight and frees its buffer.
  void drop_prefetches();

 private:
  struct Sharded {
    nn::ParamBlock* block;
    int64_t shard_size;                  // elements per rank
    Tensor shard;                        // the owned slice of the compute weights
    int refs = 0;
    Tensor prefetched;                   // a full buffer being gathered on the comm stream
    std::shared_ptr<Event> prefetch_done;  // recorded on the comm stream after that gather
  };
  Sharded& of(nn::ParamBlock& b);
  void prefetch(Sharded& u);
  comm::Communicator* dp_;
  CollectiveStream& comm_;
  StreamHandle s_;
  int world_ = 1, rank_ = 0;
  std::vector<Sharded> blocks_;
  std::vector<Sharded*> gather_order_, this_step_order_;
  size_t order_pos_ = 0;
};

}  // namespace zp::parallel
