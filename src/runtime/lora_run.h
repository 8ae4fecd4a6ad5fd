// What a LoRA run (issue 14) prints and records about its adapters and its frozen base, the same for
// every model family.
#pragma once
#include <string>
#include <vector>

#include "models/lora_modules.h"
#include "nn/context.h"
#include "nn/parameter.h"
#include "runtime/checkpoint.h"
#include "runtime/train_config.h"

namespace zp::runtime {

// The config's lora section (r 0: no LoRA), as every model family and `zeropipe plan` build it.
models::LoraSpec lora_spec_of(const TrainConfig& cfg);
// The parameters that train: every one of a block that is not frozen (with LoRA, the adapters).
int64_t trained_parameters(const std::vector<nn::ParamBlock*>& blocks);

// " | LoRA r=16 alpha=32 dropout=0.05 on [...]: 41.9M trainable, 8030.3M frozen" for the start-up
// line; "" without LoRA.
std::string lora_summary(const models::LoraSpec& lora, const std::vector<nn::ParamBlock*>& blocks);
// The LoRA fields of a checkpoint's model identity: the settings, the base's path (model.hub_dir, or
// its random initialisation's seed and std) and fingerprint. Nothing without LoRA.
// LoRA dropout's draw for one micro-batch of `samples` samples starting at global sample `first`: the
// key depends only on (seed, step), so every sample's masks are the same whatever rank, micro-step or
// pipeline chunk runs it. No draw (key 0) without LoRA or without dropout.
nn::DropoutDraw lora_dropout_draw(const models::LoraSpec& lora, uint64_t seed, int64_t step, int64_t first,
                                  int64_t samples);
void set_lora_identity(CheckpointModel& m, const models::LoraSpec& lora, const TrainConfig& cfg, bool base_from_hub,
                       const std::string& fingerprint);

}  // namespace zp::runtime
