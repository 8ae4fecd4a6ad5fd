// Parameter initialisation from a counter-based generator: element i of the tensor named `name`
// gets a value that depends only on (seed, name, i), never on the world size, the shard a rank owns
// or the order of initialisation (DESIGN decision 7), so any rank can initialise any slice alone.
#pragma once
#include <cstdint>
#include <string>

#include "nn/parameter.h"

namespace zp::nn {

// The counter-based generator's mixing function (SplitMix64's finaliser): every random draw of the
// engine (initialisation, diffusion timesteps and noise, demo latents) is splitmix64 of a key plus
// a counter, so it depends only on what it is for, never on the world size or the order of calls.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a of a name: keys what belongs to a named tensor or module (its initial values, a LoRA
// adapter's dropout masks) apart from every other's, the same on every run and rank.
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Normal(0, std) for elements [begin, begin + count) of `name`'s flat index space, into host floats.
void counter_normal(uint64_t seed, const std::string& name, int64_t begin, int64_t count, double std, float* out);
// Fills a parameter (any device, any dtype) with counter_normal values or a constant.
void init_normal(Parameter& p, uint64_t seed, double std, StreamHandle s = nullptr);
// Uniform(-bound, bound) from the same generator (LoRA's A: PEFT's kaiming_uniform(a = sqrt(5)), whose
// bound is 1 / sqrt(in)).
void init_uniform(Parameter& p, uint64_t seed, double bound, StreamHandle s = nullptr);
void init_constant(Parameter& p, float value, StreamHandle s = nullptr);

}  // namespace zp::nn
