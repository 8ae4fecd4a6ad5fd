// The one-step delayed parameter update (the ZeRO-Offload paper's DPU;
// zero_optimization.offload_optimizer.delayed_update): with the optimizer on the CPU, the update of
// step s runs on a host thread while the GPU (or the CPU's own thread) computes the forward and
// backward of step s+1, so the CPU step no longer stands between two steps.
//
// Semantics (updates counted from 1, w_0 the initial weights, w_k = AdamW(w_{k-1}, g_k)): the
// gradients g_k of step k are taken at the weights w_{k-2} (w_0 for steps 1 and 2), one update
// behind the plain trajectory, whose g_k is taken at w_{k-1}. The master weights and moments still
// follow AdamW exactly; only the point where each gradient is taken moves. At the end of step k:
//   1. wait for update k-1 (its master weights and moments are final);
//   2. install its new compute weights (w_{k-1}, in the compute dtype) into the blocks;
//   3. copy step k's gradients into a second buffer (the next backward overwrites the first);
//   4. start update k on the host thread: gradients from that buffer, new compute weights into a
//      second weights buffer (the blocks' are being read by step k+1), state in place.
// Double buffers, one per owned range: fp32 gradients on the blocks' device, and compute-dtype
// weights on the device too, or in host memory where the parameter tier keeps the shards there.
// On a GPU the copies of steps 2 and 3 are device-to-device (milliseconds); the PCIe traffic of
// update k (gradients down, weights up, through the store's staging ring) overlaps step k+1.
//
// fp16 (dynamic loss scaling): the caller knows whether step k's gradients overflowed (their global
// norm, the same on every rank) before it calls step() or skip(), so an overflow never reaches the
// host thread. A skipped step k runs skip(): steps 1 and 2 above (update k-1's weights are that
// update's, and holding them back would put step k+1 two updates behind), then nothing; the step
// counter (ShardedAdamW::next_config, bias correction) is not advanced. So step k+1 computes with
// w_{k-1}, and so does step k+2: no update k publishes weights. The gradient scale of update k
// (1/loss scale, times the clipping factor) is fixed in `cfg` when step() starts it: the loss scale
// may change before the host thread runs, the update uses the one its gradients were made with.
//
// Whoever reads or writes the optimizer state (checkpoints, gather_master, the next update, the
// destructor) calls wait() first: the state is then that after k updates, while the compute weights
// stay w_{k-1} until the next step installs w_k. A checkpoint keeps both (runtime/checkpoint.h), so
// that a resumed run computes step k+1 with the same weights as the uninterrupted one.
#pragma once
#include <exception>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "parallel/sharded_adamw.h"

namespace zp::parallel {

class DelayedUpdate {
 public:
  // `opt`'s ranges get the double buffers; weights_on_host: the compute weights the updates install
  // are host memory (the parameter tier's shards), so the spare weights are too (pinned when asked).
  DelayedUpdate(ShardedAdamW& opt, bool weights_on_host, bool pinned, StreamHandle s);
  ~DelayedUpdate();  // waits for the update in flight
  DelayedUpdate(const DelayedUpdate&) = delete;
  DelayedUpdate& operator=(const DelayedUpdate&) = delete;

  // The end of a step (semantics above). `updates` lists every range once: its gradients (the
  // engine's, ready on `s`) and where its compute weights live. cfg: this step's AdamW settings
  // (ShardedAdamW::next_config). Returns whether the previous update's weights were installed into
  // the ranges' weights_out (ordered on `s`): the engine all-gathers them where they are replicated.
  // `weight_tensors` (optional, one per range, null where not): a range whose compute weights are a
  // whole tensor (a ZeRO-3 shard) that its spare matches in size, dtype and device gets the new
  // weights by exchanging the two tensors instead of a copy: with the parameters in host memory that
  // copy is a host memcpy of every owned weight between two steps, which the GPU waits for.
  bool step(std::span<const RangeUpdate> updates, const kernels::AdamWConfig& cfg,
            std::span<Tensor* const> weight_tensors = {});
  // The end of a step that takes no update (an fp16 overflow; semantics above): installs the previous
  // update's weights as step() does and starts none. The updates' gradients are not read. Returns
  // whether weights were installed.
  bool skip(std::span<const RangeUpdate> updates, std::span<Tensor* const> weight_tensors = {});
  // Waits for the update in flight, if any, and rethrows its failure. Its weights stay pending.
  void wait();
  // Whether new compute weights wait for the next step to install them.
  bool pending() const { return pending_; }
  // After the master weights were loaded (a checkpoint), with the compute weights set as the
  // checkpoint says: the next step installs the loaded master weights (cast to the compute dtype),
  // as the run that wrote the checkpoint would have. Ordered on `s`.
  void stage_master_weights();
  // After the master weights were loaded and the compute weights rewritten from them: nothing pending.
  void drop_pending() { pending_ = false; }

  // Bytes of the double buffers: on the blocks' device (both, or the gradients alone with
  // weights_on_host) and in host memory (the weights with weights_on_host). For `elements` owned
  // elements of compute dtype `dt`.
  static size_t device_bytes_for(int64_t elements, DType dt, bool weights_on_host);
  static size_t host_bytes_for(int64_t elements, DType dt, bool weights_on_host);

 private:
  void run_update() noexcept;
  // Steps 1 and 2 of the semantics: waits for the update in flight and installs its weights, if any.
  bool install(std::span<const RangeUpdate> updates, std::span<Tensor* const> weight_tensors);

  ShardedAdamW& opt_;
  Device dev_;            // the blocks' device: gradients and (unless weights_on_host) weights
  Device weights_dev_;    // where the spare weights live
  DType dt_ = DType::F32;
  StreamHandle s_;
  std::vector<Tensor> grads_, weights_;  // the double buffers, one per range
  std::vector<RangeUpdate> spare_;       // the update in flight: from grads_ into weights_
  kernels::AdamWConfig cfg_;
  std::unique_ptr<Stream> stream_;       // the host thread's (GPU blocks): its copies and waits
  std::unique_ptr<Event> ready_;         // the buffers are written (GPU blocks)
  std::thread thread_;
  std::exception_ptr error_;
  bool pending_ = false;
};

}  // namespace zp::parallel
