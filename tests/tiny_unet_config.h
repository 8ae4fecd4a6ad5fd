// The tiny diffusers UNet config the training tests share: golden unet-sd-tiny's layout (a
// cross-attention down block and a plain one, mirrored on the way up, GroupNorm over 8 groups),
// with SDXL's text_time conditioning and linear projections on request. Tests vary the latent size
// (smaller runs faster) and the second block's width (a different model for mismatch errors).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

namespace zp::test {

inline nlohmann::json tiny_unet_config(bool sdxl = false, int64_t sample_size = 8, int64_t width = 32) {
  nlohmann::json j = {{"_class_name", "UNet2DConditionModel"},
                      {"block_out_channels", {16, width}},
                      {"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
                      {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
                      {"layers_per_block", 1},
                      {"attention_head_dim", 8},
                      {"cross_attention_dim", 16},
                      {"norm_num_groups", 8},
                      {"sample_size", sample_size}};
  if (sdxl) {
    j["addition_embed_type"] = "text_time";
    j["addition_time_embed_dim"] = 8;
    j["projection_class_embeddings_input_dim"] = 56;  // text_embeds of 8 + 6 time ids x 8
    j["use_linear_projection"] = true;
  }
  return j;
}

}  // namespace zp::test
