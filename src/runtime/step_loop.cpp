#include "runtime/step_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "runtime/stop_signals.h"

namespace zp::runtime {

namespace {

// The first signal any rank of the group received (0: none), so that every rank stops at the same
// step boundary.
int agreed_signal(const StopSignals& signals, comm::Communicator* ctrl) {
  int32_t sig = signals.received();
  if (ctrl) ctrl->all_reduce(&sig, &sig, 1, DType::I32, comm::ReduceOp::Max);
  return sig;
}

}  // namespace

void run_steps(const StepLoop& loop, const std::function<double(int64_t, int64_t, float)>& train,
               const std::function<double(int64_t)>& validate, TrainResult& result) {
  const TrainConfig& cfg = loop.cfg;
  const int64_t micro = cfg.micro_batch, world = loop.data_size, rank = loop.data_rank;
  // The mean over the ranks that computed `v` (one pipeline stage's data group; every rank without a
  // pipeline), on every rank.
  const bool computes_loss = !loop.pipeline || loop.pipeline->last_stage();
  auto dp_mean = [&](double v) {
    if (!loop.ctrl) return v;
    double mine = computes_loss ? v : 0.0, out = 0;
    loop.ctrl->all_reduce(&mine, &out, 1, DType::F64, comm::ReduceOp::Sum);
    return out / double(world);
  };
  StopSignals signals;
  int64_t bad_in_a_row = 0;
  // The step-time breakdown: the forward-and-backward and update phases on the compute stream
  // (events; waits for communication included) or the host clock on a CPU, the host's time reading
  // batches, and the communication streams' busy time (not all of it exposed).
  loop.engine.set_timing(true);
  std::unique_ptr<Event> phase[3];  // start, forward and backward done, update done
  if (loop.s)
    for (auto& e : phase) e = std::make_unique<Event>();
  using Clock = std::chrono::steady_clock;
  auto ms_between = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  for (int64_t step = loop.checkpoints.start_step(); step < cfg.max_steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    loop.engine.comm_ms();  // validation's and checkpoints' collectives are not this step's
    if (loop.s) phase[0]->record(loop.s);
    loop.engine.begin_step();
    const float loss_scale = float(loop.scaler.scale());
    double loss = 0;
    auto first_of = [&](int64_t m) { return loop.checkpoints.first_sample(step) + m * micro * world + rank * micro; };
    if (loop.begin_step)
      if (const auto items = loop.begin_step(loop.checkpoints.first_sample(step), micro * world * cfg.grad_accum))
        loop.reporter.set_step_items(*items);
    if (loop.pipeline) {
      std::vector<int64_t> firsts;
      for (int64_t m = 0; m < cfg.grad_accum; ++m) firsts.push_back(first_of(m));
      loss = loop.pipeline->train(step, firsts, loss_scale / float(cfg.grad_accum));
    } else {
      for (int64_t m = 0; m < cfg.grad_accum; ++m) {
        begin_micro_step(loop.engine, loop.schedule, m, cfg.grad_accum, loss_scale);
        loss += train(step, first_of(m), loss_scale / float(cfg.grad_accum)) / double(cfg.grad_accum);
      }
    }
    const auto t1 = Clock::now();
    if (loop.s) phase[1]->record(loop.s);
    const StepUpdate upd =
        finish_step(loop.engine, loop.scaler, loop.schedule, cfg.grad_clip, loss_scale, loop.pipeline_grads);
    if (loop.s) phase[2]->record(loop.s);
    if (loop.s) stream_synchronize(loop.s);
    const auto t2 = Clock::now();
    const double secs = std::chrono::duration<double>(t2 - t0).count();
    StepReporter::Breakdown bd;
    bd.data_ms = loop.data_seconds ? 1e3 * loop.data_seconds() : 0.0;
    bd.forward_backward_ms = loop.s ? phase[1]->elapsed_ms_since(*phase[0]) : ms_between(t0, t1) - bd.data_ms;
    bd.optimizer_ms = loop.s ? phase[2]->elapsed_ms_since(*phase[1]) : ms_between(t1, t2);
    const parallel::CommTimes comm = loop.engine.comm_times();
    bd.comm_busy_ms = comm.busy_total_ms();
    bd.exposed_comm_ms = comm.exposed_ms;
    for (int k = 0; k < int(parallel::CollectiveKind::Count); ++k)
      bd.comm_busy_by_kind_ms.emplace_back(parallel::collective_kind_name(parallel::CollectiveKind(k)), comm.busy_ms[k]);
    if (loop.pipeline) {
      // The stage link's sends and receives, one more kind of the busy time. Not exposed_comm_ms: a
      // stage waiting for its input is mostly waiting for the peer's compute (the bubble), which the
      // pipeline's recv_wait_ms and bubble report.
      const double link_ms = 1e3 * loop.pipeline->last_times().link_busy;
      bd.comm_busy_by_kind_ms.emplace_back("send_recv", link_ms);
      bd.comm_busy_ms += link_ms;
    }
    if (loop.forward_ms && !loop.pipeline) {
      // The forward as the task measured it, the backward the rest of the phase (the two add up to it).
      bd.forward_ms = std::clamp(loop.forward_ms(), 0.0, bd.forward_backward_ms);
      bd.backward_ms = bd.forward_backward_ms - bd.forward_ms;
    }
    loop.reporter.set_breakdown(bd);
    loss = dp_mean(loss);
    result.losses.push_back(loss);
    double val = NAN;
    if (validate && cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.max_steps)) {
      double mean = 0;
      if (loop.pipeline) {
        std::vector<int64_t> firsts;
        for (int64_t e = 0; e < cfg.eval_batches; ++e) firsts.push_back((e * world + rank) * micro);
        mean = loop.pipeline->validate(firsts);
      } else {
        for (int64_t e = 0; e < cfg.eval_batches; ++e) mean += validate((e * world + rank) * micro);
        mean /= double(cfg.eval_batches);
      }
      val = dp_mean(mean);
      result.val_losses.push_back(val);
    }
    if (loop.pipeline) {
      const StageTimes t = loop.pipeline->last_times();
      // Idle time counts against the step's window, the longest stage span (the first stage's in 1F1B
      // and ZB-H1: it starts the first pass and ends the last), as the theory counts it. Against its
      // own span a stage leaves out its wait for the first activation or after its last pass: measured
      // that way on two H200s, P2 with balanced stages at M8 idled 5% against the theory's 11%.
      double window = t.span;
      StageTimes mean_stage = t;  // the stages' mean busy time
      if (loop.ctrl) {
        loop.ctrl->all_reduce(&window, &window, 1, DType::F64, comm::ReduceOp::Max);
        loop.ctrl->all_reduce(&mean_stage.busy, &mean_stage.busy, 1, DType::F64, comm::ReduceOp::Sum);
        mean_stage.busy /= double(loop.ctrl->size());  // every pipeline has every stage once
      }
      loop.reporter.set_pipeline({loop.pipeline->stage(), t.busy * 1e3, window * 1e3, t.waiting * 1e3,
                                  t.bubble_in(window), mean_stage.bubble_in(window),
                                  loop.pipeline->theoretical_bubble(), t.recv_gaps * 1e3, t.other_gaps * 1e3});
      if (comm::pipeline_trace_enabled())
        ZP_LOG_INFO_ALL("pipeline trace: step ", step + 1, " stage ", loop.pipeline->stage(), ": busy ", t.busy * 1e3,
                        " ms, span ", t.span * 1e3, " ms, window ", window * 1e3, " ms, idle between passes ",
                        t.recv_gaps * 1e3, " ms before receiving ones and ", t.other_gaps * 1e3, " ms before others");
    }
    loop.reporter.report(step + 1, loss, upd.lr, upd.grad_norm, secs, upd.skipped, loss_scale, val);

    // Loss and norm are the same on every rank (averaged, global), so every rank decides alike. In
    // fp16 a non-finite step is routine until the scale reaches its minimum.
    const bool finite = std::isfinite(loss) && std::isfinite(upd.grad_norm);
    const bool bad = !finite && (!loop.scaler.enabled() || loop.scaler.scale() <= loop.scaler.min_scale());
    bad_in_a_row = bad ? bad_in_a_row + 1 : 0;
    const int stop = agreed_signal(signals, loop.ctrl);
    const size_t saved_before = result.saved.size();
    loop.checkpoints.step_done(step + 1, std::isfinite(loss) && !bad, stop != 0, loop.scaler, result);
    if (result.saved.size() > saved_before)
      loop.reporter.checkpoint_event(step + 1, result.saved.back(), loop.checkpoints.last_save().seconds,
                                     loop.checkpoints.last_save().bytes);
    if (bad_in_a_row >= cfg.max_bad_steps) {
      const std::string& last = !result.saved.empty() ? result.saved.back() : result.resumed_from;
      throw TrainingDiverged(detail::cat(
          "training diverged: the loss or gradient norm was not finite for ", bad_in_a_row, " steps in a row (steps ",
          step + 2 - bad_in_a_row, "..", step + 1, "; training.max_bad_steps = ", cfg.max_bad_steps, "). ",
          last.empty() ? std::string("No checkpoint was written by this run.")
                       : "The newest checkpoint, written after the last step with a finite loss, is " + last +
                             " (older ones in checkpoint.dir are kept)."));
    }
    if (stop) {
      signals.stop_completed();
      result.stopped_by_signal = stop;
      ZP_LOG_INFO("stopped by signal ", stop, " after step ", step + 1,
                  result.saved.empty() ? std::string(": nothing saved (no checkpoint.dir)")
                                       : ": resume with --resume latest (" + result.saved.back() + ")");
      break;
    }
    if (step == loop.checkpoints.start_step() && cfg.checkpoint_dir.empty()) {
      const double left = secs * double(cfg.max_steps - step - 1);
      if (left > 180)
        ZP_LOG_WARN("this run has about ", int64_t(left / 60), " more minutes of work and no checkpoint.dir: nothing "
                    "will be saved, not even at the end (set checkpoint.dir)");
    }
  }
  result.skipped_steps = loop.checkpoints.skipped_steps(loop.scaler);
}

}  // namespace zp::runtime
