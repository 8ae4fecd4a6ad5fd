// LoRA's adapters on a model's linear and convolution modules (issue 14), shared by the transformer
// and the UNet: which modules a LoRA config targets (PEFT's rule for a list of names: the module's
// name is a target or ends with "." + target), and the adapter parameters of each targeted module,
// <module>.lora_A.weight [r, in] and <module>.lora_B.weight [out, r] (a convolution's, as PEFT's:
// [r, in, kh, kw] and [out, r, 1, 1]), added to the layer's or stage's adapter block and given to the
// Linear or Conv2d that computes the module. The A matrices of one Linear (a packed q/k/v or gate/up
// projection) are added back to back, so the Linear computes them all with one GEMM.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "io/lora_adapter_files.h"
#include "nn/conv2d.h"
#include "nn/linear.h"
#include "nn/parameter.h"

namespace zp::models {

using LoraSpec = io::LoraConfig;

// "model.layers.0.self_attn.q_proj" of "model.layers.0.self_attn.q_proj.weight".
std::string module_of(const std::string& weight_name);
// PEFT's matching of a list of target modules.
bool lora_targets(const std::vector<std::string>& targets, const std::string& module);
// Throws zp::Error naming a target that matches none of the module names a layer offers (`offered`,
// relative names such as "self_attn.q_proj"; `family` names the model in the message).
void check_lora_targets(const LoraSpec& lora, const std::vector<std::string>& offered, const std::string& family);

// PEFT's initialisation of an adapter parameter: A uniform within 1/sqrt(fan_in) (kaiming_uniform with
// a = sqrt(5); fan_in = in, or in * kh * kw for a convolution's), B zero, so training starts from the base's output. False for any other parameter.
bool init_lora_parameter(nn::Parameter& p, uint64_t seed, StreamHandle s);

// lora.init_from: an adapter the run's adapters start from instead of PEFT's initialisation (to go
// on fine-tuning a shared adapter, or one a run converted). A resumed run takes its adapters from the
// checkpoint instead, so this only decides a fresh start.
class LoraInitialAdapter {
 public:
  // Reads `path` (a PEFT folder, a LoRA checkpoint, a diffusers or kohya-ss file, whose names resolve
  // against the adapters of the model's `blocks`) and checks it against the run: every module
  // it adapts is one lora.target_modules selects, with rank lora.r and the run's scale (alpha / r,
  // or alpha / sqrt(r) with rslora). Errors name the file, the module and both values.
  LoraInitialAdapter(const std::string& path, const LoraSpec& lora, const std::vector<nn::ParamBlock*>& blocks);
  // Fills block `b`'s adapter parameters with the file's values (a block without adapters is left
  // alone). Errors name the file and a tensor it lacks or whose shape differs.
  void fill(nn::ParamBlock& b, StreamHandle s) const;
  const io::LoraAdapter& adapter() const { return adapter_; }

 private:
  io::LoraAdapter adapter_;
};

class LoraAttacher {
 public:
  // Adds to `adapters` (not yet laid out) the parameters of every module it attaches.
  LoraAttacher(const LoraSpec& lora, nn::ParamBlock& adapters) : lora_(lora), adapters_(adapters) {}
  // `weights`: the parameters packed in `linear`, in row order. Gives `linear` an adapter for each
  // targeted one; returns how many.
  int attach(nn::Linear& linear, const std::vector<nn::Parameter*>& weights);
  // `weight`: the convolution's [out, in, kh, kw]. Gives `conv` an adapter when it is targeted.
  int attach(nn::Conv2d& conv, nn::Parameter* weight);
  int attached() const { return attached_; }
  const std::vector<std::string>& targets() const { return lora_.target_modules; }
  // The entries of lora.target_modules that selected at least one module so far.
  const std::set<std::string>& targets_used() const { return used_; }

 private:
  bool targeted(const std::string& module);
  const LoraSpec& lora_;
  nn::ParamBlock& adapters_;
  int attached_ = 0;
  std::set<std::string> used_;
};

}  // namespace zp::models
