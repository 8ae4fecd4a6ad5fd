#include "runtime/lm_training.h"

#include <memory>
#include <optional>

#include "io/token_dataset.h"
#include "io/weight_source.h"
#include "models/activation_estimate.h"
#include "models/transformer.h"
#include "runtime/causal_lm_loss.h"
#include "runtime/training_driver.h"

namespace zp::runtime {

namespace {

// One rank's micro-batch: `rows` windows at consecutive global positions starting at `first`.
struct Batch {
  Tensor ids, targets;  // host int32 [rows * T]
};

Batch make_batch(const io::TokenDataset& ds, uint64_t seed, bool shuffle, int64_t first, int64_t rows) {
  const int64_t T = ds.seq_len(), n = ds.num_windows();
  Batch b{Tensor::empty({rows * T}, DType::I32, Device::cpu(), "batch"),
          Tensor::empty({rows * T}, DType::I32, Device::cpu(), "batch")};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t p = first + i, epoch = p / n, w = ds.epoch_order(seed, epoch, p % n, shuffle);
    ds.window(w, b.ids.data<int32_t>() + i * T, b.targets.data<int32_t>() + i * T);
  }
  return b;
}

class LmTask final : public TrainingTask {
 public:
  LmTask(const TrainConfig& cfg, const TrainingPlace& at)
      : cfg_(cfg), at_(at), train_ds_(cfg.train_files, cfg.seq_len, 0.0, 1.0 - cfg.val_fraction) {
    // Data first: a missing or bad file is reported before any model memory is allocated.
    if (!cfg.val_files.empty())
      val_ds_.emplace(cfg.val_files, cfg.seq_len);
    else if (cfg.val_fraction > 0)
      val_ds_.emplace(cfg.train_files, cfg.seq_len, 1.0 - cfg.val_fraction, 1.0);
    std::string source;
    hub_ = cfg.hub_config_json(source);
    mcfg_ = models::TransformerConfig::from_hub_json(hub_, source);
    ZP_REQUIRE(cfg.seq_len <= mcfg_.max_positions || !mcfg_.learned_positions, "data.seq_len ", cfg.seq_len,
               " exceeds the model's ", mcfg_.max_positions, " positions");
    const int32_t file_vocab = train_ds_.max_token_seen_bound();
    ZP_REQUIRE(file_vocab == 0 || file_vocab <= mcfg_.vocab, cfg.train_files[0], ": the token file's vocabulary (",
               file_vocab, ") is larger than the model's (", mcfg_.vocab, ")");
    // Every id, once, now: an id past the embedding would otherwise stop the run when its window is
    // first drawn, possibly hours in.
    train_ds_.check_vocab(mcfg_.vocab);
    if (!cfg.val_files.empty()) val_ds_->check_vocab(mcfg_.vocab);
  }

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad_multiple) override {
    model_.emplace(mcfg_, at_.dev, cfg_.dtype, at_.s(), pad_multiple, /*allocate=*/false);
    if (cfg_.init == "hub") hub_weights_ = io::WeightSource::open(cfg_.hub_dir, "model");
    return model_->blocks();
  }
  void fill_block(nn::ParamBlock& b) override {
    if (hub_weights_)
      model_->load_block(*hub_weights_, b);
    else
      model_->init_block_random(b, cfg_.seed, cfg_.init_std);
  }
  void set_block_access(nn::BlockAccess* access) override { model_->set_block_access(access); }

  CheckpointModel checkpoint_model() const override { return {cfg_.config_json, hub_, "transformer"}; }
  ProgressUnit progress() override { return {"tok", cfg_.seq_len, model_->flops_per_token(cfg_.seq_len)}; }
  double activation_bytes() override {
    return models::transformer_activation_bytes(mcfg_, cfg_.micro_batch, cfg_.seq_len, cfg_.dtype,
                                                cfg_.activation_checkpointing);
  }
  std::string describe() override {
    return detail::cat("model ", mcfg_.model_type, " ", mcfg_.num_parameters() / 1e6, "M parameters, ", mcfg_.layers,
                       " layers, d=", mcfg_.hidden, " | ", at_.world(), " rank(s) on ", at_.dev.str(), " | ",
                       dtype_name(cfg_.dtype), " | global batch ", at_.global_batch, " x ", cfg_.seq_len,
                       " tokens (micro ", cfg_.micro_batch, ", accum ", cfg_.grad_accum, ") | ",
                       train_ds_.num_windows(), " training windows");
  }

  double micro_step(int64_t, int64_t first, float loss_scale) override {
    return forward_backward(make_batch(train_ds_, cfg_.seed, cfg_.shuffle, first, cfg_.micro_batch), true, loss_scale);
  }
  bool has_validation() const override { return val_ds_.has_value(); }
  double validation_loss(int64_t first) override {
    return forward_backward(make_batch(*val_ds_, cfg_.seed, false, first, cfg_.micro_batch), false, 1.f);
  }

 private:
  // The model's part of a micro-batch: forward, the next-token loss, and the backward when training.
  double forward_backward(const Batch& b, bool train_step, float loss_scale) {
    const Device dev = at_.dev;
    const StreamHandle s = at_.s();
    Tensor ids = b.ids.to(dev, s), tgt = b.targets.to(dev, s);
    int64_t valid = 0;
    for (int64_t i = 0; i < b.targets.numel(); ++i) valid += b.targets.data<int32_t>()[i] >= 0;
    using models::ForwardMode;
    models::TransformerActivations acts;
    model_->forward(ids.data<int32_t>(), cfg_.micro_batch, cfg_.seq_len, acts,
                    !train_step                     ? ForwardMode::Inference
                    : cfg_.activation_checkpointing ? ForwardMode::TrainCheckpointed
                                                    : ForwardMode::Train);
    CausalLmLoss lm(acts.logits, mcfg_.vocab, tgt.data<int32_t>(), valid, s);
    if (train_step) model_->backward(acts, lm.backward(acts.logits, loss_scale));
    return lm.mean();  // read after the backward is queued, so the GPU never waits for the host
  }

  const TrainConfig& cfg_;
  const TrainingPlace& at_;
  io::TokenDataset train_ds_;
  std::optional<io::TokenDataset> val_ds_;
  io::json hub_;
  models::TransformerConfig mcfg_;
  std::optional<models::Transformer> model_;
  std::unique_ptr<io::WeightSource> hub_weights_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_lm_task(const TrainConfig& cfg, const TrainingPlace& at) {
  return std::make_unique<LmTask>(cfg, at);
}

TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  return run_training(cfg, rt, group, return_params, [&](const TrainingPlace& at) { return make_lm_task(cfg, at); });
}

}  // namespace zp::runtime
