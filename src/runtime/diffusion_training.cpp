#include "runtime/diffusion_training.h"

#include <cstdio>
#include <memory>
#include <optional>

#include "io/latent_dataset.h"
#include "io/weight_source.h"
#include "kernels/elementwise.h"
#include "kernels/mse.h"
#include "models/activation_estimate.h"
#include "models/unet.h"
#include "models/unet_flops.h"
#include "models/unet_init.h"
#include "nn/init.h"
#include "runtime/base_fingerprint.h"
#include "runtime/diffusion_draws.h"
#include "runtime/lora_run.h"
#include "runtime/noise_schedule.h"
#include "runtime/training_driver.h"

namespace zp::runtime {

namespace {

// What the latent file must provide for this model.
io::LatentRequirements requirements(const models::UNetConfig& m, const std::string& source) {
  io::LatentRequirements r;
  r.channels = m.in_channels;
  r.spatial_multiple = int64_t(1) << (m.num_blocks() - 1);
  r.text_embeds_dim = m.text_embeds_dim();
  // One encoder_hidden_states feeds every attention block: their cross_attention_dim must agree.
  r.context_dim = 0;
  for (int64_t i = 0; i < m.num_blocks(); ++i) {
    const bool used = m.down_attn[size_t(i)] || m.up_attn[size_t(m.num_blocks() - 1 - i)] || i + 1 == m.num_blocks();
    if (!used) continue;
    ZP_REQUIRE(r.context_dim == 0 || r.context_dim == m.cross_dim[size_t(i)], source,
               ": key 'cross_attention_dim' differs between attention blocks; one text encoder cannot feed them");
    r.context_dim = m.cross_dim[size_t(i)];
  }
  return r;
}

// Host floats -> a tensor of `dt` on `dev`.
Tensor upload(const std::vector<float>& v, const Shape& shape, DType dt, Device dev, StreamHandle s) {
  ZP_CHECK(int64_t(v.size()) == shape_numel(shape), "upload of ", v.size(), " values as ", shape_str(shape));
  Tensor h = Tensor::empty(shape, dt, Device::cpu(), "batch");
  kernels::cpu::cast(nullptr, dt, h.data(), DType::F32, v.data(), int64_t(v.size()));
  return dev.is_cpu() ? h : h.to(dev, s);
}

// One rank's micro-batch on the device: the UNet's inputs, and the regression target and loss
// weight of every sample.
struct DiffusionBatch {
  models::UNetInputs in;
  Tensor target, weights;  // f32 [B, n], [B]
};

class DiffusionTask final : public TrainingTask {
 public:
  DiffusionTask(const TrainConfig& common, const DiffusionConfig& diffusion, const TrainingPlace& at)
      : cfg_(common), diffusion_(diffusion), at_(at), noise_(diffusion) {
    // Model config and data first: a bad config or file is reported before any model memory exists.
    std::string source;
    hub_ = cfg_.hub_config_json(source);
    mcfg_ = models::UNetConfig::from_hub_json(hub_, source);
    ZP_REQUIRE(mcfg_.out_channels == mcfg_.in_channels, source, ": key 'out_channels' = ", mcfg_.out_channels,
               " must equal in_channels = ", mcfg_.in_channels, " to predict noise (or v) of the latents");
    const io::LatentRequirements need = requirements(mcfg_, source);
    train_ds_.emplace(cfg_.train_files[0], 0.0, cfg_.val_files.empty() ? 1.0 - cfg_.val_fraction : 1.0);
    train_ds_->require(need);
    if (!cfg_.val_files.empty())
      val_ds_.emplace(cfg_.val_files[0]);
    else if (cfg_.val_fraction > 0)
      val_ds_.emplace(cfg_.train_files[0], 1.0 - cfg_.val_fraction, 1.0);
    if (val_ds_) {
      val_ds_->require(need);
      ZP_REQUIRE(val_ds_->height() == train_ds_->height() && val_ds_->width() == train_ds_->width() &&
                     val_ds_->text_len() == train_ds_->text_len(),
                 val_ds_->path(), ": validation samples are ", val_ds_->height(), "x", val_ds_->width(), " with ",
                 val_ds_->text_len(), " text tokens, training samples ", train_ds_->height(), "x",
                 train_ds_->width(), " with ", train_ds_->text_len());
    }
    B_ = cfg_.micro_batch;
    C_ = train_ds_->channels();
    H_ = train_ds_->height();
    W_ = train_ds_->width();
    L_ = train_ds_->text_len();
    D_ = train_ds_->text_dim();
    E_ = need.text_embeds_dim;
    n_ = C_ * H_ * W_;
    // Host buffers of one micro-batch, reused.
    x0_.resize(size_t(B_ * n_));
    eps_.resize(size_t(n_));
    xt_.resize(size_t(B_ * n_));
    target_.resize(size_t(B_ * n_));
    context_.resize(size_t(B_ * L_ * D_));
    text_embeds_.resize(size_t(B_ * E_));
    time_ids_.resize(size_t(E_ > 0 ? B_ * models::kTimeIdsPerSample : 0));
    weights_.resize(size_t(B_));
  }

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad_multiple) override {
    lora_ = {cfg_.lora_r, cfg_.lora_alpha, cfg_.lora_dropout, cfg_.lora_targets, cfg_.lora_rslora};
    model_.emplace(mcfg_, at_.dev, cfg_.dtype, at_.s(), pad_multiple, /*allocate=*/false, lora_);
    if (cfg_.init == "hub") {
      hub_weights_ = io::WeightSource::open(cfg_.hub_dir, "diffusion_pytorch_model");
      model_->check_weights(*hub_weights_);
    }
    if (!cfg_.lora_init_from.empty()) initial_adapter_.emplace(cfg_.lora_init_from, lora_, model_->blocks());
    return model_->blocks();
  }
  // LoRA's adapters start from lora.init_from's values, else from PEFT's initialisation, whatever
  // the base came from; the base's fingerprint is taken as its blocks are filled.
  void fill_block(nn::ParamBlock& b) override {
    const bool adapters = lora_.r > 0 && !b.frozen();
    if (adapters && initial_adapter_)
      initial_adapter_->fill(b, at_.s());
    else if (hub_weights_ && !adapters)
      model_->load_block(*hub_weights_, b);
    else
      models::init_unet_block_random(b, cfg_.seed, cfg_.init_std, at_.s());
    if (lora_.r > 0 && b.frozen()) fingerprint_.add(b, at_.s());
  }
  void set_block_access(nn::BlockAccess* access) override { model_->set_block_access(access); }

  CheckpointModel checkpoint_model() const override {
    CheckpointModel m;
    m.config_json = cfg_.config_json;
    m.model_config = hub_;
    m.model_family = "unet";
    set_lora_identity(m, lora_, cfg_, hub_weights_ != nullptr, fingerprint_.hex());
    return m;
  }
  ProgressUnit progress() override { return {"samples", 1, models::unet_train_flops_per_sample(*model_, H_, W_, L_)}; }
  double activation_bytes() override {
    return models::unet_activation_bytes(*model_, B_, H_, W_, L_, cfg_.dtype, cfg_.activation_checkpointing);
  }
  std::string describe() override {
    std::string widths;
    for (int64_t w : mcfg_.block_out) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
    char gamma[64] = "";
    if (diffusion_.snr_gamma > 0) std::snprintf(gamma, sizeof(gamma), ", min-SNR gamma %g", diffusion_.snr_gamma);
    return detail::cat("model unet ", model_->num_parameters() / 1e6, "M parameters, block_out_channels [", widths,
                       "]", mcfg_.text_time ? ", text_time conditioning" : "", " | ", at_.world(), " rank(s) on ",
                       at_.dev.str(), " | ", dtype_name(cfg_.dtype), " | global batch ", at_.global_batch, " x ", C_,
                       "x", H_, "x", W_, " latents, ", L_, " text tokens (micro ", B_, ", accum ", cfg_.grad_accum,
                       ") | ", train_ds_->size(), " training samples | ", diffusion_.prediction_type, ", ",
                       noise_.num_timesteps(), " timesteps", gamma, lora_summary(lora_, model_->blocks()));
  }

  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    DiffusionBatch b = timed_read([&] { return make_batch(*train_ds_, step, first, true); });
    if (lora_.r > 0 && lora_.dropout > 0)  // keyed by (seed, step), rows apart per micro-batch
      b.in.dropout = {nn::splitmix64(cfg_.seed ^ nn::splitmix64(0x4C6F5241ull + uint64_t(step))) | 1,
                      first << 24};
    return forward_backward(b, true, loss_scale);
  }
  bool has_validation() const override { return val_ds_.has_value(); }
  // Draws keyed by step -1: the same noise every evaluation, so validation losses compare over training.
  double validation_loss(int64_t first) override {
    return forward_backward(make_batch(*val_ds_, -1, first, false), false, 1.f);
  }

 private:
  // The micro-batch at global positions [first, first + B) of `ds` (training: of the seeded epoch
  // order), with the draws keyed by `key_step`, on the device.
  DiffusionBatch make_batch(const io::LatentDataset& ds, int64_t key_step, int64_t first, bool train_step) {
    const int64_t B = B_, n = n_, L = L_, D = D_, E = E_, N = ds.size();
    DiffusionBatch b;
    b.in.timesteps.resize(size_t(B));
    for (int64_t i = 0; i < B; ++i) {
      const int64_t p = first + i;
      const int64_t w = train_step ? ds.epoch_order(cfg_.seed, p / N, p % N, cfg_.shuffle) : p % N;
      ds.read(w, &x0_[size_t(i * n)], &context_[size_t(i * L * D)], E > 0 ? &text_embeds_[size_t(i * E)] : nullptr,
              E > 0 ? &time_ids_[size_t(i * models::kTimeIdsPerSample)] : nullptr);
      const int64_t t = draw_timestep(cfg_.seed, key_step, p, noise_.num_timesteps());
      draw_noise(cfg_.seed, key_step, p, n, eps_.data());
      noise_.noisy_and_target(t, &x0_[size_t(i * n)], eps_.data(), n, &xt_[size_t(i * n)], &target_[size_t(i * n)]);
      b.in.timesteps[size_t(i)] = float(t);
      weights_[size_t(i)] = float(noise_.loss_weight(t));
    }
    const Device dev = at_.dev;
    const StreamHandle s = at_.s();
    b.in.sample = upload(xt_, {B, C_, H_, W_}, cfg_.dtype, dev, s);
    b.in.encoder_hidden_states = upload(context_, {B, L, D}, cfg_.dtype, dev, s);
    if (E > 0) {
      b.in.text_embeds = upload(text_embeds_, {B, E}, cfg_.dtype, dev, s);
      b.in.time_ids = time_ids_;
    }
    b.target = upload(target_, {B, n}, DType::F32, dev, s);
    b.weights = upload(weights_, {B}, DType::F32, dev, s);
    return b;
  }


  // The model's part of a micro-batch: forward, weighted MSE, and the backward when training.
  // Returns the mean weighted loss, read after the backward is queued.
  double forward_backward(const DiffusionBatch& b, bool train_step, float loss_scale) {
    const int64_t B = B_, n = n_;
    const Device dev = at_.dev;
    const StreamHandle s = at_.s();
    Tensor losses = Tensor::empty({B}, DType::F32, dev, "metrics", s);
    // Validation runs for the loss alone: an inference forward, which keeps nothing.
    auto acts = train_step ? models::UNetActivations::training(cfg_.activation_checkpointing)
                           : models::UNetActivations::inference();
    if (train_step) forward_begins(s);
    Tensor pred = model_->forward(b.in, acts);
    ZP_KERNEL_CALL(dev, mse_forward, s, cfg_.dtype, losses.data<float>(), pred.data(), b.target.data<float>(),
                   b.weights.data<float>(), B, n);
    if (train_step) forward_ends(s);
    if (train_step) {
      Tensor dpred = Tensor::empty(pred.shape(), cfg_.dtype, dev, "activations", s);
      ZP_KERNEL_CALL(dev, mse_backward, s, cfg_.dtype, dpred.data(), pred.data(), b.target.data<float>(),
                     b.weights.data<float>(), loss_scale, B, n);
      pred = Tensor();
      model_->backward(dpred, acts);
    }
    Tensor h = losses.to(Device::cpu(), s);
    double sum = 0;
    for (int64_t i = 0; i < B; ++i) sum += h.data<float>()[i];
    return sum / double(B);
  }

  const TrainConfig& cfg_;
  const DiffusionConfig& diffusion_;
  const TrainingPlace& at_;
  const NoiseSchedule noise_;
  io::json hub_;
  models::UNetConfig mcfg_;
  std::optional<io::LatentDataset> train_ds_, val_ds_;
  int64_t B_ = 0, C_ = 0, H_ = 0, W_ = 0, L_ = 0, D_ = 0, E_ = 0, n_ = 0;  // batch, latent and text sizes
  std::vector<float> x0_, eps_, xt_, target_, context_, text_embeds_, time_ids_, weights_;
  std::optional<models::UNet> model_;
  std::unique_ptr<io::WeightSource> hub_weights_;
  models::LoraSpec lora_;
  std::optional<models::LoraInitialAdapter> initial_adapter_;
  BaseFingerprint fingerprint_;  // LoRA: of the frozen blocks
};

}  // namespace

TrainResult train_unet(const UNetTrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  return run_training(cfg.common, rt, group, return_params,
                      [&](const TrainConfig& placed, const TrainingPlace& at) {
                        return std::make_unique<DiffusionTask>(placed, cfg.diffusion, at);
                      });
}

}  // namespace zp::runtime
