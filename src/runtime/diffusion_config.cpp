#include "runtime/diffusion_config.h"

namespace zp::runtime {

const io::json& unet_schema_additions() {
  static const io::json j = io::json::parse(R"({
    "diffusion": {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                  "beta_schedule": "scaled_linear", "prediction_type": "epsilon", "snr_gamma": null}
  })");
  return j;
}

io::json train_schema_with_diffusion() {
  io::json schema = train_config_schema();
  for (const auto& [key, value] : unet_schema_additions().items()) schema[key] = value;
  return schema;
}

DiffusionConfig DiffusionConfig::from(const io::Config& c) {
  io::ConfigReader r(c);
  DiffusionConfig d = read(r);
  r.throw_if_any();
  return d;
}

DiffusionConfig DiffusionConfig::read(io::ConfigReader& r) {
  using io::Range;
  DiffusionConfig d;
  if (!r.config().root().contains("diffusion")) return d;
  // The schedule holds two doubles per timestep; diffusers' models use 1000.
  d.num_train_timesteps = r.integer("diffusion.num_train_timesteps", 1, 1000000);
  d.beta_start = r.number("diffusion.beta_start", Range{0, 1, true, true});
  d.beta_end = r.number("diffusion.beta_end", Range::half_open(d.beta_start, 1));
  d.beta_schedule = r.one_of("diffusion.beta_schedule", {"scaled_linear", "linear"});
  d.prediction_type = r.one_of("diffusion.prediction_type", {"epsilon", "v_prediction"});
  d.snr_gamma = r.number_or_null("diffusion.snr_gamma", Range::above(0)).value_or(0.0);
  return d;
}

UNetTrainConfig UNetTrainConfig::from(const io::Config& c) {
  // The shared keys are read by the LM's reader, so both families give them one meaning and one set
  // of checks; every problem of both readers is reported in one error.
  io::ConfigReader r(c);
  UNetTrainConfig u;
  u.common = TrainConfig::read(r, "unet");
  u.diffusion = DiffusionConfig::read(r);
  // An empty list is TrainConfig::read's problem already.
  r.require(u.common.train_files.size() <= 1,
            "data.train_files must hold exactly one latent file (HDF5), got " + std::to_string(u.common.train_files.size()));
  r.require(!u.common.instruction_data(), "data.format \"" + u.common.data_format +
            "\" is for language models: diffusion training reads a latent file (leave data.format \"tokens\")");
  r.require(u.common.val_files.size() <= 1,
            "data.val_files holds at most one latent file (HDF5), got " + std::to_string(u.common.val_files.size()));
  r.throw_if_any();
  return u;
}

}  // namespace zp::runtime
