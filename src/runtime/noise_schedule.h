// The DDPM noise schedule and objective of diffusion training. One training sample: latents x0, a
// timestep t, noise eps ~ N(0, 1) (runtime/diffusion_draws.h);
//   x_t    = sqrt(acp_t) x0 + sqrt(1 - acp_t) eps          (acp = alphas_cumprod, in double)
//   target = eps                                            (prediction_type "epsilon")
//          = sqrt(acp_t) eps - sqrt(1 - acp_t) x0           ("v_prediction")
//   loss   = mean over the batch's elements of w_t * (unet(x_t, t, text) - target)^2
// with w_t = 1, or with min-SNR-gamma weighting (snr_gamma set; snr_t = acp_t / (1 - acp_t))
// w_t = min(snr_t, gamma) / snr_t for epsilon and min(snr_t, gamma) / (snr_t + 1) for v.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/diffusion_config.h"

namespace zp::runtime {

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

}  // namespace zp::runtime
