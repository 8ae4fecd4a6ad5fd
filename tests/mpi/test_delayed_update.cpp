// The one-step delayed parameter update (zero_optimization.offload_optimizer.delayed_update;
// parallel/delayed_update.h), at any world size (mpirun -np 1, 2, 3, 5):
//  - its trajectory is the delayed one, built here from parts that do not know the feature: the plain
//    engine (stage 0) with the optimizer on the device, whose master weights this test sets to
//    w_{k-2} before step k's forward (so the compute weights are those) and back to w_{k-1} after its
//    last backward, so that the step's ordinary update makes w_k = AdamW(w_{k-1}, g(w_{k-2})). The
//    delayed run follows it to 1e-5 (losses, final fp32 parameters) at stages 1-3, optimizer in host
//    memory or on NVMe, parameters in host memory, with gradient accumulation and clipping (the test
//    config clips at 0.5); and it is not the plain trajectory. The same in fp16 with dynamic loss
//    scaling, where overflowed steps come by themselves and are skipped alike by both. fp16 compute
//    weights make a trajectory depend on the order in which fp32 gradients are summed (one rounding
//    of a weight to fp16 that goes the other way): the plain engine's own fp16 runs at stages 0 and
//    3 differ by up to 4e-5 with accumulation (GPT-2, 2 ranks). So the fp16 reference runs at the
//    delayed run's stage, which sums in the same order, and the delay is held to the same 1e-5;
//  - an fp16 overflow injected into one rank's gradients is skipped by every rank at that step: the
//    scale backs off, the master weights and the update count stay, the previous update is still
//    published, and the run goes on as the reference does;
//  - a checkpoint of a delayed run holds the state after every update of its steps plus the weights
//    the next step computes with, and a run resumed from it continues bit for bit like the
//    uninterrupted delayed run (fp32 on the CPU; fp16 saved after skipped and after applied steps).
// Every rank takes the same branches: no rank is ever left alone in a collective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>

#include "core/device.h"
#include "parallel/zero_engine.h"
#include "runtime/lm_training.h"
#include "runtime/training_driver.h"
#include "test_util.h"
#include "training_runs.h"

namespace zp::test {
namespace {

int accumulation() { return (kGlobalBatch / world_size()) % 2 == 0 ? 2 : 3; }

constexpr int kFp16ScalePower = 20;  // fp16.initial_scale_power of fp16_section(): 2 of 6 steps overflow
// With fewer updates than the other runs the fp16 ones take a larger step, so the delay shows as clearly.
constexpr double kFp16Lr = 1e-2;

// Every block's owned fp32 master weights, in block order.
using MasterWeights = std::vector<std::vector<float>>;

MasterWeights read_master(parallel::ZeroEngine& e) {
  MasterWeights w;
  e.visit_state([&](parallel::BlockState& st) {
    w.emplace_back(size_t(st.owned_end() - st.owned_begin()));
    st.read(parallel::OptimizerState::Master, st.owned_begin(), st.owned_end() - st.owned_begin(), w.back().data());
  });
  return w;
}

// Writing master weights makes the engine rewrite the compute weights from them.
void write_master(parallel::ZeroEngine& e, const MasterWeights& w) {
  size_t i = 0;
  e.visit_state([&](parallel::BlockState& st) {
    st.write(parallel::OptimizerState::Master, st.owned_begin(), st.owned_end() - st.owned_begin(), w.at(i++).data());
  });
}

// A task that forwards everything to another: the test's tasks below change a part.
class ForwardingTask : public runtime::TrainingTask {
 public:
  explicit ForwardingTask(std::unique_ptr<runtime::TrainingTask> inner) : inner_(std::move(inner)) {}

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad) override { return inner_->lay_out_model(pad); }
  void fill_block(nn::ParamBlock& b) override { inner_->fill_block(b); }
  void set_block_access(nn::BlockAccess* access) override { inner_->set_block_access(access); }
  runtime::CheckpointModel checkpoint_model() const override { return inner_->checkpoint_model(); }
  runtime::ProgressUnit progress() override { return inner_->progress(); }
  double activation_bytes() override { return inner_->activation_bytes(); }
  std::string describe() override { return inner_->describe(); }
  bool has_validation() const override { return inner_->has_validation(); }
  double validation_loss(int64_t first) override { return inner_->validation_loss(first); }
  std::optional<int64_t> begin_step(int64_t first, int64_t samples) override {
    return inner_->begin_step(first, samples);
  }
  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    return inner_->micro_step(step, first, loss_scale);
  }

 protected:
  std::unique_ptr<runtime::TrainingTask> inner_;
};

// The LM task with the delay applied from outside (see the top of the file): step k's forward and
// backward see w_{k-2} (w_0 in steps 1 and 2), its update starts from w_{k-1}. A step that skips its
// update (an fp16 overflow) leaves w_{k-1} in place, so the next step computes with it too.
class LaggingWeightsTask final : public ForwardingTask {
 public:
  LaggingWeightsTask(std::unique_ptr<runtime::TrainingTask> inner, int64_t grad_accum)
      : ForwardingTask(std::move(inner)), grad_accum_(grad_accum) {}

  void set_block_access(nn::BlockAccess* access) override {
    engine_ = dynamic_cast<parallel::ZeroEngine*>(access);
    ZP_CHECK(engine_ && !engine_->delays_update(), "the reference runs the plain engine");
    inner_->set_block_access(access);
  }

  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    if (micro_ == 0) {
      latest_ = read_master(*engine_);            // w_{k-1}
      if (!older_.empty()) write_master(*engine_, older_);  // compute with w_{k-2}
    }
    const double loss = inner_->micro_step(step, first, loss_scale);
    if (++micro_ == grad_accum_) {
      micro_ = 0;
      if (!older_.empty()) write_master(*engine_, latest_);  // the update starts from w_{k-1}
      older_ = latest_;
    }
    return loss;
  }

 private:
  int64_t grad_accum_, micro_ = 0;
  parallel::ZeroEngine* engine_ = nullptr;
  MasterWeights older_, latest_;
};

// The reference: the plain engine at r's stage, optimizer on the device, the delay applied by the task.
runtime::TrainResult delayed_reference(const std::string& data, TrainingRun r, comm::Runtime& rt) {
  r.offload = r.offload_param = "none";
  r.delayed_update = false;
  runtime::TrainConfig cfg = runtime::TrainConfig::from(user_config(data, r));
  return runtime::run_training(cfg, rt, MPI_COMM_WORLD, true,
                               [](const runtime::TrainConfig& placed, const runtime::TrainingPlace& at) {
    return std::make_unique<LaggingWeightsTask>(runtime::make_lm_task(placed, at), placed.grad_accum);
  });
}

// What a step of a run looks like from its task before its forward: the loss scale it computes with
// (per micro-step), the optimizer's update count (bias correction) and every block's fp32 master
// weights gathered from their owners (with the delayed update: after the update in flight).
struct StepRecord {
  float loss_scale = 0;
  int64_t optimizer_steps = 0;
  std::vector<float> master;
};

// Records every step (above) and injects an fp16 overflow: in the first micro-step of step
// `overflow_step` (from 0), rank `overflow_rank` alone multiplies its loss scale by 2^40, far beyond
// fp16's range, so its gradients hold inf and no other rank's do: those learn of the overflow only
// through the global norm.
class OverflowTask final : public ForwardingTask {
 public:
  OverflowTask(std::unique_ptr<runtime::TrainingTask> inner, int64_t grad_accum, int64_t overflow_step,
               int overflow_rank, std::vector<StepRecord>& records)
      : ForwardingTask(std::move(inner)), grad_accum_(grad_accum), overflow_step_(overflow_step),
        overflow_rank_(overflow_rank), records_(records) {}

  void set_block_access(nn::BlockAccess* access) override {
    engine_ = dynamic_cast<parallel::ZeroEngine*>(access);
    ZP_CHECK(engine_, "the overflow test runs on the ZeRO engine");
    inner_->set_block_access(access);
  }

  double micro_step(int64_t step, int64_t first, float loss_scale) override {
    const bool first_micro = micro_ == 0;
    if (first_micro) records_.push_back({loss_scale, engine_->optimizer_steps(), engine_->gather_master()});
    micro_ = (micro_ + 1) % grad_accum_;
    const bool overflow = first_micro && step == overflow_step_ && world_rank() == overflow_rank_;
    return inner_->micro_step(step, first, overflow ? loss_scale * 0x1p40f : loss_scale);
  }

 private:
  int64_t grad_accum_, micro_ = 0, overflow_step_;
  int overflow_rank_;
  std::vector<StepRecord>& records_;
  parallel::ZeroEngine* engine_ = nullptr;
};

// The relative RMS difference of two vectors of parameters (infinite when their sizes differ).
double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double(got[i]) - want[i];
    num += e * e;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// The largest relative difference of two loss trajectories.
double loss_gap(const runtime::TrainResult& a, const runtime::TrainResult& b) {
  double gap = 0;
  for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); ++i)
    gap = std::max(gap, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  return gap;
}

enum class Precision { Fp32, Bf16, Fp16 };

std::string name_of(Precision p) { return p == Precision::Fp32 ? "fp32" : p == Precision::Bf16 ? "bf16" : "fp16"; }

// fp16 with dynamic loss scaling whose overflows come by themselves in the suite's 6 steps: a scale
// that doubles after every clean step and halves at every overflow (no hysteresis), started where
// the tiny models' gradients overflow (the count is checked against the reference below).
io::json fp16_section() {
  return {{"enabled", true}, {"initial_scale_power", kFp16ScalePower}, {"loss_scale_window", 1}, {"hysteresis", 1}};
}

void expect_delayed_runs_follow_the_reference(const std::string& device, Precision precision, double loss_tol,
                                              double param_tol) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("delayed_" + device + "_" + name_of(precision) + "_" + model);
    const std::string data = data_file(dir, model);
    for (int accum : {1, accumulation()}) {
      TrainingRun r{model, 0, world};
      r.device = device;
      r.bf16 = precision == Precision::Bf16;
      if (precision == Precision::Fp16) {
        r.fp16 = fp16_section();
        r.lr = kFp16Lr;
      }
      r.grad_accum = accum;
      const runtime::TrainResult at_stage_0 = delayed_reference(data, r, rt);
      const runtime::TrainResult plain = run(data, r, rt, MPI_COMM_WORLD, true);
      // The delay must show: otherwise the comparisons below could not tell the two apart.
      EXPECT_GT(loss_gap(at_stage_0, plain), 1e-4) << model << ": the delayed trajectory equals the plain one";
      if (precision == Precision::Fp16) {  // both kinds of step end, skipped and applied, come in the run
        EXPECT_GT(at_stage_0.skipped_steps, 0) << model << ": no fp16 overflow in the reference";
        EXPECT_LT(at_stage_0.skipped_steps, kSteps - 2) << model << ": the reference hardly updates";
      }
      for (int stage = 1; stage <= 3; ++stage) {
        // Accumulation at one stage per model keeps the suite short: Llama at 2, GPT-2 at 3.
        if (accum > 1 && stage != (model == "llama" ? 2 : 3)) continue;
        const std::string what = model + " on " + device + " " + name_of(precision) + " stage " +
                                 std::to_string(stage) + " world " + std::to_string(world) + " accumulation " +
                                 std::to_string(accum);
        TrainingRun d = r;
        d.stage = stage;
        const runtime::TrainResult want = precision == Precision::Fp16 ? delayed_reference(data, d, rt) : at_stage_0;
        d.delayed_update = true;
        auto check = [&](const runtime::TrainResult& got, const std::string& how) {
          ASSERT_EQ(got.losses.size(), want.losses.size()) << what << how;
          for (size_t i = 0; i < want.losses.size(); ++i)
            EXPECT_NEAR(got.losses[i], want.losses[i], loss_tol * std::abs(want.losses[i]))
                << what << how << " step " << i + 1;
          ASSERT_EQ(got.final_params.size(), want.final_params.size()) << what << how;
          EXPECT_LE(rel_rms(got.final_params, want.final_params), param_tol) << what << how << ": final parameters";
          EXPECT_EQ(got.skipped_steps, want.skipped_steps) << what << how << ": fp16 overflows skipped";
        };
        d.offload = "cpu";
        check(run(data, d, rt, MPI_COMM_WORLD, true), ", optimizer in host memory");
        if (stage == 3) {  // the new weights go into the host shards through the second weight buffer
          d.offload_param = "cpu";
          check(run(data, d, rt, MPI_COMM_WORLD, true), ", optimizer and parameters in host memory");
          d.offload_param = "none";
        }
        if (stage == 2 && accum == 1) {
          d.offload = "nvme";
          check(run(data, d, rt, MPI_COMM_WORLD, true), ", optimizer on NVMe");
        }
      }
    }
  }
}

}  // namespace

TEST(DelayedUpdate, FollowsTheDelayedTrajectoryBuiltFromThePlainEngine) {
  expect_delayed_runs_follow_the_reference("cpu", Precision::Fp32, 1e-5, 1e-5);
}

// fp16 with dynamic loss scaling: a step whose gradients overflow starts no update, and the update
// before it is still published; the reference (the plain engine's fp16 run, delayed from outside)
// skips the same steps, so the two agree step for step.
TEST(DelayedUpdate, Fp16SkipsOverflowedStepsOnTheDelayedTrajectory) {
  expect_delayed_runs_follow_the_reference("cpu", Precision::Fp16, 1e-5, 1e-5);
}

// An injected fp16 overflow (OverflowTask: inf in one rank's gradients, in step kOverflowStep) with
// the delayed update: every rank skips that step (the loss scale halves, the hysteresis being 1; the
// master weights and the update count stay exactly), no update starts, the update before it is still
// published, and the run goes on updating. Step by step the scale, the update count and the master
// weights equal the reference's (the plain fp16 engine delayed from outside, with the same injection),
// and so do the losses and the final parameters. A scale low enough that nothing else overflows.
// Llama at stages 1, 2 and 3, the optimizer in host memory or on NVMe, with and without accumulation.
TEST(DelayedUpdate, Fp16InjectedOverflowIsSkippedByEveryRank) {
  constexpr int64_t kOverflowStep = 3;  // after three updates started: one is in flight
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("delayed_fp16_overflow");
  const std::string data = data_file(dir, "llama");
  for (int accum : {1, accumulation()}) {
    TrainingRun r{"llama", 0, world};
    r.fp16 = {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}};
    r.grad_accum = accum;
    auto run_recorded = [&](const TrainingRun& t, bool lagging, std::vector<StepRecord>& records) {
      runtime::TrainConfig cfg = runtime::TrainConfig::from(user_config(data, t));
      return runtime::run_training(cfg, rt, MPI_COMM_WORLD, true,
                                   [&](const runtime::TrainConfig& placed, const runtime::TrainingPlace& at) {
        std::unique_ptr<runtime::TrainingTask> task = runtime::make_lm_task(placed, at);
        if (lagging) task = std::make_unique<LaggingWeightsTask>(std::move(task), placed.grad_accum);
        return std::make_unique<OverflowTask>(std::move(task), placed.grad_accum, kOverflowStep, world - 1, records);
      });
    };
    for (const auto& [stage, offload, offload_param] :
         {std::tuple<int, std::string, std::string>{1, "cpu", "none"}, {2, "nvme", "none"}, {3, "cpu", "cpu"}}) {
      const std::string what = "stage " + std::to_string(stage) + " optimizer " + offload + " params " +
                               offload_param + " world " + std::to_string(world) + " accumulation " +
                               std::to_string(accum);
      TrainingRun d = r;
      d.stage = stage;
      std::vector<StepRecord> want_steps;  // at the same stage: fp16 (the top of the file)
      const runtime::TrainResult want = run_recorded(d, true, want_steps);
      ASSERT_EQ(want.skipped_steps, 1) << what << ": the injected overflow alone";
      ASSERT_EQ(want_steps.size(), size_t(kSteps)) << what;
      d.offload = offload;
      d.offload_param = offload_param;
      d.delayed_update = true;
      std::vector<StepRecord> got_steps;
      const runtime::TrainResult got = run_recorded(d, false, got_steps);
      expect_same_trajectory(got, want, what);
      EXPECT_EQ(got.skipped_steps, 1) << what;
      ASSERT_EQ(got_steps.size(), size_t(kSteps)) << what << ": the run goes on after the overflow";
      for (size_t i = 0; i < got_steps.size(); ++i) {
        const std::string at = what + " before step " + std::to_string(i + 1);
        EXPECT_EQ(got_steps[i].loss_scale, want_steps[i].loss_scale) << at;
        EXPECT_EQ(got_steps[i].optimizer_steps, want_steps[i].optimizer_steps) << at;
        EXPECT_EQ(got_steps[i].optimizer_steps, int64_t(i) - (i > size_t(kOverflowStep))) << at;
        EXPECT_LE(rel_rms(got_steps[i].master, want_steps[i].master), 1e-5) << at << ": master weights";
      }
      // The overflowed step changed nothing but the scale; the next one updates again.
      const StepRecord &before = got_steps[kOverflowStep], &after = got_steps[kOverflowStep + 1];
      EXPECT_EQ(after.loss_scale, before.loss_scale / 2) << what << ": the scale backs off";
      EXPECT_EQ(after.master, before.master) << what << ": the skipped step changed the master weights";
      EXPECT_EQ(got_steps[kOverflowStep + 2].optimizer_steps, after.optimizer_steps + 1) << what;
      EXPECT_NE(got_steps[kOverflowStep + 2].master, after.master) << what << ": no update after the overflow";
      // Every rank saw the same scales (the overflow of one rank's gradients is everyone's).
      std::vector<float> scales, first(kSteps);
      for (const StepRecord& s : got_steps) scales.push_back(s.loss_scale);
      first = scales;
      MPI_Bcast(first.data(), kSteps, MPI_FLOAT, 0, MPI_COMM_WORLD);
      EXPECT_EQ(scales, first) << what << ": the ranks' loss scales differ";
    }
  }
}

// A checkpoint written with an update in flight waits for it (the file holds the state after all
// the updates of its steps) and keeps the weights the next step computes with; resumed, the run is
// the uninterrupted one bit for bit. Llama at stage 2 with the optimizer in host memory, and at
// stage 3 with the optimizer on NVMe and the parameters in host memory; each also with accumulation.
TEST(DelayedUpdate, ResumesBitForBitMidRun) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("delayed_resume");
  const std::string data = data_file(dir, "llama");
  for (const auto& [stage, offload, offload_param] :
       {std::tuple<int, std::string, std::string>{2, "cpu", "none"}, {3, "nvme", "cpu"}})
    for (int accum : {1, accumulation()}) {
      const std::string what = "stage " + std::to_string(stage) + " optimizer " + offload + " params " +
                               offload_param + " world " + std::to_string(world) + " accumulation " +
                               std::to_string(accum);
      TrainingRun r{"llama", stage, world};
      r.offload = offload;
      r.offload_param = offload_param;
      r.delayed_update = true;
      r.grad_accum = accum;
      const runtime::TrainResult straight = run(data, r, rt, MPI_COMM_WORLD, true);
      const std::string ckpt = dir / ("ckpt_" + std::to_string(stage) + "_" + std::to_string(accum));
      TrainingRun first = r;
      first.max_steps = kSaveAt;
      first.save_every = kSaveAt;
      first.dir = ckpt;
      const runtime::TrainResult head = run(data, first, rt, MPI_COMM_WORLD, true);
      // The file's master weights are those after kSaveAt updates: the gathered ones (gather_master
      // waits for the update in flight too) equal the uninterrupted run's after as many steps.
      ASSERT_EQ(head.losses.size(), size_t(kSaveAt)) << what;
      for (int i = 0; i < kSaveAt; ++i) EXPECT_EQ(head.losses[size_t(i)], straight.losses[size_t(i)]) << what;
      TrainingRun second = r;
      second.dir = ckpt;
      second.resume = "latest";
      const runtime::TrainResult resumed = run(data, second, rt, MPI_COMM_WORLD, true);
      EXPECT_EQ(resumed.first_step, kSaveAt) << what;
      const std::vector<double> rest = tail(straight.losses, kSaveAt);
      ASSERT_EQ(resumed.losses.size(), rest.size()) << what;
      for (size_t i = 0; i < rest.size(); ++i)
        EXPECT_EQ(resumed.losses[i], rest[i]) << what << " step " << kSaveAt + int64_t(i) + 1;
      ASSERT_EQ(resumed.final_params.size(), straight.final_params.size()) << what;
      size_t differ = 0;
      for (size_t i = 0; i < straight.final_params.size(); ++i)
        differ += resumed.final_params[i] != straight.final_params[i];
      EXPECT_EQ(differ, 0u) << what << ": final parameters differ from the uninterrupted run's";

      // Resumed without the delayed update, the same file continues from its master weights: the
      // first resumed step then computes with other weights, so its loss differs. (This is what the
      // file's lagging weights are for.)
      TrainingRun plain = second;
      plain.delayed_update = false;
      plain.dir.clear();  // the resumed run saved its last step there
      plain.resume = ckpt + "/step-00000003.h5";
      const runtime::TrainResult other = run(data, plain, rt, MPI_COMM_WORLD, false);
      ASSERT_FALSE(other.losses.empty()) << what;
      EXPECT_NE(other.losses[0], rest[0]) << what << ": the lagging weights made no difference";
    }
}

// fp16: a checkpoint written at the end of any step, skipped (no update in flight, the last one's
// weights just installed) or not (one in flight), resumes bit for bit, the loss scaler's state
// included: Llama at stage 2 with the optimizer in host memory, saved after each of steps 1 to 5.
TEST(DelayedUpdate, Fp16ResumesBitForBitAfterSkippedAndAppliedSteps) {
  comm::Runtime rt;
  const int world = world_size();
  SharedDir dir("delayed_fp16_resume");
  const std::string data = data_file(dir, "llama");
  TrainingRun r{"llama", 2, world};
  r.offload = "cpu";
  r.delayed_update = true;
  r.fp16 = fp16_section();
  r.lr = kFp16Lr;
  const runtime::TrainResult straight = run(data, r, rt, MPI_COMM_WORLD, true);
  // Two overflows in six steps: at least one of them among the saved steps 1 to 5.
  ASSERT_GE(straight.skipped_steps, 2) << "too few overflows to resume across";
  for (int at = 1; at < kSteps; ++at) {
    const std::string what = "saved after step " + std::to_string(at) + " world " + std::to_string(world);
    TrainingRun first = r;
    first.max_steps = at;
    first.save_every = at;
    first.dir = dir / ("ckpt_" + std::to_string(at));
    run(data, first, rt, MPI_COMM_WORLD);
    TrainingRun second = r;
    second.dir = first.dir;
    second.resume = "latest";
    const runtime::TrainResult resumed = run(data, second, rt, MPI_COMM_WORLD, true);
    EXPECT_EQ(resumed.first_step, at) << what;
    EXPECT_EQ(resumed.losses, tail(straight.losses, size_t(at))) << what;
    EXPECT_EQ(resumed.skipped_steps, straight.skipped_steps) << what;
    EXPECT_EQ(resumed.final_params, straight.final_params) << what << ": final parameters";
  }
}

// On GPUs the update runs on the host thread through the staging ring and the device double buffers.
// fp32: against the reference on the same GPUs (its AdamW is the CUDA one, the delayed run's the
// CPU's: 1e-5, as for the other offload tiers). bf16 and fp16: the compute weights are rounded to
// 16 bits on both sides, at different places of each AdamW: within bf16's resolution.
TEST(DelayedUpdateGpu, FollowsTheDelayedTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  expect_delayed_runs_follow_the_reference("cuda", Precision::Fp32, 1e-5, 1e-5);
  expect_delayed_runs_follow_the_reference("cuda", Precision::Bf16, 1e-2, 1e-2);
  expect_delayed_runs_follow_the_reference("cuda", Precision::Fp16, 1e-2, 1e-2);
}

}  // namespace zp::test
