// Diffusion training of the UNet (`zeropipe train` with model.type "unet"): the DDPM noise schedule,
// the counter-based draws of timesteps and noise, and the training loop.
//
// One training sample: latents x0 from the latent file (io/latent_dataset.h), a timestep t drawn
// uniformly from [0, num_train_timesteps), noise eps ~ N(0, 1);
//   x_t    = sqrt(acp_t) x0 + sqrt(1 - acp_t) eps          (acp = alphas_cumprod, in double)
//   target = eps                                            (prediction_type "epsilon")
//          = sqrt(acp_t) eps - sqrt(1 - acp_t) x0           ("v_prediction")
//   loss   = mean over the batch's elements of w_t * (unet(x_t, t, text) - target)^2
// with w_t = 1, or with min-SNR-gamma weighting (snr_gamma set; snr_t = acp_t / (1 - acp_t))
// w_t = min(snr_t, gamma) / snr_t for epsilon and min(snr_t, gamma) / (snr_t + 1) for v.
//
// Every draw depends only on (seed, step, global sample index): the same global batch gets the same
// timesteps and noise at any world size, so ZeRO stages 0-3 at any world size follow the single-rank
// trajectory. The sample at global position p of step s comes from position
// s*G + m*(micro*world) + r*micro + i of the seeded epoch order, exactly as in the LM loop.
//
// Everything else (optimizer, ZeRO engine, loss scaling, schedule, progress line with samples/s,
// metrics JSONL, checkpoints and --resume: runtime/loop_checkpoints.h) is the LM loop's
// (runtime/trainer.h); model.activation_checkpointing checkpoints the UNet's ResBlocks and
// transformer blocks (models/unet.h). A checkpoint also fixes the draws: they are keyed by the step
// and the global sample position, both of which a resumed run continues from.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "io/config.h"
#include "nn/parameter.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"

namespace zp::models {
class UNet;
}

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

class NoiseSchedule {
 public:
  explicit NoiseSchedule(const DiffusionConfig& c);
  int64_t num_timesteps() const { return int64_t(betas_.size()); }
  double beta(int64_t t) const { return betas_.at(size_t(t)); }
  double alphas_cumprod(int64_t t) const { return acp_.at(size_t(t)); }
  double snr(int64_t t) const { return acp_.at(size_t(t)) / (1.0 - acp_.at(size_t(t))); }
  // The loss weight of timestep t: 1 without snr_gamma, else the min-SNR weight for the prediction type.
  double loss_weight(int64_t t) const;
  // x_t and the regression target for one sample of n elements at timestep t.
  void noisy_and_target(int64_t t, const float* x0, const float* eps, int64_t n, float* xt, float* target) const;

 private:
  std::vector<double> betas_, acp_;
  bool v_prediction_ = false;
  double snr_gamma_ = 0;
};

// Counter-based draws keyed by (seed, step, global sample index); step -1 is used for validation
// (the same noise every evaluation, so validation losses are comparable over training).
int64_t draw_timestep(uint64_t seed, int64_t step, int64_t index, int64_t num_timesteps);
// n values ~ N(0, 1): element k of sample `index` is counter_normal(seed, "diffusion.noise.<step>",
// index * n + k).
void draw_noise(uint64_t seed, int64_t step, int64_t index, int64_t n, float* out);

struct UNetTrainConfig {
  // The keys every training run shares (batch, optimizer, schedule, precision, ZeRO, model, data,
  // loop), with the LM trainer's meaning. model.config / model.hub_dir hold a diffusers UNet
  // config.json; model.init "hub" loads diffusion_pytorch_model*.safetensors from model.hub_dir;
  // data.train_files holds one latent file (data.val_files at most one); data.seq_len is unused.
  TrainConfig common;
  DiffusionConfig diffusion;

  // Reads and validates a config with model.type "unet"; throws one zp::Error listing every problem,
  // each naming its key.
  static UNetTrainConfig from(const io::Config& c);
};

// From-scratch initialisation: conv and linear weights Normal(0, std), norm weights 1, biases 0,
// each value depending only on (seed, parameter name, element) (nn/init.h).
void init_unet_random(models::UNet& m, uint64_t seed, double std);
// One block of init_unet_random (the ZeRO engine fills blocks one at a time).
void init_unet_block_random(nn::ParamBlock& b, uint64_t seed, double std, StreamHandle s);
// FLOPs of one training step (forward + backward = 3 x forward) per sample of H x W latents with L
// text tokens: every conv and linear weight times the positions it slides over (twice: multiply and
// add), plus attention's scores and weighted values. Norms and elementwise ops are not counted.
double unet_train_flops_per_sample(models::UNet& m, int64_t H, int64_t W, int64_t L);

// Trains the UNet on the ranks of `group` (default: the world). With `return_params`, every rank
// gets the final fp32 master weights (tests; small models only).
TrainResult train_unet(const UNetTrainConfig& cfg, comm::Runtime& rt, MPI_Comm group = MPI_COMM_NULL,
                       bool return_params = false);

}  // namespace zp::runtime
