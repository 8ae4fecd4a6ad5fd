// Which layers each pipeline stage of a training run holds (issue 12), for the language models and
// the UNet, and the activations its in-flight micro-batches keep. One place for the trainers, which
// build their stage's chunks from it, and for `zeropipe plan`, which plans every stage from it: the
// plan counts the blocks the run builds.
#pragma once
#include <cstdint>
#include <vector>

#include "models/transformer.h"
#include "models/unet.h"
#include "runtime/train_config.h"

namespace zp::runtime {

// The model chunks of stage `stage` of `stages`: the whole model without a pipeline; with one, the
// global chunks stage, stage + P, ... of the P x V cut by pipeline.partition
// (parallel/pipeline_partition.h), each at least one layer (else a zp::Error naming pipeline.stages).
template <class Span>
struct StageChunks {
  std::vector<int64_t> bounds;  // P x V + 1 layer (UNet: block) boundaries
  std::vector<Span> local;      // this stage's chunks, in local order
};
using LmChunks = StageChunks<models::LayerSpan>;
using UNetChunks = StageChunks<models::UNetSpan>;

// A language model's layers; the first chunk holds the embedding, the last the final norm and head.
LmChunks lm_chunks(const TrainConfig& cfg, const models::TransformerConfig& m, int stage, int stages);

// The UNet's units (down, mid and up blocks; the stem with the first chunk, the head with the last).
// `whole`: the whole model laid out (no memory), whose blocks give the units' costs: "parameters"
// counts each unit's parameters, "compute" its training FLOPs per sample of H x W latents with L
// text tokens (models/unet_flops.h).
UNetChunks unet_chunks(const TrainConfig& cfg, models::UNet& whole, int64_t H, int64_t W, int64_t L, int stage,
                       int stages);

// The units a pipeline cuts the model of `cfg` into, from its config alone: a language model's
// layers, or (`unet`) the UNet's down, mid and up blocks.
int64_t pipeline_units(const TrainConfig& cfg, bool unet);

// A stage's activations, an estimate: the most its schedule keeps in flight at once
// (parallel::peak_in_flight_bytes) of its local chunks' bytes per micro-batch (`chunk_bytes`, in
// local order); without a pipeline one micro-batch's.
double stage_activation_bytes(const TrainConfig& cfg, int stage, int stages, const std::vector<double>& chunk_bytes);

}  // namespace zp::runtime
