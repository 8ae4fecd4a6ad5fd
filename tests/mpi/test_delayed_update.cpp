// The one-step delayed parameter update (zero_optimization.offload_optimizer.delayed_update;
// parallel/delayed_update.h), at any world size (mpirun -np 1, 2, 3, 5):
//  - its trajectory is the delayed one, built here from parts that do not know the feature: the plain
//    engine at stage 0 with the optimizer on the device, whose master weights this test sets to
//    w_{k-2} before step k's forward (so the compute weights are those) and back to w_{k-1} after its
//    last backward, so that the step's ordinary update makes w_k = AdamW(w_{k-1}, g(w_{k-2})). The
//    delayed run follows it to 1e-5 (losses, final fp32 parameters) at stages 1-3, optimizer in host
//    memory or on NVMe, parameters in host memory, with gradient accumulation and clipping (the test
//    config clips at 0.5); and it is not the plain trajectory;
//  - a checkpoint of a delayed run holds the state after every update of its steps plus the weights
//    the next step computes with, and a run resumed from it continues bit for bit like the
//    uninterrupted delayed run (fp32 on the CPU).
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

// Every block's owned fp32 master weights (stage 0: all of them), in block order.
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

// The LM task with the delay applied from outside (see the top of the file): step k's forward and
// backward see w_{k-2} (w_0 in steps 1 and 2), its update starts from w_{k-1}.
class LaggingWeightsTask final : public runtime::TrainingTask {
 public:
  LaggingWeightsTask(std::unique_ptr<runtime::TrainingTask> inner, int64_t grad_accum)
      : inner_(std::move(inner)), grad_accum_(grad_accum) {}

  std::vector<nn::ParamBlock*> lay_out_model(int64_t pad) override { return inner_->lay_out_model(pad); }
  void fill_block(nn::ParamBlock& b) override { inner_->fill_block(b); }
  void set_block_access(nn::BlockAccess* access) override {
    engine_ = dynamic_cast<parallel::ZeroEngine*>(access);
    ZP_CHECK(engine_ && !engine_->delays_update() && engine_->stage() == 0, "the reference runs the plain stage 0");
    inner_->set_block_access(access);
  }
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
  std::unique_ptr<runtime::TrainingTask> inner_;
  int64_t grad_accum_, micro_ = 0;
  parallel::ZeroEngine* engine_ = nullptr;
  MasterWeights older_, latest_;
};

// The reference: the plain engine at stage 0, optimizer on the device, the delay applied by the task.
runtime::TrainResult delayed_reference(const std::string& data, TrainingRun r, comm::Runtime& rt) {
  r.stage = 0;
  r.offload = r.offload_param = "none";
  r.delayed_update = false;
  runtime::TrainConfig cfg = runtime::TrainConfig::from(user_config(data, r));
  return runtime::run_training(cfg, rt, MPI_COMM_WORLD, true,
                               [](const runtime::TrainConfig& placed, const runtime::TrainingPlace& at) {
    return std::make_unique<LaggingWeightsTask>(runtime::make_lm_task(placed, at), placed.grad_accum);
  });
}

// The largest relative difference of two loss trajectories.
double loss_gap(const runtime::TrainResult& a, const runtime::TrainResult& b) {
  double gap = 0;
  for (size_t i = 0; i < a.losses.size() && i < b.losses.size(); ++i)
    gap = std::max(gap, std::abs(a.losses[i] - b.losses[i]) / std::abs(b.losses[i]));
  return gap;
}

void expect_delayed_runs_follow_the_reference(const std::string& device, bool bf16, double loss_tol,
                                              double param_tol) {
  comm::Runtime rt;
  const int world = world_size();
  for (const std::string model : {"llama", "gpt2"}) {
    SharedDir dir("delayed_" + device + "_" + model);
    const std::string data = data_file(dir, model);
    for (int accum : {1, accumulation()}) {
      TrainingRun r{model, 0, world};
      r.device = device;
      r.bf16 = bf16;
      r.grad_accum = accum;
      const runtime::TrainResult want = delayed_reference(data, r, rt);
      const runtime::TrainResult plain = run(data, r, rt, MPI_COMM_WORLD, true);
      // The delay must show: otherwise the comparisons below could not tell the two apart.
      EXPECT_GT(loss_gap(want, plain), 1e-4) << model << ": the delayed trajectory equals the plain one";
      for (int stage = 1; stage <= 3; ++stage) {
        // Accumulation at one stage per model keeps the suite short: Llama at 2, GPT-2 at 3.
        if (accum > 1 && stage != (model == "llama" ? 2 : 3)) continue;
        const std::string what = model + " on " + device + (bf16 ? " bf16" : " fp32") + " stage " +
                                 std::to_string(stage) + " world " + std::to_string(world) + " accumulation " +
                                 std::to_string(accum);
        TrainingRun d = r;
        d.stage = stage;
        d.delayed_update = true;
        auto check = [&](const runtime::TrainResult& got, const std::string& how) {
          ASSERT_EQ(got.losses.size(), want.losses.size()) << what << how;
          for (size_t i = 0; i < want.losses.size(); ++i)
            EXPECT_NEAR(got.losses[i], want.losses[i], loss_tol * std::abs(want.losses[i]))
                << what << how << " step " << i + 1;
          ASSERT_EQ(got.final_params.size(), want.final_params.size()) << what << how;
          double num = 0, den = 0;
          for (size_t i = 0; i < want.final_params.size(); ++i) {
            const double e = double(got.final_params[i]) - want.final_params[i];
            num += e * e;
            den += double(want.final_params[i]) * want.final_params[i];
          }
          EXPECT_LE(std::sqrt(num / den), param_tol) << what << how << ": final parameters";
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
  expect_delayed_runs_follow_the_reference("cpu", false, 1e-5, 1e-5);
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

// On GPUs the update runs on the host thread through the staging ring and the device double buffers.
// fp32: against the reference on the same GPUs (its AdamW is the CUDA one, the delayed run's the
// CPU's: 1e-5, as for the other offload tiers). bf16: the compute weights are rounded to bf16 on
// both sides, at different places of each AdamW: within bf16's resolution.
TEST(DelayedUpdateGpu, FollowsTheDelayedTrajectoryOnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  expect_delayed_runs_follow_the_reference("cuda", false, 1e-5, 1e-5);
  expect_delayed_runs_follow_the_reference("cuda", true, 1e-2, 1e-2);
}

}  // namespace zp::test
