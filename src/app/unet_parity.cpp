#include "app/unet_parity.h"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "models/unet.h"

namespace zp::app {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<float> host_floats(const io::SafetensorsFile& f, const std::string& name) {
  Tensor t = f.read_as(name, DType::F32);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace

ParityReport run_unet_parity(const std::string& dir, Device dev, DType dt, bool print, const AlterResult& alter_result) {
  return run_unet_parity(dir, "", dev, dt, print, alter_result);
}

ParityReport run_unet_parity(const std::string& dir, const std::string& lora_dir, Device dev, DType dt, bool print,
                             const AlterResult& alter_result) {
  ZP_REQUIRE(fs::is_directory(dir), dir, ": not a directory");
  if (dev.is_cuda()) ZP_REQUIRE(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());

  const fs::path cfg_path = fs::path(dir) / "config.json";
  const json cfg_json = io::read_json_file(cfg_path.string());
  const auto cfg = models::UNetConfig::from_hub_json(cfg_json, cfg_path.string());

  const fs::path io_path = fs::path(dir) / "io.safetensors";
  ZP_REQUIRE(fs::exists(io_path), io_path.string(), ": missing (the reference inputs and outputs)");
  io::SafetensorsFile ref(io_path.string());
  std::vector<std::string> needed = {"input.sample", "input.timestep", "input.encoder_hidden_states", "output.sample",
                                     "grad_output.sample", "grad_input.sample"};
  if (cfg.text_time) needed.insert(needed.end(), {"input.text_embeds", "input.time_ids"});
  for (const std::string& n : needed) ZP_REQUIRE(ref.contains(n), io_path.string(), ": no tensor '", n, "'");

  // A LoRA dump: its settings, the adapters' values (input.lora.<name>) and the expected results.
  models::LoraSpec lora;
  std::optional<io::SafetensorsFile> lora_ref;
  if (!lora_dir.empty()) {
    const std::string spec = (fs::path(lora_dir) / "lora.json").string(), lio = (fs::path(lora_dir) / "io.safetensors").string();
    lora = io::LoraConfig::from_json(io::read_json_file(spec), spec);
    ZP_REQUIRE(fs::exists(lio), lio, ": missing (the LoRA reference outputs)");
    lora_ref.emplace(lio);
  }
  models::UNet model(cfg, dev, dt, nullptr, 1, true, lora);
  model.load(*io::WeightSource::open(dir, "diffusion_pytorch_model"));
  std::vector<nn::Parameter*> adapters;
  if (lora_ref)
    for (nn::ParamBlock* b : model.trainable_blocks())
      for (const auto& p : b->params()) {
        const std::string n = "input.lora." + p->name;
        ZP_REQUIRE(lora_ref->contains(n), lora_dir, "/io.safetensors: no tensor '", n, "'");
        p->value.copy_from(lora_ref->read_as(n, dt));
        adapters.push_back(p.get());
      }
  // The results come from the LoRA dump when there is one; the inputs always from the model's.
  io::SafetensorsFile& want = lora_ref ? *lora_ref : ref;

  models::UNetInputs inputs;
  inputs.sample = ref.read_as("input.sample", dt).to(dev);
  inputs.timesteps = host_floats(ref, "input.timestep");
  inputs.encoder_hidden_states = ref.read_as("input.encoder_hidden_states", dt).to(dev);
  if (cfg.text_time) {
    inputs.text_embeds = ref.read_as("input.text_embeds", dt).to(dev);
    inputs.time_ids = host_floats(ref, "input.time_ids");
  }
  ParityReport rep(ParityCriterion::for_dump(lora_dir.empty() ? dir : lora_dir, dt), print);
  rep.expect(want.names());
  rep.alter_results(alter_result);
  const Shape& xs = inputs.sample.shape();
  if (print)
    std::printf("parity: %s (UNet2DConditionModel, %lld parameters) on %s in %s, sample %s, tolerance %.0e\n",
                dir.c_str(), (long long)model.num_parameters(), dev.str().c_str(), std::string(dtype_name(dt)).c_str(),
                shape_str(xs).c_str(), rep.tolerance());

  models::UNetActivations acts = models::UNetActivations::training();
  Tensor out = model.forward(inputs, acts);
  rep.check("output.sample", host_values(out), host_values(want.read_as("output.sample", DType::F64)));
  Tensor dsample = model.backward(ref.read_as("grad_output.sample", dt).to(dev), acts);
  rep.check("grad_input.sample", host_values(dsample), host_values(want.read_as("grad_input.sample", DType::F64)));
  for (nn::Parameter* p : lora_ref ? adapters : model.parameters()) {
    const std::string g = "grad." + p->name;
    ZP_REQUIRE(want.contains(g), lora_ref ? lora_dir : io_path.string(), ": no tensor '", g, "'");
    rep.check(g, host_values(p->grad), host_values(want.read_as(g, DType::F64)));
  }
  rep.record_missing();
  return rep;
}

}  // namespace zp::app
