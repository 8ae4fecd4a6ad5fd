#include "models/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "io/weight_source.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "models/hub_keys.h"
#include "nn/init.h"
#include "nn/trained_blocks.h"

namespace zp::models {
using nlohmann::json;
using namespace zp::nn;
using namespace zp::kernels;

namespace {

// The unique parameters of `c` counted in I: int64_t for num_parameters(), __int128 to check, before
// anything is built, that a config's sizes (each at most 2^31) do not overflow int64.
template <class I> I count_parameters(const TransformerConfig& c) {
  const I C = c.hidden, D = c.head_dim, F = c.ffn, qkv = (I(c.heads) + 2 * I(c.kv_heads)) * D;
  I per_layer = qkv * C + (c.qkv_bias ? qkv : 0) + I(c.heads) * D * C + (c.out_bias ? C : 0);
  per_layer += c.mlp == MlpKind::SwiGLU ? 3 * F * C + (c.mlp_bias ? 2 * F + C : 0) : 2 * F * C + F + C;
  per_layer += c.norm == NormKind::LayerNorm ? 4 * C : 2 * C;
  I total = I(c.layers) * per_layer + I(c.vocab) * C + (c.tied ? 0 : I(c.vocab) * C) +
            (c.norm == NormKind::LayerNorm ? 2 * C : C);
  if (c.learned_positions) total += I(c.max_positions) * C;
  return total;
}

// Parameters, gradients and both Adam moments in fp32 take 16 bytes per parameter; 2^56 parameters
// keep every byte count and offset within int64, far above any model that fits a machine.
constexpr int64_t kMaxParameters = int64_t(1) << 56;

TransformerConfig read_hub_config(const json& j, const std::string& source) {
  ZP_REQUIRE(j.is_object(), source, ": not a JSON object");
  HubKeys k{j, source};
  TransformerConfig c;
  c.model_type = k.get<std::string>("model_type");
  const char *hidden_key, *heads_key;
  if (c.model_type == "gpt2") {
    hidden_key = "n_embd";
    heads_key = "n_head";
    c.hidden = k.size("n_embd");
    c.layers = k.size("n_layer");
    c.heads = c.kv_heads = k.size("n_head");
    c.vocab = k.size("vocab_size");
    c.max_positions = k.size("n_positions");
    c.norm_eps = k.positive_float_or("layer_norm_epsilon", 1e-5);
    c.ffn = k.size_or("n_inner", 4 * c.hidden);
    c.tied = k.get_or<bool>("tie_word_embeddings", true);
    std::string act = k.get_or<std::string>("activation_function", "gelu_new");
    ZP_REQUIRE(act == "gelu_new" || act == "gelu_pytorch_tanh", source, ": key 'activation_function' = \"",
               io::text_excerpt(act), "\" is not supported (gelu_new)");
    k.reject_if("scale_attn_by_inverse_layer_idx", true, "per-layer attention scaling");
    k.reject_if("scale_attn_weights", false, "unscaled attention");
    k.reject_if("add_cross_attention", true, "encoder-decoder GPT-2");
    c.qkv_bias = c.out_bias = c.mlp_bias = true;
    c.learned_positions = true;
    c.norm = NormKind::LayerNorm;
    c.mlp = MlpKind::GeluTanh;
  } else if (c.model_type == "llama" || c.model_type == "qwen2") {
    hidden_key = "hidden_size";
    heads_key = "num_attention_heads";
    c.hidden = k.size("hidden_size");
    c.layers = k.size("num_hidden_layers");
    c.heads = k.size("num_attention_heads");
    c.kv_heads = k.size_or("num_key_value_heads", c.heads);
    c.vocab = k.size("vocab_size");
    c.ffn = k.size("intermediate_size");
    c.max_positions = k.size_or("max_position_embeddings", 4096);
    c.norm_eps = k.positive_float_or("rms_norm_eps", 1e-6);
    c.tied = k.get_or<bool>("tie_word_embeddings", false);
    if (k.has("rope_parameters")) {
      ZP_REQUIRE(j["rope_parameters"].is_object(), source, ": key 'rope_parameters' = ",
                 io::json_excerpt(j["rope_parameters"]), " must be an object");
      HubKeys rope{j["rope_parameters"], source, "rope_parameters."};
      const std::string type = rope.get_or<std::string>("rope_type", "default");
      ZP_REQUIRE(type == "default", source, ": key 'rope_parameters.rope_type' = \"", io::text_excerpt(type),
                 "\" is not supported (default RoPE only)");
      c.rope_theta = rope.positive_float_or("rope_theta", 10000.0);
    } else {
      c.rope_theta = k.positive_float_or("rope_theta", 10000.0);
      ZP_REQUIRE(!k.has("rope_scaling"), source, ": key 'rope_scaling' is not supported (default RoPE only)");
    }
    std::string act = k.get_or<std::string>("hidden_act", "silu");
    ZP_REQUIRE(act == "silu", source, ": key 'hidden_act' = \"", io::text_excerpt(act), "\" is not supported (silu)");
    bool attention_bias = k.get_or<bool>("attention_bias", false);
    c.qkv_bias = c.model_type == "qwen2" || attention_bias;
    c.out_bias = attention_bias;
    c.mlp_bias = k.get_or<bool>("mlp_bias", false);
    k.reject_if("use_sliding_window", true, "sliding-window attention");
    c.norm = NormKind::RMSNorm;
    c.mlp = MlpKind::SwiGLU;
  } else {
    throw Error(source + ": key 'model_type' = \"" + io::text_excerpt(c.model_type) +
                "\" is not supported (gpt2, llama, qwen2)");
  }
  ZP_REQUIRE(c.heads % c.kv_heads == 0, source, ": ", c.heads, " attention heads cannot share ", c.kv_heads,
             " key/value heads");
  ZP_REQUIRE(k.has("head_dim") || c.hidden % c.heads == 0, source, ": key '", hidden_key, "' = ", c.hidden,
             " must divide by '", heads_key, "' = ", c.heads, " (or give head_dim)");
  c.head_dim = k.size_or("head_dim", c.hidden / c.heads);
  ZP_REQUIRE(c.head_dim % 2 == 0, source, ": head_dim ", c.head_dim, " must be even");
  ZP_REQUIRE(c.model_type != "gpt2" || c.head_dim * c.heads == c.hidden, source, ": n_embd must divide by n_head");
  const __int128 parameters = count_parameters<__int128>(c);
  ZP_REQUIRE(parameters <= kMaxParameters, source, ": the sizes describe about ", double(parameters),
             " parameters, more than 2^56 (the byte counts of weights and optimizer state must fit int64)");
  return c;
}

}  // namespace

TransformerConfig TransformerConfig::from_hub_json(const json& j, const std::string& source) {
  return named_json_errors(source, [&] { return read_hub_config(j, source); });
}

bool TransformerConfig::hub_transposed(const std::string& name) const {
  if (model_type != "gpt2") return false;
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

int64_t TransformerConfig::num_parameters() const { return count_parameters<int64_t>(*this); }

std::vector<LayerLinear> layer_linears(const TransformerConfig& c) {
  const int64_t C = c.hidden, F = c.ffn, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  if (c.model_type == "gpt2")
    return {{"attn.c_attn", 3 * C, C}, {"attn.c_proj", C, C}, {"mlp.c_fc", F, C}, {"mlp.c_proj", C, F}};
  return {{"self_attn.q_proj", q, C}, {"self_attn.k_proj", kv, C}, {"self_attn.v_proj", kv, C},
          {"self_attn.o_proj", C, q}, {"mlp.gate_proj", F, C},     {"mlp.up_proj", F, C},
          {"mlp.down_proj", C, F}};
}

std::vector<std::string> lora_modules_of(const std::string& model_type) {
  TransformerConfig c;  // the names do not depend on the sizes
  c.model_type = model_type;
  std::vector<std::string> names;
  for (const LayerLinear& l : layer_linears(c)) names.push_back(l.module);
  return names;
}

LmTrainFlops lm_train_flops_per_token(const TransformerConfig& cfg, const LoraSpec& lora, int64_t T) {
  const bool frozen_base = lora.r > 0;
  const double base = frozen_base ? 4.0 : 6.0;  // no weight gradient for a frozen weight
  LmTrainFlops f;
  for (const LayerLinear& l : layer_linears(cfg)) {
    f.layer += base * double(l.out) * double(l.in);
    // The same test as the model's (LoraAttacher), on a layer's module name.
    if (frozen_base && lora_targets(lora.target_modules, "layer." + l.module))
      f.layer += 6.0 * double(lora.r) * double(l.in + l.out);
  }
  // Scores and weighted values: 2 * 2 * T * (Hq * D) forward, x3 with the backward, halved by the causal mask.
  f.layer += 6.0 * double(T) * double(cfg.heads * cfg.head_dim);
  f.head = base * double(cfg.vocab) * double(cfg.hidden);
  return f;
}


Transformer::Transformer(const TransformerConfig& cfg, Device dev, DType dt, StreamHandle s, int64_t pad_multiple,
                         bool allocate, LayerSpan span, const LoraSpec& lora)
    : cfg_(cfg), span_(span), lora_(lora) {
  if (trains_adapters()) check_lora_targets(lora_, lora_modules_of(cfg.model_type), cfg.model_type);
  if (span_.end < 0) span_.end = cfg.layers;
  ZP_CHECK(0 <= span_.begin && span_.begin <= span_.end && span_.end <= cfg.layers, "layer span [", span_.begin, ", ",
           span_.end, ") of a model with ", cfg.layers, " layers");
  tied_here_ = cfg.tied && span_.embedding && span_.head;
  replica_ = cfg.tied && !span_.embedding && span_.head;
  auto place = [&](ParamBlock& b) {
    if (allocate)
      b.allocate(dev, dt, s, pad_multiple);
    else
      b.layout(dev, dt, pad_multiple);
  };
  ctx_.dev = dev;
  ctx_.s = s;
  ctx_.dt = dt;
  vpad_ = (cfg.vocab + 63) / 64 * 64;  // aligned rows for the logits GEMM and the loss
  const int64_t C = cfg.hidden, D = cfg.head_dim, F = cfg.ffn;
  const bool gpt2 = cfg.model_type == "gpt2";
  const std::string pre = gpt2 ? "transformer." : "model.";
  embed_ = std::make_unique<ParamBlock>("embed");
  if (trains_adapters()) embed_->freeze();
  wte_ = embed_->add(pre + (gpt2 ? "wte.weight" : "embed_tokens.weight"), {cfg.vocab, C}, false);
  if (cfg.tied) embed_->add_gap((vpad_ - cfg.vocab) * C);  // the head GEMM reads vpad rows
  if (cfg.learned_positions) wpe_ = embed_->add(pre + "wpe.weight", {cfg.max_positions, C}, false);
  if (span_.embedding || replica_) {
    place(*embed_);
  } else {
    embed_.reset();
    wte_ = wpe_ = nullptr;
  }

  for (int64_t i = span_.begin; i < span_.end; ++i) {
    Layer l;
    const std::string p = pre + (gpt2 ? "h." : "layers.") + std::to_string(i) + ".";
    l.block = std::make_unique<ParamBlock>("layer" + std::to_string(i));
    ParamBlock& b = *l.block;
    auto norm = [&](const std::string& n) -> std::pair<Parameter*, Parameter*> {
      Parameter* w = b.add(p + n + ".weight", {C}, false);
      Parameter* bias = cfg.norm == NormKind::LayerNorm ? b.add(p + n + ".bias", {C}, false) : nullptr;
      return {w, bias};
    };
    auto [n1w, n1b] = norm(gpt2 ? "ln_1" : "input_layernorm");
    auto [n2w, n2b] = norm(gpt2 ? "ln_2" : "post_attention_layernorm");
    std::vector<Parameter*> qkv_w, qkv_b;
    Parameter *ow, *ob = nullptr, *upw, *upb = nullptr, *dw, *db = nullptr;
    std::vector<Parameter*> up_w, up_b;
    if (gpt2) {
      qkv_w = {b.add(p + "attn.c_attn.weight", {3 * C, C}, true)};
      qkv_b = {b.add(p + "attn.c_attn.bias", {3 * C}, false)};
      ow = b.add(p + "attn.c_proj.weight", {C, C}, true);
      ob = b.add(p + "attn.c_proj.bias", {C}, false);
      upw = b.add(p + "mlp.c_fc.weight", {F, C}, true);
      upb = b.add(p + "mlp.c_fc.bias", {F}, false);
      up_w = {upw};
      up_b = {upb};
      dw = b.add(p + "mlp.c_proj.weight", {C, F}, true);
      db = b.add(p + "mlp.c_proj.bias", {C}, false);
      for (Parameter* w : {qkv_w[0], ow, upw, dw}) w->file_transposed = cfg.hub_transposed(w->name);
    } else {
      const int64_t Hq = cfg.heads, Hkv = cfg.kv_heads;
      qkv_w = {b.add(p + "self_attn.q_proj.weight", {Hq * D, C}, true),
               b.add(p + "self_attn.k_proj.weight", {Hkv * D, C}, true, true),
               b.add(p + "self_attn.v_proj.weight", {Hkv * D, C}, true, true)};
      if (cfg.qkv_bias)
        qkv_b = {b.add(p + "self_attn.q_proj.bias", {Hq * D}, false),
                 b.add(p + "self_attn.k_proj.bias", {Hkv * D}, false, true),
                 b.add(p + "self_attn.v_proj.bias", {Hkv * D}, false, true)};
      ow = b.add(p + "self_attn.o_proj.weight", {C, Hq * D}, true);
      if (cfg.out_bias) ob = b.add(p + "self_attn.o_proj.bias", {C}, false);
      up_w = {b.add(p + "mlp.gate_proj.weight", {F, C}, true), b.add(p + "mlp.up_proj.weight", {F, C}, true, true)};
      if (cfg.mlp_bias)
        up_b = {b.add(p + "mlp.gate_proj.bias", {F}, false), b.add(p + "mlp.up_proj.bias", {F}, false, true)};
      dw = b.add(p + "mlp.down_proj.weight", {C, F}, true);
      if (cfg.mlp_bias) db = b.add(p + "mlp.down_proj.bias", {C}, false);
    }
    place(b);
    l.ln1 = Norm(cfg.norm, n1w, n1b, cfg.norm_eps);
    l.ln2 = Norm(cfg.norm, n2w, n2b, cfg.norm_eps);
    Linear qkv(qkv_w, qkv_b), o(ow, ob), up(up_w, up_b), down(dw, db);
    if (trains_adapters()) {
      b.freeze();
      l.adapters = std::make_unique<ParamBlock>(b.name() + ".lora");
      LoraAttacher lora(lora_, *l.adapters);
      lora.attach(qkv, qkv_w);
      lora.attach(o, {ow});
      lora.attach(up, up_w);
      lora.attach(down, {dw});
      place(*l.adapters);
    }
    AttentionShape ash{cfg.heads, cfg.kv_heads, D, !gpt2, cfg.rope_theta};
    l.attn = SelfAttention(qkv, o, ash);
    l.mlp = Mlp(cfg.mlp, up, down);
    layers_.push_back(std::move(l));
  }

  if (!span_.head) return;
  head_ = std::make_unique<ParamBlock>("head");
  if (trains_adapters()) head_->freeze();
  Parameter* nw = head_->add(pre + (gpt2 ? "ln_f.weight" : "norm.weight"), {C}, false);
  Parameter* nb = cfg.norm == NormKind::LayerNorm ? head_->add(pre + "ln_f.bias", {C}, false) : nullptr;
  if (!cfg.tied) {
    lm_head_ = head_->add("lm_head.weight", {cfg.vocab, C}, true);
    head_->add_gap((vpad_ - cfg.vocab) * C);
  }
  place(*head_);
  lnf_ = Norm(cfg.norm, nw, nb, cfg.norm_eps);
  head_linear_ = Linear::padded(cfg.tied ? wte_ : lm_head_, vpad_);
}

std::vector<ParamBlock*> Transformer::blocks() {
  std::vector<ParamBlock*> b;
  if (embed_) b.push_back(embed_.get());
  for (auto& l : layers_) {
    b.push_back(l.block.get());
    if (l.adapters) b.push_back(l.adapters.get());
  }
  if (head_) b.push_back(head_.get());
  return b;
}

std::vector<ParamBlock*> Transformer::trainable_blocks() { return nn::trained_blocks(blocks()); }

std::vector<ParamBlock*> Transformer::frozen_blocks() { return nn::frozen_blocks(blocks()); }

std::vector<Parameter*> Transformer::parameters() { return parameters_of(blocks()); }

Parameter* Transformer::find(const std::string& name) { return find_parameter(blocks(), name); }

void Transformer::init_random(uint64_t seed, double std) {
  for (ParamBlock* b : blocks()) init_block_random(*b, seed, std);
}

void Transformer::init_block_random(ParamBlock& b, uint64_t seed, double std) {
  const double proj_std = std / std::sqrt(2.0 * double(cfg_.layers));
  for (auto& owned : b.params()) {
    Parameter* p = owned.get();
    if (init_lora_parameter(*p, seed, ctx_.s)) {
      continue;
    } else if (p->shape.size() == 1) {
      const bool norm_weight = p->name.ends_with(".weight");  // every 1-d weight is a norm's
      init_constant(*p, norm_weight ? 1.f : 0.f, ctx_.s);
    } else {
      const std::string& n = p->name;
      const bool residual_proj = n.ends_with("attn.c_proj.weight") || n.ends_with("mlp.c_proj.weight") ||
                                 n.ends_with("o_proj.weight") || n.ends_with("down_proj.weight");
      init_normal(*p, seed, residual_proj ? proj_std : std, ctx_.s);
    }
  }
}

double Transformer::flops_per_token(int64_t T) const {
  const LmTrainFlops f = lm_train_flops_per_token(cfg_, lora_, T);
  return double(cfg_.layers) * f.layer + f.head;
}

void Transformer::load(const io::WeightSource& files) {
  for (ParamBlock* b : trains_adapters() ? frozen_blocks() : blocks()) load_block(files, *b);
}

namespace {

void require_loadable(const io::WeightSource& files, const Parameter& p) {
  ZP_REQUIRE(files.contains(p.name), files.path(), ": model weights: tensor '", p.name, "' is missing");
  const Shape have = files.shape(p.name, p.file_transposed);
  ZP_REQUIRE(have == p.shape, files.path(), ": tensor '", p.name, "' has shape ", shape_str(have),
             " (in the engine's layout), the config needs ", shape_str(p.shape));
}

}  // namespace

void Transformer::load_block(const io::WeightSource& files, ParamBlock& b) {
  for (auto& owned : b.params()) {
    Parameter* p = owned.get();
    require_loadable(files, *p);
    p->value.copy_from(files.read(p->name, ctx_.dt, p->file_transposed), ctx_.s);
  }
}

void Transformer::load_block_slice(const io::WeightSource& files, const ParamBlock& b, int64_t first,
                                   Tensor& slice) const {
  ZP_CHECK(slice.device().is_cpu() && slice.dtype() == ctx_.dt && first >= 0 && first + slice.numel() <= b.padded(),
           "block ", b.name(), ": a slice of ", slice.numel(), " elements at ", first, " of its ", b.padded());
  const int64_t last = first + slice.numel();
  const size_t esize = dtype_size(ctx_.dt);
  for (const auto& owned : b.params()) {
    const Parameter& p = *owned;
    // Every tensor is checked, also those outside the slice: each rank refuses a wrong file alike.
    require_loadable(files, p);
    const int64_t from = std::max(first, p.offset), to = std::min(last, p.offset + p.numel());
    if (from >= to) continue;
    files.read_range(p.name, ctx_.dt, p.file_transposed, from - p.offset, to - from,
                     static_cast<char*>(slice.data()) + size_t(from - first) * esize);
  }
}

void Transformer::layer_forward(const Ctx& c, const Layer& l, const Tensor& x_in, Tensor& x_out, LayerSaved& sv,
                                int64_t B, int64_t T, const nn::TokenLayout& tokens) {
  const int64_t N = B * T, C = cfg_.hidden;
  sv.a1 = c.saved({N, C});
  l.ln1.forward(c, sv.a1.data(), x_in.data(), N, sv.n1);
  // Both residual adds happen in the output projections' GEMMs.
  sv.x_mid = c.saved({N, C});
  l.attn.forward(c, sv.x_mid.data(), sv.a1.data(), B, T, sv.attn, x_in.data(), tokens);
  sv.a2 = c.saved({N, C});
  l.ln2.forward(c, sv.a2.data(), sv.x_mid.data(), N, sv.n2);
  l.mlp.forward(c, x_out.data(), sv.a2.data(), N, sv.mlp, sv.x_mid.data());
}

void Transformer::layer_backward(const Ctx& c, const Layer& l, const Tensor& x_in, Tensor& dres, LayerSaved& sv,
                                 int64_t B, int64_t T, const nn::TokenLayout& tokens, nn::DeferredWeightGrads* later) {
  const int64_t N = B * T, C = cfg_.hidden;
  Tensor da = c.act({N, C});
  // A split backward's W still reads each branch's output gradient: the residual gradient goes on
  // accumulating into a copy.
  auto keep_for_later = [&] {
    if (!later) return;
    Tensor next = c.act({N, C});
    next.copy_from(dres, c.s);
    dres = std::move(next);
  };
  // dres holds d(x_out); each branch's input gradient is added into it on the way down.
  l.mlp.backward(c, da.data(), dres, sv.a2, N, sv.mlp, false, later);
  keep_for_later();
  l.ln2.backward(c, dres.data(), da.data(), sv.x_mid.data(), N, sv.n2, true, later);
  l.attn.backward(c, da.data(), dres, sv.a1, B, T, sv.attn, false, tokens, later);
  keep_for_later();
  l.ln1.backward(c, dres.data(), da.data(), x_in.data(), N, sv.n1, true, later);
}

void Transformer::forward(const int32_t* ids, int64_t B, int64_t T, TransformerActivations& a, ForwardMode mode,
                          nn::DropoutDraw dropout, nn::TokenLayout tokens) {
  ZP_CHECK(span_.embedding, "forward from token ids on a pipeline stage without the embedding (forward_hidden)");
  forward_from(ids, Tensor(), B, T, a, mode, dropout, tokens);
}

void Transformer::forward_hidden(Tensor hidden_in, int64_t B, int64_t T, TransformerActivations& a,
                                 ForwardMode mode, nn::DropoutDraw dropout, nn::TokenLayout tokens) {
  ZP_CHECK(!span_.embedding, "forward_hidden on the stage with the embedding (forward from token ids)");
  ZP_CHECK(hidden_in.defined() && hidden_in.shape() == Shape({B * T, cfg_.hidden}) && hidden_in.dtype() == ctx_.dt,
           "forward_hidden: the input must be ", dtype_name(ctx_.dt), "[", B * T, ", ", cfg_.hidden, "], got ",
           hidden_in.defined() ? hidden_in.str() : std::string("none"));
  forward_from(nullptr, std::move(hidden_in), B, T, a, mode, dropout, tokens);
}

void Transformer::forward_from(const int32_t* ids, Tensor x_in, int64_t B, int64_t T, TransformerActivations& a,
                               ForwardMode mode, nn::DropoutDraw dropout, nn::TokenLayout tokens) {
  const int64_t N = B * T, C = cfg_.hidden, V = cfg_.vocab;
  ZP_REQUIRE(T <= cfg_.max_positions || !cfg_.learned_positions, "sequence length ", T, " exceeds the model's ",
             cfg_.max_positions, " positions");
  a = TransformerActivations();  // frees what an earlier forward left in it
  const bool train = mode != ForwardMode::Inference;
  // kept: memory that outlives the forward, for the backward (tagged apart); transient: the rest.
  Ctx kept = ctx_, transient = ctx_;
  kept.saves = true;
  transient.saves = false;
  kept.dropout = transient.dropout = train ? dropout : nn::DropoutDraw{};
  const Ctx& streams = train ? kept : transient;                         // residual streams, final norm
  const Ctx& layer_ctx = mode == ForwardMode::Train ? kept : transient;  // inside a layer
  a.mode_ = mode;
  a.dropout_ = kept.dropout;
  a.tokens_ = tokens;
  a.B_ = B;
  a.T_ = T;
  a.ids_ = ids;
  const size_t L = layers_.size();
  if (train) a.residual_.reserve(L + 1);
  if (mode == ForwardMode::Train) a.layers_.reserve(L);

  Tensor x = std::move(x_in);
  if (span_.embedding) {
    x = streams.saved({N, C});
    // A tied head reads the token embedding again at the end: keep the block until then.
    if (tied_here_ && access_) access_->acquire_params(*embed_);
    ParamsInUse use(access_, *embed_);
    ZP_KERNEL_CALL(ctx_.dev, embedding_forward, ctx_.s, ctx_.dt, x.data(), ids, wte_->v(), N, C, V,
                   wpe_ ? wpe_->v() : nullptr, T, 0, tokens.positions);
  }
  for (const Layer& l : layers_) {
    Tensor y = streams.saved({N, C});
    LayerSaved sv;
    {
      nn::AdaptedBlockInUse use(access_, *l.block, l.adapters.get());
      layer_forward(layer_ctx, l, x, y, sv, B, T, tokens);
    }
    // Checkpointing and inference drop sv here; the backward re-runs the layer from its input.
    if (mode == ForwardMode::Train) a.layers_.push_back(std::move(sv));
    if (train) a.residual_.push_back(std::move(x));
    x = std::move(y);  // inference: the layer's input is freed
  }
  if (!span_.head) {
    if (train) {
      a.residual_.push_back(x);
      a.awaiting_backward_ = true;
    }
    a.hidden = std::move(x);
    return;
  }
  Tensor af = streams.saved({N, C});
  nn::Norm::Saved nf;
  a.logits = transient.act({N, vpad_});
  {
    // The replica of a tied embedding is used by the head alone.
    std::optional<ParamsInUse> replica;
    if (replica_) replica.emplace(access_, *embed_);
    ParamsInUse use(access_, *head_);
    lnf_.forward(streams, af.data(), x.data(), N, nf);
    head_linear_.forward(transient, a.logits.data(), af.data(), N, vpad_);
  }
  if (tied_here_ && access_) access_->release_params(*embed_);
  if (train) {
    a.residual_.push_back(std::move(x));
    a.af_ = std::move(af);
    a.nf_ = std::move(nf);
    a.awaiting_backward_ = true;
  }
}

Tensor Transformer::forward_cached(const int32_t* ids, const nn::CachedBatch& b, const nn::PagedKvCache& cache) {
  ZP_CHECK(span_.embedding && span_.head, "forward_cached runs the whole model, not a pipeline stage");
  ZP_CHECK(cache.layers() == cfg_.layers, "forward_cached: the cache has ", cache.layers(), " layers, the model ",
           cfg_.layers);
  const int64_t N = b.num_tokens, C = cfg_.hidden, V = cfg_.vocab, S = b.num_outputs;
  ZP_CHECK(N > 0 && S > 0 && b.num_prefill_tokens >= 0 && b.num_prefill_tokens <= N, "forward_cached: bad batch");
  Ctx c = ctx_;
  c.saves = false;
  c.dropout = {};
  Tensor x = c.act({N, C});
  if (tied_here_ && access_) access_->acquire_params(*embed_);
  {
    ParamsInUse use(access_, *embed_);
    ZP_KERNEL_CALL(c.dev, embedding_forward, c.s, c.dt, x.data(), ids, wte_->v(), N, C, V, wpe_ ? wpe_->v() : nullptr,
                   N, 0, b.positions);
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    nn::AdaptedBlockInUse use(access_, *l.block, l.adapters.get());
    Tensor mid = c.act({N, C}), y = c.act({N, C});
    // The norms go into the next products' inputs (one kernel each on a GPU for a decode step).
    l.attn.forward_cached(c, mid.data(), x.data(), b, cache, int64_t(i), x.data(), &l.ln1);
    l.mlp.forward_normed(c, y.data(), mid.data(), l.ln2, N, mid.data());
    x = std::move(y);
  }
  // Only the wanted rows go through the head: a prompt's other tokens need no logits. The gather is
  // the embedding lookup with the hidden states as the table.
  Tensor last = c.act({S, C});
  ZP_KERNEL_CALL(c.dev, embedding_forward, c.s, c.dt, last.data(), b.output_rows, x.data(), S, C, N, nullptr, S, 0,
                 nullptr);
  x = Tensor();
  Tensor logits = c.act({S, vpad_});
  {
    ParamsInUse use(access_, *head_);
    head_linear_.forward_normed(c, logits.data(), last.data(), lnf_, S);  // one kernel for a decode step
  }
  if (tied_here_ && access_) access_->release_params(*embed_);
  return logits;
}

void Transformer::forward_without_tokens() {
  ZP_CHECK(span_.embedding && span_.head, "forward_without_tokens stands for a whole model's forward");
  if (tied_here_ && access_) access_->acquire_params(*embed_);
  { ParamsInUse use(access_, *embed_); }
  for (const Layer& l : layers_) nn::AdaptedBlockInUse use(access_, *l.block, l.adapters.get());
  {
    std::optional<ParamsInUse> replica;  // as forward(); forward_cached() never has a replica
    if (replica_) replica.emplace(access_, *embed_);
    ParamsInUse use(access_, *head_);
  }
  if (tied_here_ && access_) access_->release_params(*embed_);
}

Tensor Transformer::backward(TransformerActivations& a, Tensor dout, TransformerWeightGrads* later) {
  ZP_CHECK(a.awaiting_backward_, a.mode_ == ForwardMode::Inference && (a.logits.defined() || a.hidden.defined())
                                     ? "backward after an inference forward (it keeps nothing for one)"
                                     : "backward without a training forward (or a second one of the same forward)");
  Ctx c = ctx_;
  c.dropout = a.dropout_;  // the forward's masks
  const int64_t B = a.B_, T = a.T_, N = B * T, C = cfg_.hidden, V = cfg_.vocab;
  // A frozen embedding (LoRA) takes no gradient from the head or the lookup.
  const bool embed_grads = embed_ && !embed_->frozen() && access_;
  const Shape want = span_.head ? Shape({N, vpad_}) : Shape({N, C});
  ZP_CHECK(dout.defined() && dout.shape() == want && dout.dtype() == c.dt, "backward: ",
           span_.head ? "dlogits" : "the output gradient", " must be ", dtype_name(c.dt), shape_str(want),
           ", got ", dout.defined() ? dout.str() : std::string("none"));
  Tensor dres;
  if (span_.head) {
    a.logits = Tensor();  // usually dout's own buffer: it goes with dout after the head's backward
    Tensor daf = c.act({N, C});
    dres = c.act({N, C});
    // The tied embedding receives gradients from the head now and, on this stage, from the lookup
    // at the end; a replica only from the head.
    if (cfg_.tied && access_) access_->acquire_params(*embed_);
    if (cfg_.tied && embed_grads) access_->acquire_grads(*embed_);
    {
      ParamsInUse use(access_, *head_);
      std::optional<GradsInUse> grads;
      if (!head_->frozen()) grads.emplace(access_, *head_);
      head_linear_.backward(c, daf.data(), dout.data(), a.af_.data(), N, false, vpad_);
      dout = Tensor();
      lnf_.backward(c, dres.data(), daf.data(), a.residual_.back().data(), N, a.nf_, false);
    }
    if (cfg_.tied && access_) access_->release_params(*embed_);
    if (replica_ && embed_grads) access_->release_grads(*embed_);
  } else {
    a.hidden = Tensor();
    dres = std::move(dout);  // the next stage's input gradient becomes this stage's residual gradient
  }
  // LoRA: the adapters' gradients need their values, so they stay in this pass.
  const bool split = later && lora_.r == 0;
  if (split) later->layers.assign(layers_.size(), {});
  for (size_t i = layers_.size(); i-- > 0;) {
    const Layer& l = layers_[i];
    nn::AdaptedBlockInUse use(access_, *l.block, l.adapters.get(), /*grads=*/!split);
    LayerSaved rerun;
    LayerSaved& sv = a.mode_ == ForwardMode::Train ? a.layers_[i] : rerun;
    if (a.mode_ == ForwardMode::TrainCheckpointed) {
      Ctx working = c;  // the re-run's activations are working memory of this backward
      working.saves = false;
      Tensor out = c.act({N, C});
      layer_forward(working, layers_[i], a.residual_[i], out, sv, B, T, a.tokens_);
    }
    layer_backward(c, layers_[i], a.residual_[i], dres, sv, B, T, a.tokens_, split ? &later->layers[i] : nullptr);
    sv = LayerSaved();
    a.residual_[i + 1] = Tensor();
  }
  if (!span_.embedding) {
    a = TransformerActivations();
    return dres;  // the gradient of this stage's input
  }
  if (!embed_->frozen()) {
    GradsInUse grads(access_, *embed_);
    ZP_KERNEL_CALL(c.dev, embedding_backward, c.s, c.dt, wte_->g(), wpe_ ? wpe_->g() : nullptr, dres.data(), a.ids_,
                   N, C, V, T, 0, a.tokens_.positions);
  }
  if (tied_here_ && embed_grads) access_->release_grads(*embed_);
  a = TransformerActivations();
  return Tensor();
}

void Transformer::backward_weights(TransformerWeightGrads& later) {
  ZP_CHECK(later.layers.empty() || later.layers.size() == layers_.size(), "backward_weights: ", later.layers.size(),
           " layers of weight gradients for a stage of ", layers_.size());
  for (size_t i = later.layers.size(); i-- > 0;) {
    if (later.layers[i].empty()) continue;
    GradsInUse grads(access_, *layers_[i].block);
    later.layers[i].run(ctx_);
  }
  later.layers.clear();
}

}  // namespace zp::models
