#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "comm/mpi_comm.h"
#include "comm/topology.h"
#include "core/log.h"
#include "io/checkpoint_file.h"
#include "io/safetensors.h"
#include "io/token_dataset.h"
#include "kernels/reduce.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/checkpoint.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_step.h"
#include "runtime/step_report.h"

namespace zp::runtime {
namespace fs = std::filesystem;

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

// LossScaler keeps its growth and hysteresis counters to itself, but both follow from the current
// run of equal outcomes (the scale only changes at the end of one): after k clean steps in a row the
// growth counter is k mod window and the hysteresis budget is full; after j overflows in a row the
// growth counter is 0 and the budget is hysteresis - j mod hysteresis. A checkpoint records those,
// and replaying that many outcomes on a scaler built at the saved scale restores it exactly (neither
// replay reaches a change of scale).
struct ScalerRuns {
  int64_t clean = 0, overflows = 0;
  void record(bool overflow) {
    if (overflow) {
      ++overflows;
      clean = 0;
    } else {
      ++clean;
      overflows = 0;
    }
  }
};

LossScalerState scaler_state(const TrainConfig& cfg, const LossScaler& sc, const ScalerRuns& runs, int64_t skipped) {
  LossScalerState st;
  st.enabled = sc.enabled();
  st.scale = sc.scale();
  st.skipped = skipped;
  st.clean_steps = sc.enabled() && cfg.scale_window > 1 ? runs.clean % cfg.scale_window : 0;
  st.overflows_left =
      sc.enabled() && cfg.hysteresis > 0 ? cfg.hysteresis - runs.overflows % cfg.hysteresis : cfg.hysteresis;
  return st;
}

// Rebuilds `sc` and `runs` from a checkpoint; returns how many skips the replay added to sc.skipped().
int64_t restore_scaler(const TrainConfig& cfg, const LossScalerState& st, LossScaler& sc, ScalerRuns& runs) {
  runs = ScalerRuns();
  if (!cfg.fp16) return 0;
  if (!st.enabled) {
    ZP_LOG_INFO("the checkpoint was not trained with fp16 loss scaling: starting the scale at ", cfg.initial_scale);
    return 0;
  }
  sc = LossScaler(true, st.scale, cfg.min_scale, cfg.scale_window, cfg.hysteresis);
  int64_t replayed = 0;
  if (st.overflows_left < cfg.hysteresis) {
    for (int64_t j = 0; j < cfg.hysteresis - st.overflows_left; ++j, ++replayed) {
      sc.update(true);
      runs.record(true);
    }
  } else {
    for (int64_t k = 0; k < st.clean_steps; ++k) {
      sc.update(false);
      runs.record(false);
    }
  }
  return replayed;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, comm::Runtime& rt, MPI_Comm group, bool return_params) {
  if (group == MPI_COMM_NULL) group = rt.world();
  int world = 1, rank = 0;
  ZP_MPI_CHECK(MPI_Comm_size(group, &world));
  ZP_MPI_CHECK(MPI_Comm_rank(group, &rank));
  Device dev = rt.device();
  if (cfg.device == "cpu") dev = Device::cpu();
  if (cfg.device == "cuda") ZP_REQUIRE(dev.is_cuda(), "training.device = \"cuda\": ", cuda_unavailable_reason());
  const int64_t global_batch = cfg.micro_batch * cfg.grad_accum * world;
  ZP_REQUIRE(cfg.train_batch_size == 0 || cfg.train_batch_size == global_batch, "train_batch_size ",
             cfg.train_batch_size, " != train_micro_batch_size_per_gpu ", cfg.micro_batch,
             " x gradient_accumulation_steps ", cfg.grad_accum, " x world size ", world);

  // Data first: a missing or bad file is reported before any model memory is allocated.
  io::TokenDataset train_ds(cfg.train_files, cfg.seq_len, 0.0, 1.0 - cfg.val_fraction);
  std::unique_ptr<io::TokenDataset> val_ds;
  if (!cfg.val_files.empty())
    val_ds = std::make_unique<io::TokenDataset>(cfg.val_files, cfg.seq_len);
  else if (cfg.val_fraction > 0)
    val_ds = std::make_unique<io::TokenDataset>(cfg.train_files, cfg.seq_len, 1.0 - cfg.val_fraction, 1.0);
  // Communicators: tensors on the device's backend, host scalars (losses) over MPI.
  std::unique_ptr<comm::Communicator> dp;
  std::unique_ptr<comm::MpiComm> ctrl;
  if (world > 1) {
    dp = comm::make_communicator(dev.is_cuda() ? comm::Backend::Nccl : comm::Backend::Mpi, group);
    ctrl = std::make_unique<comm::MpiComm>(group);
  }

  // Model.
  std::string source;
  const io::json hub = cfg.hub_config_json(source);
  auto mcfg = models::TransformerConfig::from_hub_json(hub, source);
  ZP_REQUIRE(cfg.seq_len <= mcfg.max_positions || !mcfg.learned_positions, "data.seq_len ", cfg.seq_len,
             " exceeds the model's ", mcfg.max_positions, " positions");
  const int32_t file_vocab = train_ds.max_token_seen_bound();
  ZP_REQUIRE(file_vocab == 0 || file_vocab <= mcfg.vocab, cfg.train_files[0], ": the token file's vocabulary (",
             file_vocab, ") is larger than the model's (", mcfg.vocab, ")");
  std::unique_ptr<Stream> stream = dev.is_cuda() ? std::make_unique<Stream>(dev) : nullptr;
  const StreamHandle s = stream ? stream->handle() : nullptr;
  // The model is only laid out; the ZeRO engine (optimizer state, gradient reduction, stage-3
  // gathering) allocates each block and has it initialised or loaded one at a time.
  models::Transformer model(mcfg, dev, cfg.dtype, s, parallel::shard_pad_multiple(world), /*allocate=*/false);
  std::optional<io::SafetensorsCollection> hub_weights;
  if (cfg.init == "hub") hub_weights = io::SafetensorsCollection::open_dir(cfg.hub_dir, "model");
  parallel::ZeroEngine engine(model.blocks(), cfg.zero_stage, dp.get(),
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
  ScalerRuns scaler_runs;
  int64_t skipped_before = 0;  // skips before this run, less those of the scaler's replay

  TrainResult result;
  int64_t start_step = 0, data_position = 0;  // where this run starts
  if (const std::string from = resolve_resume(cfg.resume, cfg.checkpoint_dir, group); !from.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const TrainState st = load_checkpoint(from, group, engine, hub, s);
    start_step = st.step;
    data_position = st.data_position;
    skipped_before = st.scaler.skipped - restore_scaler(cfg, st.scaler, scaler, scaler_runs);
    result.first_step = start_step;
    result.resumed_from = from;
    ZP_LOG_INFO("resumed from ", from, " in ",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s: step ", st.step,
                ", ", st.optimizer_steps, " optimizer steps, sample ", st.data_position, " (written by ", st.world_size,
                " rank(s) at ZeRO stage ", st.zero_stage, "; now ", world, " at stage ", cfg.zero_stage, ")");
    if (st.global_batch != global_batch)
      ZP_LOG_INFO("note: the checkpoint was trained with a global batch of ", st.global_batch, ", this run uses ",
                  global_batch, "; the data continues from sample ", st.data_position);
    if (st.seed != cfg.seed)
      ZP_LOG_INFO("note: the checkpoint was trained with seed ", st.seed, ", this run uses ", cfg.seed,
                  ": the data order changes");
  }
  auto save = [&](int64_t steps_done) {
    const auto t0 = std::chrono::steady_clock::now();
    TrainState st;
    st.step = steps_done;
    st.data_position = data_position + (steps_done - start_step) * global_batch;
    st.global_batch = global_batch;
    st.seed = cfg.seed;
    st.scaler = scaler_state(cfg, scaler, scaler_runs, skipped_before + scaler.skipped());
    const std::string path = (fs::path(cfg.checkpoint_dir) / io::checkpoint_filename(steps_done)).string();
    save_checkpoint(path, group, engine, {cfg.config_json, hub, "transformer"}, st, s);
    std::vector<std::string> deleted;
    if (cfg.keep_last > 0) deleted = io::keep_last_checkpoints(cfg.checkpoint_dir, "step-", int(cfg.keep_last), group);
    result.saved.push_back(path);
    ZP_LOG_INFO("saved ", path, " in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                " s", deleted.empty() ? "" : " (deleted " + std::to_string(deleted.size()) + " older)");
  };



  ZP_LOG_INFO(engine.memory_plan().str(cfg.zero_stage, world));
  // A resumed run continues its metrics file.
  StepReporter reporter(cfg.metrics_file, rank, world, dev, "tok", global_batch * cfg.seq_len,
                        model.flops_per_token(cfg.seq_len), cfg.max_steps, cfg.print_every, !result.resumed_from.empty());
  ZP_LOG_INFO("model ", mcfg.model_type, " ", mcfg.num_parameters() / 1e6, "M parameters, ", mcfg.layers,
              " layers, d=", mcfg.hidden, " | ", world, " rank(s) on ", dev.str(), " | ", dtype_name(cfg.dtype),
              " | global batch ", global_batch, " x ", cfg.seq_len, " tokens (micro ", cfg.micro_batch, ", accum ",
              cfg.grad_accum, ") | ", train_ds.num_windows(), " training windows");

  auto dp_mean = [&](double v) {
    if (!ctrl) return v;
    double out = 0;
    ctrl->all_reduce(&v, &out, 1, DType::F64, comm::ReduceOp::Avg);
    return out;
  };
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

  for (int64_t step = start_step; step < cfg.max_steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    engine.begin_step();
    const float loss_scale = float(scaler.scale());
    double loss = 0;
    for (int64_t m = 0; m < cfg.grad_accum; ++m) {
      begin_micro_step(engine, sched, m, cfg.grad_accum, loss_scale);
      const int64_t first = data_position + (step - start_step) * global_batch + m * cfg.micro_batch * world +
                            rank * cfg.micro_batch;
      loss += run_micro(train_ds, cfg.seed, cfg.shuffle, first, true, loss_scale / float(cfg.grad_accum)) /
              double(cfg.grad_accum);
    }
    const StepUpdate upd = finish_step(engine, scaler, sched, cfg.grad_clip, loss_scale);
    scaler_runs.record(upd.skipped);
    const double grad_norm = upd.grad_norm, lr = upd.lr;
    const bool skip = upd.skipped;
    if (s) stream_synchronize(s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss = dp_mean(loss);
    result.losses.push_back(loss);
    double val = NAN;
    if (val_ds && cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.max_steps)) {
      double sum = 0;
      for (int64_t e = 0; e < cfg.eval_batches; ++e)
        sum += run_micro(*val_ds, cfg.seed, false, (e * world + rank) * cfg.micro_batch, false, 1.f);
      val = dp_mean(sum / double(cfg.eval_batches));
      result.val_losses.push_back(val);
    }
    reporter.report(step + 1, loss, lr, grad_norm, secs, skip, loss_scale, val);
    if (cfg.save_every > 0 && ((step + 1) % cfg.save_every == 0 || step + 1 == cfg.max_steps)) save(step + 1);
  }
  result.skipped_steps = skipped_before + scaler.skipped();
  if (return_params) result.final_params = engine.gather_master();
  return result;
}

}  // namespace zp::runtime
