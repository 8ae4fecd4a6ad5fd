#include "models/unet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "io/weight_source.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/nchw.h"
#include "kernels/upsample.h"
#include "models/hub_keys.h"

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
    ZP_REQUIRE(c.add_time_dim > 0 && c.add_in_dim > 6 * c.add_time_dim, source,
               ": keys 'addition_time_embed_dim' and 'projection_class_embeddings_input_dim' leave no room for "
               "text_embeds (", c.add_in_dim, " <= 6 * ", c.add_time_dim, ")");
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

// y[n] = [a[n] | b[n]] along channels (torch.cat(dim=1)) for NCHW a[N, Ca, H, W], b[N, Cb, H, W].
Tensor concat_channels(const Ctx& c, const Tensor& a, const Tensor& b) {
  const int64_t N = a.size(0), Ca = a.size(1), Cb = b.size(1), H = a.size(2), W = a.size(3);
  ZP_CHECK(b.size(0) == N && b.size(2) == H && b.size(3) == W, "concat of ", a.str(), " and ", b.str());
  Tensor y = c.act({N, Ca + Cb, H, W});
  const size_t esz = dtype_size(c.dt), sa = size_t(Ca * H * W) * esz, sb = size_t(Cb * H * W) * esz;
  char* dst = static_cast<char*>(y.data());
  for (int64_t i = 0; i < N; ++i) {
    copy_bytes(dst + i * (sa + sb), c.dev, static_cast<const char*>(a.data()) + i * sa, c.dev, sa, c.s);
    copy_bytes(dst + i * (sa + sb) + sa, c.dev, static_cast<const char*>(b.data()) + i * sb, c.dev, sb, c.s);
  }
  return y;
}

// The inverse: da[N, Ca, H, W] and db[N, Cb, H, W] from dy[N, Ca + Cb, H, W].
void split_channels(const Ctx& c, const Tensor& dy, Tensor& da, Tensor& db, int64_t Ca) {
  const int64_t N = dy.size(0), Cb = dy.size(1) - Ca, H = dy.size(2), W = dy.size(3);
  da = c.act({N, Ca, H, W});
  db = c.act({N, Cb, H, W});
  const size_t esz = dtype_size(c.dt), sa = size_t(Ca * H * W) * esz, sb = size_t(Cb * H * W) * esz;
  const char* src = static_cast<const char*>(dy.data());
  for (int64_t i = 0; i < N; ++i) {
    copy_bytes(static_cast<char*>(da.data()) + i * sa, c.dev, src + i * (sa + sb), c.dev, sa, c.s);
    copy_bytes(static_cast<char*>(db.data()) + i * sb, c.dev, src + i * (sa + sb) + sa, c.dev, sb, c.s);
  }
}

void add_into(const Ctx& c, Tensor& y, const Tensor& x) {
  ZP_CHECK(y.numel() == x.numel(), "add ", x.str(), " into ", y.str());
  ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), y.data(), x.data(), y.numel());
}

// What every ResBlock and attention block is conditioned on during one forward/backward.
struct Cond {
  Tensor temb;             // [B, T]: SiLU(emb), or emb itself with resnet_skip_time_act
  Tensor dtemb;            // fp-dt [B, T]: its gradient, accumulated over every ResBlock
  Tensor context;          // [B*L, Dc]: encoder_hidden_states
  int64_t B = 0, L = 0;
};

// ---- parameter builders (diffusers names under `p`)

Conv2d add_conv(ParamBlock& b, const std::string& p, int64_t cin, int64_t cout, int64_t k, int64_t stride,
                int64_t pad) {
  Parameter* w = b.add(p + ".weight", {cout, cin, k, k}, true);
  Parameter* bias = b.add(p + ".bias", {cout}, false);
  return Conv2d(w, bias, stride, pad);
}
GroupNorm add_group_norm(ParamBlock& b, const std::string& p, int64_t C, int64_t groups, float eps, bool silu) {
  Parameter* w = b.add(p + ".weight", {C}, false);
  Parameter* bias = b.add(p + ".bias", {C}, false);
  return GroupNorm(w, bias, groups, eps, silu);
}
Linear add_linear(ParamBlock& b, const std::string& p, int64_t in, int64_t out) {
  Parameter* w = b.add(p + ".weight", {out, in}, true);
  Parameter* bias = b.add(p + ".bias", {out}, false);
  return Linear(w, bias);
}
Norm add_layer_norm(ParamBlock& b, const std::string& p, int64_t C) {
  Parameter* w = b.add(p + ".weight", {C}, false);
  Parameter* bias = b.add(p + ".bias", {C}, false);
  return Norm(NormKind::LayerNorm, w, bias, 1e-5f);  // BasicTransformerBlock's norm_eps default
}

// ---- ResnetBlock2D: norm1+SiLU, conv1, + time_emb_proj(temb) per channel, norm2+SiLU, conv2,
// (1x1 conv_shortcut when the width changes), (shortcut + h) / output_scale_factor. An up block's
// resnet reads its input concatenated with a skip connection (torch.cat(dim=1)), done here so that a
// checkpointed resnet keeps the two halves, which exist anyway, rather than their concatenation.
struct ResBlock {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2, shortcut;
  Linear temb_proj;
  float out_scale = 1.f;
  struct Saved {
    Tensor in, skip;        // the forward's arguments: all a checkpointed forward keeps
    Tensor x, a1, h1, a2;   // x: the input, [in | skip] along channels with a skip
    GroupNorm::Saved n1, n2;
  } sv;

  ResBlock(ParamBlock& b, const std::string& p, int64_t cin, int64_t cout, const UNetConfig& cfg, float scale)
      : out_scale(scale) {
    norm1 = add_group_norm(b, p + ".norm1", cin, cfg.groups, cfg.norm_eps, true);
    conv1 = add_conv(b, p + ".conv1", cin, cout, 3, 1, 1);
    temb_proj = add_linear(b, p + ".time_emb_proj", cfg.time_embed_dim, cout);
    norm2 = add_group_norm(b, p + ".norm2", cout, cfg.groups, cfg.norm_eps, true);
    conv2 = add_conv(b, p + ".conv2", cout, cout, 3, 1, 1);
    if (cin != cout) shortcut = add_conv(b, p + ".conv_shortcut", cin, cout, 1, 1, 0);
  }

  // skip: empty except in up blocks. checkpoint: keep only `in` and `skip`; backward() re-runs this
  // forward from them first.
  Tensor forward(const Ctx& c, const Tensor& in, const Tensor& skip, int64_t H, int64_t W, const Cond& cond,
                 bool checkpoint) {
    const int64_t B = cond.B, Ci = conv1.in(), Co = conv1.out(), HW = H * W;
    const Tensor x = skip.defined() ? concat_channels(c, in, skip) : in;
    sv.x = x;
    sv.a1 = c.act({B, Ci, H, W});
    norm1.forward(c, sv.a1.data(), x.data(), B, HW, sv.n1);
    sv.h1 = c.act({B, Co, H, W});
    conv1.forward(c, sv.h1.data(), sv.a1.data(), B, H, W);
    Tensor t = c.act({B, Co});
    temb_proj.forward(c, t.data(), cond.temb.data(), B);
    ZP_KERNEL_CALL(c.dev, channel_add, c.s, c.dt, sv.h1.data(), t.data(), B, Co, HW);
    sv.a2 = c.act({B, Co, H, W});
    norm2.forward(c, sv.a2.data(), sv.h1.data(), B, HW, sv.n2);
    Tensor y = c.act({B, Co, H, W});
    conv2.forward(c, y.data(), sv.a2.data(), B, H, W);
    if (shortcut.defined()) {
      Tensor s = c.act({B, Co, H, W});
      shortcut.forward(c, s.data(), x.data(), B, H, W);
      add_into(c, y, s);
    } else {
      add_into(c, y, x);
    }
    if (out_scale != 1.f) ZP_KERNEL_CALL(c.dev, scale, c.s, c.dt, y.data(), y.data(), 1.f / out_scale, y.numel());
    if (checkpoint) {
      sv = {};
      sv.in = in;
      sv.skip = skip;
    }
    return y;
  }

  // Returns the gradient of the input x (with a skip: of [in | skip]). recompute: the forward was
  // checkpointed.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, Cond& cond, bool recompute) {
    if (recompute) {
      const Saved args = sv;
      forward(c, args.in, args.skip, H, W, cond, false);
    }
    const int64_t B = cond.B, Ci = conv1.in(), Co = conv1.out(), HW = H * W;
    Tensor g = dy;
    if (out_scale != 1.f) {
      g = c.act(dy.shape());
      ZP_KERNEL_CALL(c.dev, scale, c.s, c.dt, g.data(), dy.data(), 1.f / out_scale, g.numel());
    }
    Tensor da2 = c.act({B, Co, H, W});
    conv2.backward(c, da2.data(), g.data(), sv.a2.data(), B, H, W);
    Tensor dh1 = c.act({B, Co, H, W});
    norm2.backward(c, dh1.data(), da2.data(), sv.h1.data(), B, HW, sv.n2);
    Tensor dt = c.act({B, Co});
    ZP_KERNEL_CALL(c.dev, channel_sum, c.s, c.dt, dt.data(), dh1.data(), B, Co, HW);
    temb_proj.backward(c, cond.dtemb.data(), dt.data(), cond.temb.data(), B, /*accumulate_dx=*/true);
    Tensor da1 = c.act({B, Ci, H, W});
    conv1.backward(c, da1.data(), dh1.data(), sv.a1.data(), B, H, W);
    Tensor dx = c.act({B, Ci, H, W});
    norm1.backward(c, dx.data(), da1.data(), sv.x.data(), B, HW, sv.n1);
    if (shortcut.defined())
      shortcut.backward(c, dx.data(), g.data(), sv.x.data(), B, H, W, /*accumulate_dx=*/true);
    else
      add_into(c, dx, g);
    sv = {};
    return dx;
  }
};

// ---- BasicTransformerBlock on tokens [B*T, I]: self-attention, cross-attention, GEGLU feed-forward,
// each pre-LayerNorm with a residual.
struct TransformerBlock {
  Norm norm1, norm2, norm3;
  CrossAttention attn1, attn2;
  Linear ff_in, ff_out;
  int64_t width = 0, ff_inner = 0;
  struct Saved {
    Tensor x, a1, t1, a2, t2, a3, pre, h;  // x: the input, all a checkpointed forward keeps
    Norm::Saved n1, n2, n3;
    CrossAttention::Saved s1, s2;
  } sv;

  TransformerBlock(ParamBlock& b, const std::string& p, int64_t I, int64_t heads, int64_t cross_dim)
      : width(I), ff_inner(4 * I) {
    norm1 = add_layer_norm(b, p + ".norm1", I);
    {
      const std::string a = p + ".attn1.";
      Parameter* q = b.add(a + "to_q.weight", {I, I}, true);
      Parameter* k = b.add(a + "to_k.weight", {I, I}, true, /*packed=*/true);
      Parameter* v = b.add(a + "to_v.weight", {I, I}, true, /*packed=*/true);
      attn1 = CrossAttention(Linear({q, k, v}, {}), add_linear(b, a + "to_out.0", I, I), heads);
    }
    norm2 = add_layer_norm(b, p + ".norm2", I);
    {
      const std::string a = p + ".attn2.";
      Parameter* q = b.add(a + "to_q.weight", {I, I}, true);
      Parameter* k = b.add(a + "to_k.weight", {I, cross_dim}, true);
      Parameter* v = b.add(a + "to_v.weight", {I, cross_dim}, true, /*packed=*/true);
      attn2 = CrossAttention(Linear(q, nullptr), Linear({k, v}, {}), add_linear(b, a + "to_out.0", I, I), heads);
    }
    norm3 = add_layer_norm(b, p + ".norm3", I);
    ff_in = add_linear(b, p + ".ff.net.0.proj", I, 2 * ff_inner);
    ff_out = add_linear(b, p + ".ff.net.2", ff_inner, I);
  }

  // checkpoint: keep only the input; recompute() re-runs this forward from it before the backward.
  Tensor forward(const Ctx& c, const Tensor& x, int64_t T, const Cond& cond, bool checkpoint) {
    const int64_t B = cond.B, N = B * T, I = width, F = ff_inner;
    sv.x = x;
    Tensor tmp = c.act({N, I});
    sv.a1 = c.act({N, I});
    norm1.forward(c, sv.a1.data(), x.data(), N, sv.n1);
    attn1.forward(c, tmp.data(), sv.a1.data(), B, T, nullptr, 0, sv.s1);
    sv.t1 = c.act({N, I});
    ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, sv.t1.data(), x.data(), tmp.data(), N * I);
    sv.a2 = c.act({N, I});
    norm2.forward(c, sv.a2.data(), sv.t1.data(), N, sv.n2);
    attn2.forward(c, tmp.data(), sv.a2.data(), B, T, cond.context.data(), cond.L, sv.s2);
    sv.t2 = c.act({N, I});
    ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, sv.t2.data(), sv.t1.data(), tmp.data(), N * I);
    sv.a3 = c.act({N, I});
    norm3.forward(c, sv.a3.data(), sv.t2.data(), N, sv.n3);
    sv.pre = c.act({N, 2 * F});
    ff_in.forward(c, sv.pre.data(), sv.a3.data(), N);
    sv.h = c.act({N, F});
    ZP_KERNEL_CALL(c.dev, geglu_forward_packed, c.s, c.dt, sv.h.data(), sv.pre.data(), N, F);
    ff_out.forward(c, tmp.data(), sv.h.data(), N);
    Tensor y = c.act({N, I});
    ZP_KERNEL_CALL(c.dev, add, c.s, c.dt, y.data(), sv.t2.data(), tmp.data(), N * I);
    if (checkpoint) {
      sv = {};
      sv.x = x;
    }
    return y;
  }

  // After a checkpointed forward: everything the backward needs, again. Returns the output.
  Tensor recompute(const Ctx& c, int64_t T, const Cond& cond) {
    const Tensor x = sv.x;
    return forward(c, x, T, cond, false);
  }

  // dres holds the output gradient on entry and the input gradient on return: each branch's input
  // gradient is added into it on the way down.
  void backward(const Ctx& c, Tensor& dres, int64_t T, const Cond& cond) {
    const int64_t B = cond.B, N = B * T, I = width, F = ff_inner;
    Tensor da = c.act({N, I});
    {
      Tensor dh = c.act({N, F}), dpre = c.act({N, 2 * F});
      ff_out.backward(c, dh.data(), dres.data(), sv.h.data(), N);
      ZP_KERNEL_CALL(c.dev, geglu_backward_packed, c.s, c.dt, dpre.data(), dh.data(), sv.pre.data(), N, F);
      ff_in.backward(c, da.data(), dpre.data(), sv.a3.data(), N);
    }
    norm3.backward(c, dres.data(), da.data(), sv.t2.data(), N, sv.n3, true);
    attn2.backward(c, da.data(), nullptr, dres.data(), sv.a2.data(), cond.context.data(), B, T, cond.L, sv.s2, false,
                   false);
    norm2.backward(c, dres.data(), da.data(), sv.t1.data(), N, sv.n2, true);
    attn1.backward(c, da.data(), nullptr, dres.data(), sv.a1.data(), nullptr, B, T, T, sv.s1, false, false);
    norm1.backward(c, dres.data(), da.data(), sv.x.data(), N, sv.n1, true);
    sv = {};
  }
};

// ---- Transformer2DModel: GroupNorm (eps 1e-6), proj_in (1x1 conv before the NCHW -> tokens move,
// or linear after it), transformer blocks, proj_out (the mirror image), + the block's input.
// Checkpointed, it keeps its input and each transformer block's input: the backward re-runs the last
// block first (its output is proj_out's input), every other block just before its backward, and the
// GroupNorm (proj_in's input) last; the proj_in and proj_out GEMMs are not re-run.
struct Transformer2D {
  GroupNorm norm;
  bool linear = false;
  Conv2d proj_in_conv, proj_out_conv;
  Linear proj_in_lin, proj_out_lin;
  std::vector<TransformerBlock> blocks;
  int64_t channels = 0, inner = 0;
  struct Saved {
    Tensor x;      // the input, all a checkpointed forward keeps (with the blocks' inputs)
    Tensor p_in;   // proj_in's input: the normalised x, [B, C, H, W] (conv) or [B*HW, C] (linear)
    Tensor p_out;  // proj_out's input: the last block's output, [B*HW, I] (linear) or [B, I, H, W] (conv)
    GroupNorm::Saved n;
  } sv;

  Transformer2D(ParamBlock& b, const std::string& p, int64_t C, int64_t heads, int64_t layers, int64_t cross_dim,
                const UNetConfig& cfg)
      : linear(cfg.linear_projection), channels(C), inner(heads * (C / heads)) {
    norm = add_group_norm(b, p + ".norm", C, cfg.groups, 1e-6f, false);
    if (linear) {
      proj_in_lin = add_linear(b, p + ".proj_in", C, inner);
    } else {
      proj_in_conv = add_conv(b, p + ".proj_in", C, inner, 1, 1, 0);
    }
    for (int64_t l = 0; l < layers; ++l)
      blocks.emplace_back(b, p + ".transformer_blocks." + std::to_string(l), inner, heads, cross_dim);
    if (linear)
      proj_out_lin = add_linear(b, p + ".proj_out", inner, C);
    else
      proj_out_conv = add_conv(b, p + ".proj_out", inner, C, 1, 1, 0);
  }

  // sv.n and sv.p_in from sv.x.
  void normalise_input(const Ctx& c, int64_t B, int64_t HW) {
    const int64_t C = channels;
    Tensor a = c.act({B, C, HW});
    norm.forward(c, a.data(), sv.x.data(), B, HW, sv.n);
    if (linear) {
      sv.p_in = c.act({B * HW, C});
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, sv.p_in.data(), a.data(), B, C, HW);
    } else {
      sv.p_in = a;
    }
  }
  // sv.p_out from the last block's output t [B*HW, I].
  void keep_proj_out_input(const Ctx& c, const Tensor& t, int64_t B, int64_t HW) {
    if (linear) {
      sv.p_out = t;
    } else {
      sv.p_out = c.act({B, inner, HW});
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, sv.p_out.data(), t.data(), B, HW, inner);
    }
  }

  Tensor forward(const Ctx& c, const Tensor& x, int64_t H, int64_t W, const Cond& cond, bool checkpoint) {
    const int64_t B = cond.B, HW = H * W, C = channels, I = inner;
    sv.x = x;
    normalise_input(c, B, HW);
    Tensor t = c.act({B * HW, I});
    if (linear) {
      proj_in_lin.forward(c, t.data(), sv.p_in.data(), B * HW);
    } else {
      Tensor p = c.act({B, I, H, W});
      proj_in_conv.forward(c, p.data(), sv.p_in.data(), B, H, W);
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, t.data(), p.data(), B, I, HW);
    }
    for (TransformerBlock& blk : blocks) t = blk.forward(c, t, HW, cond, checkpoint);
    keep_proj_out_input(c, t, B, HW);
    Tensor y = c.act({B, C, H, W});
    if (linear) {
      Tensor yt = c.act({B * HW, C});
      proj_out_lin.forward(c, yt.data(), sv.p_out.data(), B * HW);
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, y.data(), yt.data(), B, HW, C);
    } else {
      proj_out_conv.forward(c, y.data(), sv.p_out.data(), B, H, W);
    }
    add_into(c, y, x);
    if (checkpoint) {
      sv = {};
      sv.x = x;
    }
    return y;
  }

  // recompute: the forward was checkpointed.
  Tensor backward(const Ctx& c, const Tensor& dy, int64_t H, int64_t W, const Cond& cond, bool recompute) {
    const int64_t B = cond.B, HW = H * W, C = channels, I = inner;
    if (recompute) keep_proj_out_input(c, blocks.back().recompute(c, HW, cond), B, HW);
    Tensor dt = c.act({B * HW, I});
    if (linear) {
      Tensor dyt = c.act({B * HW, C});
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, dyt.data(), dy.data(), B, C, HW);
      proj_out_lin.backward(c, dt.data(), dyt.data(), sv.p_out.data(), B * HW);
    } else {
      Tensor du = c.act({B, I, H, W});
      proj_out_conv.backward(c, du.data(), dy.data(), sv.p_out.data(), B, H, W);
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, dt.data(), du.data(), B, I, HW);
    }
    sv.p_out = Tensor();
    for (size_t i = blocks.size(); i-- > 0;) {
      if (recompute && i + 1 < blocks.size()) blocks[i].recompute(c, HW, cond);
      blocks[i].backward(c, dt, HW, cond);
    }
    if (recompute) normalise_input(c, B, HW);
    Tensor da = c.act({B, C, H, W});
    if (linear) {
      Tensor dat = c.act({B * HW, C});
      proj_in_lin.backward(c, dat.data(), dt.data(), sv.p_in.data(), B * HW);
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, da.data(), dat.data(), B, HW, C);
    } else {
      Tensor dp = c.act({B, I, H, W});
      ZP_KERNEL_CALL(c.dev, transpose_batched, c.s, c.dt, dp.data(), dt.data(), B, HW, I);
      proj_in_conv.backward(c, da.data(), dp.data(), sv.p_in.data(), B, H, W);
    }
    Tensor dx = c.act({B, C, H, W});
    norm.backward(c, dx.data(), da.data(), sv.x.data(), B, HW, sv.n);
    add_into(c, dx, dy);
    sv = {};
    return dx;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Stages (down, mid and up blocks): one ParamBlock each.

struct UNet::Stage {
  enum class Kind { Down, Mid, Up };
  Kind kind;
  std::unique_ptr<ParamBlock> block;
  std::vector<ResBlock> resnets;
  std::vector<Transformer2D> attentions;  // empty for DownBlock2D / UpBlock2D
  Conv2d sampler;                         // downsamplers.0.conv (stride 2) or upsamplers.0.conv
  // State of the last forward.
  int64_t H = 0, W = 0;          // input size
  bool checkpoint = false;       // the resnets and attentions kept only their inputs
  Tensor sampler_in;             // input of the sampler conv (Up: after the nearest 2x; before it when
                                 // checkpointed, a quarter of the size)
  std::vector<int64_t> skips;    // indices into the skip list: pushed (Down) or popped (Up), per resnet
  int64_t sampler_skip = -1;     // Down: index of the downsampler's output in the skip list

  Stage(Kind k, const std::string& name) : kind(k), block(std::make_unique<ParamBlock>(name)) {}
  bool has_attention() const { return !attentions.empty(); }

  Tensor forward(const Ctx& c, Tensor h, int64_t& H_, int64_t& W_, const Cond& cond, std::vector<Tensor>& skip_list,
                 int64_t& skip_top, bool checkpoint_) {
    H = H_;
    W = W_;
    checkpoint = checkpoint_;
    skips.clear();
    sampler_skip = -1;
    if (kind == Kind::Mid) {
      h = resnets[0].forward(c, h, Tensor(), H, W, cond, checkpoint);
      for (size_t j = 0; j < attentions.size(); ++j) {
        h = attentions[j].forward(c, h, H, W, cond, checkpoint);
        h = resnets[j + 1].forward(c, h, Tensor(), H, W, cond, checkpoint);
      }
      return h;
    }
    for (size_t j = 0; j < resnets.size(); ++j) {
      Tensor skip;
      if (kind == Kind::Up) {
        ZP_CHECK(skip_top > 0, "skip connections exhausted");
        skips.push_back(--skip_top);
        skip = skip_list[size_t(skip_top)];
        ZP_CHECK(skip.size(1) == skip_channels[j], "skip connection ", skip_top, " is ", skip.str(), ", expected ",
                 skip_channels[j], " channels");
      }
      h = resnets[j].forward(c, h, skip, H, W, cond, checkpoint);
      if (has_attention()) h = attentions[j].forward(c, h, H, W, cond, checkpoint);
      if (kind == Kind::Down) {
        skips.push_back(int64_t(skip_list.size()));
        skip_list.push_back(h);
      }
    }
    if (!sampler.defined()) return h;
    const int64_t B = cond.B, C = h.size(1);
    if (kind == Kind::Down) {
      const kernels::Conv2dShape s = sampler.shape(B, H, W);
      sampler_in = h;  // a skip connection: kept anyway
      Tensor y = c.act({B, C, s.oh(), s.ow()});
      sampler.forward(c, y.data(), h.data(), B, H, W);
      H_ = s.oh();
      W_ = s.ow();
      sampler_skip = int64_t(skip_list.size());
      skip_list.push_back(y);
      return y;
    }
    Tensor up = c.act({B, C, 2 * H, 2 * W});
    ZP_KERNEL_CALL(c.dev, upsample_nearest2x_forward, c.s, c.dt, up.data(), h.data(), B, C, H, W);
    sampler_in = checkpoint ? h : up;
    Tensor y = c.act({B, C, 2 * H, 2 * W});
    sampler.forward(c, y.data(), up.data(), B, 2 * H, 2 * W);
    H_ = 2 * H;
    W_ = 2 * W;
    return y;
  }

  // g: gradient of the stage's output (Down: before adding the skip gradients, which this adds).
  Tensor backward(const Ctx& c, Tensor g, Cond& cond, std::vector<Tensor>& dskips) {
    const int64_t B = cond.B;
    if (kind == Kind::Mid) {
      for (size_t j = attentions.size(); j-- > 0;) {
        g = resnets[j + 1].backward(c, g, H, W, cond, checkpoint);
        g = attentions[j].backward(c, g, H, W, cond, checkpoint);
      }
      return resnets[0].backward(c, g, H, W, cond, checkpoint);
    }
    if (sampler.defined()) {
      const int64_t C = g.size(1);
      if (kind == Kind::Down) {
        add_into(c, g, dskips[size_t(sampler_skip)]);
        Tensor dx = c.act({B, C, H, W});
        sampler.backward(c, dx.data(), g.data(), sampler_in.data(), B, H, W);
        g = dx;
      } else {
        Tensor up = sampler_in;
        if (checkpoint) {
          up = c.act({B, C, 2 * H, 2 * W});
          ZP_KERNEL_CALL(c.dev, upsample_nearest2x_forward, c.s, c.dt, up.data(), sampler_in.data(), B, C, H, W);
        }
        Tensor du = c.act({B, C, 2 * H, 2 * W});
        sampler.backward(c, du.data(), g.data(), up.data(), B, 2 * H, 2 * W);
        g = c.act({B, C, H, W});
        ZP_KERNEL_CALL(c.dev, upsample_nearest2x_backward, c.s, c.dt, g.data(), du.data(), B, C, H, W);
      }
      sampler_in = Tensor();
    }
    for (size_t j = resnets.size(); j-- > 0;) {
      if (kind == Kind::Down) add_into(c, g, dskips[size_t(skips[j])]);
      if (has_attention()) g = attentions[j].backward(c, g, H, W, cond, checkpoint);
      g = resnets[j].backward(c, g, H, W, cond, checkpoint);
      if (kind == Kind::Up) {
        const int64_t k = skips[j];
        Tensor dh;
        split_channels(c, g, dh, dskips[size_t(k)], g.size(1) - skip_channels[j]);
        g = dh;
      }
    }
    return g;
  }

  std::vector<int64_t> skip_channels;  // Up: channels of the skip each resnet concatenates
};

// ---------------------------------------------------------------------------------------------
// The model

struct UNet::State {
  int64_t B = 0, H = 0, W = 0;
  Cond cond;
  Tensor sample, t_in, e1, s1, emb, add_in, f1, fs;
  std::vector<Tensor> skips;
  Tensor h_last, o;  // input and output of the final GroupNorm + SiLU
  GroupNorm::Saved n_out;
};

UNet::~UNet() = default;

UNet::UNet(const UNetConfig& cfg, Device dev, DType dt, StreamHandle s, int64_t pad_multiple, bool allocate)
    : cfg_(cfg) {
  auto place = [&](ParamBlock& b) {
    if (allocate)
      b.allocate(dev, dt, s, pad_multiple);
    else
      b.layout(dev, dt, pad_multiple);
  };
  ctx_ = Ctx{dev, s, dt};
  const int64_t n = cfg.num_blocks(), T = cfg.time_embed_dim, C0 = cfg.block_out[0];

  stem_ = std::make_unique<ParamBlock>("stem");
  conv_in_ = add_conv(*stem_, "conv_in", cfg.in_channels, C0, cfg.conv_in_kernel, 1, (cfg.conv_in_kernel - 1) / 2);
  time_1_ = add_linear(*stem_, "time_embedding.linear_1", C0, T);
  time_2_ = add_linear(*stem_, "time_embedding.linear_2", T, T);
  if (cfg.text_time) {
    add_1_ = add_linear(*stem_, "add_embedding.linear_1", cfg.add_in_dim, T);
    add_2_ = add_linear(*stem_, "add_embedding.linear_2", T, T);
  }
  place(*stem_);

  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "down_blocks." + std::to_string(i);
    auto st = std::make_unique<Stage>(Stage::Kind::Down, p);
    const int64_t cin = cfg.block_out[size_t(i == 0 ? 0 : i - 1)], cout = cfg.block_out[size_t(i)];
    for (int64_t l = 0; l < cfg.layers[size_t(i)]; ++l) {
      const std::string ls = std::to_string(l);
      st->resnets.emplace_back(*st->block, p + ".resnets." + ls, l == 0 ? cin : cout, cout, cfg, cfg.resnet_scale);
      if (cfg.down_attn[size_t(i)])
        st->attentions.emplace_back(*st->block, p + ".attentions." + ls, cout, cfg.heads[size_t(i)],
                                    cfg.transformer_layers[size_t(i)], cfg.cross_dim[size_t(i)], cfg);
    }
    if (i + 1 < n) st->sampler = add_conv(*st->block, p + ".downsamplers.0.conv", cout, cout, 3, 2, 1);
    place(*st->block);
    down_.push_back(std::move(st));
  }

  {
    const int64_t C = cfg.block_out.back();
    mid_ = std::make_unique<Stage>(Stage::Kind::Mid, "mid_block");
    mid_->resnets.emplace_back(*mid_->block, "mid_block.resnets.0", C, C, cfg, cfg.mid_scale);
    mid_->attentions.emplace_back(*mid_->block, "mid_block.attentions.0", C, cfg.heads.back(),
                                  cfg.transformer_layers.back(), cfg.cross_dim.back(), cfg);
    mid_->resnets.emplace_back(*mid_->block, "mid_block.resnets.1", C, C, cfg, cfg.mid_scale);
    place(*mid_->block);
  }

  for (int64_t i = 0; i < n; ++i) {
    const size_t r = size_t(n - 1 - i);  // the down block this up block mirrors
    const std::string p = "up_blocks." + std::to_string(i);
    auto st = std::make_unique<Stage>(Stage::Kind::Up, p);
    const int64_t out = cfg.block_out[r], prev = i == 0 ? out : cfg.block_out[r + 1],
                  in = cfg.block_out[r == 0 ? 0 : r - 1];
    const int64_t num = cfg.layers[r] + 1;
    for (int64_t l = 0; l < num; ++l) {
      const std::string ls = std::to_string(l);
      const int64_t skip = l == num - 1 ? in : out, res_in = l == 0 ? prev : out;
      st->skip_channels.push_back(skip);
      st->resnets.emplace_back(*st->block, p + ".resnets." + ls, res_in + skip, out, cfg, cfg.resnet_scale);
      if (cfg.up_attn[size_t(i)])
        st->attentions.emplace_back(*st->block, p + ".attentions." + ls, out, cfg.heads[r], cfg.transformer_layers[r],
                                    cfg.cross_dim[r], cfg);
    }
    if (i + 1 < n) st->sampler = add_conv(*st->block, p + ".upsamplers.0.conv", out, out, 3, 1, 1);
    place(*st->block);
    up_.push_back(std::move(st));
  }

  head_ = std::make_unique<ParamBlock>("head");
  norm_out_ = add_group_norm(*head_, "conv_norm_out", C0, cfg.groups, cfg.norm_eps, true);
  conv_out_ = add_conv(*head_, "conv_out", C0, cfg.out_channels, cfg.conv_out_kernel, 1, (cfg.conv_out_kernel - 1) / 2);
  place(*head_);
}

std::vector<ParamBlock*> UNet::blocks() {
  std::vector<ParamBlock*> b{stem_.get()};
  for (auto& st : down_) b.push_back(st->block.get());
  b.push_back(mid_->block.get());
  for (auto& st : up_) b.push_back(st->block.get());
  b.push_back(head_.get());
  return b;
}

std::vector<Parameter*> UNet::parameters() { return parameters_of(blocks()); }

Parameter* UNet::find(const std::string& name) { return find_parameter(blocks(), name); }

int64_t UNet::num_parameters() {
  int64_t total = 0;
  for (Parameter* p : parameters()) total += p->numel();
  return total;
}

void UNet::check_weights(const io::WeightSource& files) {
  std::set<std::string> used;
  for (Parameter* p : parameters()) {
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
  for (ParamBlock* b : blocks()) load_block(files, *b);
}

Tensor UNet::forward(const UNetInputs& in, bool checkpoint) {
  const Ctx& c = ctx_;
  const UNetConfig& cfg = cfg_;
  ZP_REQUIRE(in.sample.defined() && in.sample.dim() == 4 && in.sample.size(1) == cfg.in_channels,
             "UNet input sample must be [B, ", cfg.in_channels, ", H, W], got ", in.sample.str());
  ZP_REQUIRE(in.sample.dtype() == c.dt && in.sample.device() == c.dev, "UNet input sample is ", in.sample.str(),
             ", the model computes in ", dtype_name(c.dt), " on ", c.dev.str());
  st_ = std::make_unique<State>();
  State& st = *st_;
  const int64_t B = in.sample.size(0), H = in.sample.size(2), W = in.sample.size(3), T = cfg.time_embed_dim;
  const int64_t factor = int64_t(1) << (cfg.num_blocks() - 1);
  ZP_REQUIRE(H % factor == 0 && W % factor == 0, "UNet input ", H, "x", W, " is not divisible by ", factor,
             " (one halving per down block)");
  st.B = B;
  st.H = H;
  st.W = W;
  st.sample = in.sample;

  // The stem's parameters serve the time embedding here and conv_in below.
  std::optional<ParamsInUse> stem_use(std::in_place, access_, *stem_);

  // Time embedding (+ SDXL's added text/time embedding).
  std::vector<float> ts = in.timesteps;
  if (ts.size() == 1) ts.assign(size_t(B), ts[0]);
  ZP_REQUIRE(int64_t(ts.size()) == B, "UNet: ", ts.size(), " timesteps for a batch of ", B);
  const int64_t C0 = cfg.block_out[0];
  st.t_in = upload(c, timestep_embedding(ts, C0, cfg.flip_sin_to_cos, cfg.freq_shift), {B, C0});
  st.e1 = c.act({B, T});
  time_1_.forward(c, st.e1.data(), st.t_in.data(), B);
  st.s1 = c.act({B, T});
  ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.s1.data(), st.e1.data(), B * T);
  st.emb = c.act({B, T});
  time_2_.forward(c, st.emb.data(), st.s1.data(), B);
  if (cfg.text_time) {
    const int64_t A = cfg.add_in_dim, Dt = cfg.add_time_dim, E = A - 6 * Dt;
    ZP_REQUIRE(in.text_embeds.defined() && in.text_embeds.dim() == 2 && in.text_embeds.size(0) == B &&
                   in.text_embeds.size(1) == E,
               "UNet (addition_embed_type text_time): text_embeds must be [", B, ", ", E, "], got ",
               in.text_embeds.defined() ? in.text_embeds.str() : "none");
    ZP_REQUIRE(in.text_embeds.dtype() == c.dt && in.text_embeds.device() == c.dev, "UNet text_embeds is ",
               in.text_embeds.str());
    ZP_REQUIRE(int64_t(in.time_ids.size()) == 6 * B, "UNet (text_time): time_ids must hold 6 values per sample, got ",
               in.time_ids.size(), " for a batch of ", B);
    Tensor time_embeds = upload(c, timestep_embedding(in.time_ids, Dt, cfg.flip_sin_to_cos, cfg.freq_shift),
                                {B, 6 * Dt});
    st.add_in = c.act({B, A});
    const size_t esz = dtype_size(c.dt), row_e = size_t(E) * esz, row_t = size_t(6 * Dt) * esz;
    for (int64_t b = 0; b < B; ++b) {
      char* dst = static_cast<char*>(st.add_in.data()) + size_t(b * A) * esz;
      copy_bytes(dst, c.dev, static_cast<const char*>(in.text_embeds.data()) + b * row_e, c.dev, row_e, c.s);
      copy_bytes(dst + row_e, c.dev, static_cast<const char*>(time_embeds.data()) + b * row_t, c.dev, row_t, c.s);
    }
    st.f1 = c.act({B, T});
    add_1_.forward(c, st.f1.data(), st.add_in.data(), B);
    st.fs = c.act({B, T});
    ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.fs.data(), st.f1.data(), B * T);
    Tensor aug = c.act({B, T});
    add_2_.forward(c, aug.data(), st.fs.data(), B);
    add_into(c, st.emb, aug);
  }
  st.cond.B = B;
  if (cfg.skip_time_act) {
    st.cond.temb = st.emb;
  } else {
    st.cond.temb = c.act({B, T});
    ZP_KERNEL_CALL(c.dev, silu_forward, c.s, c.dt, st.cond.temb.data(), st.emb.data(), B * T);
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
  st.cond.L = ctx.size(1);
  st.cond.context = ctx.view({B * ctx.size(1), ctx.size(2)});
  st.cond.dtemb = Tensor();

  // conv_in, down path, mid, up path, head.
  Tensor h = c.act({B, C0, H, W});
  conv_in_.forward(c, h.data(), in.sample.data(), B, H, W);
  stem_use.reset();
  st.skips = {h};
  int64_t h_ = H, w_ = W, top = 0;
  for (auto& sg : down_) {
    ParamsInUse use(access_, *sg->block);
    h = sg->forward(c, h, h_, w_, st.cond, st.skips, top, checkpoint);
  }
  {
    ParamsInUse use(access_, *mid_->block);
    h = mid_->forward(c, h, h_, w_, st.cond, st.skips, top, checkpoint);
  }
  top = int64_t(st.skips.size());
  for (auto& sg : up_) {
    ParamsInUse use(access_, *sg->block);
    h = sg->forward(c, h, h_, w_, st.cond, st.skips, top, checkpoint);
  }
  ZP_CHECK(top == 0 && h_ == H && w_ == W, "UNet: skip connections or sizes out of step");
  st.h_last = h;
  st.o = c.act({B, C0, H, W});
  Tensor y = c.act({B, cfg.out_channels, H, W});
  {
    ParamsInUse use(access_, *head_);
    norm_out_.forward(c, st.o.data(), h.data(), B, H * W, st.n_out);
    conv_out_.forward(c, y.data(), st.o.data(), B, H, W);
  }
  return y;
}

Tensor UNet::backward(const Tensor& dout) {
  const Ctx& c = ctx_;
  const UNetConfig& cfg = cfg_;
  ZP_CHECK(st_, "UNet backward without a forward");
  State& st = *st_;
  const int64_t B = st.B, H = st.H, W = st.W, T = cfg.time_embed_dim, C0 = cfg.block_out[0];
  ZP_REQUIRE(dout.numel() == B * cfg.out_channels * H * W && dout.dtype() == c.dt && dout.device() == c.dev,
             "UNet backward: output gradient ", dout.str(), " does not match the output [", B, ", ", cfg.out_channels,
             ", ", H, ", ", W, "] in ", dtype_name(c.dt), " on ", c.dev.str());
  st.cond.dtemb = Tensor::zeros({B, T}, c.dt, c.dev, "activations", c.s);

  Tensor g = c.act({B, C0, H, W});
  {
    ParamsInUse use(access_, *head_);
    GradsInUse grads(access_, *head_);
    Tensor dout_o = c.act({B, C0, H, W});
    conv_out_.backward(c, dout_o.data(), dout.data(), st.o.data(), B, H, W);
    norm_out_.backward(c, g.data(), dout_o.data(), st.h_last.data(), B, H * W, st.n_out);
  }
  st.o = st.h_last = Tensor();

  std::vector<Tensor> dskips(st.skips.size());
  auto stage_backward = [&](Stage& sg) {
    ParamsInUse use(access_, *sg.block);
    GradsInUse grads(access_, *sg.block);
    g = sg.backward(c, g, st.cond, dskips);
  };
  for (size_t i = up_.size(); i-- > 0;) stage_backward(*up_[i]);
  stage_backward(*mid_);
  for (size_t i = down_.size(); i-- > 0;) stage_backward(*down_[i]);
  add_into(c, g, dskips[0]);
  ParamsInUse stem_use(access_, *stem_);
  GradsInUse stem_grads(access_, *stem_);
  Tensor dsample = c.act({B, cfg.in_channels, H, W});
  conv_in_.backward(c, dsample.data(), g.data(), st.sample.data(), B, H, W);

  // Back through the time embedding into the stem's linears (no gradient for the sinusoids).
  Tensor demb = st.cond.dtemb;
  if (!cfg.skip_time_act) {
    demb = c.act({B, T});
    ZP_KERNEL_CALL(c.dev, silu_backward, c.s, c.dt, demb.data(), st.cond.dtemb.data(), st.emb.data(), B * T);
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
  st_.reset();
  return dsample;
}

}  // namespace zp::models
