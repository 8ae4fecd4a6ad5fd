// Estimates of the activation memory one training micro-batch keeps for its backward, for memory
// plans (`zeropipe plan`, the start-up fit check). They are estimates, counted from the layer shapes
// rather than measured, and plans label them so: the model states are what a plan can count exactly.
//
// The trick is one rule for both families: every GEMM and convolution saves its input for its weight
// gradient, and the norms and activation functions around them save about as much again, so a
// layer keeps about twice the sum of its weight inputs (a transformer layer: 2 x (3h + ffn) values
// per token; a ResBlock: 2 x its two convolutions' inputs). Flash attention keeps no T x T scores.
// With activation checkpointing only each layer's input is kept, plus one layer re-run at a time.
// LoRA's adapters keep nothing of their own (their module's input is kept anyway; nn/linear.h).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "models/transformer.h"
#include "models/unet.h"

namespace zp::models {

// Bytes of activations of one forward of B sequences of T tokens in `dt`, logits included (and their
// fp32 loss gradient, written over them in place). `span`: a pipeline chunk's layers, the logits and
// the final norm's input only with its head.
double transformer_activation_bytes(const TransformerConfig& cfg, int64_t B, int64_t T, DType dt, bool checkpointed,
                                    const LayerSpan& span = {});

// Bytes of activations of one forward of B samples of H x W latents with L text tokens.
double unet_activation_bytes(UNet& m, int64_t B, int64_t H, int64_t W, int64_t L, DType dt, bool checkpointed);

}  // namespace zp::models
