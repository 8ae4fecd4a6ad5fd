#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"

using namespace zp;
using namespace zp::parallel;

namespace {

std::vector<std::vector<PipeAction>> all_stages(PipelineScheduleKind k, const PipelineShape& sh) {
  std::vector<std::vector<PipeAction>> out;
  for (int s = 0; s < sh.stages; ++s) out.push_back(stage_schedule(k, sh, s));
  return out;
}

}  // namespace

TEST(PipelineSchedule, OneFOneBOrderOfTheLastAndFirstStage) {
  const PipelineShape sh{4, 6, 1};
  // The last stage alternates from the start; the first warms up with P - 1 forwards.
  const auto last = stage_schedule(PipelineScheduleKind::OneFOneB, sh, 3);
  ASSERT_EQ(last.size(), 12u);
  for (int m = 0; m < 6; ++m) {
    EXPECT_EQ(last[size_t(2 * m)], (PipeAction{PipeOp::Forward, m, 0}));
    EXPECT_EQ(last[size_t(2 * m + 1)], (PipeAction{PipeOp::Backward, m, 0}));
  }
  const auto first = stage_schedule(PipelineScheduleKind::OneFOneB, sh, 0);
  const std::vector<PipeAction> want = {
      {PipeOp::Forward, 0, 0}, {PipeOp::Forward, 1, 0},  {PipeOp::Forward, 2, 0},  {PipeOp::Forward, 3, 0},
      {PipeOp::Backward, 0, 0}, {PipeOp::Forward, 4, 0}, {PipeOp::Backward, 1, 0}, {PipeOp::Forward, 5, 0},
      {PipeOp::Backward, 2, 0}, {PipeOp::Backward, 3, 0}, {PipeOp::Backward, 4, 0}, {PipeOp::Backward, 5, 0}};
  EXPECT_EQ(first, want);
}

TEST(PipelineSchedule, EveryPassOnceBackwardAfterForwardAndNoDeadlock) {
  for (auto kind : {PipelineScheduleKind::OneFOneB, PipelineScheduleKind::Interleaved})
    for (int P : {1, 2, 3, 5})
      for (int M : {1, 2, 3, 4, 5, 8, 10, 16})
        for (int V : {1, 2, 3}) {
          const PipelineShape sh{P, M, V};
          if ((kind == PipelineScheduleKind::OneFOneB) != (V == 1) || (V > 1 && (M % P || P < 2)) || M < P) {
            EXPECT_THROW(check_schedule(kind, sh), Error);
            continue;
          }
          const auto lists = all_stages(kind, sh);
          for (int s = 0; s < P; ++s) {
            std::set<std::tuple<int, int, int>> seen;
            for (const PipeAction& a : lists[size_t(s)]) {
              EXPECT_TRUE(seen.insert({int(a.op), a.micro, a.chunk}).second) << "a pass twice";
              if (a.op == PipeOp::Backward) EXPECT_TRUE(seen.count({int(PipeOp::Forward), a.micro, a.chunk}));
            }
            EXPECT_EQ(seen.size(), size_t(2 * M * V));
          }
          const ScheduleSimulation sim = simulate(lists, sh);
          EXPECT_FALSE(sim.deadlocked) << schedule_name(kind) << " P" << P << " M" << M << " V" << V << ": "
                                       << sim.why;
        }
}

TEST(PipelineSchedule, SimulatedBubbleIsTheTheoreticalOne) {
  // With every chunk's forward costing 1 and backward 2, 1F1B's and the interleaved schedule's
  // bubbles are exactly (P - 1) / (V M + P - 1).
  for (auto [kind, P, M, V] : std::vector<std::tuple<PipelineScheduleKind, int, int, int>>{
           {PipelineScheduleKind::OneFOneB, 2, 4, 1},
           {PipelineScheduleKind::OneFOneB, 2, 8, 1},
           {PipelineScheduleKind::OneFOneB, 5, 5, 1},
           {PipelineScheduleKind::OneFOneB, 5, 16, 1},
           {PipelineScheduleKind::Interleaved, 2, 8, 2},
           {PipelineScheduleKind::Interleaved, 4, 8, 2},
           {PipelineScheduleKind::Interleaved, 5, 10, 3}}) {
    const PipelineShape sh{P, M, V};
    const ScheduleSimulation sim = simulate(all_stages(kind, sh), sh);
    ASSERT_FALSE(sim.deadlocked) << sim.why;
    EXPECT_NEAR(sim.bubble, theoretical_bubble(kind, sh), 1e-9) << schedule_name(kind) << " P" << P << " M" << M;
    EXPECT_NEAR(sim.makespan, 3.0 * (V * M + P - 1), 1e-9);
  }
}

TEST(PipelineSchedule, TheSimulatorFindsADeadlock) {
  // Every stage running all its backwards first can never start.
  const PipelineShape sh{2, 2, 1};
  std::vector<std::vector<PipeAction>> lists(2);
  for (auto& l : lists)
    l = {{PipeOp::Backward, 0, 0}, {PipeOp::Forward, 0, 0}, {PipeOp::Backward, 1, 0}, {PipeOp::Forward, 1, 0}};
  const ScheduleSimulation sim = simulate(lists, sh);
  EXPECT_TRUE(sim.deadlocked);
  EXPECT_NE(sim.why.find("stage 0 waits at its backward of micro-batch 0"), std::string::npos) << sim.why;
}

TEST(PipelineSchedule, ErrorsNameTheKeys) {
  auto message = [](PipelineScheduleKind k, PipelineShape sh) {
    try {
      check_schedule(k, sh);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(PipelineScheduleKind::Interleaved, {4, 6, 2}).find("gradient_accumulation_steps (6) must be a "
                                                                        "multiple of it"),
            std::string::npos);
  EXPECT_NE(message(PipelineScheduleKind::Interleaved, {4, 8, 1}).find("pipeline.virtual_stages >= 2"),
            std::string::npos);
  EXPECT_NE(message(PipelineScheduleKind::OneFOneB, {4, 8, 2}).find("pipeline.virtual_stages = 2 needs"),
            std::string::npos);
  EXPECT_NE(message(PipelineScheduleKind::OneFOneB, {4, 3, 1}).find("gradient_accumulation_steps (the micro-batches "
                                                                     "per step, 3) >= pipeline.stages (4)"),
            std::string::npos);
  EXPECT_NE(message(PipelineScheduleKind::ZeroBubbleH1, {4, 8, 2}).find("pipeline.virtual_stages = 2 needs "
                                                                         "pipeline.schedule = \"interleaved\" (zb-h1"),
            std::string::npos);
  EXPECT_NE(message(PipelineScheduleKind::ZeroBubbleH1, {4, 3, 1}).find("pipeline.schedule = \"zb-h1\" needs "
                                                                         "gradient_accumulation_steps (the micro-batches "
                                                                         "per step, 3) >= pipeline.stages (4)"),
            std::string::npos);
  EXPECT_THROW(schedule_kind_from("gpipe", "pipeline.schedule"), Error);
}

TEST(PipelineSchedule, ZeroBubbleH1PassesOrderAndMemory) {
  const auto kind = PipelineScheduleKind::ZeroBubbleH1;
  for (int P : {1, 2, 3, 4, 5, 8})
    for (int M : {1, 2, 3, 4, 5, 6, 8, 9, 16, 20}) {
      const PipelineShape sh{P, M, 1};
      if (M < P) {
        EXPECT_THROW(check_schedule(kind, sh), Error);
        continue;
      }
      const auto lists = all_stages(kind, sh);
      for (int s = 0; s < P; ++s) {
        std::set<std::tuple<int, int, int>> seen;
        int forwards = 0, backwards = 0, weights = 0;
        for (const PipeAction& a : lists[size_t(s)]) {
          EXPECT_EQ(a.chunk, 0);
          EXPECT_TRUE(seen.insert({int(a.op), a.micro, a.chunk}).second) << "a pass twice";
          if (a.op == PipeOp::Backward) EXPECT_TRUE(seen.count({int(PipeOp::Forward), a.micro, 0})) << "B before F";
          if (a.op == PipeOp::BackwardWeight)
            EXPECT_TRUE(seen.count({int(PipeOp::Backward), a.micro, 0})) << "W before B";
          forwards += a.op == PipeOp::Forward;
          backwards += a.op == PipeOp::Backward;
          weights += a.op == PipeOp::BackwardWeight;
          // When a forward adds a micro-batch's activations: at most s W pending (never more than
          // P - 1), at most 1F1B's P - s between F and B, and in all no more micro-batches alive
          // than stage 0 of 1F1B holds (P). (A W runs right after the B that makes s + 1 pending.)
          if (a.op == PipeOp::Forward) {
            EXPECT_LE(backwards - weights, s);
            EXPECT_LE(backwards - weights, P - 1);
            EXPECT_LE(forwards - backwards, P - s);
            EXPECT_LE(forwards - weights, P);
          }
          EXPECT_LE(backwards - weights, s + 1) << "a pending W beyond the lag";
        }
        EXPECT_EQ(seen.size(), size_t(3 * M)) << "P" << P << " M" << M << " stage " << s;
      }
      const ScheduleSimulation sim = simulate(lists, sh, PassCosts{});
      ASSERT_FALSE(sim.deadlocked) << "P" << P << " M" << M << ": " << sim.why;
      // With F = B = W the simulated bubble is the paper's, and below 1F1B's (P > 1).
      EXPECT_NEAR(sim.bubble, theoretical_bubble(kind, sh), 1e-9) << "P" << P << " M" << M;
      EXPECT_NEAR(sim.makespan, 3.0 * M + P - 1, 1e-9) << "P" << P << " M" << M;
      const ScheduleSimulation one = simulate(all_stages(PipelineScheduleKind::OneFOneB, sh), sh, PassCosts{});
      if (P > 1) {
        EXPECT_LT(sim.bubble, one.bubble) << "P" << P << " M" << M;
        EXPECT_LT(theoretical_bubble(kind, sh), theoretical_bubble(PipelineScheduleKind::OneFOneB, sh));
      }
      // The ZB cost model's 1F1B (B + W = 2 F) is the usual one.
      EXPECT_NEAR(one.bubble, theoretical_bubble(PipelineScheduleKind::OneFOneB, sh), 1e-9);
    }
}

TEST(PipelineSchedule, ZeroBubbleH1FirstAndLastStage) {
  const PipelineShape sh{3, 4, 1};
  using A = PipeAction;
  const PipeOp F = PipeOp::Forward, B = PipeOp::Backward, W = PipeOp::BackwardWeight;
  // Stage 0: 1F1B's warm-up, each W right after its B.
  EXPECT_EQ(stage_schedule(PipelineScheduleKind::ZeroBubbleH1, sh, 0),
            (std::vector<A>{{F, 0, 0}, {F, 1, 0}, {F, 2, 0}, {B, 0, 0}, {W, 0, 0}, {F, 3, 0}, {B, 1, 0}, {W, 1, 0},
                            {B, 2, 0}, {W, 2, 0}, {B, 3, 0}, {W, 3, 0}}));
  // The last stage: F B alternate, two W pending, the rest after the last B.
  EXPECT_EQ(stage_schedule(PipelineScheduleKind::ZeroBubbleH1, sh, 2),
            (std::vector<A>{{F, 0, 0}, {B, 0, 0}, {F, 1, 0}, {B, 1, 0}, {F, 2, 0}, {B, 2, 0}, {W, 0, 0}, {F, 3, 0},
                            {B, 3, 0}, {W, 1, 0}, {W, 2, 0}, {W, 3, 0}}));
  // Other costs: a weight pass cheaper than B still leaves less bubble than 1F1B.
  const PipelineShape p5{5, 10, 1};
  const PassCosts costs{1.0, 1.2, 0.8};
  EXPECT_LT(simulate(all_stages(PipelineScheduleKind::ZeroBubbleH1, p5), p5, costs).bubble,
            simulate(all_stages(PipelineScheduleKind::OneFOneB, p5), p5, costs).bubble);
  EXPECT_EQ(schedule_kind_from("zb-h1", "pipeline.schedule"), PipelineScheduleKind::ZeroBubbleH1);
  EXPECT_STREQ(schedule_name(PipelineScheduleKind::ZeroBubbleH1), "zb-h1");
}

// The activations a stage holds: 1F1B's stage s keeps P - s micro-batches between forward and
// backward, ZB-H1's every stage P (its pending W passes included), interleaved its warm-up's
// (P - s - 1) x 2 + (V - 1) x P forwards and one more, each chunk's own bytes.
TEST(PipelineSchedule, PeakInFlightBytesFollowTheSchedule) {
  for (int P : {2, 3, 5})
    for (int M : {5, 10}) {
      const PipelineShape sh{P, M, 1};
      for (int s = 0; s < P; ++s) {
        EXPECT_DOUBLE_EQ(peak_in_flight_bytes(stage_schedule(PipelineScheduleKind::OneFOneB, sh, s), {3.0}),
                         3.0 * (P - s)) << "1F1B P" << P << " M" << M << " stage " << s;
        EXPECT_DOUBLE_EQ(peak_in_flight_bytes(stage_schedule(PipelineScheduleKind::ZeroBubbleH1, sh, s), {3.0}),
                         3.0 * P) << "ZB-H1 P" << P << " M" << M << " stage " << s;
      }
      const PipelineShape il{P, 2 * P, 2};
      for (int s = 0; s < P; ++s) {
        const std::vector<PipeAction> list = stage_schedule(PipelineScheduleKind::Interleaved, il, s);
        const int passes = std::min(2 * 2 * P, (P - s - 1) * 2 + P + 1);
        EXPECT_DOUBLE_EQ(peak_in_flight_bytes(list, {1.0, 1.0}), double(passes)) << "interleaved P" << P << " stage " << s;
        // Chunk 1's micro-batches weigh 100: the peak counts which chunks are in flight.
        const double weighted = peak_in_flight_bytes(list, {1.0, 100.0});
        EXPECT_GT(weighted, double(passes)) << "interleaved P" << P << " stage " << s;
        EXPECT_LE(weighted, 100.0 * passes);
      }
    }
}

TEST(PipelinePartition, UniformBalancedAndExplicit) {
  EXPECT_EQ(uniform_partition(10, 4), (std::vector<int64_t>{0, 3, 6, 8, 10}));
  // Equal layers, a heavy head: the last chunk gets fewer layers.
  LayerCosts c{std::vector<double>(8, 1.0), 0.0, 3.0};
  EXPECT_EQ(balanced_partition(c, 2), (std::vector<int64_t>{0, 5, 8}));
  // A heavy embedding: the first chunk gets fewer.
  c = {std::vector<double>(6, 1.0), 4.0, 0.0};
  EXPECT_EQ(balanced_partition(c, 2), (std::vector<int64_t>{0, 1, 6}));
  // Uneven layers: the least costly costliest chunk is 4; of the cuts that reach it
  // (3 | 1 1 1 | 3 1 and 3 1 | 1 1 | 3 1) the earliest.
  c = {{3, 1, 1, 1, 3, 1}, 0.0, 0.0};
  EXPECT_EQ(balanced_partition(c, 3), (std::vector<int64_t>{0, 1, 4, 6}));
  EXPECT_EQ(explicit_partition({2, 5}, 8, 3), (std::vector<int64_t>{0, 2, 5, 8}));
  EXPECT_EQ(partition_str({0, 2, 5, 8}), "layers [0, 2) | [2, 5) | [5, 8)");
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([] { uniform_partition(3, 4); }).find("4 model chunks, but the model has 3 layers"),
            std::string::npos);
  EXPECT_NE(message([] { explicit_partition({5, 5}, 8, 3); }).find("layer 5 cannot start a chunk"), std::string::npos);
  EXPECT_NE(message([] { explicit_partition({5}, 8, 3); }).find("lists 1 layer boundaries; 3 model chunks need 2"),
            std::string::npos);
}
