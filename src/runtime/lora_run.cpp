#include "runtime/lora_run.h"

#include "core/error.h"

namespace zp::runtime {

std::string lora_summary(const models::LoraSpec& lora, const std::vector<nn::ParamBlock*>& blocks) {
  if (lora.r == 0) return "";
  int64_t trained = 0, frozen = 0;
  for (const nn::ParamBlock* b : blocks)
    for (const auto& p : b->params()) (b->frozen() ? frozen : trained) += p->numel();
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

}  // namespace zp::runtime
