// `zeropipe make-latents`: writes a small synthetic latent file (io/latent_dataset.h layout) that a
// UNet can learn from, for demos and tests without a VAE or a text encoder.
//
// Each sample belongs to one of 8 classes and 4 phases: its latents are smooth sinusoidal patterns
// (per channel, class-dependent frequencies and offsets, shifted by the phase, times a random
// amplitude in [0.75, 1.25]; about unit variance like scaled SD latents). The conditioning encodes
// exactly what defines the pattern: encoder_hidden_states alternates the class's embedding and the
// phase's embedding times the amplitude; SDXL models also get the class's pooled embedding as
// text_embeds and SDXL-style time_ids (8H, 8W, 0, 0, 8H, 8W). Embeddings are fixed vectors (they do
// not depend on the seed), so files written with different seeds share one meaning (train/val).
// The sample choice (class, phase, amplitude) depends only on (seed, sample index).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace zp::app {

// The diffusers UNet config.json that `spec` names: inline JSON text (starting with '{'), a folder
// holding config.json, a config.json file, or a training config (model.config inline, or
// model.hub_dir/config.json). `source` receives a name for error messages.
nlohmann::json resolve_unet_config(const std::string& spec, std::string& source);

// Writes n samples of the UNet's in_channels x sample_size x sample_size latents (sample_size from
// the config, default 16), 8 text tokens of its cross_attention_dim, to `path` (through a temporary
// name, renamed when complete). Returns 0; throws zp::Error naming the file or the config key.
int make_latents(const std::string& path, const std::string& unet_config_json_or_dir, int64_t n, uint64_t seed);

}  // namespace zp::app
