// Where a model's layers are cut into pipeline chunks (issue 12's pipeline.partition): P x V chunks
// of consecutive layers, each at least one layer, the first chunk also holding the input side (the
// embedding) and the last the output side (the head). A layer is the model's unit of a cut: a
// transformer layer, or a UNet's down, mid or up block; `unit` names it in messages.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zp::parallel {

// What one layer costs, and what the first and the last chunk carry besides their layers, in one
// unit (parameters or FLOPs).
struct LayerCosts {
  std::vector<double> layers;
  double first_extra = 0, last_extra = 0;
};

// The chunks' boundaries: chunks + 1 layer indices from 0 to L, chunk k holding [b[k], b[k+1]).
//   "uniform"   every chunk L / chunks layers, the first L % chunks chunks one more;
//   "balanced"  the cut that minimises the costliest chunk (ties: the earliest cut), exact.
// Throws zp::Error naming pipeline.stages / pipeline.virtual_stages when L < chunks.
std::vector<int64_t> uniform_partition(int64_t layers, int chunks, const std::string& unit = "layer");
std::vector<int64_t> balanced_partition(const LayerCosts& costs, int chunks, const std::string& unit = "layer");
// From pipeline.partition's explicit list (the first layer of every chunk after the first): checks
// it against L and returns the boundaries; throws zp::Error naming pipeline.partition.
std::vector<int64_t> explicit_partition(const std::vector<int64_t>& firsts, int64_t layers, int chunks,
                                        const std::string& unit = "layer");

// "layers [0, 3) | [3, 6) | ..." for the start-up line.
std::string partition_str(const std::vector<int64_t>& bounds, const std::string& unit = "layer");

}  // namespace zp::parallel
