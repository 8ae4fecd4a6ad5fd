// Decoder-only transformer LMs built from a hub config.json: GPT-2, Llama and Qwen2.
//
// The model holds weights only (its nn modules and ParamBlocks); what one forward call computes lives
// in a TransformerActivations that the caller owns. forward(ids, B, T, acts, mode) fills it with the
// logits [B*T, padded_vocab()] and, in a training mode, with what the backward needs;
// backward(acts, dlogits) consumes it and accumulates every parameter's gradient. So several forwards
// may be in flight at once, each with its own object (micro-batch A forward, B forward, B backward,
// A backward), and the gradients are the same as running them one after the other.
//
// The objective is not the model's: the runtime turns the logits into a loss and into dlogits, the
// gradient of that scalar with respect to the logits (runtime/causal_lm_loss.h: next-token
// cross-entropy, dlogits written over the logits in place, so the logits' buffer is the only one).
//
// Modes (ForwardMode): Train keeps every layer's activations; TrainCheckpointed (activation
// checkpointing) keeps only each layer's input and re-runs the layer's forward inside its backward;
// Inference keeps nothing for a backward: between layers only the current residual stream is alive,
// and the object ends up holding the logits alone. What the object keeps for the backward is
// allocated under the tag nn::kSavedTag; transient memory (inside a layer, the backward's
// gradients, the logits) under "activations", so the allocator's per-tag statistics tell them apart.
//
// Sharding units (ParamBlocks): "embed" (token and, for GPT-2, position embeddings), one per layer,
// and "head" (final norm and, when untied, lm_head). A tied head reuses the token embedding, so its
// gradient accumulates both uses. Every use of a block, in the forward and the backward, is reported
// to the engine (nn::BlockAccess).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/lora_modules.h"
#include "nn/attention.h"
#include "nn/block_access.h"
#include "nn/deferred_weight_grads.h"
#include "nn/mlp.h"
#include "nn/norm.h"
#include "nn/parameter.h"

namespace zp::io {
class WeightSource;
}

namespace zp::models {

struct TransformerConfig {
  std::string model_type;  // gpt2 | llama | qwen2
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, max_positions = 0;
  float norm_eps = 1e-5f, rope_theta = 10000.f;
  bool tied = false, qkv_bias = false, out_bias = false, mlp_bias = false, learned_positions = false;
  nn::NormKind norm = nn::NormKind::LayerNorm;
  nn::MlpKind mlp = nn::MlpKind::GeluTanh;

  // Throws zp::Error naming `source` and the key for a missing key or an unsupported feature.
  static TransformerConfig from_hub_json(const nlohmann::json& j, const std::string& source);
  int64_t num_parameters() const;  // unique parameters (a tied head counted once)
  // True for weights that hub files store [in, out] (GPT-2's Conv1D: attn.c_attn, attn.c_proj,
  // mlp.c_fc, mlp.c_proj) while the engine, its checkpoints and weights files keep [out, in].
  bool hub_transposed(const std::string& name) const;
};

// The part of the model a pipeline stage holds (issue 12): layers [begin, end), the token embedding
// when `embedding` (the first stage), the final norm and head when `head` (the last stage). A stage
// with the head but not the embedding of a tied model holds a replica of the embedding block for the
// head; the runtime sums the two copies' gradients every step so they stay one value. The default
// is the whole model.
struct LayerSpan {
  int64_t begin = 0, end = -1;  // end -1: through the last layer
  bool embedding = true, head = true;
};

// LoRA (issue 14): low-rank adapters on the named linear modules of every layer, the rest of the
// model frozen; the settings are io::LoraConfig's (r 0: no LoRA). target_modules are matched as PEFT
// matches them: a module whose name equals a target or ends with "." + target (the hub's names:
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2's c_attn, c_fc and c_proj,
// which is both attn.c_proj and mlp.c_proj, or one of them by its longer name). Each targeted module
// gets <module>.lora_A.weight [r, in] (PEFT's init: uniform within 1/sqrt(in)) and
// <module>.lora_B.weight [out, r] (zeros), in one extra block per layer ("layer<i>.lora"), and adds
// scale * B A dropout(x) to its output (nn::Linear's adapters).
// The module names a layer of `model_type` offers to LoRA (without the layer prefix).
std::vector<std::string> lora_modules_of(const std::string& model_type);

// One layer's linear modules, in the layer's order: the name without the layer prefix (as
// lora_modules_of) and the weight's [out, in].
struct LayerLinear {
  std::string module;
  int64_t out = 0, in = 0;
};
std::vector<LayerLinear> layer_linears(const TransformerConfig& cfg);

// Training FLOPs (forward + backward) per token at sequence length T, for the progress line's MFU,
// the benchmarks and the pipeline's "compute" partition: every matrix multiply's weight (2-d; the
// lookups of the embeddings, norms, biases and elementwise ops are not counted) 2x for the forward,
// 2x for the input gradient and, unless it is frozen (a LoRA run's base), 2x for its weight
// gradient; LoRA's adapters (A [r, in] and B [out, r] of every targeted module) are weights that
// train: 6x. Causal attention's scores and weighted values: 2 x 2 x T x (heads x head_dim) per
// layer forward, x3 with the backward, halved by the mask. What the backward recomputes
// (checkpointed layers) is not counted. The same rule as models/unet_flops.h.
struct LmTrainFlops {
  double layer = 0;  // one layer's (every layer alike)
  double head = 0;   // the head's GEMM
};
LmTrainFlops lm_train_flops_per_token(const TransformerConfig& cfg, const LoraSpec& lora, int64_t T);

// What a forward keeps for the backward.
enum class ForwardMode {
  Train,              // every layer's activations
  TrainCheckpointed,  // activation checkpointing: each layer's input; the backward re-runs the layer
  Inference,          // nothing: no backward follows
};

// The activations of one forward call, filled by Transformer::forward and consumed by
// Transformer::backward (see the top of this file). Move-only: one object, one backward.
class TransformerActivations {
 public:
  TransformerActivations() = default;
  TransformerActivations(TransformerActivations&&) = default;
  TransformerActivations& operator=(TransformerActivations&&) = default;
  TransformerActivations(const TransformerActivations&) = delete;
  TransformerActivations& operator=(const TransformerActivations&) = delete;

  // The forward's output, [B*T, padded_vocab()] in the model's dtype: row b*T+t scores the token
  // after position t of sequence b over the vocabulary; the columns from vocab on are padding (the
  // head's zero rows: 0). The objective may overwrite it with its gradient, in place, for backward().
  Tensor logits;
  // A stage without the head: its last layer's output [B*T, C] in the model's dtype, the next
  // stage's input (the same buffer a training backward reads: do not overwrite it).
  Tensor hidden;

  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  ForwardMode mode() const { return mode_; }
  // True from a training forward until its backward.
  bool awaiting_backward() const { return awaiting_backward_; }
  // Frees everything (a training forward that no backward will follow).
  void clear() { *this = TransformerActivations(); }

 private:
  friend class Transformer;
  struct Layer {
    Tensor a1, x_mid, a2;
    nn::Norm::Saved n1, n2;
    nn::SelfAttention::Saved attn;
    nn::Mlp::Saved mlp;
  };
  ForwardMode mode_ = ForwardMode::Inference;
  bool awaiting_backward_ = false;
  nn::DropoutDraw dropout_;  // the forward's, for its backward
  nn::TokenLayout tokens_;   // the caller's
  int64_t B_ = 0, T_ = 0;
  const int32_t* ids_ = nullptr;  // the caller's; the embedding's backward reads them again
  std::vector<Tensor> residual_;  // training: L+1 residual streams [N, C], the layer inputs and the final output
  std::vector<Layer> layers_;     // Train: every layer's saved activations
  Tensor af_;                     // training: the final norm's output [N, C]
  nn::Norm::Saved nf_;
};

// A split backward's weight-gradient work (ZB-H1, issue 12; nn/deferred_weight_grads.h), one entry
// per layer of the stage: filled by Transformer::backward, run by backward_weights. The caller's,
// like the activations: one per micro-batch between its B and W.
struct TransformerWeightGrads {
  std::vector<nn::DeferredWeightGrads> layers;
  bool pending() const {
    for (const auto& l : layers)
      if (!l.empty()) return true;
    return false;
  }
};

class Transformer {
 public:
  // pad_multiple: every block's flat size is padded to a multiple of it (the ZeRO engine's world x
  // alignment, so each rank owns an equal slice).
  // allocate = false only lays the blocks out: the ZeRO engine then allocates and fills them one at a
  // time (init_block_random / load_block), so no rank ever holds the whole model.
  // span: the layers this pipeline stage holds (the whole model by default).
  // lora: adapters on the named modules, every base block frozen (nn::ParamBlock::freeze); throws
  // zp::Error when a target names no module of this family.
  Transformer(const TransformerConfig& cfg, Device dev, DType dt, StreamHandle s = nullptr, int64_t pad_multiple = 1,
              bool allocate = true, LayerSpan span = {}, const LoraSpec& lora = {});
  // The engine told about every block's use (ZeRO); nullptr = blocks always resident.
  void set_block_access(nn::BlockAccess* a) { access_ = a; }
  const TransformerConfig& config() const { return cfg_; }
  nn::Ctx ctx() const { return ctx_; }
  const LayerSpan& span() const { return span_; }
  // The embedding block when this stage holds it only as the tied head's replica, else nullptr.
  nn::ParamBlock* embedding_replica() { return replica_ ? embed_.get() : nullptr; }
  // Every block (frozen or not) in model order; with LoRA each layer's adapter block follows it.
  std::vector<nn::ParamBlock*> blocks();
  // The blocks that train (all without LoRA; the adapter blocks with it) and those that do not.
  std::vector<nn::ParamBlock*> trainable_blocks();
  std::vector<nn::ParamBlock*> frozen_blocks();
  const LoraSpec& lora() const { return lora_; }
  bool trains_adapters() const { return lora_.r > 0; }
  std::vector<nn::Parameter*> parameters();
  nn::Parameter* find(const std::string& name);  // nullptr when absent
  int64_t padded_vocab() const { return vpad_; }

  // From-scratch initialisation (GPT-2 style): linear weights and embeddings Normal(0, std), the
  // projections into the residual stream Normal(0, std / sqrt(2 * layers)), norm weights 1, biases 0;
  // LoRA's A uniform within 1/sqrt(in), B zero (PEFT's).
  // Values depend only on (seed, parameter name, element), see nn/init.h.
  void init_random(uint64_t seed, double std);
  void init_block_random(nn::ParamBlock& b, uint64_t seed, double std);
  // Loads every parameter from hub safetensors or a ZeRO-Pipe .h5 (io/weight_source.h; Conv1D weights
  // come out transposed, a tied head that the file omits is fine, anything else missing or
  // mis-shaped is an error naming the tensor).
  void load(const io::WeightSource& files);
  void load_block(const io::WeightSource& files, nn::ParamBlock& b);
  // Elements [first, first + slice.numel()) of block b's flat values, as load_block would fill them,
  // into `slice` (host memory, b's dtype, zeroed by the caller: gaps and padding stay as given),
  // reading only the part of each tensor inside the range (a sharded rank's slice: WeightSource::
  // read_range). The block needs no buffer bound.
  void load_block_slice(const io::WeightSource& files, const nn::ParamBlock& b, int64_t first, Tensor& slice) const;

  // The whole model's training FLOPs per token at sequence length T (lm_train_flops_per_token, with
  // this model's LoRA), whatever span this stage holds.
  double flops_per_token(int64_t T) const;

  // ids: device int32 [B*T] (B sequences of T tokens). Fills `acts` (dropping whatever it held) with
  // the logits and what `mode` keeps for the backward; the ids are read again by the backward, so
  // they must live until then. Nothing is synchronised.
  // dropout: where a training forward's dropout masks come from (LoRA's dropout; nn/context.h); the
  // backward reuses it. tokens: packed sequences (instruction data, issue 14): device int32 [B*T]
  // segment ids (attention stays within a segment) and positions (RoPE's, or GPT-2's learned ones),
  // read again by the backward, so they must live until then like the ids.
  void forward(const int32_t* ids, int64_t B, int64_t T, TransformerActivations& acts,
               ForwardMode mode = ForwardMode::Train, nn::DropoutDraw dropout = {}, nn::TokenLayout tokens = {});
  // A stage without the embedding: its input is the previous stage's `hidden` [B*T, C] (kept, and
  // read again by the backward, so it must not change until then).
  void forward_hidden(Tensor hidden_in, int64_t B, int64_t T, TransformerActivations& acts,
                      ForwardMode mode = ForwardMode::Train, nn::DropoutDraw dropout = {}, nn::TokenLayout tokens = {});
  // Inference against a paged KV cache, the generation path (nn/paged_kv_cache.h): runs the step's
  // new tokens (ids: device int32 [batch.num_tokens], laid out as CachedBatch says) through every
  // layer, writing their keys and values into `cache` (made for this model: config().layers layers of
  // kv_heads x head_dim), and returns the logits [batch.num_outputs, padded_vocab()] of the rows
  // batch.output_rows names. The whole model only; LoRA adapters apply. Nothing is synchronised.
  Tensor forward_cached(const int32_t* ids, const nn::CachedBatch& batch, const nn::PagedKvCache& cache);
  // A forward with no tokens: acquires and releases every block as forward() and forward_cached() do
  // and in their order, computing nothing. With sharded weights each acquire is a collective gather,
  // so a rank without tokens of its own joins the other ranks' forwards with this (sharded
  // inference); the order must stay that of the forwards above.
  void forward_without_tokens();
  // dlogits: the gradient of the objective with respect to acts.logits, [B*T, padded_vocab()] in the
  // model's dtype, zero in the padding columns; usually acts.logits itself, overwritten in place by
  // the objective. Gradients accumulate into every block's fp32 gradient buffer. Consumes `acts`
  // (empty afterwards); the logits' buffer is freed as soon as the head's backward is done with it,
  // unless the caller still holds another handle to it.
  // A stage without the head takes d(acts.hidden) [B*T, C] (overwritten) instead of dlogits; a stage
  // without the embedding returns the gradient of its input (for the previous stage), others an
  // empty tensor.
  // With `later` (ZB-H1's B pass) the layers' weight gradients are not computed but left in it, for
  // backward_weights (W): their projections' backward_params, and the norms' weight gradients
  // (computed here with the input gradients, into scratch that W adds in). The layers' blocks then
  // take no gradient until W. The head's and the embedding's gradients are computed here either way:
  // deferring the head's would hold the [N, vocab] logits gradient until W. With LoRA everything
  // is computed here (adapters' gradients need their values) and `later` stays empty.
  Tensor backward(TransformerActivations& acts, Tensor dlogits, TransformerWeightGrads* later = nullptr);
  // W: every layer's weight gradients that backward left in `later`, into the blocks' gradients
  // (each block's gradients acquired, ZeRO-2/3 reduce-scattering them when released), from the last
  // layer down as the backward runs; leaves `later` empty.
  void backward_weights(TransformerWeightGrads& later);

 private:
  struct Layer {
    std::unique_ptr<nn::ParamBlock> block;
    std::unique_ptr<nn::ParamBlock> adapters;  // LoRA's A and B matrices of this layer, or null
    nn::Norm ln1, ln2;
    nn::SelfAttention attn;
    nn::Mlp mlp;
  };
  using LayerSaved = TransformerActivations::Layer;
  void forward_from(const int32_t* ids, Tensor x_in, int64_t B, int64_t T, TransformerActivations& acts,
                    ForwardMode mode, nn::DropoutDraw dropout, nn::TokenLayout tokens);
  // Adds layer `l`'s LoRA block (A and B of every targeted module) and gives its Linears the adapters.
  void add_adapters(Layer& l, const std::string& prefix, std::vector<nn::Parameter*> qkv, nn::Parameter* o,
                    std::vector<nn::Parameter*> up, nn::Parameter* down);
  // c.saves: whether what `sv` holds is kept for the backward (tagged apart) or transient.
  void layer_forward(const nn::Ctx& c, const Layer& l, const Tensor& x_in, Tensor& x_out, LayerSaved& sv, int64_t B,
                     int64_t T, const nn::TokenLayout& tokens);
  void layer_backward(const nn::Ctx& c, const Layer& l, const Tensor& x_in, Tensor& dres, LayerSaved& sv, int64_t B,
                      int64_t T, const nn::TokenLayout& tokens, nn::DeferredWeightGrads* later);

  TransformerConfig cfg_;
  LayerSpan span_;
  LoraSpec lora_;
  bool tied_here_ = false;  // both uses of a tied embedding on this stage (the whole model)
  bool replica_ = false;    // the embedding block is here for the tied head only
  nn::Ctx ctx_;
  nn::BlockAccess* access_ = nullptr;
  int64_t vpad_ = 0;
  std::unique_ptr<nn::ParamBlock> embed_, head_;
  nn::Parameter *wte_ = nullptr, *wpe_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  nn::Norm lnf_;
  nn::Linear head_linear_;
};

}  // namespace zp::models
