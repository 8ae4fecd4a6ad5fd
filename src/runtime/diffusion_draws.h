// The random draws of diffusion training, counter-based: each depends only on (seed, step, global
// sample index), so the same global batch gets the same timesteps and noise at any world size and
// ZeRO stages 0-3 at any world size follow the single-rank trajectory. A resumed run continues them
// too: it continues the step and the global sample position.
#pragma once
#include <cstdint>

namespace zp::runtime {

// Uniform on [0, num_timesteps). Step -1 is used for validation (the same draws every evaluation, so
// validation losses are comparable over training).
int64_t draw_timestep(uint64_t seed, int64_t step, int64_t index, int64_t num_timesteps);
// n values ~ N(0, 1): element k of sample `index` is counter_normal(seed, "diffusion.noise.<step>",
// index * n + k).
void draw_noise(uint64_t seed, int64_t step, int64_t index, int64_t n, float* out);

}  // namespace zp::runtime
