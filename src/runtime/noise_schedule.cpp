#include "runtime/noise_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace zp::runtime {

NoiseSchedule::NoiseSchedule(const DiffusionConfig& c)
    : v_prediction_(c.prediction_type == "v_prediction"), snr_gamma_(c.snr_gamma) {
  const int64_t T = c.num_train_timesteps;
  ZP_REQUIRE(T >= 1, "diffusion.num_train_timesteps must be >= 1");
  betas_.resize(size_t(T));
  acp_.resize(size_t(T));
  double prod = 1.0;
  for (int64_t t = 0; t < T; ++t) {
    const double f = T == 1 ? 0.0 : double(t) / double(T - 1);  // torch.linspace's points
    double b;
    if (c.beta_schedule == "scaled_linear") {
      const double s = std::sqrt(c.beta_start) + f * (std::sqrt(c.beta_end) - std::sqrt(c.beta_start));
      b = s * s;
    } else {
      b = c.beta_start + f * (c.beta_end - c.beta_start);
    }
    betas_[size_t(t)] = b;
    prod *= 1.0 - b;
    acp_[size_t(t)] = prod;
  }
}

double NoiseSchedule::loss_weight(int64_t t) const {
  if (snr_gamma_ <= 0) return 1.0;
  const double s = snr(t), clipped = std::min(s, snr_gamma_);
  return v_prediction_ ? clipped / (s + 1.0) : clipped / s;
}

void NoiseSchedule::noisy_and_target(int64_t t, const float* x0, const float* eps, int64_t n, float* xt,
                                     float* target) const {
  const double a = std::sqrt(alphas_cumprod(t)), b = std::sqrt(1.0 - alphas_cumprod(t));
  for (int64_t i = 0; i < n; ++i) {
    xt[i] = float(a * double(x0[i]) + b * double(eps[i]));
    target[i] = v_prediction_ ? float(a * double(eps[i]) - b * double(x0[i])) : eps[i];
  }
}

}  // namespace zp::runtime
