#include "models/activation_estimate.h"

#include <algorithm>
#include <map>
#include <string>

#include "io/lora_adapter_files.h"
#include "models/unet_flops.h"

namespace zp::models {

double transformer_activation_bytes(const TransformerConfig& c, int64_t B, int64_t T, DType dt, bool checkpointed,
                                    const LayerSpan& span) {
  const double tokens = double(B) * double(T), esz = double(dtype_size(dt));
  const double layers = double((span.end < 0 ? c.layers : span.end) - span.begin);
  // A layer's weight inputs per token: q/k/v and the MLP's up (and gate) read the normed hidden
  // state, the output projection the attention output, the down projection the MLP's hidden.
  const double layer = 2.0 * (3.0 * double(c.hidden) + double(c.ffn)) * tokens * esz;
  const double logits = tokens * double((c.vocab + 63) / 64 * 64) * esz;  // padded as the model pads them
  const double kept = checkpointed ? layers * tokens * double(c.hidden) * esz + layer : layers * layer;
  return kept + (span.head ? logits + tokens * double(c.hidden) * esz : 0.0);  // and the final norm's input
}

double unet_activation_bytes(UNet& m, int64_t B, int64_t H, int64_t W, int64_t L, DType dt, bool checkpointed) {
  const double esz = double(dtype_size(dt)) * double(B);
  // The layers activation checkpointing re-runs: each ResBlock and each transformer block. Other
  // weights (samplers, proj_in/out, stem, head) count with the layer before them, close enough.
  struct Layer {
    double input = -1, full = 0;
  };
  std::map<std::string, Layer> layers;
  auto layer_of = [](const std::string& name) {
    for (const char* unit : {"resnets.", "transformer_blocks."}) {
      const size_t at = name.find(unit);
      if (at == std::string::npos) continue;
      const size_t end = name.find('.', at + std::string(unit).size());
      return name.substr(0, end);
    }
    return name.substr(0, name.find('.'));
  };
  for (nn::Parameter* p : m.parameters()) {
    if (p->shape.size() < 2) continue;
    const std::string& name = p->name;
    // LoRA's adapters keep nothing: their module's input is kept anyway, u is recomputed in the
    // backward and the dropout masks come back from their hash (nn/linear.h, nn/conv2d.h).
    if (!io::lora_module_of(name).empty()) continue;
    const bool text = name.find(".attn2.to_k.") != std::string::npos || name.find(".attn2.to_v.") != std::string::npos;
    const double positions = text ? double(L) : unet_weight_positions(m.config(), name, H, W);
    const double input = positions * double(p->shape[1]) * esz;  // [out, in] or [out, in, kh, kw]
    Layer& l = layers[layer_of(name)];
    if (l.input < 0) l.input = input;  // the layer's first weight reads the layer's input
    l.full += 2.0 * input;
  }
  double all = 0, inputs = 0, largest = 0;
  for (const auto& [name, l] : layers) {
    all += l.full;
    inputs += l.input;
    largest = std::max(largest, l.full);
  }
  return checkpointed ? inputs + largest : all;
}

}  // namespace zp::models
