#include "runtime/diffusion_training.h"

#include <cstdio>
#include <map>
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
#include "parallel/pipeline_partition.h"
#include "runtime/base_fingerprint.h"
#include "runtime/diffusion_draws.h"
#include "runtime/lora_run.h"
#include "runtime/noise_schedule.h"
#include "runtime/pipeline_chunks.h"
#include "runtime/pipeline_step.h"
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

class DiffusionTask final : public TrainingTask, public PipelineStageModel {
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

    lora_ = lora_spec_of(cfg_);
    // The whole model laid out (no memory): the partition's costs and the progress line's FLOPs.
    models::UNet whole(mcfg_, at.dev, cfg_.dtype, at.s(), 1, /*allocate=*/false, lora_);
    flops_per_sample_ = models::unet_train_flops_per_sample(whole, H_, W_, L_);
    whole_parameters_ = whole.num_parameters();
    layout_ = unet_chunks(cfg_, whole, H_, W_, L_, at.stage(), at.stages());
  }

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad_multiple) override {
    std::vector<nn::ParamBlock*> blocks;
    for (const models::UNetSpan& span : layout_.local) {
      chunks_.push_back(std::make_unique<models::UNet>(mcfg_, at_.dev, cfg_.dtype, at_.s(), pad_multiple,
                                                       /*allocate=*/false, lora_, span));
      for (nn::ParamBlock* b : chunks_.back()->blocks()) blocks.push_back(b);
    }
    if (cfg_.init == "hub") {
      hub_weights_ = io::WeightSource::open(cfg_.hub_dir, "diffusion_pytorch_model");
      chunks_[0]->check_weights(*hub_weights_);  // against the whole model
    }
    if (!cfg_.lora_init_from.empty()) initial_adapter_.emplace(cfg_.lora_init_from, lora_, blocks);
    return blocks;
  }
  // LoRA's adapters start from lora.init_from's values, else from PEFT's initialisation, whatever
  // the base came from; the base's fingerprint is taken as its blocks are filled. Any chunk loads
  // any block, and the random initialisation depends on the parameters' names only: a block's values
  // do not depend on the cut.
  void fill_block(nn::ParamBlock& b) override {
    const bool adapters = lora_.r > 0 && !b.frozen();
    if (adapters && initial_adapter_)
      initial_adapter_->fill(b, at_.s());
    else if (hub_weights_ && !adapters)
      chunks_[0]->load_block(*hub_weights_, b);
    else
      models::init_unet_block_random(b, cfg_.seed, cfg_.init_std, at_.s());
    if (lora_.r > 0 && b.frozen()) fingerprint_.add(b, at_.s());
  }
  void set_block_access(nn::BlockAccess* access) override {
    for (auto& c : chunks_) c->set_block_access(access);
  }
  PipelineStageModel* pipeline_stage() override { return this; }
  bool has_shared_blocks() const override { return false; }
  SharedBlock shared_block() override { return {}; }
  // The stem, then each unit's block and its LoRA adapters, then the head: the whole model's order.
  int64_t model_position(const nn::ParamBlock& b) const override {
    const int64_t u = mcfg_.unit_of_block(b.name());
    return 2 * (u + 1) + (b.name().ends_with(".lora") ? 1 : 0);
  }

  // PipelineStageModel: one micro-batch through one local chunk. Every chunk reads the micro-batch
  // itself (the draws depend only on the seed, the step and the sample): the first for the noisy
  // latents and the timesteps, every chunk for the text embeddings, the last for the target.
  Tensor boundary_buffer(int chunk) override {
    const int64_t n = mcfg_.boundary_numel(layout_.bounds[size_t(chunk)], B_, H_, W_);
    return Tensor::empty({n}, cfg_.dtype, at_.dev, "activations", at_.s());
  }
  Tensor forward(int chunk, int micro, int64_t step, int64_t first, Tensor input, bool train, float loss_scale) override {
    const models::UNet& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_[{micro, chunk}];
    f.loss_scale = loss_scale;
    if (train) {
      f.batch = timed_read([&] { return make_batch(*train_ds_, step, first, true); });
      f.batch.in.dropout = lora_dropout(step, first);
    } else {
      f.batch = make_batch(*val_ds_, -1, first, false);
    }
    f.acts = train ? models::UNetActivations::training(cfg_.activation_checkpointing)
                   : models::UNetActivations::inference();
    Tensor out = m.forward(f.batch.in, f.acts, input);
    if (!m.has_head()) {
      if (!train) in_flight_.erase({micro, chunk});
      return out;
    }
    f.losses = weighted_mse(out, f.batch);
    if (train) f.pred = out;
    return Tensor();
  }
  Tensor backward(int chunk, int micro, Tensor output_grad) override {
    return chunk_backward(chunk, micro, std::move(output_grad), /*split=*/false);
  }
  // ZB-H1: B leaves the down, mid and up blocks' weight gradients in the micro-batch's state (the
  // stem's and the head's are computed in B: models::UNet::backward), W computes them.
  Tensor backward_input(int chunk, int micro, Tensor output_grad) override {
    return chunk_backward(chunk, micro, std::move(output_grad), /*split=*/true);
  }
  void backward_weight(int chunk, int micro) override {
    const models::UNet& m = *chunks_[size_t(chunk)];
    m.backward_weights(in_flight_.at({micro, chunk}).later);
    if (!m.has_head()) in_flight_.erase({micro, chunk});  // the last chunk's loss is read later
  }
  double loss(int micro) override {
    const std::pair<int, int> key{micro, int(chunks_.size()) - 1};
    const double mean = mean_loss(in_flight_.at(key).losses);
    in_flight_.erase(key);
    return mean;
  }

  CheckpointModel checkpoint_model() const override {
    CheckpointModel m;
    m.config_json = cfg_.config_json;
    m.model_config = hub_;
    m.model_family = "unet";
    set_lora_identity(m, lora_, cfg_, hub_weights_ != nullptr, lora_.r > 0 ? base_fingerprint() : "");
    return m;
  }
  ProgressUnit progress() override { return {"samples", 1, flops_per_sample_}; }
  double activation_bytes() override {
    std::vector<double> chunk_bytes;  // of this rank's chunks
    for (auto& c : chunks_)
      chunk_bytes.push_back(models::unet_activation_bytes(*c, B_, H_, W_, L_, cfg_.dtype, cfg_.activation_checkpointing));
    return stage_activation_bytes(cfg_, at_.stage(), at_.stages(), chunk_bytes);
  }
  std::string describe() override {
    std::string widths;
    for (int64_t w : mcfg_.block_out) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
    char gamma[64] = "";
    if (diffusion_.snr_gamma > 0) std::snprintf(gamma, sizeof(gamma), ", min-SNR gamma %g", diffusion_.snr_gamma);
    std::string stages;
    if (at_.stages() > 1)
      stages = detail::cat(" | ", at_.stages(), " pipeline stages (", cfg_.pipeline_schedule, ", ",
                           parallel::partition_str(layout_.bounds, "UNet block"), ") x ", at_.data_size(),
                           " data-parallel");
    return detail::cat("model unet ", double(whole_parameters_) / 1e6, "M parameters, block_out_channels [", widths,
                       "]", mcfg_.text_time ? ", text_time conditioning" : "", stages, " | ", at_.world(), " rank(s) on ",
                       at_.dev.str(), " | ", dtype_name(cfg_.dtype), " | global batch ", at_.global_batch, " x ", C_,
                       "x", H_, "x", W_, " latents, ", L_, " text tokens (micro ", B_, ", accum ", cfg_.grad_accum,
                       ") | ", train_ds_->size(), " training samples | ", diffusion_.prediction_type, ", ",
                       noise_.num_timesteps(), " timesteps", gamma, lora_summary(lora_, all_blocks()));
  }

  // Every sample is one item of the objective's mean, none of them padding: nothing to count.
  std::optional<int64_t> begin_step(int64_t, int64_t) override { return std::nullopt; }
  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    DiffusionBatch b = timed_read([&] { return make_batch(*train_ds_, step, first, true); });
    b.in.dropout = lora_dropout(step, first);
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


  nn::DropoutDraw lora_dropout(int64_t step, int64_t first) const {
    return lora_dropout_draw(lora_, cfg_.seed, step, first, B_);
  }

  // Every sample's weighted MSE of the prediction against the batch's target: f32 [B] on the device.
  Tensor weighted_mse(const Tensor& pred, const DiffusionBatch& b) const {
    Tensor losses = Tensor::empty({B_}, DType::F32, at_.dev, "metrics", at_.s());
    ZP_KERNEL_CALL(at_.dev, mse_forward, at_.s(), cfg_.dtype, losses.data<float>(), pred.data(),
                   b.target.data<float>(), b.weights.data<float>(), B_, n_);
    return losses;
  }
  // The mean loss's gradient with respect to the prediction, scaled by `loss_scale`.
  Tensor mse_gradient(const Tensor& pred, const DiffusionBatch& b, float loss_scale) const {
    Tensor dpred = Tensor::empty(pred.shape(), cfg_.dtype, at_.dev, "activations", at_.s());
    ZP_KERNEL_CALL(at_.dev, mse_backward, at_.s(), cfg_.dtype, dpred.data(), pred.data(), b.target.data<float>(),
                   b.weights.data<float>(), loss_scale, B_, n_);
    return dpred;
  }
  double mean_loss(const Tensor& losses) const {
    Tensor h = losses.to(Device::cpu(), at_.s());
    double sum = 0;
    for (int64_t i = 0; i < B_; ++i) sum += h.data<float>()[i];
    return sum / double(B_);
  }

  // The backward of (micro, chunk), whole or (split) its B pass; the last chunk's starts from the
  // objective's gradient.
  Tensor chunk_backward(int chunk, int micro, Tensor output_grad, bool split) {
    const models::UNet& m = *chunks_[size_t(chunk)];
    InFlight& f = in_flight_.at({micro, chunk});
    if (m.has_head()) {
      output_grad = mse_gradient(f.pred, f.batch, f.loss_scale);
      f.pred = Tensor();
    }
    Tensor din = m.backward(output_grad, f.acts, split ? &f.later : nullptr);
    if (!split && !m.has_head()) in_flight_.erase({micro, chunk});  // the last chunk's loss is read later
    return m.has_stem() ? Tensor() : din;
  }

  // The model's part of a micro-batch: forward, weighted MSE, and the backward when training.
  // Returns the mean weighted loss, read after the backward is queued.
  double forward_backward(const DiffusionBatch& b, bool train_step, float loss_scale) {
    const StreamHandle s = at_.s();
    const models::UNet& model = *chunks_[0];
    // Validation runs for the loss alone: an inference forward, which keeps nothing.
    auto acts = train_step ? models::UNetActivations::training(cfg_.activation_checkpointing)
                           : models::UNetActivations::inference();
    if (train_step) forward_begins(s);
    Tensor pred = model.forward(b.in, acts);
    Tensor losses = weighted_mse(pred, b);
    if (train_step) forward_ends(s);
    if (train_step) {
      Tensor dpred = mse_gradient(pred, b, loss_scale);
      pred = Tensor();
      model.backward(dpred, acts);
    }
    return mean_loss(losses);
  }

  // The fingerprint of the whole base: every stage's part (each fingerprints the blocks it filled).
  // Collective over the pipeline group on the first call, which every rank makes at the same point
  // (the driver's first checkpoint_model(), after the engine filled every block).
  std::string base_fingerprint() const {
    if (!fingerprint_hex_)
      fingerprint_hex_ = at_.stages() > 1
                             ? fingerprint_.combined_over(at_.topology->mpi_comm(comm::Group::Pipeline)).hex()
                             : fingerprint_.hex();
    return *fingerprint_hex_;
  }

  std::vector<nn::ParamBlock*> all_blocks() const {
    std::vector<nn::ParamBlock*> b;
    for (const auto& c : chunks_)
      for (nn::ParamBlock* x : c->blocks()) b.push_back(x);
    return b;
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
  UNetChunks layout_;
  double flops_per_sample_ = 0;  // the whole model's training FLOPs per sample
  int64_t whole_parameters_ = 0;  // the whole model's, which every stage's start-up line reports
  std::vector<std::unique_ptr<models::UNet>> chunks_;  // one without a pipeline
  std::unique_ptr<io::WeightSource> hub_weights_;
  models::LoraSpec lora_;
  std::optional<models::LoraInitialAdapter> initial_adapter_;
  BaseFingerprint fingerprint_;  // LoRA: of the frozen blocks this rank filled
  mutable std::optional<std::string> fingerprint_hex_;
  // A pipeline's micro-batches between their forward and backward, by (micro, local chunk).
  struct InFlight {
    DiffusionBatch batch;
    float loss_scale = 1.f;
    models::UNetActivations acts = models::UNetActivations::inference();
    Tensor pred, losses;  // the last chunk: the prediction (training) and every sample's loss
    models::UNetWeightGrads later;  // ZB-H1: from the micro-batch's B to its W
  };
  std::map<std::pair<int, int>, InFlight> in_flight_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_unet_task(const TrainConfig& cfg, const DiffusionConfig& diffusion,
                                             const TrainingPlace& at) {
  return std::make_unique<DiffusionTask>(cfg, diffusion, at);
}

TrainResult train_unet(const UNetTrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  return run_training(cfg.common, rt, group, return_params, [&](const TrainConfig& placed, const TrainingPlace& at) {
    return make_unet_task(placed, cfg.diffusion, at);
  });
}

}  // namespace zp::runtime
