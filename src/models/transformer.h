// Decoder-only transformer LMs built from a hub config.json: GPT-2, Llama and Qwen2.
//
// Sharding units (ParamBlocks): "embed" (token and, for GPT-2, position embeddings), one per layer,
// and "head" (final norm and, when untied, lm_head). A tied head reuses the token embedding, so its
// gradient accumulates both uses. Activations saved for the backward are kept per layer; with
// activation checkpointing only each layer's input is kept and the layer's forward is re-run inside
// its backward.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/block_access.h"
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

class Transformer {
 public:
  // pad_multiple: every block's flat size is padded to a multiple of it (the ZeRO engine's world x
  // alignment, so each rank owns an equal slice).
  // allocate = false only lays the blocks out: the ZeRO engine then allocates and fills them one at a
  // time (init_block_random / load_block), so no rank ever holds the whole model.
  Transformer(const TransformerConfig& cfg, Device dev, DType dt, StreamHandle s = nullptr, int64_t pad_multiple = 1,
              bool allocate = true);
  // The engine told about every block's use (ZeRO); nullptr = blocks always resident.
  void set_block_access(nn::BlockAccess* a) { access_ = a; }
  const TransformerConfig& config() const { return cfg_; }
  nn::Ctx ctx() const { return ctx_; }
  std::vector<nn::ParamBlock*> blocks();
  std::vector<nn::Parameter*> parameters();
  nn::Parameter* find(const std::string& name);  // nullptr when absent
  int64_t padded_vocab() const { return vpad_; }

  // From-scratch initialisation (GPT-2 style): linear weights and embeddings Normal(0, std), the
  // projections into the residual stream Normal(0, std / sqrt(2 * layers)), norm weights 1, biases 0.
  // Values depend only on (seed, parameter name, element), see nn/init.h.
  void init_random(uint64_t seed, double std);
  void init_block_random(nn::ParamBlock& b, uint64_t seed, double std);
  // Loads every parameter from hub safetensors or a ZeRO-Pipe .h5 (io/weight_source.h; Conv1D weights
  // come out transposed, a tied head that the file omits is fine, anything else missing or
  // mis-shaped is an error naming the tensor).
  void load(const io::WeightSource& files);
  void load_block(const io::WeightSource& files, nn::ParamBlock& b);

  // FLOPs of one training step (forward + backward) per token at sequence length T, counting the
  // matrix multiplies (6 per parameter used in one) and causal attention (half the score matrix).
  double flops_per_token(int64_t T) const;

  // ids, targets: device int32 [B*T]; a target < 0 is ignored, and num_valid (counted by the caller,
  // who has the batch on the host) is how many are not. Nothing is synchronised: the loss stays on
  // the device until loss() is asked for. Keeps what the backward needs; `logits_out` (optional)
  // receives [B*T, V] in dt.
  void forward(const int32_t* ids, const int32_t* targets, int64_t num_valid, int64_t B, int64_t T,
               bool checkpoint = false, Tensor* logits_out = nullptr);
  // Mean loss over the valid targets of the last forward (waits for it).
  double loss() const;
  // Gradients of (loss * loss_scale) accumulate into every block's fp32 gradient buffer.
  void backward(float loss_scale = 1.f);

 private:
  struct Layer {
    std::unique_ptr<nn::ParamBlock> block;
    nn::Norm ln1, ln2;
    nn::SelfAttention attn;
    nn::Mlp mlp;
  };
  struct LayerSaved {
    Tensor a1, x_mid, a2;
    nn::Norm::Saved n1, n2;
    nn::SelfAttention::Saved attn;
    nn::Mlp::Saved mlp;
  };
  void layer_forward(const Layer& l, const Tensor& x_in, Tensor& x_out, LayerSaved& sv, int64_t B, int64_t T);
  void layer_backward(const Layer& l, const Tensor& x_in, Tensor& dres, LayerSaved& sv, int64_t B, int64_t T);

  TransformerConfig cfg_;
  nn::Ctx ctx_;
  nn::BlockAccess* access_ = nullptr;
  int64_t vpad_ = 0;
  std::unique_ptr<nn::ParamBlock> embed_, head_;
  nn::Parameter *wte_ = nullptr, *wpe_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  nn::Norm lnf_;
  nn::Linear head_linear_;

  // State of the last forward, for the backward.
  int64_t B_ = 0, T_ = 0, num_valid_ = 0;
  bool checkpoint_ = false;
  const int32_t *ids_ = nullptr, *targets_ = nullptr;
  std::vector<Tensor> residual_;  // L+1 residual streams [N, C]: layer inputs and the final output
  std::vector<LayerSaved> saved_;
  Tensor af_, logits_, lse_, losses_;
  nn::Norm::Saved nf_;
};

}  // namespace zp::models
