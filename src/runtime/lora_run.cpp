#include "runtime/lora_run.h"

#include "core/error.h"
#include "nn/init.h"
#include "nn/trained_blocks.h"

namespace zp::runtime {

models::LoraSpec lora_spec_of(const TrainConfig& cfg) {
  return {cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, cfg.lora_rslora};
}

int64_t trained_parameters(const std::vector<nn::ParamBlock*>& blocks) {
  int64_t n = 0;
  for (const nn::ParamBlock* b : nn::trained_blocks(blocks))
    for (const auto& p : b->params()) n += p->numel();
  return n;
}

std::string lora_summary(const models::LoraSpec& lora, const std::vector<nn::ParamBlock*>& blocks) {
  if (lora.r == 0) return "";
  int64_t all = 0;
  for (const nn::ParamBlock* b : blocks)
    for (const auto& p : b->params()) all += p->numel();
  const int64_t trained = trained_parameters(blocks), frozen = all - trained;
  return detail::cat(" | LoRA r=", lora.r, " alpha=", lora.alpha, lora.rslora ? " (rslora)" : "", " dropout=",
                     lora.dropout, " on ", nlohmann::json(lora.target_modules).dump(), ": ", trained / 1e6,
                     "M trainable, ", frozen / 1e6, "M frozen");
}

void set_lora_identity(CheckpointModel& m, const models::LoraSpec& lora, const TrainConfig& cfg, bool base_from_hub,
                       const std::string& fingerprint) {
  if (lora.r == 0) return;
  m.lora = lora.to_json();
  m.base_model = base_from_hub ? cfg.hub_dir
                               : detail::cat("random initialisation (seed ", cfg.seed, ", std ", cfg.init_std, ")");
  m.base_fingerprint = fingerprint;
}

nn::DropoutDraw lora_dropout_draw(const models::LoraSpec& lora, uint64_t seed, int64_t step, int64_t first,
                                  int64_t samples) {
  if (lora.r == 0 || lora.dropout == 0) return {};
  return {nn::splitmix64(seed ^ nn::splitmix64(0x4C6F5241ull + uint64_t(step))) | 1, first, samples};
}

}  // namespace zp::runtime
