// A base model's weights with a LoRA adapter merged in as they are read (`zeropipe generate`, `chat`
// and `eval` with --lora): each adapted module's weight comes out as W + scale * B A (PEFT's merge,
// in float64, rounded once to the dtype asked for), every other tensor as the base has it. The merge
// happens in the engine layout (WeightSource::read), so GPT-2's transposed Conv1D weights take their
// adapters the way PEFT's fan_in_fan_out does.
//
// Serving merged weights costs nothing per token, which is why the inference path merges rather
// than running the adapters beside the base as training does.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/lora_adapter_files.h"
#include "io/weight_source.h"

namespace zp::io {

class LoraMergedWeights final : public WeightSource {
 public:
  // Every adapter module must name a weight of `base` (`<module>.weight`); errors name the adapter's
  // file and the module.
  LoraMergedWeights(std::unique_ptr<WeightSource> base, LoraAdapter adapter);

  // The adapter a path holds: a LoRA training checkpoint (.h5), a PEFT folder, or a diffusers or
  // kohya-ss file or folder (whose names are resolved against `base`'s weights).
  static LoraAdapter read_adapter(const std::string& path, const WeightSource& base);

  json config() const override { return base_->config(); }
  std::vector<std::string> names() const override { return base_->names(); }
  bool contains(const std::string& name) const override { return base_->contains(name); }
  Shape shape(const std::string& name, bool hub_transposed) const override {
    return base_->shape(name, hub_transposed);
  }
  Tensor read(const std::string& name, DType dt, bool hub_transposed) const override;
  // read_range stays WeightSource's: the base weight is read whole, merged, and the range kept.
  int64_t bytes_read() const override { return base_->bytes_read(); }

  const LoraAdapter& adapter() const { return adapter_; }
  // Adapter modules whose weight nobody has read yet: after a model has loaded, any left were not
  // applied (the model does not use that weight), which the caller must refuse.
  std::vector<std::string> unmerged_modules() const;

 private:
  std::unique_ptr<WeightSource> base_;
  LoraAdapter adapter_;
  mutable std::set<std::string> merged_;
};

}  // namespace zp::io
