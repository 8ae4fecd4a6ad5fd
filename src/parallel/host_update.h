// What the stores that update on the CPU share (host_state_store.h, nvme_state_store.h): the AdamW
// table of a piece of a range, the split of a step into chunks, and the staging ring that brings a
// GPU block's gradients down ahead of the CPU and takes its new weights up behind it.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/adamw.h"
#include "parallel/optimizer_state_store.h"

namespace zp::parallel {

// Where elements [begin, end) of a range's three states are, each pointer at element `begin`.
struct StateSpan {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// Appends to `table` the AdamW entries of elements [begin, end) of range `r` (offsets relative to the
// range): one per parameter, clipped to the piece, with the parameter's weight decay; grads from
// `grad` and new weights (the block's dtype) to `weights_out`, both indexed from `begin`. zero_gaps:
// also zero the elements of `weights_out` that no parameter covers (a staging slot goes up whole, so
// its gaps must carry the zeros the block holds there).
void add_range_params(const OwnedRange& r, int64_t begin, int64_t end, StateSpan state, const float* grad,
                      void* weights_out, const AdamWHyper& h, std::vector<kernels::AdamWTensor>& table,
                      bool zero_gaps);

// One piece of a step: elements [begin, end) of the range of updates[update], offsets relative to it.
struct UpdateChunk {
  size_t update = 0;
  int64_t begin = 0, end = 0;
};

// The step's ranges cut into pieces of at most `chunk` elements, each range's at multiples of `chunk`.
std::vector<UpdateChunk> split_into_chunks(std::span<const RangeUpdate> updates, const std::vector<OwnedRange>& ranges,
                                           int64_t chunk);

// Host staging for blocks on a GPU (HostStateStore's design, shared): `slots` pairs of a chunk's fp32
// gradients and its new weights, and a copy stream. A walk brings chunk j+K's gradients down while
// the CPU works on chunk j and chunk j-1's weights go up, so the copies both ways hide behind the
// CPU, and the compute stream waits for the last upload only. For blocks in host memory (a CPU run)
// there is nothing to stage: the ring holds no memory and hands out the blocks' own memory.
//
// weights_on_host: the updates' weights_out are host memory (the parameter tier's shards): the walk
// hands them to the body directly and nothing goes up; only the gradients come down.
class StagingRing {
 public:
  StagingRing(Device dev, DType dt, int64_t chunk, int slots, bool pinned, bool weights_on_host = false);
  ~StagingRing();  // no copy into or out of a slot outlives it

  int64_t chunk() const { return chunk_; }
  size_t bytes() const;  // host memory of the slots

  // Calls body(j, grad, weights_out, staged) for every chunk in order: grad holds the chunk's
  // gradients, weights_out takes its new weights, each a staging slot (weights_out then goes up whole
  // after body returns: `staged`) or the update's own memory at the chunk. The gradients are complete
  // on `s` where walk is called; `s` waits for the last weights.
  using ChunkBody = std::function<void(size_t j, const float* grad, void* weights_out, bool staged)>;
  void walk(const std::vector<UpdateChunk>& chunks, std::span<const RangeUpdate> updates, StreamHandle s,
            const ChunkBody& body);

  // `n` compute-dtype elements at `src` (the blocks' memory), in pieces of at most chunk() elements:
  // use(piece, offset, count) sees each piece in host memory. Synchronous: for start-up and checkpoints.
  void download(const void* src, int64_t n, StreamHandle s,
                const std::function<void(const void* piece, int64_t offset, int64_t count)>& use);
  // The reverse: fill(piece, offset, count) writes each piece in host memory, which then goes to `dst`.
  void upload(void* dst, int64_t n, StreamHandle s,
              const std::function<void(void* piece, int64_t offset, int64_t count)>& fill);

 private:
  struct Slot;
  Device dev_;
  DType dt_;
  int64_t chunk_ = 0;
  bool weights_on_host_ = false;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Stream> copy_;  // device-to-host and host-to-device copies (CUDA blocks only)
};

}  // namespace zp::parallel
