// The step-time breakdown on several ranks (CPU, MPI): each rank's metrics file has the
// communication's busy time per collective kind, summing to comm_busy_ms, the kinds the ZeRO stage
// uses (stage 0 all-reduces gradients; stage 2 reduce-scatters them and all-gathers the weights),
// and on the CPU all of it exposed (the host runs each collective and waits for it). In a pipelined
// run the stage link's sends and receives are one more kind, "send_recv", in the busy total.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "training_runs.h"

namespace zp::test {

namespace {

// A rank's metrics file, its step records (events, which carry an "event" key, left out).
std::vector<io::json> step_records(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<io::json> steps;
  for (std::string line; std::getline(in, line);) {
    io::json j = io::json::parse(line);
    if (!j.contains("event")) steps.push_back(std::move(j));
  }
  return steps;
}

}  // namespace

TEST(Telemetry, CommBusyPerCollectiveKindOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs several ranks";
  comm::Runtime rt;
  SharedDir dir("telemetry");
  const std::string data = data_file(dir, "llama");
  for (int stage : {0, 2}) {
    TrainingRun r{"llama", stage, world_size()};
    r.max_steps = 2;
    const std::string metrics = dir / ("m" + std::to_string(stage) + ".{rank}.jsonl");
    runtime::TrainConfig t = runtime::TrainConfig::from(user_config(data, r));
    t.metrics_file = metrics;
    runtime::train(t, rt, MPI_COMM_WORLD);
    const std::vector<io::json> steps =
        step_records(dir / ("m" + std::to_string(stage) + "." + std::to_string(world_rank()) + ".jsonl"));
    for (const io::json& j : steps) {
      const io::json& b = j.at("breakdown");
      const io::json& kinds = b.at("comm_busy_by_kind_ms");
      double sum = 0;
      for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) sum += kinds.at(kind).get<double>();
      EXPECT_NEAR(sum, b.at("comm_busy_ms").get<double>(), 1e-9) << j.dump();
      EXPECT_FALSE(kinds.contains("send_recv")) << "no pipeline, no stage link: " << j.dump();
      EXPECT_NEAR(b.at("exposed_comm_ms").get<double>(), b.at("comm_busy_ms").get<double>(), 1e-9) << j.dump();
      if (stage == 0) {
        EXPECT_GT(kinds.at("all_reduce").get<double>(), 0.0) << j.dump();
        EXPECT_EQ(kinds.at("reduce_scatter").get<double>(), 0.0) << j.dump();
      } else {
        EXPECT_GT(kinds.at("reduce_scatter").get<double>(), 0.0) << j.dump();
        EXPECT_GT(kinds.at("all_gather").get<double>(), 0.0) << j.dump();
        EXPECT_EQ(kinds.at("all_reduce").get<double>(), 0.0) << j.dump();
      }
      EXPECT_NEAR(b.at("forward_ms").get<double>() + b.at("backward_ms").get<double>(),
                  b.at("forward_backward_ms").get<double>(), 1e-9 * b.at("forward_backward_ms").get<double>());
    }
    EXPECT_EQ(steps.size(), 2u) << "stage " << stage;
  }
}

// Two ranks as the two stages of one pipeline (ZeRO 1 inside each stage, one rank per stage: no
// collective has a peer), two micro-batches: each stage sends and receives every step, and both
// count their idle time against the same step window.
TEST(Telemetry, PipelineSendRecvIsACommunicationKind) {
  if (world_size() < 2) GTEST_SKIP() << "needs several ranks";
  comm::Runtime rt;
  SharedDir dir("telemetry_pipeline");
  const std::string data = data_file(dir, "llama");
  MPI_Comm two = first_ranks(2);
  if (two == MPI_COMM_NULL) return;
  TrainingRun r{"llama", 1, 2};
  r.max_steps = 2;
  r.stages = 2;
  r.grad_accum = 2;
  r.layers = 4;
  runtime::TrainConfig t = runtime::TrainConfig::from(user_config(data, r));
  t.metrics_file = dir / "m.{rank}.jsonl";
  runtime::train(t, rt, two);
  const std::vector<io::json> steps = step_records(dir / ("m." + std::to_string(world_rank()) + ".jsonl"));
  // The bubble counts each stage's idle time against the step window, the same for both stages:
  // busy + idle is one number per step on every stage, bubble = idle / window, and the mean bubble
  // is the stages' average.
  std::vector<double> mine;  // per step: window, bubble
  for (const io::json& j : steps) {
    const io::json& p = j.at("pipeline");
    const double busy = p.at("busy_ms").get<double>(), idle = p.at("idle_ms").get<double>();
    EXPECT_GE(idle, -1e-9) << j.dump();
    EXPECT_NEAR(p.at("bubble").get<double>(), idle / (busy + idle), 1e-9) << j.dump();
    // The device's idle time between passes (0 on the CPU, whose passes the host times) is part of
    // the idle time.
    const double recv_gaps = p.at("recv_gap_ms").get<double>(), other_gaps = p.at("other_gap_ms").get<double>();
    EXPECT_GE(recv_gaps, 0.0) << j.dump();
    EXPECT_GE(other_gaps, 0.0) << j.dump();
    EXPECT_LE(recv_gaps + other_gaps, idle + 1e-6) << j.dump();
    mine.insert(mine.end(), {busy + idle, p.at("bubble").get<double>(), p.at("mean_bubble").get<double>()});
  }
  std::vector<double> both(2 * mine.size());
  ZP_MPI_CHECK(
      MPI_Allgather(mine.data(), int(mine.size()), MPI_DOUBLE, both.data(), int(mine.size()), MPI_DOUBLE, two));
  for (size_t k = 0; k + 2 < mine.size(); k += 3) {
    const size_t o = mine.size();
    EXPECT_DOUBLE_EQ(both[k], both[o + k]) << "step " << k / 3 + 1 << ": the stages' windows";
    EXPECT_NEAR(mine[k + 2], (both[k + 1] + both[o + k + 1]) / 2, 1e-9) << "step " << k / 3 + 1 << ": mean bubble";
  }
  MPI_Comm_free(&two);
  for (const io::json& j : steps) {
    const io::json& b = j.at("breakdown");
    const io::json& kinds = b.at("comm_busy_by_kind_ms");
    ASSERT_TRUE(kinds.contains("send_recv")) << j.dump();
    EXPECT_GT(kinds.at("send_recv").get<double>(), 0.0) << j.dump();
    double sum = 0;
    for (const auto& [kind, ms] : kinds.items()) sum += ms.get<double>();
    EXPECT_NEAR(sum, b.at("comm_busy_ms").get<double>(), 1e-9) << j.dump();
    EXPECT_GE(b.at("comm_busy_ms").get<double>(), kinds.at("send_recv").get<double>()) << j.dump();
    // The host's waits for the link are part of its busy time (MPI: the waits and the posting).
    EXPECT_GE(kinds.at("send_recv").get<double>(), j.at("pipeline").at("recv_wait_ms").get<double>()) << j.dump();
  }
  EXPECT_EQ(steps.size(), 2u);
}

}  // namespace zp::test
