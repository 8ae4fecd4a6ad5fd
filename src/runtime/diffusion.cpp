#include "runtime/diffusion.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "core/log.h"
#include "io/latent_dataset.h"
#include "io/weight_source.h"
#include "kernels/elementwise.h"
#include "kernels/mse.h"
#include "models/unet.h"
#include "nn/init.h"
#include "parallel/zero_engine.h"
#include "runtime/loop_checkpoints.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_step.h"
#include "runtime/step_loop.h"
#include "runtime/step_report.h"

namespace zp::runtime {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Config

const io::json& unet_schema_additions() {
  static const io::json j = io::json::parse(R"({
    "diffusion": {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                  "beta_schedule": "scaled_linear", "prediction_type": "epsilon", "snr_gamma": null}
  })");
  return j;
}

io::json train_schema_with_diffusion() {
  io::json schema = train_config_schema();
  for (const auto& [key, value] : unet_schema_additions().items()) schema[key] = value;
  return schema;
}

DiffusionConfig DiffusionConfig::from(const io::Config& c) {
  io::ConfigReader r(c);
  DiffusionConfig d = read(r);
  r.throw_if_any();
  return d;
}

DiffusionConfig DiffusionConfig::read(io::ConfigReader& r) {
  using io::Range;
  DiffusionConfig d;
  if (!r.config().root().contains("diffusion")) return d;
  // The schedule holds two doubles per timestep; diffusers' models use 1000.
  d.num_train_timesteps = r.integer("diffusion.num_train_timesteps", 1, 1000000);
  d.beta_start = r.number("diffusion.beta_start", Range{0, 1, true, true});
  d.beta_end = r.number("diffusion.beta_end", Range::half_open(d.beta_start, 1));
  d.beta_schedule = r.one_of("diffusion.beta_schedule", {"scaled_linear", "linear"});
  d.prediction_type = r.one_of("diffusion.prediction_type", {"epsilon", "v_prediction"});
  d.snr_gamma = r.number_or_null("diffusion.snr_gamma", Range::above(0)).value_or(0.0);
  return d;
}

UNetTrainConfig UNetTrainConfig::from(const io::Config& c) {
  // The shared keys are read by the LM trainer's reader, so both loops give them one meaning and one
  // set of checks; every problem of both readers is reported in one error.
  io::ConfigReader r(c);
  UNetTrainConfig u;
  u.common = TrainConfig::read(r, "unet");
  u.diffusion = DiffusionConfig::read(r);
  // An empty list is TrainConfig::read's problem already.
  r.require(u.common.train_files.size() <= 1,
            "data.train_files must hold exactly one latent file (HDF5), got " + std::to_string(u.common.train_files.size()));
  r.require(u.common.val_files.size() <= 1,
            "data.val_files holds at most one latent file (HDF5), got " + std::to_string(u.common.val_files.size()));
  r.throw_if_any();
  return u;
}

// ---------------------------------------------------------------------------------------------
// Noise schedule and draws

NoiseSchedule::NoiseSchedule(const DiffusionConfig& c)
    : v_prediction_(c.prediction_type == "v_prediction"), snr_gamma_(c.snr_gamma) {
  const int64_t T = c.num_train_timesteps;
  ZP_REQUIRE(T >= 1, "diffusion.num_train_timesteps must be >= 1");
  betas_.resize(size_t(T));
  acp_.resize(size_t(T));
  double prod = 1.0;
  for (int64_t t = 0; t < T; ++t) {
    const double f = T == 1 ? 0.0 : double(t) / double(T - 1);  // torch.linspace's points
    double b;
    if (c.beta_schedule == "scaled_linear") {
      const double s = std::sqrt(c.beta_start) + f * (std::sqrt(c.beta_end) - std::sqrt(c.beta_start));
      b = s * s;
    } else {
      b = c.beta_start + f * (c.beta_end - c.beta_start);
    }
    betas_[size_t(t)] = b;
    prod *= 1.0 - b;
    acp_[size_t(t)] = prod;
  }
}

double NoiseSchedule::loss_weight(int64_t t) const {
  if (snr_gamma_ <= 0) return 1.0;
  const double s = snr(t), clipped = std::min(s, snr_gamma_);
  return v_prediction_ ? clipped / (s + 1.0) : clipped / s;
}

void NoiseSchedule::noisy_and_target(int64_t t, const float* x0, const float* eps, int64_t n, float* xt,
                                     float* target) const {
  const double a = std::sqrt(alphas_cumprod(t)), b = std::sqrt(1.0 - alphas_cumprod(t));
  for (int64_t i = 0; i < n; ++i) {
    xt[i] = float(a * double(x0[i]) + b * double(eps[i]));
    target[i] = v_prediction_ ? float(a * double(eps[i]) - b * double(x0[i])) : eps[i];
  }
}

int64_t draw_timestep(uint64_t seed, int64_t step, int64_t index, int64_t num_timesteps) {
  ZP_CHECK(num_timesteps >= 1, "draw_timestep over ", num_timesteps, " timesteps");
  const uint64_t key = nn::splitmix64(nn::splitmix64(seed ^ 0x74696D6573746570ull) + uint64_t(step));  // "timestep"
  const uint64_t r = nn::splitmix64(key + uint64_t(index));
  // The high half of r * T: uniform on [0, T) up to a bias of T / 2^64.
  return int64_t((unsigned __int128)r * uint64_t(num_timesteps) >> 64);
}

void draw_noise(uint64_t seed, int64_t step, int64_t index, int64_t n, float* out) {
  nn::counter_normal(seed, "diffusion.noise." + std::to_string(step), index * n, n, 1.0, out);
}

// ---------------------------------------------------------------------------------------------
// Initialisation and FLOPs

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
bool contains(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

}  // namespace

void init_unet_block_random(nn::ParamBlock& b, uint64_t seed, double std, StreamHandle s) {
  for (auto& p : b.params()) {
    if (p->shape.size() == 1)  // every 1-d weight is a norm's scale; the rest are biases
      nn::init_constant(*p, ends_with(p->name, ".weight") ? 1.f : 0.f, s);
    else
      nn::init_normal(*p, seed, std, s);
  }
}

void init_unet_random(models::UNet& m, uint64_t seed, double std) {
  for (nn::ParamBlock* b : m.blocks()) init_unet_block_random(*b, seed, std, m.ctx().s);
}

double unet_train_flops_per_sample(models::UNet& m, int64_t H, int64_t W, int64_t L) {
  const int64_t n = m.config().num_blocks();
  // Positions at resolution level k (the input halved k times).
  auto at = [&](int64_t k) { return double((H >> k) * (W >> k)); };
  auto block_index = [](const std::string& name, size_t prefix) { return std::stoll(name.substr(prefix)); };
  double forward = 0;
  for (nn::Parameter* p : m.parameters()) {
    if (p->shape.size() < 2) continue;  // norms and biases
    const std::string& name = p->name;
    double positions = 0;
    if (starts_with(name, "time_embedding.") || starts_with(name, "add_embedding.") ||
        contains(name, ".time_emb_proj.")) {
      positions = 1;  // once per sample
    } else if (starts_with(name, "conv_in.") || starts_with(name, "conv_out.")) {
      positions = at(0);
    } else if (starts_with(name, "mid_block.")) {
      positions = at(n - 1);
    } else if (starts_with(name, "down_blocks.")) {
      const int64_t i = block_index(name, 12);
      positions = contains(name, ".downsamplers.") ? at(i + 1) : at(i);
    } else if (starts_with(name, "up_blocks.")) {
      const int64_t i = block_index(name, 10);
      positions = contains(name, ".upsamplers.") ? at(n - 2 - i) : at(n - 1 - i);
    } else {
      ZP_FATAL("unet_train_flops_per_sample: unexpected parameter ", name);
    }
    const double pixels = positions;
    if (contains(name, ".attn2.to_k.") || contains(name, ".attn2.to_v.")) positions = double(L);  // text tokens
    forward += 2.0 * double(p->numel()) * positions;
    // Scores (T x Tk x I) and weighted values (the same again), all heads together.
    if (ends_with(name, ".attn1.to_q.weight")) forward += 4.0 * pixels * pixels * double(p->shape[0]);
    if (ends_with(name, ".attn2.to_q.weight")) forward += 4.0 * pixels * double(L) * double(p->shape[0]);
  }
  return 3.0 * forward;
}

// ---------------------------------------------------------------------------------------------
// The training loop

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

}  // namespace

TrainResult train_unet(const UNetTrainConfig& ucfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  const TrainConfig& cfg = ucfg.common;
  const LoopPlace at = place_loop(cfg, rt, group);
  const auto [world, rank, dev, global_batch] = at;

  // Model config and data first: a bad config or file is reported before any model memory exists.
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  const auto mcfg = models::UNetConfig::from_hub_json(hub, source);
  ZP_REQUIRE(mcfg.out_channels == mcfg.in_channels, source, ": key 'out_channels' = ", mcfg.out_channels,
             " must equal in_channels = ", mcfg.in_channels, " to predict noise (or v) of the latents");
  const io::LatentRequirements need = requirements(mcfg, source);
  io::LatentDataset train_ds(cfg.train_files[0], 0.0, cfg.val_files.empty() ? 1.0 - cfg.val_fraction : 1.0);
  train_ds.require(need);
  std::unique_ptr<io::LatentDataset> val_ds;
  if (!cfg.val_files.empty())
    val_ds = std::make_unique<io::LatentDataset>(cfg.val_files[0]);
  else if (cfg.val_fraction > 0)
    val_ds = std::make_unique<io::LatentDataset>(cfg.train_files[0], 1.0 - cfg.val_fraction, 1.0);
  if (val_ds) {
    val_ds->require(need);
    ZP_REQUIRE(val_ds->height() == train_ds.height() && val_ds->width() == train_ds.width() &&
                   val_ds->text_len() == train_ds.text_len(),
               val_ds->path(), ": validation samples are ", val_ds->height(), "x", val_ds->width(), " with ",
               val_ds->text_len(), " text tokens, training samples ", train_ds.height(), "x", train_ds.width(),
               " with ", train_ds.text_len());
  }
  const int64_t B = cfg.micro_batch, C = train_ds.channels(), H = train_ds.height(), W = train_ds.width(),
                L = train_ds.text_len(), D = train_ds.text_dim(), E = need.text_embeds_dim;
  const int64_t n = C * H * W;

  const auto [dp, ctrl] = make_loop_comms(at, group);

  std::unique_ptr<Stream> stream = dev.is_cuda() ? std::make_unique<Stream>(dev) : nullptr;
  const StreamHandle s = stream ? stream->handle() : nullptr;
  // Laid out only: the engine allocates, fills and shards one block at a time (start-up memory).
  models::UNet model(mcfg, dev, cfg.dtype, s, parallel::shard_pad_multiple(world), /*allocate=*/false);
  std::unique_ptr<io::WeightSource> hub_weights;
  if (cfg.init == "hub") {
    hub_weights = io::WeightSource::open(cfg.hub_dir, "diffusion_pytorch_model");
    model.check_weights(*hub_weights);
  }
  parallel::ZeroEngine engine(model.blocks(), sharding_policy(cfg), dp.get(),
                              adamw_hyper(cfg), s,
                              [&](nn::ParamBlock& b) {
                                if (hub_weights)
                                  model.load_block(*hub_weights, b);
                                else
                                  init_unet_block_random(b, cfg.seed, cfg.init_std, s);
                              });
  model.set_block_access(&engine);
  engine.set_overlap_comm(cfg.overlap_comm);
  LrSchedule sched{cfg.scheduler, cfg.lr, cfg.min_lr_ratio, cfg.warmup_steps, cfg.total_steps};
  LossScaler scaler(cfg.fp16, cfg.initial_scale, cfg.min_scale, cfg.scale_window, cfg.hysteresis);
  const NoiseSchedule noise(ucfg.diffusion);
  const int64_t T_train = noise.num_timesteps();
  TrainResult result;
  LoopCheckpoints checkpoints(cfg, group, engine, {cfg.config_json, hub, "unet"}, global_batch, s);
  checkpoints.resume(scaler, result);

  ZP_LOG_INFO(engine.memory_plan().str(cfg.zero_stage, world));
  const double flops_sample = unet_train_flops_per_sample(model, H, W, L);
  // A resumed run continues its metrics file.
  StepReporter reporter(cfg.metrics_file, rank, world, dev, "samples", global_batch, flops_sample, cfg.max_steps,
                        cfg.print_every, !result.resumed_from.empty());
  std::string widths;
  for (int64_t w : mcfg.block_out) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
  char gamma[64] = "";
  if (ucfg.diffusion.snr_gamma > 0) std::snprintf(gamma, sizeof(gamma), ", min-SNR gamma %g", ucfg.diffusion.snr_gamma);
  ZP_LOG_INFO("model unet ", model.num_parameters() / 1e6, "M parameters, block_out_channels [", widths, "]",
              mcfg.text_time ? ", text_time conditioning" : "", " | ", world, " rank(s) on ", dev.str(),
              " | ", dtype_name(cfg.dtype), " | global batch ", global_batch, " x ", C, "x", H, "x", W,
              " latents, ", L, " text tokens (micro ", B, ", accum ", cfg.grad_accum, ") | ", train_ds.size(),
              " training samples | ", ucfg.diffusion.prediction_type, ", ", T_train, " timesteps", gamma);


  // Host buffers of one micro-batch, reused.
  std::vector<float> x0(static_cast<size_t>(B * n)), eps(static_cast<size_t>(n)), xt(static_cast<size_t>(B * n)),
      target(static_cast<size_t>(B * n)), context(static_cast<size_t>(B * L * D)),
      text_embeds(static_cast<size_t>(B * E)),
      time_ids(static_cast<size_t>(E > 0 ? B * models::kTimeIdsPerSample : 0)),
      weights(static_cast<size_t>(B));
  // One micro-batch at global positions [first, first + B) of `ds`; `key_step` keys the draws (-1
  // for validation). Returns the mean weighted loss (read after the backward is queued).
  auto run_micro = [&](const io::LatentDataset& ds, int64_t key_step, int64_t first, bool train_step,
                       float loss_scale) {
    const int64_t N = ds.size();
    models::UNetInputs in;
    in.timesteps.resize(size_t(B));
    for (int64_t i = 0; i < B; ++i) {
      const int64_t p = first + i;
      const int64_t w = train_step ? ds.epoch_order(cfg.seed, p / N, p % N, cfg.shuffle) : p % N;
      ds.read(w, &x0[size_t(i * n)], &context[size_t(i * L * D)], E > 0 ? &text_embeds[size_t(i * E)] : nullptr,
              E > 0 ? &time_ids[size_t(i * models::kTimeIdsPerSample)] : nullptr);
      const int64_t t = draw_timestep(cfg.seed, key_step, p, T_train);
      draw_noise(cfg.seed, key_step, p, n, eps.data());
      noise.noisy_and_target(t, &x0[size_t(i * n)], eps.data(), n, &xt[size_t(i * n)], &target[size_t(i * n)]);
      in.timesteps[size_t(i)] = float(t);
      weights[size_t(i)] = float(noise.loss_weight(t));
    }
    in.sample = upload(xt, {B, C, H, W}, cfg.dtype, dev, s);
    in.encoder_hidden_states = upload(context, {B, L, D}, cfg.dtype, dev, s);
    if (E > 0) {
      in.text_embeds = upload(text_embeds, {B, E}, cfg.dtype, dev, s);
      in.time_ids = time_ids;
    }
    Tensor tgt = upload(target, {B, n}, DType::F32, dev, s), wts = upload(weights, {B}, DType::F32, dev, s);
    Tensor losses = Tensor::empty({B}, DType::F32, dev, "metrics", s);
    // Validation runs for the loss alone: an inference forward, which keeps nothing.
    auto acts = train_step ? models::UNetActivations::training(cfg.activation_checkpointing)
                           : models::UNetActivations::inference();
    Tensor pred = model.forward(in, acts);
    ZP_KERNEL_CALL(dev, mse_forward, s, cfg.dtype, losses.data<float>(), pred.data(), tgt.data<float>(),
                   wts.data<float>(), B, n);
    if (train_step) {
      Tensor dpred = Tensor::empty(pred.shape(), cfg.dtype, dev, "activations", s);
      ZP_KERNEL_CALL(dev, mse_backward, s, cfg.dtype, dpred.data(), pred.data(), tgt.data<float>(), wts.data<float>(),
                     loss_scale, B, n);
      pred = Tensor();
      model.backward(dpred, acts);
    }
    Tensor h = losses.to(Device::cpu(), s);
    double sum = 0;
    for (int64_t i = 0; i < B; ++i) sum += h.data<float>()[i];
    return sum / double(B);
  };

  std::function<double(int64_t)> validate;
  if (val_ds) validate = [&](int64_t first) { return run_micro(*val_ds, -1, first, false, 1.f); };
  run_steps({cfg, engine, scaler, sched, checkpoints, reporter, ctrl.get(), rank, world, s},
            [&](int64_t step, int64_t first, float scale) { return run_micro(train_ds, step, first, true, scale); },
            validate, result);
  if (return_params) result.final_params = engine.gather_master();
  return result;
}

}  // namespace zp::runtime
