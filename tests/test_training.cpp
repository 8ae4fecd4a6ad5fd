// The training loop end to end on the CPU: a tiny model overfits one batch, fp16 loss scaling skips
// overflowing steps and recovers, bad configurations are errors naming the key.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "comm/bootstrap.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/train_config.h"
#include "runtime/lm_training.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

static std::string token_file(const std::string& name, int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint64_t(vocab));
  fs::path p = fs::temp_directory_path() / name;
  io::write_token_file(p.string(), t, vocab);
  return p.string();
}

// MPI can be initialised once per process: one Runtime for every test in this binary.
static comm::Runtime& runtime() {
  static comm::Runtime rt;
  return rt;
}

static io::Config tiny_config(const std::string& data, const std::string& model_type = "llama") {
  io::json model = model_type == "gpt2"
                       ? io::json{{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_positions", 32}, {"n_embd", 32},
                                  {"n_layer", 2}, {"n_head", 2}}
                       : io::json{{"model_type", "llama"}, {"vocab_size", 70}, {"hidden_size", 32},
                                  {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2}, {"max_position_embeddings", 32}};
  io::json user = {{"train_micro_batch_size_per_gpu", 4},
                   {"steps_per_print", 1000},
                   {"gradient_clipping", 1.0},
                   {"optimizer", {{"params", {{"lr", 1e-2}, {"weight_decay", 0.0}}}}},
                   {"scheduler", {{"type", "WarmupLR"}}},
                   {"model", {{"config", model}}},
                   {"data", {{"train_files", {data}}, {"seq_len", 16}}},
                   {"training", {{"max_steps", 60}, {"device", "cpu"}}}};
  return io::Config(train_config_schema(), user, "test");
}

TEST(Training, TinyModelOverfitsOneBatch) {
  std::string data = token_file("zp_overfit.bin", 4 * 16 + 1, 64, 1);  // exactly one batch of 4 windows
  for (const char* type : {"llama", "gpt2"}) {
    io::Config c = tiny_config(data, type);
    TrainResult r = train(TrainConfig::from(c), runtime());
    ASSERT_EQ(r.losses.size(), 60u);
    EXPECT_GT(r.losses.front(), 3.5) << type << ": starts near log(vocabulary) >= 4.2";
    EXPECT_LT(r.losses.back(), 0.1) << type << ": memorises the batch";
  }
}

// The HF Trainer's ds_config_zero2.json ("auto" everywhere, ZeRO-2 with the optimizer on the CPU)
// trains as it is once the micro-batch is given, with DeepSpeed's learning rates update for update,
// and csv_monitor writes DeepSpeed's files with the samples as the step.
TEST(Training, HfZero2ConfigTrainsAndWritesDeepSpeedsCsv) {
  const std::string data = token_file("zp_hf_zero2.bin", 4 * 16 + 1, 64, 4);
  const fs::path csv = fs::temp_directory_path() / "zp_hf_zero2_csv";
  fs::remove_all(csv);
  io::Config c = io::Config::from_file(train_config_schema(), std::string(ZP_DEEPSPEED_CONFIGS) + "/hf_ds_config_zero2.json");
  c.set("model.config=" + tiny_config(data).at("model.config").dump());
  for (const std::string& s : {"data.train_files=[\"" + data + "\"]", std::string("data.seq_len=16"),
                               std::string("train_micro_batch_size_per_gpu=2"), std::string("training.max_steps=4"),
                               std::string("training.device=cpu"), std::string("scheduler.params.warmup_num_steps=4"),
                               std::string("csv_monitor.enabled=true"), "csv_monitor.output_path=" + csv.string(),
                               std::string("csv_monitor.job_name=run")})
    c.set(s);
  const TrainConfig cfg = TrainConfig::from(c);
  const TrainResult r = train(cfg, runtime());
  ASSERT_EQ(r.losses.size(), 4u);
  std::ifstream in(csv / "run" / "Train_Samples_lr.csv");
  std::string header;
  ASSERT_TRUE(std::getline(in, header));
  EXPECT_EQ(header, "step,lr");
  // WarmupLR from "auto": 0 -> 6e-4 (our lr) over 4 iterations, linear; update k at iteration k - 1.
  const double expected[] = {0.0, 0.0, 1.5e-4, 3e-4};
  for (int k = 0; k < 4; ++k) {
    std::string row;
    ASSERT_TRUE(std::getline(in, row)) << k;
    const size_t comma = row.find(',');
    EXPECT_EQ(row.substr(0, comma), std::to_string(2 * (k + 1))) << "samples after update " << k;
    EXPECT_NEAR(std::stod(row.substr(comma + 1)), expected[k], 1e-12) << row;
  }
  EXPECT_TRUE(fs::exists(csv / "run" / "Train_Samples_train_loss.csv"));
  EXPECT_FALSE(fs::exists(csv / "run" / "Train_Samples_loss_scale.csv")) << "fp32 on the CPU: no loss scale";
}

// The metrics JSONL that `zeropipe report` reads: a start event with the configuration, the
// banner and the rank's start line, every step's time breakdown (data, forward, backward, update,
// communication busy per collective kind and exposed), an event per checkpoint with its bytes and
// GB/s, and the run's summary (steps, tokens, best validation loss and its step, last checkpoint).
TEST(Training, MetricsHaveTheStepBreakdownAndEvents) {
  const std::string data = token_file("zp_metrics.bin", 16 * 16 + 1, 64, 5);
  const fs::path dir = fs::temp_directory_path() / "zp_metrics_events";
  fs::remove_all(dir);
  io::Config c = tiny_config(data);
  for (const std::string& s : {std::string("training.max_steps=4"), "training.metrics_file=" + (dir / "m.jsonl").string(),
                               std::string("wall_clock_breakdown=true"), "checkpoint.dir=" + (dir / "ck").string(),
                               std::string("checkpoint.save_every=2"), std::string("data.val_fraction=0.25"),
                               std::string("training.eval_every=2"), std::string("training.eval_batches=1")})
    c.set(s);
  const TrainResult r = train(TrainConfig::from(c), runtime());
  ASSERT_EQ(r.saved.size(), 2u);
  ASSERT_EQ(r.val_losses.size(), 2u);
  std::ifstream in(dir / "m.jsonl");
  std::vector<io::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(io::json::parse(line));
  ASSERT_EQ(lines.size(), 1u + 4u + 2u + 1u) << "a start event, 4 steps, 2 checkpoints, the summary";
  EXPECT_EQ(lines[0].at("event"), "start");
  EXPECT_EQ(lines[0].at("config").at("training").at("max_steps"), 4);
  ASSERT_EQ(lines[0].at("banner").size(), 4u);
  EXPECT_NE(lines[0].at("banner")[0].get<std::string>().find("ZeRO stage"), std::string::npos);
  const std::string rank_line = lines[0].at("rank_line");
  EXPECT_EQ(rank_line.rfind("rank 0/1: host ", 0), 0u) << rank_line;
  for (const char* part : {", cpu, NUMA node ", " | per rank: device ", " GB, host ", " GB, NVMe 0.00 GB"})
    EXPECT_NE(rank_line.find(part), std::string::npos) << part << " in " << rank_line;

  const io::json& summary = lines.back();
  ASSERT_EQ(summary.at("event"), "summary");
  EXPECT_EQ(summary.at("steps"), 4);
  EXPECT_EQ(summary.at("first_step"), 1);
  EXPECT_EQ(summary.at("last_step"), 4);
  EXPECT_EQ(summary.at("tokens").get<double>(), 4.0 * 4 * 16) << "4 steps of 4 windows of 16 tokens";
  const double best = std::min(r.val_losses[0], r.val_losses[1]);
  EXPECT_DOUBLE_EQ(summary.at("best_val_loss").get<double>(), best);
  EXPECT_EQ(summary.at("best_val_step"), best == r.val_losses[0] ? 2 : 4);
  EXPECT_EQ(summary.at("checkpoint"), r.saved.back());
  EXPECT_GE(summary.at("wall_s").get<double>(), summary.at("steps_s").get<double>()) << "start-up included";
  EXPECT_GT(summary.at("mean_tokens_per_s").get<double>(), 0.0);

  int steps = 0, checkpoints = 0;
  double data_ms = 0, forward_ms = 0;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    const io::json& j = lines[i];
    if (j.contains("event")) {
      EXPECT_EQ(j.at("event"), "checkpoint");
      const std::string path = r.saved.at(size_t(checkpoints++));
      EXPECT_EQ(j.at("path"), path);
      EXPECT_EQ(j.at("bytes").get<int64_t>(), int64_t(fs::file_size(path)));
      EXPECT_GT(j.at("gb_per_s").get<double>(), 0.0);
      continue;
    }
    ++steps;
    const io::json& b = j.at("breakdown");
    EXPECT_GT(b.at("forward_backward_ms").get<double>(), 0.0) << j.dump();
    EXPECT_GT(b.at("optimizer_ms").get<double>(), 0.0) << j.dump();
    EXPECT_GE(b.at("comm_busy_ms").get<double>(), 0.0) << j.dump();
    EXPECT_LE(b.at("data_ms").get<double>() + b.at("forward_backward_ms").get<double>() + b.at("optimizer_ms").get<double>(),
              j.at("step_ms").get<double>() * 1.001 + 1e-3)
        << "the phases fit in the step: " << j.dump();
    data_ms += b.at("data_ms").get<double>();
    // The forward and backward split the phase; the per-kind busy times split the busy total.
    const double fb = b.at("forward_backward_ms").get<double>();
    EXPECT_GE(b.at("backward_ms").get<double>(), 0.0) << j.dump();
    EXPECT_NEAR(b.at("forward_ms").get<double>() + b.at("backward_ms").get<double>(), fb, 1e-9 * fb) << j.dump();
    forward_ms += b.at("forward_ms").get<double>();
    double by_kind = 0;
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"})
      by_kind += b.at("comm_busy_by_kind_ms").at(kind).get<double>();
    EXPECT_NEAR(by_kind, b.at("comm_busy_ms").get<double>(), 1e-9) << j.dump();
    // On the CPU every collective runs on the host, which waits for it: all of it is exposed.
    EXPECT_NEAR(b.at("exposed_comm_ms").get<double>(), b.at("comm_busy_ms").get<double>(), 1e-9) << j.dump();
  }
  EXPECT_GT(forward_ms, 0.0) << "the forwards take some time";

  // Resumed from the first checkpoint, the run appends its load to the file: seconds, bytes, GB/s.
  TrainConfig again = TrainConfig::from(c);
  again.resume = r.saved.front();
  const TrainResult resumed = train(again, runtime());
  ASSERT_EQ(resumed.first_step, 2);
  std::ifstream in2(dir / "m.jsonl");
  std::vector<io::json> all;
  for (std::string line; std::getline(in2, line);) all.push_back(io::json::parse(line));
  ASSERT_GT(all.size(), lines.size() + 1);
  EXPECT_EQ(all[lines.size()].at("event"), "start");
  const io::json& load = all[lines.size() + 1];
  ASSERT_EQ(load.at("event"), "checkpoint_load") << load.dump();
  EXPECT_EQ(load.at("step"), 2);
  EXPECT_EQ(load.at("path"), r.saved.front());
  EXPECT_EQ(load.at("bytes").get<int64_t>(), int64_t(fs::file_size(r.saved.front())));
  EXPECT_GT(load.at("gb_per_s").get<double>(), 0.0);
  EXPECT_EQ(all.back().at("event"), "summary");
  EXPECT_EQ(all.back().at("first_step"), 3);
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(checkpoints, 2);
  EXPECT_GT(data_ms, 0.0) << "reading the batches takes some time";
}

TEST(Training, Fp16LossScalingSkipsOverflowAndRecovers) {
  std::string data = token_file("zp_fp16.bin", 4 * 16 + 1, 64, 2);
  io::Config c = tiny_config(data);
  c.set("fp16.enabled=true");
  c.set("fp16.initial_scale_power=40");  // far beyond fp16's range: the first steps overflow
  c.set("fp16.hysteresis=1");
  c.set("training.max_steps=40");
  TrainResult r = train(TrainConfig::from(c), runtime());
  EXPECT_GE(r.skipped_steps, 20) << "2^40 must be halved at least 20 times before the gradients fit";
  EXPECT_LT(r.skipped_steps, 40);
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << "training recovers once the scale fits";
}

TEST(LossScaler, HalvesAfterHysteresisAndGrowsAfterWindow) {
  LossScaler s(true, 1024, 1, 3, 2);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);  // first overflow is absorbed by the hysteresis
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped(), 2);
}

TEST(TrainConfig, ErrorsNameTheKey) {
  std::string data = token_file("zp_cfg.bin", 200, 64, 3);
  auto error = [&](const std::string& set) {
    try {
      io::Config c = tiny_config(data);
      c.set(set);
      TrainConfig::from(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("zero_optimization.stage=7").find("zero_optimization.stage"), std::string::npos);
  EXPECT_NE(error("optimizer.params.betas=[0.9]").find("optimizer.params.betas"), std::string::npos);
  EXPECT_NE(error("scheduler.type=OneCycle").find("scheduler.type"), std::string::npos);
  EXPECT_NE(error("optimizer.params.lr=\"fast\"").find("optimizer.params.lr"), std::string::npos);
  EXPECT_NE(error("data.seq_len=0").find("data.seq_len"), std::string::npos);
  EXPECT_NE(error("training.devise=cpu").find("unknown key 'training.devise'"), std::string::npos);
  io::Config both = tiny_config(data);
  both.set("bf16.enabled=true");
  both.set("fp16.enabled=true");
  EXPECT_THROW(TrainConfig::from(both), Error);
  // The optimizer in the backward needs transient gradient buffers (stage 2/3) and cannot clip or
  // skip an fp16 overflow, since each block is updated before the global norm is known.
  auto in_backward_error = [&](std::vector<std::string> sets) {
    io::Config c = tiny_config(data);
    c.set("optimizer.step_in_backward=true");
    for (const auto& s : sets) c.set(s);
    try {
      TrainConfig::from(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(in_backward_error({"zero_optimization.stage=1", "gradient_clipping=0"}).find("zero_optimization.stage"),
            std::string::npos);
  EXPECT_NE(in_backward_error({"zero_optimization.stage=2", "gradient_clipping=1"}).find("gradient_clipping"),
            std::string::npos);
  EXPECT_NE(in_backward_error({"zero_optimization.stage=3", "gradient_clipping=0", "fp16.enabled=true"}).find("fp16"),
            std::string::npos);
  EXPECT_EQ(in_backward_error({"zero_optimization.stage=3", "gradient_clipping=0"}), "");
}

}  // namespace zp::test
