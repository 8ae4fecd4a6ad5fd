#include "io/lora_merged_weights.h"

#include "core/error.h"
#include "kernels/elementwise.h"

namespace zp::io {

LoraAdapter LoraMergedWeights::read_adapter(const std::string& path, const WeightSource& base) {
  std::vector<std::string> known;
  for (const std::string& n : base.names())
    if (n.ends_with(".weight")) {
      const std::string module = n.substr(0, n.size() - 7);
      known.push_back(module + kLoraASuffix);
      known.push_back(module + kLoraBSuffix);
    }
  return read_lora_adapter_files(path, known);
}

LoraMergedWeights::LoraMergedWeights(std::unique_ptr<WeightSource> base, LoraAdapter adapter)
    : WeightSource(base->path()), base_(std::move(base)), adapter_(std::move(adapter)) {
  adapter_.check();
  for (const std::string& m : adapter_.modules())
    ZP_REQUIRE(base_->contains(m + ".weight"), adapter_.source, ": adapts module '", m, "', but ", base_->path(),
               " has no weight '", m, ".weight'");
}

Tensor LoraMergedWeights::read(const std::string& name, DType dt, bool hub_transposed) const {
  const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : std::string();
  if (module.empty() || !adapter_.tensors.contains(module + kLoraASuffix)) return base_->read(name, dt, hub_transposed);
  Tensor w = base_->read(name, DType::F64, hub_transposed);
  add_lora_update(adapter_, module, static_cast<double*>(w.data()), w.shape());
  merged_.insert(module);
  if (dt == DType::F64) return w;
  Tensor out = Tensor::empty(w.shape(), dt, Device::cpu(), "weights");
  kernels::cpu::cast(nullptr, dt, out.data(), DType::F64, w.data(), w.numel());
  return out;
}

std::vector<std::string> LoraMergedWeights::unmerged_modules() const {
  std::vector<std::string> out;
  for (const std::string& m : adapter_.modules())
    if (!merged_.contains(m)) out.push_back(m);
  return out;
}

}  // namespace zp::io
