// The causal language-model objective of one micro-batch: the mean cross-entropy of each position's
// next token, over the positions that have one. The model only produces logits
// (models/transformer.h); this turns them into the loss and into its gradient, which it writes over
// the logits in place, so no second [N, vocab] buffer ever exists:
//
//   models::TransformerActivations acts;
//   model.forward(ids, B, T, acts);
//   CausalLmLoss lm(acts.logits, model.config().vocab, targets, num_valid, stream);  // queued
//   model.backward(acts, lm.backward(acts.logits, loss_scale));                     // dlogits in place
//   double loss = lm.mean();                                                         // waits, when asked
//
// One object per forward, so micro-batches may overlap as their activations do.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace zp::runtime {

class CausalLmLoss {
 public:
  // logits: [N, ld] in the model's dtype; the first `vocab` columns of a row are real, the rest
  // padding (ignored). targets: device int32 [N], the token after each position (the labels shifted
  // by one); a target < 0 is ignored. divisor: what the sum of the valid targets' losses is divided
  // by, in [0, N]: the number of targets >= 0 (the caller counts them on the host, where the batch
  // is) for this micro-batch's own mean; or, when micro-batches hold different numbers of valid
  // targets (masked instruction data), the average number per micro-batch of the whole step, so
  // that the mean of the micro-batches' losses is the step's mean over all its valid targets.
  // Queues the per-token losses and log-sum-exps on `s`; synchronises nothing.
  CausalLmLoss(const Tensor& logits, int64_t vocab, const int32_t* targets, double divisor,
               StreamHandle s = nullptr);

  // The valid targets' summed loss over the divisor (0 when the divisor is 0). Copies the per-token
  // losses to the host, so it waits for them: ask after the backward is queued and the device never
  // idles.
  double mean() const;
  // Per-token losses, fp32 [N] on the logits' device; 0 where the target is ignored.
  const Tensor& losses() const { return losses_; }
  double divisor() const { return divisor_; }

  // Overwrites `logits` (those given to the constructor) with d(mean * loss_scale) / d logits: rows
  // of ignored targets and padding columns get 0. Returns them, as dlogits for the model's backward.
  // Once per object.
  Tensor backward(const Tensor& logits, float loss_scale = 1.f);

 private:
  Tensor losses_, lse_;  // fp32 [N]; lse_ until the backward
  const void* logits_data_ = nullptr;  // which buffer backward() must be given (not kept alive here)
  const int32_t* targets_ = nullptr;
  double divisor_ = 0;
  int64_t N_ = 0, vocab_ = 0, ld_ = 0;
  StreamHandle s_ = nullptr;
};

}  // namespace zp::runtime
