#include "runtime/loop_checkpoints.h"

#include <chrono>
#include <filesystem>

#include "core/log.h"
#include "io/checkpoint_file.h"

namespace zp::runtime {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LoopCheckpoints::LoopCheckpoints(const TrainConfig& cfg, MPI_Comm group, parallel::ZeroEngine& engine,
                                 CheckpointModel model, int64_t global_batch, StreamHandle s)
    : cfg_(cfg), group_(group), engine_(engine), model_(std::move(model)), global_batch_(global_batch), s_(s) {}

// After k clean steps in a row the scaler's growth counter is k mod window and its hysteresis budget
// is full; after j overflows in a row the growth counter is 0 and the budget is hysteresis - j mod
// hysteresis. A checkpoint records those, and replaying that many outcomes on a scaler built at the
// saved scale restores it exactly (neither replay reaches a change of scale).
void LoopCheckpoints::ScalerRuns::record(bool overflow) {
  if (overflow) {
    ++overflows;
    clean = 0;
  } else {
    ++clean;
    overflows = 0;
  }
}

LossScalerState LoopCheckpoints::scaler_state(const LossScaler& sc) const {
  LossScalerState st;
  st.enabled = sc.enabled();
  st.scale = sc.scale();
  st.skipped = skipped_steps(sc);
  st.clean_steps = sc.enabled() && cfg_.scale_window > 1 ? runs_.clean % cfg_.scale_window : 0;
  st.overflows_left =
      sc.enabled() && cfg_.hysteresis > 0 ? cfg_.hysteresis - runs_.overflows % cfg_.hysteresis : cfg_.hysteresis;
  return st;
}

void LoopCheckpoints::resume(LossScaler& scaler, TrainResult& result) {
  const std::string from = resolve_resume(cfg_.resume, cfg_.checkpoint_dir, group_);
  if (from.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const TrainState st = load_checkpoint(from, group_, engine_, model_, s_);
  start_step_ = st.step;
  data_position_ = st.data_position;
  result.first_step = start_step_;
  result.resumed_from = from;

  // The loss scaler: rebuilt at the saved scale, then the current run of outcomes replayed.
  runs_ = ScalerRuns();
  int64_t replayed = 0;  // skips the replay adds to scaler.skipped()
  if (cfg_.fp16 && !st.scaler.enabled) {
    ZP_LOG_INFO("the checkpoint was not trained with fp16 loss scaling: starting the scale at ", cfg_.initial_scale);
  } else if (cfg_.fp16) {
    scaler = LossScaler(true, st.scaler.scale, cfg_.min_scale, cfg_.scale_window, cfg_.hysteresis);
    if (st.scaler.overflows_left < cfg_.hysteresis) {
      for (int64_t j = 0; j < cfg_.hysteresis - st.scaler.overflows_left; ++j, ++replayed) {
        scaler.update(true);
        runs_.record(true);
      }
    } else {
      for (int64_t k = 0; k < st.scaler.clean_steps; ++k) {
        scaler.update(false);
        runs_.record(false);
      }
    }
  }
  skipped_before_ = st.scaler.skipped - replayed;

  ZP_LOG_INFO("resumed from ", from, " in ", seconds_since(t0), " s: step ", st.step, ", ", st.optimizer_steps,
              " optimizer steps, sample ", st.data_position, " (written by ", st.world_size, " rank(s) at ZeRO stage ",
              st.zero_stage, "; now ", engine_.world(), " at stage ", engine_.stage(), ")");
  if (st.global_batch != global_batch_)
    ZP_LOG_INFO("note: the checkpoint was trained with a global batch of ", st.global_batch, ", this run uses ",
                global_batch_, "; the data continues from sample ", st.data_position);
  if (st.seed != cfg_.seed)
    ZP_LOG_INFO("note: the checkpoint was trained with seed ", st.seed, ", this run uses ", cfg_.seed,
                ": the data order changes");
}

void LoopCheckpoints::step_done(int64_t steps_done, bool skipped, const LossScaler& scaler, TrainResult& result) {
  runs_.record(skipped);
  if (cfg_.save_every > 0 && (steps_done % cfg_.save_every == 0 || steps_done == cfg_.max_steps))
    save(steps_done, scaler, result);
}

void LoopCheckpoints::save(int64_t steps_done, const LossScaler& scaler, TrainResult& result) {
  const auto t0 = std::chrono::steady_clock::now();
  TrainState st;
  st.step = steps_done;
  st.data_position = first_sample(steps_done);
  st.global_batch = global_batch_;
  st.seed = cfg_.seed;
  st.scaler = scaler_state(scaler);
  const std::string path = (fs::path(cfg_.checkpoint_dir) / io::checkpoint_filename(steps_done)).string();
  save_checkpoint(path, group_, engine_, model_, st, s_);
  std::vector<std::string> deleted;
  if (cfg_.keep_last > 0) deleted = io::keep_last_checkpoints(cfg_.checkpoint_dir, "step-", int(cfg_.keep_last), group_);
  result.saved.push_back(path);
  ZP_LOG_INFO("saved ", path, " in ", seconds_since(t0), " s",
              deleted.empty() ? "" : " (deleted " + std::to_string(deleted.size()) + " older)");
}

}  // namespace zp::runtime
