#include "models/unet_flops.h"

#include <string>

#include "core/error.h"

namespace zp::models {

double unet_weight_positions(const UNetConfig& cfg, const std::string& name, int64_t H, int64_t W) {
  const int64_t n = cfg.num_blocks();
  // Positions at resolution level k (the input halved k times).
  auto at = [&](int64_t k) { return double((H >> k) * (W >> k)); };
  auto block_index = [](const std::string& s, size_t prefix) { return std::stoll(s.substr(prefix)); };
  auto contains = [](const std::string& s, const char* t) { return s.find(t) != std::string::npos; };
  if (name.starts_with("time_embedding.") || name.starts_with("add_embedding.") || contains(name, ".time_emb_proj."))
    return 1;  // once per sample
  if (name.starts_with("conv_in.") || name.starts_with("conv_out.")) return at(0);
  if (name.starts_with("mid_block.")) return at(n - 1);
  if (name.starts_with("down_blocks.")) {
    const int64_t i = block_index(name, 12);
    return contains(name, ".downsamplers.") ? at(i + 1) : at(i);
  }
  if (name.starts_with("up_blocks.")) {
    const int64_t i = block_index(name, 10);
    return contains(name, ".upsamplers.") ? at(n - 2 - i) : at(n - 1 - i);
  }
  ZP_FATAL("unet_weight_positions: unexpected parameter ", name);
}

double unet_train_flops_per_sample(UNet& m, int64_t H, int64_t W, int64_t L) {
  return unet_train_flops_per_sample(m.config(), m.parameters(), H, W, L);
}

double unet_train_flops_per_sample(const UNetConfig& cfg, const std::vector<nn::Parameter*>& params, int64_t H,
                                   int64_t W, int64_t L) {
  auto contains = [](const std::string& s, const char* t) { return s.find(t) != std::string::npos; };
  double step = 0;
  for (nn::Parameter* p : params) {
    if (p->shape.size() < 2) continue;  // norms and biases
    const std::string& name = p->name;
    const double pixels = unet_weight_positions(cfg, name, H, W);
    double positions = pixels;
    if (contains(name, ".attn2.to_k.") || contains(name, ".attn2.to_v.")) positions = double(L);  // text tokens
    // Forward and input gradient; the weight gradient only for a weight that trains.
    step += (p->frozen ? 2.0 : 3.0) * 2.0 * double(p->numel()) * positions;
    // Scores (T x Tk x I) and weighted values (the same again), all heads together.
    if (name.ends_with(".attn1.to_q.weight")) step += 3.0 * 4.0 * pixels * pixels * double(p->shape[0]);
    if (name.ends_with(".attn2.to_q.weight")) step += 3.0 * 4.0 * pixels * double(L) * double(p->shape[0]);
  }
  return step;
}

}  // namespace zp::models
