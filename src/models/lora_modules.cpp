#include "models/lora_modules.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "nn/init.h"

namespace zp::models {

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  return weight_name.ends_with(suffix) ? weight_name.substr(0, weight_name.size() - suffix.size()) : weight_name;
}

bool lora_targets(const std::vector<std::string>& targets, const std::string& module) {
  for (const std::string& t : targets)
    if (module == t || module.ends_with("." + t)) return true;
  return false;
}

void check_lora_targets(const LoraSpec& lora, const std::vector<std::string>& offered, const std::string& family) {
  ZP_REQUIRE(!lora.target_modules.empty(), "lora.target_modules is empty: name the modules to adapt (",
             nlohmann::json(offered).dump(), ")");
  for (const std::string& t : lora.target_modules) {
    bool found = false;
    for (const std::string& m : offered) found = found || lora_targets({t}, "layer." + m);
    ZP_REQUIRE(found, "lora.target_modules: '", t, "' names no module of a ", family, " layer (its linear modules: ",
               nlohmann::json(offered).dump(), ")");
  }
}

bool init_lora_parameter(nn::Parameter& p, uint64_t seed, StreamHandle s) {
  if (p.name.ends_with(".lora_A.weight")) {
    nn::init_uniform(p, seed, 1.0 / std::sqrt(double(shape_numel(p.shape) / p.shape.at(0))), s);
    return true;
  }
  if (p.name.ends_with(".lora_B.weight")) {
    nn::init_constant(p, 0.f, s);
    return true;
  }
  return false;
}

namespace {

std::vector<std::string> adapter_names(const std::vector<nn::ParamBlock*>& blocks) {
  std::vector<std::string> out;
  for (const nn::ParamBlock* b : blocks)
    for (const auto& p : b->params())
      if (p->name.ends_with(io::kLoraASuffix) || p->name.ends_with(io::kLoraBSuffix)) out.push_back(p->name);
  return out;
}

}  // namespace

LoraInitialAdapter::LoraInitialAdapter(const std::string& path, const LoraSpec& lora,
                                       const std::vector<nn::ParamBlock*>& blocks)
    : adapter_(io::read_lora_adapter_files(path, adapter_names(blocks))) {
  adapter_.check();
  const double scale = lora.scale_for(lora.r, lora.alpha);
  for (const std::string& m : adapter_.modules()) {
    ZP_REQUIRE(lora_targets(lora.target_modules, m), "lora.init_from: ", adapter_.source, " adapts module '", m,
               "', which lora.target_modules ", nlohmann::json(lora.target_modules).dump(), " does not select");
    ZP_REQUIRE(adapter_.rank(m) == lora.r, "lora.init_from: ", adapter_.source, ": module '", m, "' has rank ",
               adapter_.rank(m), ", the run's lora.r is ", lora.r);
    ZP_REQUIRE(std::abs(adapter_.scale_of(m) - scale) <= 1e-12 * std::abs(scale), "lora.init_from: ",
               adapter_.source, ": module '", m, "' is scaled by ", adapter_.scale_of(m),
               " (its alpha over its rank), the run's lora.alpha / lora.r", lora.rslora ? " (rslora: over sqrt(r))" : "",
               " give ", scale, ": set lora.alpha to the adapter's");
  }
}

void LoraInitialAdapter::fill(nn::ParamBlock& b, StreamHandle s) const {
  for (auto& owned : b.params()) {
    nn::Parameter& p = *owned;
    if (!p.name.ends_with(io::kLoraASuffix) && !p.name.ends_with(io::kLoraBSuffix)) continue;
    auto it = adapter_.tensors.find(p.name);
    ZP_REQUIRE(it != adapter_.tensors.end(), "lora.init_from: ", adapter_.source, " has no tensor '", p.name,
               "', which the run's lora.target_modules adapt");
    const Tensor& t = it->second;
    // PEFT's 4-d shape of a 1x1 convolution's adapter has the same values as a 2-d one.
    ZP_REQUIRE(t.numel() == shape_numel(p.shape) && t.size(0) == p.shape.at(0), "lora.init_from: ", adapter_.source,
               ": tensor '", p.name, "' has shape ", shape_str(t.shape()), ", the model's is ", shape_str(p.shape));
    Tensor v = Tensor::empty(p.shape, p.value.dtype(), Device::cpu(), "lora");
    kernels::cpu::cast(nullptr, p.value.dtype(), v.data(), t.dtype(), t.data(), t.numel());
    p.value.copy_from(v, s);
  }
}

bool LoraAttacher::targeted(const std::string& module) {
  bool hit = false;
  for (const std::string& t : lora_.target_modules)
    if (lora_targets({t}, module)) {
      used_.insert(t);
      hit = true;
    }
  return hit;
}

int LoraAttacher::attach(nn::Conv2d& conv, nn::Parameter* weight) {
  const std::string module = module_of(weight->name);
  if (!targeted(module)) return 0;
  const Shape& w = weight->shape;
  nn::Parameter* a = adapters_.add(module + ".lora_A.weight", {lora_.r, w.at(1), w.at(2), w.at(3)}, true);
  nn::Parameter* b = adapters_.add(module + ".lora_B.weight", {w.at(0), lora_.r, 1, 1}, true);
  conv.set_adapter(a, b, float(lora_.scale_for(lora_.r, lora_.alpha)), float(lora_.dropout));
  attached_ += 1;
  return 1;
}

int LoraAttacher::attach(nn::Linear& linear, const std::vector<nn::Parameter*>& weights) {
  struct Targeted {
    nn::Parameter* base;
    int64_t col;
    nn::Parameter *a = nullptr, *b = nullptr;
  };
  std::vector<Targeted> hit;
  int64_t col = 0;
  for (nn::Parameter* w : weights) {
    if (targeted(module_of(w->name))) hit.push_back({w, col});
    col += w->shape[0];
  }
  if (hit.empty()) return 0;
  for (size_t k = 0; k < hit.size(); ++k)
    hit[k].a = adapters_.add(module_of(hit[k].base->name) + ".lora_A.weight", {lora_.r, hit[k].base->shape[1]}, true,
                             /*packed=*/k > 0);
  for (Targeted& t : hit)
    t.b = adapters_.add(module_of(t.base->name) + ".lora_B.weight", {t.base->shape[0], lora_.r}, true);
  std::vector<nn::LowRankAdapter> adapters;
  for (const Targeted& t : hit) adapters.push_back({t.a, t.b, t.col});
  linear.set_adapters(std::move(adapters), float(lora_.scale_for(lora_.r, lora_.alpha)), float(lora_.dropout));
  attached_ += int(hit.size());
  return int(hit.size());
}

}  // namespace zp::models
