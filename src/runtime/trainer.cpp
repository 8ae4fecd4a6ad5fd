#include "runtime/trainer.h"

#include <cmath>
#include <functional>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "core/log.h"
#include "io/weight_source.h"
#include "io/token_dataset.h"
#include "kernels/reduce.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/loop_checkpoints.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_step.h"
#include "runtime/step_loop.h"
#include "runtime/step_report.h"

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

}  // namespace

TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  const LoopPlace at = place_loop(cfg, rt, group);
  const auto [world, rank, dev, global_batch] = at;

  // Data first: a missing or bad file is reported before any model memory is allocated.
  io::TokenDataset train_ds(cfg.train_files, cfg.seq_len, 0.0, 1.0 - cfg.val_fraction);
  std::unique_ptr<io::TokenDataset> val_ds;
  if (!cfg.val_files.empty())
    val_ds = std::make_unique<io::TokenDataset>(cfg.val_files, cfg.seq_len);
  else if (cfg.val_fraction > 0)
    val_ds = std::make_unique<io::TokenDataset>(cfg.train_files, cfg.seq_len, 1.0 - cfg.val_fraction, 1.0);
  const auto [dp, ctrl] = make_loop_comms(at, group);

  // Model.
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  auto mcfg = models::TransformerConfig::from_hub_json(hub, source);
  ZP_REQUIRE(cfg.seq_len <= mcfg.max_positions || !mcfg.learned_positions, "data.seq_len ", cfg.seq_len,
             " exceeds the model's ", mcfg.max_positions, " positions");
  const int32_t file_vocab = train_ds.max_token_seen_bound();
  ZP_REQUIRE(file_vocab == 0 || file_vocab <= mcfg.vocab, cfg.train_files[0], ": the token file's vocabulary (",
             file_vocab, ") is larger than the model's (", mcfg.vocab, ")");
  // Every id, once, now: an id past the embedding would otherwise stop the run when its window is
  // first drawn, possibly hours in.
  train_ds.check_vocab(mcfg.vocab);
  if (!cfg.val_files.empty()) val_ds->check_vocab(mcfg.vocab);
  std::unique_ptr<Stream> stream = dev.is_cuda() ? std::make_unique<Stream>(dev) : nullptr;
  const StreamHandle s = stream ? stream->handle() : nullptr;
  // The model is only laid out; the ZeRO engine (optimizer state, gradient reduction, stage-3
  // gathering) allocates each block and has it initialised or loaded one at a time.
  models::Transformer model(mcfg, dev, cfg.dtype, s, parallel::shard_pad_multiple(world), /*allocate=*/false);
  std::unique_ptr<io::WeightSource> hub_weights;
  if (cfg.init == "hub") hub_weights = io::WeightSource::open(cfg.hub_dir, "model");
  parallel::ZeroEngine engine(model.blocks(), sharding_policy(cfg), dp.get(),
                              adamw_hyper(cfg), s,
                              [&](nn::ParamBlock& b) {
                                if (hub_weights)
                                  model.load_block(*hub_weights, b);
                                else
                                  model.init_block_random(b, cfg.seed, cfg.init_std);
                              });
  model.set_block_access(&engine);
  engine.set_overlap_comm(cfg.overlap_comm);
  LrSchedule sched{cfg.scheduler, cfg.lr, cfg.min_lr_ratio, cfg.warmup_steps, cfg.total_steps};
  LossScaler scaler(cfg.fp16, cfg.initial_scale, cfg.min_scale, cfg.scale_window, cfg.hysteresis);
  TrainResult result;
  LoopCheckpoints checkpoints(cfg, group, engine, {cfg.config_json, hub, "transformer"}, global_batch, s);
  checkpoints.resume(scaler, result);

  ZP_LOG_INFO(engine.memory_plan().str(cfg.zero_stage, world));
  // A resumed run continues its metrics file.
  StepReporter reporter(cfg.metrics_file, rank, world, dev, "tok", global_batch * cfg.seq_len,
                        model.flops_per_token(cfg.seq_len), cfg.max_steps, cfg.print_every, !result.resumed_from.empty());
  ZP_LOG_INFO("model ", mcfg.model_type, " ", mcfg.num_parameters() / 1e6, "M parameters, ", mcfg.layers,
              " layers, d=", mcfg.hidden, " | ", world, " rank(s) on ", dev.str(), " | ", dtype_name(cfg.dtype),
              " | global batch ", global_batch, " x ", cfg.seq_len, " tokens (micro ", cfg.micro_batch, ", accum ",
              cfg.grad_accum, ") | ", train_ds.num_windows(), " training windows");

  auto run_micro = [&](const io::TokenDataset& ds, uint64_t seed, bool shuffle, int64_t first, bool train_step,
                       float loss_scale) {
    Batch b = make_batch(ds, seed, shuffle, first, cfg.micro_batch);
    Tensor ids = b.ids.to(dev, s), tgt = b.targets.to(dev, s);
    int64_t valid = 0;
    for (int64_t i = 0; i < b.targets.numel(); ++i) valid += b.targets.data<int32_t>()[i] >= 0;
    model.forward(ids.data<int32_t>(), tgt.data<int32_t>(), valid, cfg.micro_batch, cfg.seq_len,
                  train_step && cfg.activation_checkpointing);
    if (train_step) model.backward(loss_scale);
    return model.loss();  // read after the backward is queued, so the GPU never waits for the host
  };

  std::function<double(int64_t)> validate;
  if (val_ds) validate = [&](int64_t first) { return run_micro(*val_ds, cfg.seed, false, first, false, 1.f); };
  run_steps({cfg, engine, scaler, sched, checkpoints, reporter, ctrl.get(), rank, world, s},
            [&](int64_t, int64_t first, float scale) {
              return run_micro(train_ds, cfg.seed, cfg.shuffle, first, true, scale);
            },
            validate, result);
  if (return_params) result.final_params = engine.gather_master();
  return result;
}

}  // namespace zp::runtime
