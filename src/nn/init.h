// Parameter initialisation from a counter-based generator: element i of the tensor named `name`
// gets a value that depends only on (seed, name, i), never on the world size, the shard a rank owns
// or the order of initialisation (DESIGN decision 7), so any rank can initialise any slice alone.
#pragma once
#include <cstdint>
#include <string>

#include "nn/parameter.h"

namespace zp::nn {

// Normal(0, std) for elements [begin, begin + count) of `name`'s flat index space, into host floats.
void counter_normal(uint64_t seed, const std::string& name, int64_t begin, int64_t count, double std, float* out);
// Fills a parameter (any device, any dtype) with counter_normal values or a constant.
void init_normal(Parameter& p, uint64_t seed, double std, StreamHandle s = nullptr);
void init_constant(Parameter& p, float value, StreamHandle s = nullptr);

}  // namespace zp::nn
