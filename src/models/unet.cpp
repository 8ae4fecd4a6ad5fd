#include "models/unet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "core/copy_rows.h"
#include "io/weight_source.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/nhwc.h"
#include "models/hub_keys.h"
#include "nn/attention.h"
#include "nn/basic_transformer_block.h"
#include "nn/cross_attention.h"
#include "nn/downsample2d.h"
#include "nn/norm.h"
#include "nn/res_block.h"
#include "nn/trained_blocks.h"
#include "nn/transformer2d.h"
#include "nn/upsample2d.h"

namespace zp::models {
using nlohmann::json;
using namespace zp::nn;
using namespace zp::kernels;

// ---------------------------------------------------------------------------------------------
// Config

namespace {

// Every key diffusers 0.40 writes for UNet2DConditionModel. Keys starting with '_' are metadata.
const std::set<std::string> kKnownKeys = {
    "sample_size", "in_channels", "out_channels", "center_input_sample", "flip_sin_to_cos", "freq_shift",
    "down_block_types", "mid_block_type", "up_block_types", "only_cross_attention", "block_out_channels",
    "layers_per_block", "downsample_padding", "mid_block_scale_factor", "dropout", "act_fn", "norm_num_groups",
    "norm_eps", "cross_attention_dim", "transformer_layers_per_block", "reverse_transformer_layers_per_block",
    "encoder_hid_dim", "encoder_hid_dim_type", "attention_head_dim", "num_attention_heads", "dual_cross_attention",
    "use_linear_projection", "class_embed_type", "addition_embed_type", "addition_time_embed_dim",
    "num_class_embeds", "upcast_attention", "resnet_time_scale_shift", "resnet_skip_time_act",
    "resnet_out_scale_factor", "time_embedding_type", "time_embedding_dim", "time_embedding_act_fn",
    "timestep_post_act", "time_cond_proj_dim", "conv_in_kernel", "conv_out_kernel",
    "projection_class_embeddings_input_dim", "attention_type", "class_embeddings_concat",
    "mid_block_only_cross_attention", "cross_attention_norm", "addition_embed_type_num_heads"};

struct DiffusersKeys : HubKeys {
  [[noreturn]] void wrong(const char* key, const std::string& want) const { wrong_type(key, want); }
  // The key is absent, or null when null is allowed, or one of `allowed` (diffusers' default first).
  void allow_only(const char* key, const std::vector<json>& allowed, bool null_ok, const std::string& why) const {
    if (!j.contains(key) || (null_ok && j[key].is_null())) return;
    for (const json& a : allowed)
      if (j[key] == a) return;
    unsupported(key, why);
  }
  // A size (HubKeys::size) for every block, or a list of n sizes.
  std::vector<int64_t> per_block(const char* key, size_t n, const json& fallback) const {
    const json& v = has(key) ? j[key] : fallback;
    std::vector<int64_t> out;
    if (v.is_number_integer()) {
      out.assign(n, v.get<int64_t>());
    } else if (v.is_array() && v.size() == n) {
      for (const json& e : v) {
        if (e.is_array()) unsupported(key, "per-layer lists (asymmetric UNets)");
        if (!e.is_number_integer()) wrong(key, "an integer or a list of " + std::to_string(n) + " integers");
        out.push_back(e.get<int64_t>());
      }
    } else {
      wrong(key, "an integer or a list of " + std::to_string(n) + " integers (one per down block)");
    }
    for (int64_t x : out)
      if (x < 1 || x > kMaxSize) wrong(key, "in [1, 2^31]");
    return out;
  }
};

// An upper bound of a UNet's parameter count from its largest sizes: every ResBlock is at most
// 2 (k^2 + 1) C^2 and every transformer at most 32 (T + 2) C^2 (attention 6 C^2, GEGLU 12 C^2, projections),
// for at most L + 2 of each in each of the 2n + 1 down, up and mid blocks, plus the embeddings and the
// outer convs. With C the largest channel or embedding width, k the largest kernel, L and T the
// most layers and transformer layers of a block.
long double unet_parameter_bound(const UNetConfig& c) {
  int64_t widest = std::max({c.in_channels, c.out_channels, c.time_embed_dim, c.add_in_dim, c.add_time_dim});
  for (int64_t x : c.block_out) widest = std::max(widest, x);
  for (int64_t x : c.cross_dim) widest = std::max(widest, x);
  const long double C = widest, k = std::max({c.conv_in_kernel, c.conv_out_kernel, int64_t(3)});
  const long double L = *std::max_element(c.layers.begin(), c.layers.end());
  const long double T = *std::max_element(c.transformer_layers.begin(), c.transformer_layers.end());
  const long double n = c.block_out.size();
  return (3 * n + 3) * (L + 2) * 32 * (k * k + 1) * (T + 2) * C * C;
}

// As in transformer.cpp: 16 bytes of weights, gradients and Adam moments per parameter stay in int64.
constexpr long double kMaxParameters = 72057594037927936.0L;  // 2^56

UNetConfig read_hub_config(const json& j, const std::string& source) {
  ZP_REQUIRE(j.is_object(), source, ": not a JSON object");
  for (const auto& [key, value] : j.items())
    if (!key.empty() && key[0] != '_' && !kKnownKeys.count(key))
      throw Error(source + ": unknown key '" + io::text_excerpt(key) + "' (not a diffusers UNet2DConditionModel key)");
  DiffusersKeys k{{j, source}};
  if (k.has("_class_name")) {
    std::string cls = k.get<std::string>("_class_name");
    ZP_REQUIRE(cls == "UNet2DConditionModel", source, ": key '_class_name' = \"", io::text_excerpt(cls),
               "\" is not supported (UNet2DConditionModel)");
  }

  // Features we do not implement: each must keep its diffusers default.
  k.allow_only("center_input_sample", {false}, false, "input centring");
  k.allow_only("only_cross_attention", {false}, false, "cross-attention-only blocks");
  k.allow_only("mid_block_only_cross_attention", {false}, true, "cross-attention-only blocks");
  k.allow_only("mid_block_type", {"UNetMidBlock2DCrossAttn"}, false, "UNetMidBlock2DCrossAttn only");
  k.allow_only("downsample_padding", {1}, false, "downsample_padding 1 only");
  k.allow_only("dropout", {0, 0.0}, false, "dropout");
  k.allow_only("act_fn", {"silu", "swish"}, false, "SiLU activations only");
  k.allow_only("reverse_transformer_layers_per_block", {}, true, "asymmetric UNets");
  k.allow_only("encoder_hid_dim", {}, true, "an encoder_hid_proj");
  k.allow_only("encoder_hid_dim_type", {}, true, "an encoder_hid_proj");
  k.allow_only("num_attention_heads", {}, true,
               "diffusers itself rejects it; the number of heads comes from attention_head_dim");
  k.allow_only("dual_cross_attention", {false}, false, "dual cross-attention");
  k.allow_only("class_embed_type", {}, true, "class embeddings");
  k.allow_only("num_class_embeds", {}, true, "class embeddings");
  k.allow_only("class_embeddings_concat", {false}, false, "class embeddings");
  k.allow_only("addition_embed_type", {"text_time"}, true, "null or \"text_time\" only");
  k.allow_only("upcast_attention", {false}, false, "upcast attention");
  k.allow_only("resnet_time_scale_shift", {"default"}, false, "\"default\" only");
  k.allow_only("time_embedding_type", {"positional"}, false, "\"positional\" only");
  k.allow_only("time_embedding_act_fn", {}, true, "an activation after the time embedding");
  k.allow_only("timestep_post_act", {}, true, "an activation after the time embedding");
  k.allow_only("time_cond_proj_dim", {}, true, "timestep conditioning");
  k.allow_only("attention_type", {"default"}, false, "\"default\" only");
  k.allow_only("cross_attention_norm", {}, true, "normalised cross-attention context");

  UNetConfig c;
  c.in_channels = k.size_or("in_channels", 4);
  c.out_channels = k.size_or("out_channels", 4);
  c.block_out = k.sizes("block_out_channels");
  const size_t n = c.block_out.size();
  ZP_REQUIRE(n >= 1, source, ": key 'block_out_channels' is empty");
  auto block_types = [&](const char* key, const char* with_attn, const char* plain) {
    auto types = k.get<std::vector<std::string>>(key);
    if (types.size() != n) k.wrong(key, "a list of " + std::to_string(n) + " block types (one per block_out_channels)");
    std::vector<bool> attn;
    for (const std::string& t : types) {
      if (t != with_attn && t != plain)
        throw Error(source + ": key '" + key + "': block type \"" + io::text_excerpt(t) + "\" is not supported (" + with_attn + ", " +
                    plain + ")");
      attn.push_back(t == with_attn);
    }
    return attn;
  };
  c.down_attn = block_types("down_block_types", "CrossAttnDownBlock2D", "DownBlock2D");
  c.up_attn = block_types("up_block_types", "CrossAttnUpBlock2D", "UpBlock2D");
  c.layers = k.per_block("layers_per_block", n, 2);
  c.heads = k.per_block("attention_head_dim", n, 8);
  c.transformer_layers = k.per_block("transformer_layers_per_block", n, 1);
  c.cross_dim = k.per_block("cross_attention_dim", n, 1280);
  c.groups = k.size_or("norm_num_groups", 32);
  c.norm_eps = k.positive_float_or("norm_eps", 1e-5);
  c.linear_projection = k.get_or<bool>("use_linear_projection", false);
  c.flip_sin_to_cos = k.get_or<bool>("flip_sin_to_cos", true);
  c.freq_shift = k.get_or<double>("freq_shift", 0);
  c.time_embed_dim = k.size_or("time_embedding_dim", 4 * c.block_out[0]);
  c.conv_in_kernel = k.size_or("conv_in_kernel", 3);
  c.conv_out_kernel = k.size_or("conv_out_kernel", 3);
  c.mid_scale = k.float_or("mid_block_scale_factor", 1.0);
  c.resnet_scale = k.float_or("resnet_out_scale_factor", 1.0);
  c.skip_time_act = k.get_or<bool>("resnet_skip_time_act", false);
  c.text_time = k.has("addition_embed_type");
  if (c.text_time) {
    c.add_time_dim = k.size("addition_time_embed_dim");
    c.add_in_dim = k.size("projection_class_embeddings_input_dim");
    ZP_REQUIRE(c.add_time_dim > 0 && c.add_in_dim > kTimeIdsPerSample * c.add_time_dim, source,
               ": keys 'addition_time_embed_dim' and 'projection_class_embeddings_input_dim' leave no room for "
               "text_embeds (", c.add_in_dim, " <= ", kTimeIdsPerSample, " * ", c.add_time_dim, ")");
  }

  ZP_REQUIRE(c.in_channels > 0 && c.out_channels > 0, source, ": in_channels and out_channels must be positive");
  ZP_REQUIRE(c.time_embed_dim > 0, source, ": key 'time_embedding_dim' must be positive");
  if (c.conv_in_kernel <= 0 || c.conv_in_kernel % 2 == 0) k.wrong("conv_in_kernel", "a positive odd kernel size");
  if (c.conv_out_kernel <= 0 || c.conv_out_kernel % 2 == 0) k.wrong("conv_out_kernel", "a positive odd kernel size");
  ZP_REQUIRE(c.groups > 0, source, ": key 'norm_num_groups' must be a positive integer");
  for (size_t i = 0; i < n; ++i) {
    ZP_REQUIRE(c.block_out[i] > 0 && c.block_out[i] % c.groups == 0, source, ": key 'norm_num_groups' = ", c.groups,
               " does not divide block_out_channels[", i, "] = ", c.block_out[i]);
    ZP_REQUIRE(c.heads[i] <= c.block_out[i], source, ": key 'attention_head_dim' (the number of heads in SD's "
               "convention) = ", c.heads[i], " exceeds the ", c.block_out[i], " channels of block ", i);
  }
  // The skip connections: the up path pops exactly what the down path pushed, with the channel counts
  // diffusers' up blocks were built for.
  std::vector<int64_t> stack{c.block_out[0]};
  for (size_t i = 0; i < n; ++i) {
    for (int64_t l = 0; l < c.layers[i]; ++l) stack.push_back(c.block_out[i]);
    if (i + 1 < n) stack.push_back(c.block_out[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t r = n - 1 - i;
    const int64_t out = c.block_out[r], in = c.block_out[r == 0 ? 0 : r - 1];
    for (int64_t l = 0; l <= c.layers[r]; ++l) {
      const int64_t want = l == c.layers[r] ? in : out;
      ZP_REQUIRE(!stack.empty() && stack.back() == want, source,
                 ": key 'layers_per_block': the up blocks' skip connections do not match the down path");
      stack.pop_back();
    }
  }
  const long double bound = unet_parameter_bound(c);
  ZP_REQUIRE(bound <= kMaxParameters, source, ": the sizes allow up to about ", double(bound),
             " parameters, more than 2^56 (the byte counts of weights and optimizer state must fit int64)");
  return c;
}

}  // namespace

UNetConfig UNetConfig::from_hub_json(const json& j, const std::string& source) {
  return named_json_errors(source, [&] { return read_hub_config(j, source); });
}

std::string UNetConfig::unit_name(int64_t u) const {
  const int64_t n = num_blocks();
  ZP_CHECK(u >= 0 && u < num_units(), "UNet unit ", u, " of ", num_units());
  if (u < n) return "down_blocks." + std::to_string(u);
  if (u == n) return "mid_block";
  return "up_blocks." + std::to_string(u - n - 1);
}

int64_t UNetConfig::unit_of_block(const std::string& block) const {
  const std::string unit = block.ends_with(".lora") ? block.substr(0, block.size() - 5) : block;
  if (unit == "stem") return -1;
  if (unit == "head") return num_units();
  for (int64_t u = 0; u < num_units(); ++u)
    if (unit == unit_name(u)) return u;
  throw Error("UNet: '" + block + "' is not a block of this model");
}

std::vector<Shape> UNetConfig::boundary_shapes(int64_t cut, int64_t B, int64_t H, int64_t W) const {
  const int64_t n = num_blocks();
  ZP_CHECK(cut > 0 && cut < num_units(), "UNet pipeline cut before unit ", cut, " of ", num_units());
  // Channels and resolution level (the input halved `level` times) of what the units before the cut
  // leave: the hidden state and the skip stack, as the forward pushes and pops it.
  struct Planes {
    int64_t channels, level;
  };
  std::vector<Planes> stack{{block_out[0], 0}};  // conv_in's output
  Planes hidden{};
  for (int64_t u = 0; u < cut; ++u) {
    if (u < n) {  // down block u: its resnets' outputs, then the downsampler's
      for (int64_t l = 0; l < layers[size_t(u)]; ++l) stack.push_back({block_out[size_t(u)], u});
      hidden = {block_out[size_t(u)], u};
      if (u + 1 < n) {
        hidden.level = u + 1;
        stack.push_back(hidden);
      }
    } else if (u == n) {
      hidden = {block_out.back(), n - 1};
    } else {  // up block i mirrors down block r, pops its layers + 1 skips, then upsamples
      const int64_t i = u - n - 1, r = n - 1 - i;
      stack.resize(stack.size() - size_t(layers[size_t(r)] + 1));
      hidden = {block_out[size_t(r)], i + 1 < n ? r - 1 : r};
    }
  }
  auto planes = [&](const Planes& p) { return Shape{B, H >> p.level, W >> p.level, p.channels}; };
  std::vector<Shape> out{planes(hidden)};
  for (const Planes& p : stack) out.push_back(planes(p));
  out.push_back({B, time_embed_dim});
  return out;
}

int64_t UNetConfig::boundary_numel(int64_t cut, int64_t B, int64_t H, int64_t W) const {
  int64_t n = 0;
  for (const Shape& sh : boundary_shapes(cut, B, H, W)) n += shape_numel(sh);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Host-side pieces

std::vector<float> timestep_embedding(const std::vector<float>& t, int64_t dim, bool flip_sin_to_cos,
                                      double freq_shift) {
  const int64_t half = dim / 2;
  // Each step rounds to float32 as the reference's float32 tensors do.
  const float neg_log_period = float(-std::log(10000.0));
  const float denom = float(double(half) - freq_shift);
  std::vector<float> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = std::exp((neg_log_period * float(i)) / denom);
  std::vector<float> out(t.size() * size_t(dim), 0.f);
  for (size_t b = 0; b < t.size(); ++b) {
    float* row = &out[b * size_t(dim)];
    for (int64_t i = 0; i < half; ++i) {
      const double arg = double(t[b] * freq[size_t(i)]);
      const float s = float(std::sin(arg)), co = float(std::cos(arg));
      row[flip_sin_to_cos ? half + i : i] = s;
      row[flip_sin_to_cos ? i : half + i] = co;
    }
  }
  return out;
}

namespace {

// Host floats -> a tensor of the compute dtype on the context's device.
Tensor upload(const Ctx& c, const std::vector<float>& v, const Shape& shape) {
  ZP_CHECK(int64_t(v.size()) == shape_numel(shape), "upload of ", v.size(), " values as ", shape_str(shape));
  Tensor h = Tensor::empty(shape, c.dt, Device::cpu(), "conditioning");
  kernels::cpu::cast(nullptr, c.dt, h.data(), DType::F32, v.data(), int64_t(v.size()));
  return c.dev.is_cpu() ? h : h.to(c.dev, c.s);
}

void add_into(const Ctx& c, Tensor& y, const Tensor& x) {
  ZP_CHECK(y.numel() == x.numel(), "add ", x.str(), " into ", y.str());
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), y.data(), x.data(), y.numel());
}

// ---- parameter builders: diffusers' names under `p`, added to the block in diffusers' order

// lora: the stage's LoRA adapters, which this convolution gets when its module is a target.
Conv2d add_conv(ParamBlock& b, const std::string& p, int64_t cin, int64_t cout, int64_t k, int64_t stride,
                int64_t pad, LoraAttacher* lora = nullptr) {
  Parameter* w = b.add(p + ".weight", {cout, cin, k, k}, true);
  Parameter* bias = b.add(p + ".bias", {cout}, false);
  Conv2d conv(w, bias, stride, pad);
  if (lora) lora->attach(conv, w);
  return conv;
}
GroupNorm add_group_norm(ParamBlock& b, const std::string& p, int64_t C, int64_t groups, float eps, bool silu) {
  Parameter* w = b.add(p + ".weight", {C}, false);
  Parameter* bias = b.add(p + ".bias", {C}, false);
  return GroupNorm(w, bias, groups, eps, silu);
}
// lora: the stage's LoRA adapters, which this Linear gets when its module is a target.
Linear add_linear(ParamBlock& b, const std::string& p, int64_t in, int64_t out, LoraAttacher* lora = nullptr) {
  Parameter* w = b.add(p + ".weight", {out, in}, true);
  Parameter* bias = b.add(p + ".bias", {out}, false);
  Linear l(w, bias);
  if (lora) lora->attach(l, {w});
  return l;
}
Norm add_layer_norm(ParamBlock& b, const std::string& p, int64_t C) {
  Parameter* w = b.add(p + ".weight", {C}, false);
  Parameter* bias = b.add(p + ".bias", {C}, false);
  return Norm(NormKind::LayerNorm, w, bias, 1e-5f);  // BasicTransformerBlock's norm_eps default
}

// ResnetBlock2D: cin -> cout channels, scaled by `scale` (output_scale_factor).
ResBlock add_res_block(ParamBlock& b, const std::string& p, int64_t cin, int64_t cout, const UNetConfig& cfg,
                       float scale, LoraAttacher* lora) {
  GroupNorm norm1 = add_group_norm(b, p + ".norm1", cin, cfg.groups, cfg.norm_eps, true);
  Conv2d conv1 = add_conv(b, p + ".conv1", cin, cout, 3, 1, 1, lora);
  Linear temb_proj = add_linear(b, p + ".time_emb_proj", cfg.time_embed_dim, cout);
  GroupNorm norm2 = add_group_norm(b, p + ".norm2", cout, cfg.groups, cfg.norm_eps, true);
  Conv2d conv2 = add_conv(b, p + ".conv2", cout, cout, 3, 1, 1, lora);
  Conv2d shortcut;
  if (cin != cout) shortcut = add_conv(b, p + ".conv_shortcut", cin, cout, 1, 1, 0, lora);
  return ResBlock(norm1, conv1, temb_proj, norm2, conv2, shortcut, scale);
}

// BasicTransformerBlock of width I: attn1's to_q, to_k, to_v packed into one [3I, I] projection,
// attn2's to_k, to_v into one [2I, cross_dim] projection of the context.
BasicTransformerBlock add_transformer_block(ParamBlock& b, const std::string& p, int64_t I, int64_t heads,
                                            int64_t cross_dim, LoraAttacher* lora) {
  const int64_t F = 4 * I;
  Norm norm1 = add_layer_norm(b, p + ".norm1", I);
  SelfAttention attn1;
  {
    const std::string a = p + ".attn1.";
    Parameter* q = b.add(a + "to_q.weight", {I, I}, true);
    Parameter* k = b.add(a + "to_k.weight", {I, I}, true, /*packed=*/true);
    Parameter* v = b.add(a + "to_v.weight", {I, I}, true, /*packed=*/true);
    Linear out = add_linear(b, a + "to_out.0", I, I, lora);
    nn::AttentionShape shape;
    shape.Hq = shape.Hkv = heads;
    shape.D = I / heads;
    shape.causal = false;
    Linear qkv({q, k, v}, {});
    if (lora) lora->attach(qkv, {q, k, v});
    attn1 = SelfAttention(qkv, out, shape);
  }
  Norm norm2 = add_layer_norm(b, p + ".norm2", I);
  CrossAttention attn2;
  {
    const std::string a = p + ".attn2.";
    Parameter* q = b.add(a + "to_q.weight", {I, I}, true);
    Parameter* k = b.add(a + "to_k.weight", {I, cross_dim}, true);
    Parameter* v = b.add(a + "to_v.weight", {I, cross_dim}, true, /*packed=*/true);
    Linear out = add_linear(b, a + "to_out.0", I, I, lora);
    Linear lq(q, nullptr), lkv({k, v}, {});
    if (lora) {
      lora->attach(lq, {q});
      lora->attach(lkv, {k, v});
    }
    attn2 = CrossAttention(lq, lkv, out, heads);
  }
  Norm norm3 = add_layer_norm(b, p + ".norm3", I);
  Linear ff_proj = add_linear(b, p + ".ff.net.0.proj", I, 2 * F, lora);
  Linear ff_out = add_linear(b, p + ".ff.net.2", F, I, lora);
  return BasicTransformerBlock(norm1, attn1, norm2, attn2, norm3, ff_proj, ff_out);
}

// Transformer2DModel on C channels with `layers` transformer blocks of heads * (C / heads) width.
Transformer2D add_transformer2d(ParamBlock& b, const std::string& p, int64_t C, int64_t heads, int64_t layers,
                                int64_t cross_dim, const UNetConfig& cfg, LoraAttacher* lora) {
  const int64_t inner = heads * (C / heads);
  GroupNorm norm = add_group_norm(b, p + ".norm", C, cfg.groups, 1e-6f, false);
  Linear in_lin;
  Conv2d in_conv;
  if (cfg.linear_projection) {
    in_lin = add_linear(b, p + ".proj_in", C, inner, lora);
  } else {
    in_conv = add_conv(b, p + ".proj_in", C, inner, 1, 1, 0, lora);
  }
  std::vector<BasicTransformerBlock> blocks;
  for (int64_t l = 0; l < layers; ++l)
    blocks.push_back(
        add_transformer_block(b, p + ".transformer_blocks." + std::to_string(l), inner, heads, cross_dim, lora));
  if (cfg.linear_projection)
    return Transformer2D(norm, in_lin, std::move(blocks), add_linear(b, p + ".proj_out", inner, C, lora));
  return Transformer2D(norm, in_conv, std::move(blocks), add_conv(b, p + ".proj_out", inner, C, 1, 1, 0, lora));
}

// What every ResBlock and Transformer2D of one forward is conditioned on.
struct Conditioning {
  Tensor temb;     // [B, T]: SiLU(emb), or emb itself with resnet_skip_time_act
  Tensor context;  // [B, L, Dc]: encoder_hidden_states
};

// What one stage's forward kept.
struct StageActivations {
  int64_t H = 0, W = 0;  // input size
  std::vector<ResBlock::Saved> resnets;
  std::vector<Transformer2D::Saved> attentions;
  Downsample2D::Saved downsampler;
  Upsample2D::Saved upsampler;
  std::vector<int64_t> skips;  // indices into the skip list: pushed (Down) or popped (Up), per resnet
  int64_t sampler_skip = -1;   // Down: index of the downsampler's output in the skip list
};

// An inference forward drops what a layer saved as soon as the layer returns: the next layers read
// only its output.
template <class Saved>
void drop_unless_saving(const Ctx& c, Saved& saved) {
  if (!c.saves) saved = {};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stages (down, mid and up blocks): one ParamBlock each.

struct UNet::Stage {
  enum class Kind { Down, Mid, Up };
  Kind kind;
  std::unique_ptr<ParamBlock> block;
  std::unique_ptr<ParamBlock> adapters;   // LoRA's A and B matrices of this stage, or null
  std::vector<ResBlock> resnets;
  std::vector<Transformer2D> attentions;  // empty for DownBlock2D / UpBlock2D
  Downsample2D downsampler;               // Down: downsamplers.0, but in the last block
  Upsample2D upsampler;                   // Up: upsamplers.0, but in the last block
  std::vector<int64_t> skip_channels;     // Up: channels of the skip each resnet concatenates

  Stage(Kind k, const std::string& name) : kind(k), block(std::make_unique<ParamBlock>(name)) {}
  bool has_attention() const { return !attentions.empty(); }

  // h: the stage's input, [B, H_, W_, C]; H_ and W_ become the output's size. Down pushes its
  // outputs on the skip list, Up pops from skip_top.
  Tensor forward(const Ctx& c, Tensor h, int64_t& H_, int64_t& W_, const Conditioning& cond,
                 std::vector<Tensor>& skip_list, int64_t& skip_top, StageActivations& a, bool checkpoint) const {
    const int64_t H = H_, W = W_;
    a.H = H;
    a.W = W;
    a.resnets.resize(resnets.size());
    a.attentions.resize(attentions.size());
    auto resnet = [&](size_t j, const Tensor& x, const Tensor& skip) {
      Tensor y = resnets[j].forward(c, x, skip, H, W, cond.temb, a.resnets[j], checkpoint);
      drop_unless_saving(c, a.resnets[j]);
      return y;
    };
    auto attention = [&](size_t j, const Tensor& x) {
      Tensor y = attentions[j].forward(c, x, H, W, cond.context, a.attentions[j], checkpoint);
      drop_unless_saving(c, a.attentions[j]);
      return y;
    };
    if (kind == Kind::Mid) {
      h = resnet(0, h, Tensor());
      for (size_t j = 0; j < attentions.size(); ++j) {
        h = attention(j, h);
        h = resnet(j + 1, h, Tensor());
      }
      return h;
    }
    for (size_t j = 0; j < resnets.size(); ++j) {
      Tensor skip;
      if (kind == Kind::Up) {
        ZP_CHECK(skip_top > 0, "skip connections exhausted");
        a.skips.push_back(--skip_top);
        skip = skip_list[size_t(skip_top)];
        ZP_CHECK(skip.size(3) == skip_channels[j], "skip connection ", skip_top, " is ", skip.str(), ", expected ",
                 skip_channels[j], " channels");
        if (!c.saves) skip_list[size_t(skip_top)] = Tensor();  // read once
      }
      h = resnet(j, h, skip);
      if (has_attention()) h = attention(j, h);
      if (kind == Kind::Down) {
        a.skips.push_back(int64_t(skip_list.size()));
        skip_list.push_back(h);
      }
    }
    if (downsampler.defined()) {
      Tensor y = downsampler.forward(c, h, H, W, a.downsampler);  // its input is a skip: kept anyway
      drop_unless_saving(c, a.downsampler);
      H_ = y.size(1);
      W_ = y.size(2);
      a.sampler_skip = int64_t(skip_list.size());
      skip_list.push_back(y);
      return y;
    }
    if (upsampler.defined()) {
      Tensor y = upsampler.forward(c, h, H, W, a.upsampler, checkpoint);
      drop_unless_saving(c, a.upsampler);
      H_ = 2 * H;
      W_ = 2 * W;
      return y;
    }
    return h;
  }

  // g: gradient of the stage's output (Down: before adding the skip gradients, which this adds).
  // temb's gradient accumulates into dtemb; the skips' gradients go to (Up) or come from (Down) dskips.
  // With `later`, the weight gradients are left in it (nn/deferred_weight_grads.h).
  Tensor backward(const Ctx& c, Tensor g, const Conditioning& cond, Tensor& dtemb, std::vector<Tensor>& dskips,
                  StageActivations& a, DeferredWeightGrads* later) const {
    const int64_t H = a.H, W = a.W;
    auto resnet = [&](size_t j, const Tensor& dy, Tensor* dskip) {
      return resnets[j].backward(c, dy, H, W, cond.temb, dtemb, a.resnets[j], dskip, later);
    };
    auto attention = [&](size_t j, const Tensor& dy) {
      return attentions[j].backward(c, dy, H, W, cond.context, a.attentions[j], later);
    };
    if (kind == Kind::Mid) {
      for (size_t j = attentions.size(); j-- > 0;) {
        g = resnet(j + 1, g, nullptr);
        g = attention(j, g);
      }
      return resnet(0, g, nullptr);
    }
    if (downsampler.defined()) {
      add_into(c, g, dskips[size_t(a.sampler_skip)]);
      g = downsampler.backward(c, g, H, W, a.downsampler, later);
    }
    if (upsampler.defined()) g = upsampler.backward(c, g, H, W, a.upsampler, later);
    for (size_t j = resnets.size(); j-- > 0;) {
      if (kind == Kind::Down) add_into(c, g, dskips[size_t(a.skips[j])]);
      if (has_attention()) g = attention(j, g);
      g = resnet(j, g, kind == Kind::Up ? &dskips[size_t(a.skips[j])] : nullptr);
    }
    return g;
  }
};

// ---------------------------------------------------------------------------------------------
// The activations

struct UNetActivations::State {
  int64_t B = 0, H = 0, W = 0;
  Conditioning cond;
  Tensor sample, t_in, e1, s1, emb, add_in, f1, fs;  // the input sample and the stem's activations
  std::vector<Tensor> skips;
  std::vector<StageActivations> units;  // num_units(); those of the span filled
  Tensor h_last, o;  // input and output of the final GroupNorm + SiLU
  GroupNorm::Saved n_out;
  nn::DropoutDraw dropout;  // the forward's, for its backward
};

UNetActivations::UNetActivations(bool saves, bool checkpoint) : saves_(saves), checkpoint_(checkpoint) {}
UNetActivations::UNetActivations(UNetActivations&&) noexcept = default;
UNetActivations& UNetActivations::operator=(UNetActivations&&) noexcept = default;
UNetActivations::~UNetActivations() = default;

// ---------------------------------------------------------------------------------------------
// The model

UNet::~UNet() = default;

// The modules LoRA can adapt: those of a down, mid or up block, and the stem's conv_in and the
// head's conv_out (which kohya-ss and some diffusers files adapt); the time embedding trains none.
static std::vector<std::string> unet_lora_modules() {
  return {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
          "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2", "proj_in", "proj_out",
          "resnets.0.conv1", "resnets.0.conv2", "resnets.0.conv_shortcut", "downsamplers.0.conv",
          "upsamplers.0.conv", "conv_in", "conv_out"};
}

UNet::UNet(const UNetConfig& cfg, Device dev, DType dt, StreamHandle s, int64_t pad_multiple, bool allocate,
           const LoraSpec& lora, UNetSpan span)
    : cfg_(cfg), lora_(lora), span_(span) {
  if (lora_.r > 0) check_lora_targets(lora_, unet_lora_modules(), "UNet block");
  auto place = [&](ParamBlock& b) {
    if (allocate)
      b.allocate(dev, dt, s, pad_multiple);
    else
      b.layout(dev, dt, pad_multiple);
  };
  ctx_.dev = dev;
  ctx_.s = s;
  ctx_.dt = dt;
  const int64_t n = cfg.num_blocks(), T = cfg.time_embed_dim, C0 = cfg.block_out[0];

  // With LoRA: a block's adapters (a stage's, the stem's, the head's) go into a block of their own,
  // placed after the (frozen) block; none when the block has no targeted module.
  auto adapters_of = [&](ParamBlock& block, std::unique_ptr<ParamBlock>& adapters) -> std::optional<LoraAttacher> {
    if (lora_.r <= 0) return std::nullopt;
    block.freeze();
    adapters = std::make_unique<ParamBlock>(block.name() + ".lora");
    return LoraAttacher(lora_, *adapters);
  };
  std::set<std::string> targets_used;
  auto place_adapters = [&](std::unique_ptr<ParamBlock>& adapters, const std::optional<LoraAttacher>& attacher) {
    if (attacher) targets_used.insert(attacher->targets_used().begin(), attacher->targets_used().end());
    if (attacher && attacher->attached() > 0)
      place(*adapters);
    else
      adapters.reset();
  };
  if (span_.end < 0) span_.end = cfg.num_units();
  ZP_CHECK(span_.begin >= 0 && span_.begin < span_.end && span_.end <= cfg.num_units(), "UNet span [", span_.begin,
           ", ", span_.end, ") of ", cfg.num_units(), " units");
  units_.resize(size_t(cfg.num_units()));
  auto held = [&](int64_t u) { return u >= span_.begin && u < span_.end; };

  if (has_stem()) {
    stem_ = std::make_unique<ParamBlock>("stem");
    std::optional<LoraAttacher> lora_here = adapters_of(*stem_, stem_adapters_);
    conv_in_ = add_conv(*stem_, "conv_in", cfg.in_channels, C0, cfg.conv_in_kernel, 1, (cfg.conv_in_kernel - 1) / 2,
                        lora_here ? &*lora_here : nullptr);
    time_1_ = add_linear(*stem_, "time_embedding.linear_1", C0, T);
    time_2_ = add_linear(*stem_, "time_embedding.linear_2", T, T);
    if (cfg.text_time) {
      add_1_ = add_linear(*stem_, "add_embedding.linear_1", cfg.add_in_dim, T);
      add_2_ = add_linear(*stem_, "add_embedding.linear_2", T, T);
    }
    place(*stem_);
    place_adapters(stem_adapters_, lora_here);
  }

  for (int64_t i = 0; i < n; ++i) {
    if (!held(i)) continue;
    const std::string p = cfg.unit_name(i);
    auto st = std::make_unique<Stage>(Stage::Kind::Down, p);
    std::optional<LoraAttacher> lora_here = adapters_of(*st->block, st->adapters);
    const int64_t cin = cfg.block_out[size_t(i == 0 ? 0 : i - 1)], cout = cfg.block_out[size_t(i)];
    for (int64_t l = 0; l < cfg.layers[size_t(i)]; ++l) {
      const std::string ls = std::to_string(l);
      st->resnets.push_back(add_res_block(*st->block, p + ".resnets." + ls, l == 0 ? cin : cout, cout, cfg,
                                          cfg.resnet_scale, lora_here ? &*lora_here : nullptr));
      if (cfg.down_attn[size_t(i)])
        st->attentions.push_back(add_transformer2d(*st->block, p + ".attentions." + ls, cout, cfg.heads[size_t(i)],
                                                   cfg.transformer_layers[size_t(i)], cfg.cross_dim[size_t(i)], cfg,
                                                   lora_here ? &*lora_here : nullptr));
    }
    if (i + 1 < n)
      st->downsampler = Downsample2D(
          add_conv(*st->block, p + ".downsamplers.0.conv", cout, cout, 3, 2, 1, lora_here ? &*lora_here : nullptr));
    place(*st->block);
    place_adapters(st->adapters, lora_here);
    units_[size_t(i)] = std::move(st);
  }

  if (held(n)) {
    const int64_t C = cfg.block_out.back();
    auto mid = std::make_unique<Stage>(Stage::Kind::Mid, "mid_block");
    std::optional<LoraAttacher> lora_here = adapters_of(*mid->block, mid->adapters);
    mid->resnets.push_back(add_res_block(*mid->block, "mid_block.resnets.0", C, C, cfg, cfg.mid_scale,
                                         lora_here ? &*lora_here : nullptr));
    mid->attentions.push_back(add_transformer2d(*mid->block, "mid_block.attentions.0", C, cfg.heads.back(),
                                                cfg.transformer_layers.back(), cfg.cross_dim.back(), cfg,
                                                lora_here ? &*lora_here : nullptr));
    mid->resnets.push_back(add_res_block(*mid->block, "mid_block.resnets.1", C, C, cfg, cfg.mid_scale,
                                         lora_here ? &*lora_here : nullptr));
    place(*mid->block);
    place_adapters(mid->adapters, lora_here);
    units_[size_t(n)] = std::move(mid);
  }

  for (int64_t i = 0; i < n; ++i) {
    if (!held(n + 1 + i)) continue;
    const size_t r = size_t(n - 1 - i);  // the down block this up block mirrors
    const std::string p = cfg.unit_name(n + 1 + i);
    auto st = std::make_unique<Stage>(Stage::Kind::Up, p);
    std::optional<LoraAttacher> lora_here = adapters_of(*st->block, st->adapters);
    const int64_t out = cfg.block_out[r], prev = i == 0 ? out : cfg.block_out[r + 1],
                  in = cfg.block_out[r == 0 ? 0 : r - 1];
    const int64_t num = cfg.layers[r] + 1;
    for (int64_t l = 0; l < num; ++l) {
      const std::string ls = std::to_string(l);
      const int64_t skip = l == num - 1 ? in : out, res_in = l == 0 ? prev : out;
      st->skip_channels.push_back(skip);
      st->resnets.push_back(
          add_res_block(*st->block, p + ".resnets." + ls, res_in + skip, out, cfg, cfg.resnet_scale,
                        lora_here ? &*lora_here : nullptr));
      if (cfg.up_attn[size_t(i)])
        st->attentions.push_back(add_transformer2d(*st->block, p + ".attentions." + ls, out, cfg.heads[r],
                                                   cfg.transformer_layers[r], cfg.cross_dim[r], cfg,
                                                   lora_here ? &*lora_here : nullptr));
    }
    if (i + 1 < n)
      st->upsampler = Upsample2D(
          add_conv(*st->block, p + ".upsamplers.0.conv", out, out, 3, 1, 1, lora_here ? &*lora_here : nullptr));
    place(*st->block);
    place_adapters(st->adapters, lora_here);
    units_[size_t(n + 1 + i)] = std::move(st);
  }

  if (has_head()) {
    head_ = std::make_unique<ParamBlock>("head");
    std::optional<LoraAttacher> lora_here = adapters_of(*head_, head_adapters_);
    norm_out_ = add_group_norm(*head_, "conv_norm_out", C0, cfg.groups, cfg.norm_eps, true);
    conv_out_ = add_conv(*head_, "conv_out", C0, cfg.out_channels, cfg.conv_out_kernel, 1,
                         (cfg.conv_out_kernel - 1) / 2, lora_here ? &*lora_here : nullptr);
    place(*head_);
    place_adapters(head_adapters_, lora_here);
  }
  // A target that the static list offers but this model lacks (conv_shortcut where no width changes,
  // a sampler of a one-block UNet): a chunk sees only its own stages, so only the whole model tells.
  if (lora_.r > 0 && span_.begin == 0 && span_.end == cfg.num_units())
    for (const std::string& t : lora_.target_modules)
      ZP_REQUIRE(targets_used.contains(t), "lora.target_modules: '", t, "' names no module of this UNet (",
                 cfg.num_blocks(), " blocks, use_linear_projection ", cfg.linear_projection ? "true" : "false", ")");
  else if (lora_.r > 0)
    UNet(cfg, dev, dt, s, 1, /*allocate=*/false, lora_);  // laid out only: the check above, for a chunk
}

std::vector<ParamBlock*> UNet::blocks() {
  std::vector<ParamBlock*> b;
  auto add = [&](const std::unique_ptr<ParamBlock>& block, const std::unique_ptr<ParamBlock>& adapters) {
    if (block) b.push_back(block.get());
    if (adapters) b.push_back(adapters.get());
  };
  add(stem_, stem_adapters_);
  for (auto& st : units_)
    if (st) add(st->block, st->adapters);
  add(head_, head_adapters_);
  return b;
}

std::vector<ParamBlock*> UNet::trainable_blocks() { return nn::trained_blocks(blocks()); }

std::vector<ParamBlock*> UNet::base_blocks() { return lora_.r > 0 ? frozen_blocks() : blocks(); }

std::vector<ParamBlock*> UNet::frozen_blocks() { return nn::frozen_blocks(blocks()); }

std::vector<Parameter*> UNet::parameters() { return parameters_of(blocks()); }

Parameter* UNet::find(const std::string& name) { return find_parameter(blocks(), name); }

int64_t UNet::num_parameters() {
  int64_t total = 0;
  for (Parameter* p : parameters()) total += p->numel();
  return total;
}

void UNet::check_weights(const io::WeightSource& files) {
  if (span_.begin != 0 || span_.end != cfg_.num_units()) {
    // A chunk: the file must fit the whole model (laid out only, nothing allocated).
    UNet whole(cfg_, ctx_.dev, ctx_.dt, ctx_.s, 1, /*allocate=*/false, lora_);
    whole.check_weights(files);
    return;
  }
  std::set<std::string> used;
  for (Parameter* p : parameters_of(base_blocks())) {
    ZP_REQUIRE(files.contains(p->name), files.path(), ": model weights: tensor '", p->name, "' is missing");
    const Shape have = files.shape(p->name, false);
    ZP_REQUIRE(have == p->shape, files.path(), ": tensor '", p->name, "' has shape ", shape_str(have),
               ", the config needs ", shape_str(p->shape));
    used.insert(p->name);
  }
  for (const std::string& name : files.names())
    ZP_REQUIRE(used.count(name), files.path(), ": model weights: tensor '", name,
               "' is not part of the model the config describes");
}

void UNet::load_block(const io::WeightSource& files, ParamBlock& b) {
  for (auto& p : b.params()) p->value.copy_from(files.read(p->name, ctx_.dt, false), ctx_.s);
}

void UNet::load(const io::WeightSource& files) {
  check_weights(files);
  for (ParamBlock* b : base_blocks()) load_block(files, *b);
}


namespace {

// The tensors `shapes` of one flat boundary tensor, as views of it (no copy).
std::vector<Tensor> boundary_views(const Tensor& flat, const std::vector<Shape>& shapes, const char* what) {
  int64_t total = 0;
  for (const Shape& sh : shapes) total += shape_numel(sh);
  ZP_CHECK(flat.defined() && flat.numel() == total, "UNet chunk: ", what, " ", flat.defined() ? flat.str() : "none",
           " does not hold the ", total, " values the cut carries");
  std::vector<Tensor> views;
  int64_t at = 0;
  for (const Shape& sh : shapes) {
    views.push_back(flat.flat(at, shape_numel(sh)).view(sh));
    at += shape_numel(sh);
  }
  return views;
}

// `parts` packed into one flat tensor in order; each must have its shape's size.
Tensor pack_boundary(const Ctx& c, const std::vector<Shape>& shapes, const std::vector<const Tensor*>& parts) {
  ZP_CHECK(shapes.size() == parts.size(), "UNet chunk: ", parts.size(), " tensors for a cut of ", shapes.size());
  int64_t total = 0;
  for (const Shape& sh : shapes) total += shape_numel(sh);
  Tensor flat = c.act({total});
  std::vector<Tensor> views = boundary_views(flat, shapes, "boundary");
  for (size_t k = 0; k < parts.size(); ++k) {
    ZP_CHECK(parts[k]->defined() && parts[k]->numel() == views[k].numel(), "UNet chunk: part ", k, " of the cut is ",
             parts[k]->defined() ? parts[k]->str() : "none", ", expected ", shape_str(shapes[k]));
    views[k].copy_from(*parts[k], c.s);
  }
  return flat;
}

}  // namespace

Tensor UNet::forward(const UNetInputs& in, UNetActivations& acts, const Tensor& boundary) const {
  ZP_REQUIRE(acts.empty(), "UNet forward into activations that still hold a forward: run its backward first, or "
             "give this forward its own UNetActivations");
  Ctx c = ctx_;
  c.saves = acts.saves();
  if (c.saves) c.dropout = in.dropout;  // an inference forward draws none
  const bool checkpoint = acts.checkpointed();
  const UNetConfig& cfg = cfg_;
  ZP_REQUIRE(in.sample.defined() && in.sample.dim() == 4 && in.sample.size(1) == cfg.in_channels,
             "UNet input sample must be [B, ", cfg.in_channels, ", H, W], got ", in.sample.str());
  ZP_REQUIRE(in.sample.dtype() == c.dt && in.sample.device() == c.dev, "UNet input sample is ", in.sample.str(),
             ", the model computes in ", dtype_name(c.dt), " on ", c.dev.str());
  ZP_CHECK(has_stem() != boundary.defined(), "UNet chunk [", span_.begin, ", ", span_.end, "): ",
           has_stem() ? "the chunk with the stem takes no boundary" : "a chunk without the stem needs its boundary");
  auto state = std::make_unique<UNetActivations::State>();
  UNetActivations::State& st = *state;
  const int64_t B = in.sample.size(0), H = in.sample.size(2), W = in.sample.size(3), T = cfg.time_embed_dim;
  const int64_t factor = int64_t(1) << (cfg.num_blocks() - 1);
  ZP_REQUIRE(H % factor == 0 && W % factor == 0, "UNet input ", H, "x", W, " is not divisible by ", factor,
             " (one halving per down block)");
  st.B = B;
  st.H = H;
  st.W = W;
  st.dropout = c.dropout;
  const int64_t C0 = cfg.block_out[0];

  Tensor h;
  if (has_stem()) {
    // The stem's parameters serve the time embedding here and conv_in below.
    nn::AdaptedBlockInUse stem_use(access_, *stem_, stem_adapters_.get());

    // Time embedding (+ SDXL's added text/time embedding).
    std::vector<float> ts = in.timesteps;
    if (ts.size() == 1) ts.assign(size_t(B), ts[0]);
    ZP_REQUIRE(int64_t(ts.size()) == B, "UNet: ", ts.size(), " timesteps for a batch of ", B);
    st.t_in = upload(c, timestep_embedding(ts, C0, cfg.flip_sin_to_cos, cfg.freq_shift), {B, C0});
    st.e1 = c.saved({B, T});
    time_1_.forward(c, st.e1.data(), st.t_in.data(), B);
    st.s1 = c.saved({B, T});
    ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.s1.data(), st.e1.data(), B * T);
    st.emb = c.saved({B, T});
    time_2_.forward(c, st.emb.data(), st.s1.data(), B);
    if (cfg.text_time) {
      const int64_t A = cfg.add_in_dim, Dt = cfg.add_time_dim, E = cfg.text_embeds_dim(), K = kTimeIdsPerSample;
      ZP_REQUIRE(in.text_embeds.defined() && in.text_embeds.dim() == 2 && in.text_embeds.size(0) == B &&
                     in.text_embeds.size(1) == E,
                 "UNet (addition_embed_type text_time): text_embeds must be [", B, ", ", E, "], got ",
                 in.text_embeds.defined() ? in.text_embeds.str() : "none");
      ZP_REQUIRE(in.text_embeds.dtype() == c.dt && in.text_embeds.device() == c.dev, "UNet text_embeds is ",
                 in.text_embeds.str());
      ZP_REQUIRE(int64_t(in.time_ids.size()) == K * B, "UNet (text_time): time_ids must hold ", K,
                 " values per sample, got ", in.time_ids.size(), " for a batch of ", B);
      Tensor time_embeds = upload(c, timestep_embedding(in.time_ids, Dt, cfg.flip_sin_to_cos, cfg.freq_shift),
                                  {B, K * Dt});
      // add_in[b] = [text_embeds[b] | time_embeds[b]]
      st.add_in = c.saved({B, A});
      const size_t esz = dtype_size(c.dt), row_e = size_t(E) * esz, row_t = size_t(K * Dt) * esz,
                   row = size_t(A) * esz;
      char* dst = static_cast<char*>(st.add_in.data());
      copy_rows(dst, row, c.dev, in.text_embeds.data(), row_e, c.dev, row_e, B, c.s);
      copy_rows(dst + row_e, row, c.dev, time_embeds.data(), row_t, c.dev, row_t, B, c.s);
      st.f1 = c.saved({B, T});
      add_1_.forward(c, st.f1.data(), st.add_in.data(), B);
      st.fs = c.saved({B, T});
      ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.fs.data(), st.f1.data(), B * T);
      Tensor aug = c.act({B, T});
      add_2_.forward(c, aug.data(), st.fs.data(), B);
      add_into(c, st.emb, aug);
    }
    if (cfg.skip_time_act) {
      st.cond.temb = st.emb;
    } else {
      st.cond.temb = c.saved({B, T});
      ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.cond.temb.data(), st.emb.data(), B * T);
    }
    if (!c.saves) st.t_in = st.e1 = st.s1 = st.emb = st.add_in = st.f1 = st.fs = Tensor();

    // The model computes on channels-last images; its sample and output keep diffusers' NCHW.
    st.sample = c.saved({B, H, W, cfg.in_channels});
    ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, st.sample.data(), in.sample.data(), B, cfg.in_channels, H * W);
    h = c.act({B, H, W, C0});
    conv_in_.forward(c, h.data(), st.sample.data(), B, H, W);
    st.skips = {h};
  } else {
    // The previous chunk's hidden state, live skips and time embedding, read in place.
    std::vector<Tensor> parts =
        boundary_views(boundary, cfg.boundary_shapes(span_.begin, B, H, W), "input boundary");
    h = parts.front();
    st.cond.temb = parts.back();
    st.skips.assign(parts.begin() + 1, parts.end() - 1);
  }

  // Text conditioning: every attention block reads the same encoder_hidden_states.
  const Tensor& ctx = in.encoder_hidden_states;
  ZP_REQUIRE(ctx.defined() && ctx.dim() == 3 && ctx.size(0) == B, "UNet encoder_hidden_states must be [", B,
             ", L, D], got ", ctx.defined() ? ctx.str() : "none");
  ZP_REQUIRE(ctx.dtype() == c.dt && ctx.device() == c.dev, "UNet encoder_hidden_states is ", ctx.str());
  for (int64_t i = 0; i < cfg.num_blocks(); ++i) {
    // Block i's cross_attention_dim serves down block i, up block n-1-i and (for the last) the mid block.
    const bool used = cfg.down_attn[size_t(i)] || cfg.up_attn[size_t(cfg.num_blocks() - 1 - i)] ||
                      i + 1 == cfg.num_blocks();
    ZP_REQUIRE(!used || cfg.cross_dim[size_t(i)] == ctx.size(2), "UNet encoder_hidden_states width ", ctx.size(2),
               " differs from cross_attention_dim ", cfg.cross_dim[size_t(i)], " of block ", i);
  }
  st.cond.context = ctx;

  // The span's units: down path, mid, up path. The up path pops from `top`: the top of the skip
  // stack once the mid block has run (before this chunk, or in it).
  st.units.resize(units_.size());
  int64_t h_ = h.size(1), w_ = h.size(2), top = int64_t(st.skips.size());
  const int64_t mid = cfg.num_blocks();
  for (int64_t u = span_.begin; u < span_.end; ++u) {
    const Stage& sg = *units_[size_t(u)];
    {
      nn::AdaptedBlockInUse use(access_, *sg.block, sg.adapters.get());
      h = sg.forward(c, h, h_, w_, st.cond, st.skips, top, st.units[size_t(u)], checkpoint);
    }
    if (u == mid) top = int64_t(st.skips.size());
  }
  if (!has_head()) {
    // The next chunk's boundary: the hidden state, the skips still on the stack, the time embedding.
    const std::vector<Shape> shapes = cfg.boundary_shapes(span_.end, B, H, W);
    const int64_t live = span_.end > mid ? top : int64_t(st.skips.size());
    ZP_CHECK(live + 2 == int64_t(shapes.size()), "UNet chunk: ", live, " skips on the stack at the cut before unit ",
             span_.end, ", expected ", shapes.size() - 2);
    std::vector<const Tensor*> parts{&h};
    for (int64_t k = 0; k < live; ++k) parts.push_back(&st.skips[size_t(k)]);
    parts.push_back(&st.cond.temb);
    Tensor out = pack_boundary(c, shapes, parts);
    if (c.saves) acts.state_ = std::move(state);
    return out;
  }
  ZP_CHECK(top == 0 && h_ == H && w_ == W, "UNet: skip connections or sizes out of step");
  st.h_last = h;
  st.o = c.saved({B, H, W, C0});
  Tensor yc = c.act({B, H, W, cfg.out_channels});
  {
    nn::AdaptedBlockInUse use(access_, *head_, head_adapters_.get());
    norm_out_.forward(c, st.o.data(), h.data(), B, H * W, st.n_out);
    conv_out_.forward(c, yc.data(), st.o.data(), B, H, W);
  }
  Tensor y = c.act({B, cfg.out_channels, H, W});
  ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, y.data(), yc.data(), B, H * W, cfg.out_channels);
  if (c.saves) acts.state_ = std::move(state);
  return y;
}

Tensor UNet::backward(const Tensor& dout, UNetActivations& acts, UNetWeightGrads* later) const {
  ZP_REQUIRE(!acts.empty(), acts.saves() ? "UNet backward without a forward (each forward's activations serve one "
                                           "backward)"
                                         : "UNet backward of an inference forward, which keeps nothing");
  Ctx c = ctx_;
  c.dropout = acts.state_->dropout;
  const UNetConfig& cfg = cfg_;
  UNetActivations::State& st = *acts.state_;
  const int64_t B = st.B, H = st.H, W = st.W, T = cfg.time_embed_dim, C0 = cfg.block_out[0];
  // The skips' gradients, by stack position: set by the up path's resnets (or received across the
  // cut after this chunk), read by the down path's.
  std::vector<Tensor> dskips(st.skips.size());
  // The time embedding's gradient, accumulated over every ResBlock (of the chunks after this one
  // first: received with the output gradient).
  Tensor dtemb, g;
  if (has_head()) {
    ZP_REQUIRE(dout.numel() == B * cfg.out_channels * H * W && dout.dtype() == c.dt && dout.device() == c.dev,
               "UNet backward: output gradient ", dout.str(), " does not match the output [", B, ", ",
               cfg.out_channels, ", ", H, ", ", W, "] in ", dtype_name(c.dt), " on ", c.dev.str());
    dtemb = Tensor::zeros({B, T}, c.dt, c.dev, "activations", c.s);
    g = c.act({B, H, W, C0});
    nn::AdaptedBlockInUse use(access_, *head_, head_adapters_.get(), /*grads=*/true);
    Tensor dout_c = c.act({B, H, W, cfg.out_channels});
    ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, dout_c.data(), dout.data(), B, cfg.out_channels, H * W);
    Tensor dout_o = c.act({B, H, W, C0});
    conv_out_.backward(c, dout_o.data(), dout_c.data(), st.o.data(), B, H, W);
    norm_out_.backward(c, g.data(), dout_o.data(), st.h_last.data(), B, H * W, st.n_out);
    st.o = st.h_last = Tensor();
  } else {
    ZP_CHECK(dout.dtype() == c.dt && dout.device() == c.dev, "UNet chunk backward: output gradient ", dout.str());
    std::vector<Tensor> parts = boundary_views(dout, cfg.boundary_shapes(span_.end, B, H, W), "output gradient");
    g = parts.front();
    dtemb = parts.back();
    for (size_t k = 0; k + 2 < parts.size(); ++k) dskips[k] = parts[k + 1];
  }

  // LoRA: the adapters' gradients need their values, so they stay in this pass.
  const bool split = later && lora_.r == 0;
  if (split) later->units.assign(units_.size(), {});
  for (int64_t u = span_.end; u-- > span_.begin;) {
    const Stage& sg = *units_[size_t(u)];
    nn::AdaptedBlockInUse use(access_, *sg.block, sg.adapters.get(), /*grads=*/!split);
    g = sg.backward(c, g, st.cond, dtemb, dskips, st.units[size_t(u)], split ? &later->units[size_t(u)] : nullptr);
  }
  if (!has_stem()) {
    // The previous chunk's output gradient: hidden state, its live skips, the time embedding.
    const std::vector<Shape> shapes = cfg.boundary_shapes(span_.begin, B, H, W);
    std::vector<const Tensor*> parts{&g};
    for (size_t k = 0; k + 2 < shapes.size(); ++k) parts.push_back(&dskips[k]);
    parts.push_back(&dtemb);
    Tensor din = pack_boundary(c, shapes, parts);
    acts.state_.reset();
    return din;
  }
  add_into(c, g, dskips[0]);
  nn::AdaptedBlockInUse stem_use(access_, *stem_, stem_adapters_.get(), /*grads=*/true);
  Tensor dsample_c = c.act({B, H, W, cfg.in_channels});
  conv_in_.backward(c, dsample_c.data(), g.data(), st.sample.data(), B, H, W);
  Tensor dsample = c.act({B, cfg.in_channels, H, W});
  ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, dsample.data(), dsample_c.data(), B, H * W, cfg.in_channels);

  // Back through the time embedding into the stem's linears (no gradient for the sinusoids).
  Tensor demb = dtemb;
  if (!cfg.skip_time_act) {
    demb = c.act({B, T});
    ZP_KERNEL_CALL(c.dev, silu_backward, c.s, c.dt, demb.data(), dtemb.data(), st.emb.data(), B * T);
  }
  Tensor dtmp = c.act({B, T});
  time_2_.backward(c, dtmp.data(), demb.data(), st.s1.data(), B);
  ZP_KERNEL_CALL(c.dev, silu_backward, c.s, c.dt, dtmp.data(), dtmp.data(), st.e1.data(), B * T);
  time_1_.backward(c, nullptr, dtmp.data(), st.t_in.data(), B);
  if (cfg.text_time) {
    add_2_.backward(c, dtmp.data(), demb.data(), st.fs.data(), B);
    ZP_KERNEL_CALL(c.dev, silu_backward, c.s, c.dt, dtmp.data(), dtmp.data(), st.f1.data(), B * T);
    add_1_.backward(c, nullptr, dtmp.data(), st.add_in.data(), B);
  }
  acts.state_.reset();
  return dsample;
}

void UNet::backward_weights(UNetWeightGrads& later) const {
  ZP_CHECK(later.units.empty() || later.units.size() == units_.size(), "UNet backward_weights: ", later.units.size(),
           " units of weight gradients for a model of ", units_.size());
  for (size_t u = later.units.size(); u-- > 0;) {
    if (later.units[u].empty()) continue;
    GradsInUse grads(access_, *units_[u]->block);
    later.units[u].run(ctx_);
  }
  later.units.clear();
}

}  // namespace zp::models
