// The configuration of diffusion training (`zeropipe train` with model.type "unet"): the keys every
// training run shares (runtime/train_config.h) and the "diffusion" section, the DDPM noise schedule
// and objective of runtime/noise_schedule.h.
#pragma once
#include <cstdint>
#include <string>

#include "io/config.h"
#include "io/config_reader.h"
#include "runtime/train_config.h"

namespace zp::runtime {

// The "diffusion" section with its defaults (diffusers' DDPMScheduler for Stable Diffusion):
//   {"diffusion": {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
//                  "beta_schedule": "scaled_linear", "prediction_type": "epsilon", "snr_gamma": null}}
const io::json& unet_schema_additions();
// train_config_schema() with unet_schema_additions() merged in: the schema `zeropipe train` reads
// every config with (LM configs simply leave "diffusion" at its defaults).
io::json train_schema_with_diffusion();

struct DiffusionConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.00085, beta_end = 0.012;
  std::string beta_schedule = "scaled_linear";  // scaled_linear (linear in sqrt(beta), SD) | linear
  std::string prediction_type = "epsilon";      // epsilon | v_prediction
  double snr_gamma = 0;                         // > 0: min-SNR-gamma loss weights; 0 (null) = off

  // Reads the "diffusion" section (defaults when the config has none); throws one zp::Error listing
  // every problem, each naming its key.
  static DiffusionConfig from(const io::Config& c);
  // The same, recording problems in `r` (UNetTrainConfig::from reports them with the shared keys').
  static DiffusionConfig read(io::ConfigReader& r);
};

struct UNetTrainConfig {
  // The keys every training run shares (batch, optimizer, schedule, precision, ZeRO, model, data,
  // loop), with the LM's meaning. model.config / model.hub_dir hold a diffusers UNet config.json;
  // model.init "hub" loads diffusion_pytorch_model*.safetensors from model.hub_dir; data.train_files
  // holds one latent file (data.val_files at most one); data.seq_len is unused.
  TrainConfig common;
  DiffusionConfig diffusion;

  // Reads and validates a config with model.type "unet"; throws one zp::Error listing every problem,
  // each naming its key.
  static UNetTrainConfig from(const io::Config& c);
};

}  // namespace zp::runtime
