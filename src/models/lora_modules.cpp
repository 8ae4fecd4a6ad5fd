#include "models/lora_modules.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include "core/error.h"
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
    nn::init_uniform(p, seed, 1.0 / std::sqrt(double(p.shape.at(1))), s);
    return true;
  }
  if (p.name.ends_with(".lora_B.weight")) {
    nn::init_constant(p, 0.f, s);
    return true;
  }
  return false;
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
    if (lora_targets(lora_.target_modules, module_of(w->name))) hit.push_back({w, col});
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
