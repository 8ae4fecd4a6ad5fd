#include "runtime/diffusion_draws.h"

#include <string>

#include "core/error.h"
#include "nn/init.h"

namespace zp::runtime {

int64_t draw_timestep(uint64_t seed, int64_t step, int64_t index, int64_t num_timesteps) {
  ZP_CHECK(num_timesteps >= 1, "draw_timestep over ", num_timesteps, " timesteps");
  const uint64_t key = nn::splitmix64(nn::splitmix64(seed ^ 0x74696D6573746570ull) + uint64_t(step));  // "timestep"
  const uint64_t r = nn::splitmix64(key + uint64_t(index));
  // The high half of r * T: uniform on [0, T) up to a bias of T / 2^64.
  return int64_t((unsigned __int128)r * uint64_t(num_timesteps) >> 64);
}

void draw_noise(uint64_t seed, int64_t step, int64_t index, int64_t n, float* out) {
  nn::counter_normal(seed, "diffusion.noise." + std::to_string(step), index * n, n, 1.0, out);
}

}  // namespace zp::runtime
