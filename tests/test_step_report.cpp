// StepReporter's start line and final summary, without a training run: the line's fields, the
// summary's best validation loss and step, its throughput, and the `summary` event.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/step_report.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

TEST(StepReport, RankStartLineNamesHostDeviceNumaAndTiers) {
  EXPECT_EQ(rank_start_line(1, 2, "n1", "cuda:1 (NVIDIA H100 80GB HBM3)", 0, 12.3e9, 4.5e9, 0),
            "rank 1/2: host n1, cuda:1 (NVIDIA H100 80GB HBM3), NUMA node 0 | per rank: device 12.30 GB, host 4.50 GB, "
            "NVMe 0.00 GB");
  EXPECT_NE(rank_start_line(0, 1, "h", "cpu", -1, 0, 1e9, 2e9).find("NUMA node -1 | per rank: device 0.00 GB, host "
                                                                     "1.00 GB, NVMe 2.00 GB"),
            std::string::npos);
}

TEST(StepReport, SummaryHasStepsItemsBestValidationAndCheckpoint) {
  const fs::path file = fs::temp_directory_path() / "zp_summary.jsonl";
  fs::remove(file);
  {
    // 512 tokens a step; steps 3..6 of 10 (a resumed run), validation after steps 4 and 6.
    StepReporter rep(file.string(), 0, 1, Device::cpu(), "tok", 512, 0.0, 10, 1000, false);
    rep.report(3, 4.0, 1e-3, 1.0, 0.5, false, 1.f, NAN);
    rep.report(4, 3.0, 1e-3, 1.0, 0.5, false, 1.f, 3.5);
    rep.report(5, 2.5, 1e-3, 1.0, 0.5, false, 1.f, NAN);
    rep.report(6, 2.0, 1e-3, 1.0, 0.5, false, 1.f, 3.7);
    EXPECT_EQ(rep.summary(10.0, "/ck/step-6.h5"),
              "run done: 4 steps (3..6 of 10), 2048 tok in 10.0 s (mean 1024.0 tok/s over the steps), best val loss "
              "3.5000 at step 4, checkpoint /ck/step-6.h5");
  }
  std::ifstream in(file);
  std::string last;
  for (std::string l; std::getline(in, l);) last = l;
  const nlohmann::json j = nlohmann::json::parse(last);
  EXPECT_EQ(j.at("event"), "summary");
  EXPECT_EQ(j.at("steps"), 4);
  EXPECT_EQ(j.at("tokens").get<double>(), 2048.0);
  EXPECT_DOUBLE_EQ(j.at("mean_tokens_per_s").get<double>(), 1024.0);
  EXPECT_DOUBLE_EQ(j.at("best_val_loss").get<double>(), 3.5);
  EXPECT_EQ(j.at("best_val_step"), 4);
  EXPECT_EQ(j.at("checkpoint"), "/ck/step-6.h5");
  fs::remove(file);

  StepReporter none("", 0, 1, Device::cpu(), "samples", 8, 0.0, 2, 1000, false);
  none.report(1, 1.0, 1e-3, 1.0, 2.0, false, 1.f, NAN);
  EXPECT_EQ(none.summary(3.0, ""),
            "run done: 1 step (1..1 of 2), 8 samples in 3.0 s (mean 4.0 samples/s over the steps), no validation, no "
            "checkpoint");
}

// Instruction rows are partly padding: with the step's real tokens given, the rate, MFU and the
// summary count those, and the metrics keep the padded count beside them.
TEST(StepReport, ThroughputCountsTheRealTokensOfPaddedRows) {
  const fs::path file = fs::temp_directory_path() / "zp_real_tokens.jsonl";
  fs::remove(file);
  std::string summary;
  {
    // 512 padded tokens a step of which 200, then 300, are real; 1 MFLOP a token on a CPU (no MFU).
    StepReporter rep(file.string(), 0, 1, Device::cpu(), "tok", 512, 1e6, 2, 1000, false);
    rep.set_step_items(200);
    rep.report(1, 4.0, 1e-3, 1.0, 0.5, false, 1.f, NAN);
    rep.set_step_items(300);
    rep.report(2, 3.0, 1e-3, 1.0, 0.5, false, 1.f, NAN);
    summary = rep.summary(2.0, "");
  }
  EXPECT_NE(summary.find("500 tok in 2.0 s (mean 500.0 tok/s"), std::string::npos) << summary;
  std::ifstream in(file);
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_DOUBLE_EQ(lines[0].at("tokens_per_s").get<double>(), 400.0);
  EXPECT_EQ(lines[0].at("tokens"), 200);
  EXPECT_EQ(lines[0].at("padded_tokens"), 512);
  EXPECT_DOUBLE_EQ(lines[0].at("padded_tokens_per_s").get<double>(), 1024.0);
  EXPECT_DOUBLE_EQ(lines[1].at("tokens_per_s").get<double>(), 600.0);
  EXPECT_EQ(lines[2].at("tokens").get<double>(), 500.0);
  EXPECT_EQ(lines[2].at("padded_tokens").get<double>(), 1024.0);
  fs::remove(file);
}

}  // namespace zp::test
