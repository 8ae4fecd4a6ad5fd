// Diffusion UNet (diffusers' UNet2DConditionModel, SD 1.x/2.x and SDXL layouts) built from a
// diffusers config.json, with explicit forward and backward: the wiring of nn's ResBlock,
// Transformer2D, Downsample2D and Upsample2D into diffusers' blocks, names and skip connections.
//
//   stem   conv_in; time_proj (sinusoids, on the host) -> time_embedding (linear, SiLU, linear);
//          SDXL's text_time add_embedding (text_embeds ++ sinusoids of the 6 time_ids -> linear,
//          SiLU, linear) added to it
//   down   per block: resnets (+ Transformer2D attentions), then a stride-2 conv downsampler
//   mid    resnet, (Transformer2D, resnet)
//   up     per block: (skip concatenation, resnet (+ attention)) x (layers + 1), then nearest 2x + conv
//   head   GroupNorm + SiLU, conv_out
// Inside, every image is channels-last, [B, H, W, C] (kernels/conv2d.h says why); the sample and the
// prediction stay NCHW as diffusers passes them, transposed at the stem and at the head.
//
// Sharding units (ParamBlocks, DESIGN decision 2): "stem", one per down block, "mid", one per up
// block, "head". Every use of a unit is reported to the engine (nn::BlockAccess) as the transformer
// does: the stem is held around the time embedding and conv_in in the forward and around conv_in's
// and the time embedding's backward at the very end (the time-embedding gradient accumulates over
// every ResBlock first); each stage and the head around their own forward and backward. Parameter
// names are diffusers' own. The time embedding reaches every ResBlock through one shared SiLU(emb)
// activation whose gradient accumulates over all of them before it flows back into the stem.
//
// Pipeline chunks (issue 12, UNetSpan): the units of a cut are the 2n + 1 stages in model order
// (down blocks, mid, up blocks); the chunk with unit 0 holds the stem, the one with the last unit
// the head. What crosses a cut is one flat tensor (UNetConfig::boundary_shapes): the hidden state,
// the skip activations pushed before the cut and popped after it, and the time embedding as the
// ResBlocks read it (SDXL's added embedding is summed into it in the stem, so it travels inside).
// Its gradient crosses back the same way: each chunk adds its ResBlocks' time-embedding gradient to
// the one it receives, so the stem's backward on the first chunk sees every ResBlock's share, in
// the whole model's order. Encoder hidden states are data: every chunk reads them itself.
//
// Activation checkpointing (a forward into UNetActivations::training(true)) keeps the input of every
// ResBlock and of every transformer block inside a Transformer2D, plus the skip connections (the up
// path reads them; most are such inputs anyway), and frees everything else; the backward re-runs each of those layers'
// forward just before its backward. The re-runs happen inside the stage's backward, where the stage's
// parameters are held (ZeRO-3: gathered) already. Why that granularity rather than whole stages: both
// re-run each layer's forward once (about a third more compute per step, a little less since the
// samplers, proj_in/proj_out GEMMs, stem and head are not re-run), but a stage's re-run materialises
// all of its activations at once. For SDXL at B=2 and 128x128 latents in bf16 (measured on the CPU
// with a tenth of the channels, scaled up), a plain step peaks at about 11 GB of activations, of
// which up_blocks.0 (three Transformer2Ds of ten blocks at 32x32) holds 3.8 GB; the kept inputs come
// to 0.8 GB, and this granularity peaks at 1.2 GB, where whole stages would reach about 4.6 GB.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/lora_modules.h"
#include "nn/block_access.h"
#include "nn/conv2d.h"
#include "nn/deferred_weight_grads.h"
#include "nn/group_norm.h"
#include "nn/linear.h"
#include "nn/parameter.h"

namespace zp::io {
class WeightSource;
}

namespace zp::models {

// SDXL's micro-conditioning: per sample, original (height, width), crop (top, left) and target
// (height, width), each embedded by the same sinusoids as the timestep.
inline constexpr int64_t kTimeIdsPerSample = 6;

struct UNetConfig {
  int64_t in_channels = 4, out_channels = 4;
  std::vector<int64_t> block_out;             // block_out_channels
  std::vector<bool> down_attn, up_attn;       // CrossAttn{Down,Up}Block2D (true) or {Down,Up}Block2D
  std::vector<int64_t> layers;                // layers_per_block, per down block
  std::vector<int64_t> heads;                 // attention heads per down block (see from_hub_json)
  std::vector<int64_t> transformer_layers;    // transformer_layers_per_block, per down block
  std::vector<int64_t> cross_dim;             // cross_attention_dim, per down block
  int64_t groups = 32;                        // norm_num_groups
  float norm_eps = 1e-5f;
  bool linear_projection = false;             // use_linear_projection
  bool flip_sin_to_cos = true;
  double freq_shift = 0;
  int64_t time_embed_dim = 0;                 // time_embedding_dim or 4 * block_out[0]
  int64_t conv_in_kernel = 3, conv_out_kernel = 3;
  float mid_scale = 1.f, resnet_scale = 1.f;  // mid_block_scale_factor, resnet_out_scale_factor
  bool skip_time_act = false;                 // resnet_skip_time_act
  bool text_time = false;                     // addition_embed_type == "text_time" (SDXL)
  int64_t add_time_dim = 0;                   // addition_time_embed_dim
  int64_t add_in_dim = 0;                     // projection_class_embeddings_input_dim

  // Every key of the file must be known; a feature we do not implement (class embeddings, other
  // time-embedding types, scale-shift ResBlocks, upcast or dual attention, ...) throws zp::Error
  // naming `source` and the key. SD convention: with num_attention_heads null (diffusers requires
  // it), attention_head_dim gives the number of heads, and head_dim = channels / heads.
  static UNetConfig from_hub_json(const nlohmann::json& j, const std::string& source);
  int64_t num_blocks() const { return int64_t(block_out.size()); }
  // SDXL's text_embeds width: what the added embedding's input keeps beside the time ids; 0 without
  // text_time conditioning.
  int64_t text_embeds_dim() const { return text_time ? add_in_dim - kTimeIdsPerSample * add_time_dim : 0; }

  // The units a pipeline cuts between: down blocks 0..n-1, the mid block (n), up blocks (n+1..2n).
  int64_t num_units() const { return 2 * num_blocks() + 1; }
  // "down_blocks.<i>", "mid_block" or "up_blocks.<i>": unit u's block name (diffusers' prefix).
  std::string unit_name(int64_t u) const;
  // The unit block `block` (a ParamBlock's name: a unit's, the stem's or the head's, or its LoRA
  // adapters' "<block>.lora") belongs to: -1 for the stem, num_units() for the head. Throws zp::Error for another name.
  int64_t unit_of_block(const std::string& block) const;
  // What crosses the cut before unit `cut` (0 < cut < num_units()) for B samples of H x W latents,
  // in the order the boundary tensor packs them: the hidden state [B, h, w, C] (channels-last, as every
  // image inside the model), the live skip activations (bottom of the stack first), the time
  // embedding [B, time_embed_dim].
  std::vector<Shape> boundary_shapes(int64_t cut, int64_t B, int64_t H, int64_t W) const;
  // The values of all of them: the flat boundary tensor's length.
  int64_t boundary_numel(int64_t cut, int64_t B, int64_t H, int64_t W) const;
};

// The part of the UNet a pipeline chunk holds (issue 12): units [begin, end) of UNetConfig's
// num_units(), the stem with unit 0 and the head with the last. The default is the whole model.
struct UNetSpan {
  int64_t begin = 0, end = -1;  // end -1: through the last unit
};

// What one forward call takes. Tensors are on the model's device in its compute dtype.
struct UNetInputs {
  Tensor sample;                  // [B, in_channels, H, W]; H and W divisible by 2^(blocks - 1)
  std::vector<float> timesteps;   // [B] (host)
  Tensor encoder_hidden_states;   // [B, L, cross_attention_dim]
  Tensor text_embeds;             // SDXL: [B, text_embeds_dim()]
  // A pipeline chunk without the stem reads only sample's shape (the boundary's sizes follow it) and
  // encoder_hidden_states; timesteps, text_embeds and time_ids serve the stem.
  std::vector<float> time_ids;    // SDXL: [B * kTimeIdsPerSample] (host)
  // LoRA's dropout masks (nn/context.h) of a training forward; its backward draws them again.
  nn::DropoutDraw dropout;
};

// What one forward keeps for its backward (DESIGN decision 11). The caller owns it: UNet::forward
// fills it and UNet::backward consumes it, so one model can have several micro-batches in flight
// (forward A, forward B, backward B, backward A), each in its own UNetActivations.
class UNetActivations {
 public:
  // Everything the backward reads, or with `checkpoint` (activation checkpointing) only what the
  // backward re-runs the forward from (see the top of this file).
  static UNetActivations training(bool checkpoint = false) { return UNetActivations(true, checkpoint); }
  // A forward for its output alone (inference, validation): keeps nothing, and frees each layer's
  // activations as soon as the next layer has read them.
  static UNetActivations inference() { return UNetActivations(false, false); }

  UNetActivations(UNetActivations&&) noexcept;
  UNetActivations& operator=(UNetActivations&&) noexcept;
  ~UNetActivations();

  bool saves() const { return saves_; }
  bool checkpointed() const { return checkpoint_; }
  // Holds no forward: not run yet, consumed by its backward, or an inference forward.
  bool empty() const { return !state_; }

 private:
  friend class UNet;
  struct State;  // the tensors of one forward (unet.cpp)
  UNetActivations(bool saves, bool checkpoint);
  bool saves_ = true, checkpoint_ = false;
  std::unique_ptr<State> state_;
};

// ZB-H1's split backward (issue 12, nn/deferred_weight_grads.h): the weight gradients of every unit
// of a chunk, which UNet::backward's B pass leaves here and backward_weights (W) computes. The
// caller's, one per micro-batch between its B and its W (DESIGN decision 11).
struct UNetWeightGrads {
  std::vector<nn::DeferredWeightGrads> units;  // num_units(); those of the span filled
};

// The model holds weights only; every forward's activations live in the caller's UNetActivations.
class UNet {
 public:
  // pad_multiple: every block's flat size is padded to a multiple of it (the ZeRO engine's world x
  // alignment, so each rank owns an equal slice).
  // allocate = false only lays the blocks out; the ZeRO engine then allocates and fills them one at a
  // time (load_block, or the diffusion loop's per-block random init).
  // lora (issue 14): adapters on the named modules of the down, mid and up blocks (diffusers' names:
  // to_q, to_k, to_v, to_out.0 of attn1 and attn2, ff.net.0.proj, ff.net.2, proj_in / proj_out (linear
  // in SDXL, 1x1 convolutions in SD 1.x), the ResBlocks' conv1, conv2, conv_shortcut, and the
  // samplers' conv), and on the stem's conv_in and the head's conv_out; one adapter block per block
  // with a target ("<block>.lora": "down_blocks.0.lora", "stem.lora", "head.lora"); every other block
  // is frozen. Throws zp::Error for a target that names no module of this model.
  // span (pipeline chunks): the model holds only those units' blocks, and the stem and the head where
  // the span has them; blocks(), parameters(), loading and initialisation see only those.
  UNet(const UNetConfig& cfg, Device dev, DType dt, StreamHandle s = nullptr, int64_t pad_multiple = 1,
       bool allocate = true, const LoraSpec& lora = {}, UNetSpan span = {});
  // The engine told about every block's use (ZeRO); nullptr = blocks always resident.
  void set_block_access(nn::BlockAccess* a) { access_ = a; }
  ~UNet();
  const UNetConfig& config() const { return cfg_; }
  const UNetSpan& span() const { return span_; }  // end resolved
  bool has_stem() const { return span_.begin == 0; }
  bool has_head() const { return span_.end == cfg_.num_units(); }
  nn::Ctx ctx() const { return ctx_; }
  // Every block in model order; with LoRA each stage's adapter block follows it.
  std::vector<nn::ParamBlock*> blocks();
  // Those that train (all without LoRA; the adapter blocks with it) and those that do not.
  std::vector<nn::ParamBlock*> trainable_blocks();
  std::vector<nn::ParamBlock*> frozen_blocks();
  // The blocks whose weights the weights files hold: every block but LoRA's adapters.
  std::vector<nn::ParamBlock*> base_blocks();
  const LoraSpec& lora() const { return lora_; }
  std::vector<nn::Parameter*> parameters();
  nn::Parameter* find(const std::string& name);  // nullptr when absent
  int64_t num_parameters();

  // Loads every base parameter (LoRA's adapters are not in weights files) from diffusers safetensors
  // or a ZeRO-Pipe .h5 (io/weight_source.h); a missing, mis-shaped or unexpected tensor is an error
  // naming it (a chunk checks the file against the whole model's names, and loads its own).
  void load(const io::WeightSource& files);
  // The checks of load() without reading anything, then one block's tensors.
  void check_weights(const io::WeightSource& files);
  void load_block(const io::WeightSource& files, nn::ParamBlock& b);

  // Returns the predicted sample [B, out_channels, H, W]. `acts` must be empty; a training one is
  // filled with what the backward needs.
  // A pipeline chunk: `boundary` is the previous chunk's output (none for the chunk with the stem);
  // a chunk without the head returns its own boundary (flat, UNetConfig::boundary_shapes).
  Tensor forward(const UNetInputs& in, UNetActivations& acts, const Tensor& boundary = Tensor()) const;
  // dout: gradient of the scalar with respect to the output of the forward that filled `acts`.
  // Parameter gradients accumulate (fp32) into every block's buffer; returns the gradient of the
  // input sample, or of the input boundary for a chunk without the stem (a boundary gradient `dout`
  // is consumed: the time embedding's share of this chunk accumulates into it). Leaves `acts` empty.
  // With `later` (ZB-H1's B pass) the down, mid and up blocks' weight gradients are not computed but
  // left in it for backward_weights (W), so B touches none of those blocks' gradient buffers; the
  // stem's and the head's are computed here (they end and start the backward). With LoRA everything
  // is computed here (adapters' gradients need their values) and `later` stays empty.
  Tensor backward(const Tensor& dout, UNetActivations& acts, UNetWeightGrads* later = nullptr) const;
  // W: the weight gradients backward left in `later`, into each block's gradients (held, under
  // ZeRO-3 reduce-scattered, one block at a time as the backward does); leaves `later` empty.
  void backward_weights(UNetWeightGrads& later) const;

  struct Stage;  // one down, mid or up block (defined in unet.cpp)

 private:
  UNetConfig cfg_;
  LoraSpec lora_;
  nn::Ctx ctx_;
  UNetSpan span_;
  nn::BlockAccess* access_ = nullptr;
  std::unique_ptr<nn::ParamBlock> stem_, head_;  // null where the span lacks them
  // LoRA's adapters of conv_in ("stem.lora") and conv_out ("head.lora"), or null
  std::unique_ptr<nn::ParamBlock> stem_adapters_, head_adapters_;
  nn::Conv2d conv_in_, conv_out_;
  nn::Linear time_1_, time_2_, add_1_, add_2_;
  nn::GroupNorm norm_out_;
  std::vector<std::unique_ptr<Stage>> units_;  // num_units(), null outside the span
};

// Timesteps(dim, flip_sin_to_cos, freq_shift) as diffusers computes it, in float32 (the reference
// casts timesteps to float32 before the sinusoids even in a float64 model): out[B, dim].
std::vector<float> timestep_embedding(const std::vector<float>& t, int64_t dim, bool flip_sin_to_cos,
                                      double freq_shift);

}  // namespace zp::models
