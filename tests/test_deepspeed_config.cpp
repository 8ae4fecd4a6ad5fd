// DeepSpeed configurations as users bring them (issue 15 item 1): the HF Trainer's examples full of
// "auto" and configs written from DeepSpeed's reference, each with its expected handling (resolved
// values, the warnings, the errors naming keys); the key table against the schema, DeepSpeed's
// documented keys and configs/README.md; the batch keys inferred as DeepSpeed infers them; the
// learning-rate schedules against values worked out by hand from DeepSpeed's formulas; csv_monitor.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "io/config.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "runtime/csv_monitor.h"
#include "runtime/deepspeed_keys.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_step.h"
#include "runtime/train_config.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
namespace {
using io::json;
using runtime::DeepSpeedKey;
using runtime::KeyHandling;
using runtime::LrSchedule;
using runtime::TrainConfig;
namespace fs = std::filesystem;

const std::string kConfigs = ZP_DEEPSPEED_CONFIGS;

// A DeepSpeed file as a user runs it: `zeropipe train --config F --set ...` with our own sections
// (model, data) added on the command line.
io::Config deepspeed_file(const std::string& name, const std::vector<std::string>& sets = {}) {
  io::Config c = io::Config::from_file(runtime::train_config_schema(), kConfigs + "/" + name,
                                       io::Config::OnProblem::Keep);
  c.set("model.config=" + tiny_llama().dump());
  c.set(R"(data.train_files=["unused.bin"])");
  for (const std::string& s : sets) c.set(s);
  return c;
}

size_t count_containing(const std::vector<std::string>& lines, const std::string& fragment) {
  return size_t(std::count_if(lines.begin(), lines.end(),
                              [&](const std::string& l) { return l.find(fragment) != std::string::npos; }));
}

TEST(DeepSpeedConfig, HfZero2ExampleNeedsTheMicroBatchAndResolvesEveryOtherAuto) {
  // The HF Trainer fills train_micro_batch_size_per_gpu from --per_device_train_batch_size; zeropipe
  // has nothing to take it from, so the error names the key to set.
  expect_error([] { TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json")); },
               {"train_micro_batch_size_per_gpu", "auto", "cannot be resolved"});

  const TrainConfig t = TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json", {"train_micro_batch_size_per_gpu=4"}));
  const json& schema = runtime::train_config_schema();
  EXPECT_EQ(t.micro_batch, 4);
  EXPECT_EQ(t.grad_accum, 1);        // "auto" with no train_batch_size: DeepSpeed's and zeropipe's default
  EXPECT_EQ(t.train_batch_size, 0);  // micro x accumulation x data-parallel size, known when placed
  EXPECT_DOUBLE_EQ(t.lr, schema["optimizer"]["params"]["lr"].get<double>());
  EXPECT_DOUBLE_EQ(t.beta1, 0.9);
  EXPECT_DOUBLE_EQ(t.beta2, 0.95);
  EXPECT_DOUBLE_EQ(t.eps, 1e-8);
  EXPECT_DOUBLE_EQ(t.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(t.grad_clip, 1.0);
  EXPECT_EQ(t.schedule.type, "WarmupLR");
  EXPECT_DOUBLE_EQ(t.schedule.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(t.schedule.warmup_max_lr, t.lr);
  EXPECT_EQ(t.schedule.warmup_steps, 0);
  EXPECT_EQ(t.print_every, 2000);  // steps_per_print
  EXPECT_TRUE(t.bf16_auto && t.fp16_auto);
  EXPECT_EQ(t.zero_stage, 2);
  EXPECT_EQ(t.offload_optimizer, "cpu");
  // Warned once each: the two bucket sizes (2e8, not DeepSpeed's 5e8); the rest of the file holds
  // DeepSpeed's defaults or "auto", which ask for nothing.
  EXPECT_EQ(t.warnings.size(), 2u) << ::testing::PrintToString(t.warnings);
  EXPECT_EQ(count_containing(t.warnings, "zero_optimization.allgather_bucket_size"), 1u);
  EXPECT_EQ(count_containing(t.warnings, "zero_optimization.reduce_bucket_size"), 1u);
}

TEST(DeepSpeedConfig, HfZero3ExamplePlacedOnTwoCpuRanks) {
  const TrainConfig given = TrainConfig::from(
      deepspeed_file("hf_ds_config_zero3.json", {"train_micro_batch_size_per_gpu=2", "training.max_steps=50"}));
  EXPECT_EQ(given.zero_stage, 3);
  EXPECT_EQ(given.offload_param, "cpu");
  EXPECT_EQ(count_containing(given.warnings, "stage3_gather_16bit_weights_on_model_save"), 1u);
  EXPECT_EQ(count_containing(given.warnings, "sub_group_size"), 0u) << "1e9 is DeepSpeed's default";
  EXPECT_EQ(count_containing(given.warnings, "stage3_prefetch_bucket_size"), 0u) << "\"auto\" asks for nothing";
  const TrainConfig placed = given.resolve_for_place(2, 2, Device::cpu());
  EXPECT_EQ(placed.train_batch_size, 4);  // 2 x 1 x 2
  EXPECT_EQ(placed.dtype, DType::F32);    // "auto" precision on the CPU
  EXPECT_FALSE(placed.fp16);
}

TEST(DeepSpeedConfig, DocsAdamExampleInfersTheMicroBatchFromTheWorld) {
  const TrainConfig t = TrainConfig::from(deepspeed_file("docs_adam_warmuplr_fp16.json"));
  EXPECT_EQ(t.train_batch_size, 32);
  EXPECT_EQ(t.grad_accum, 2);
  EXPECT_EQ(t.micro_batch, 0);  // inferred when placed
  EXPECT_TRUE(t.fp16);
  EXPECT_EQ(t.dtype, DType::F16);
  EXPECT_DOUBLE_EQ(t.initial_scale, 65536);
  EXPECT_EQ(t.scale_window, 1000);
  EXPECT_EQ(t.hysteresis, 2);
  EXPECT_DOUBLE_EQ(t.min_scale, 1);
  EXPECT_DOUBLE_EQ(t.beta1, 0.8);
  EXPECT_DOUBLE_EQ(t.beta2, 0.999);
  EXPECT_DOUBLE_EQ(t.weight_decay, 3e-7);
  EXPECT_EQ(t.schedule.warmup_steps, 1000);
  EXPECT_EQ(t.print_every, 10);
  EXPECT_EQ(t.csv_monitor_dir, (fs::path("output/ds_logs/") / "train_bert").string());
  EXPECT_EQ(count_containing(t.warnings, "tensorboard"), 1u);
  EXPECT_FALSE(t.consecutive_hysteresis);
  EXPECT_EQ(count_containing(t.warnings, "fp16"), 0u) << "every fp16 key of the example is honoured";
  EXPECT_EQ(count_containing(t.warnings, "activation_checkpointing"), 1u) << "the section tunes checkpointing, which is off";
  EXPECT_EQ(count_containing(t.warnings, "overlap_comm"), 0u) << "honoured, not warned";

  EXPECT_EQ(t.resolve_for_place(4, 4, Device::cpu()).micro_batch, 4);  // 32 / (2 x 4)
  EXPECT_EQ(t.resolve_for_place(16, 16, Device::cpu()).micro_batch, 1);
  expect_error([&] { t.resolve_for_place(3, 3, Device::cpu()); },
               {"train_batch_size 32", "gradient_accumulation_steps 2", "data-parallel size 3",
                "train_micro_batch_size_per_gpu cannot be inferred"});
}

TEST(DeepSpeedConfig, Fp16FixedLossScaleNeitherGrowsNorHalves) {
  const TrainConfig t = TrainConfig::from(deepspeed_file("docs_adam_warmuplr_fp16.json", {"fp16.loss_scale=128"}));
  EXPECT_DOUBLE_EQ(t.initial_scale, 128);
  EXPECT_DOUBLE_EQ(t.min_scale, 128);  // its own floor: an overflow skips the step, the scale stays
  EXPECT_EQ(t.scale_window, INT64_MAX);
  const TrainConfig dynamic = TrainConfig::from(deepspeed_file(
      "docs_adam_warmuplr_fp16.json", {"fp16.initial_scale_power=12", "fp16.loss_scale_window=50",
                                       "fp16.hysteresis=3", "fp16.min_loss_scale=0.25"}));
  EXPECT_DOUBLE_EQ(dynamic.initial_scale, 4096);
  EXPECT_EQ(dynamic.scale_window, 50);
  EXPECT_EQ(dynamic.hysteresis, 3);
  EXPECT_DOUBLE_EQ(dynamic.min_scale, 0.25);
}

TEST(DeepSpeedConfig, RefusedFeaturesAreErrorsNamingEachKey) {
  const std::string m = error_message([] { TrainConfig::from(deepspeed_file("docs_refused_features.json")); });
  for (const char* key : {"sparse_attention", "zero_optimization.zero_quantized_weights",
                          "zero_optimization.zero_quantized_gradients", "optimizer.type", "OneBitAdam",
                          "activation_checkpointing.cpu_checkpointing", "checkpoint.use_node_local_storage"})
    EXPECT_NE(m.find(key), std::string::npos) << key << " in\n" << m;
  EXPECT_EQ(m.find("data_efficiency"), std::string::npos) << "a disabled section asks for nothing:\n" << m;
  EXPECT_EQ(m.find("flops_profiler"), std::string::npos) << m;
  EXPECT_EQ(m.find("zero_hpz_partition_size"), std::string::npos) << "warned, not refused:\n" << m;
}

TEST(DeepSpeedConfig, TrainBatchSizeIsCheckedAgainstMicroAccumulationAndDataParallelSize) {
  io::Config c = deepspeed_file("hf_ds_config_zero2.json",
                                {"train_batch_size=24", "train_micro_batch_size_per_gpu=4", "gradient_accumulation_steps=3"});
  const TrainConfig t = TrainConfig::from(c);
  EXPECT_EQ(t.resolve_for_place(2, 2, Device::cpu()).train_batch_size, 24);
  // 4 pipeline stages of 2 ranks: the data-parallel size is the world over the stages.
  TrainConfig piped = t;
  piped.pipeline_stages = 2;
  expect_error([&] { piped.resolve_for_place(1, 2, Device::cpu()); },
               {"train_batch_size 24 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 3 x "
                "data-parallel size 1", "world size 2", "pipeline.stages 2"});
  // Only train_batch_size: accumulation 1, the micro-batch inferred (DeepSpeed's rule).
  const TrainConfig only_total =
      TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json", {"train_batch_size=12"}));
  const TrainConfig placed = only_total.resolve_for_place(3, 3, Device::cpu());
  EXPECT_EQ(placed.micro_batch, 4);
  EXPECT_EQ(placed.grad_accum, 1);
  // train_batch_size and the micro-batch: the accumulation inferred.
  const TrainConfig accum = TrainConfig::from(
      deepspeed_file("hf_ds_config_zero2.json", {"train_batch_size=16", "train_micro_batch_size_per_gpu=2"}));
  EXPECT_EQ(accum.resolve_for_place(2, 2, Device::cpu()).grad_accum, 4);
}

TEST(DeepSpeedConfig, AutoInKeysWithNothingToResolveFromIsAnErrorNamingTheKey) {
  expect_error([] { TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json",
                                                     {"train_micro_batch_size_per_gpu=4", "fp16.min_loss_scale=auto"})); },
               {"fp16.min_loss_scale", "auto"});
  expect_error([] { TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json",
                                                     {"train_micro_batch_size_per_gpu=4", "pipeline.stages=auto"})); },
               {"pipeline.stages", "auto"});
  // total_num_steps "auto" is training.max_steps, as the HF Trainer takes its max_steps.
  const TrainConfig t = TrainConfig::from(deepspeed_file(
      "hf_ds_config_zero2.json", {"train_micro_batch_size_per_gpu=4", "scheduler.type=WarmupDecayLR",
                                  "scheduler.params.total_num_steps=auto", "training.max_steps=77"}));
  EXPECT_EQ(t.schedule.total_steps, 77);
}

TEST(DeepSpeedConfig, OptimizerAndSchedulerTypes) {
  auto with = [](std::vector<std::string> sets) {
    sets.push_back("train_micro_batch_size_per_gpu=1");
    return TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json", sets));
  };
  EXPECT_NO_THROW(with({"optimizer.type=adamw"}));  // DeepSpeed lowercases its optimizer names
  EXPECT_NO_THROW(with({"optimizer.type=Adam"}));
  expect_error([&] { with({"optimizer.type=Lamb"}); }, {"optimizer.type", "Lamb"});
  expect_error([&] { with({"optimizer.type=Adam", "optimizer.params.adam_w_mode=false"}); },
               {"optimizer.params.adam_w_mode"});
  expect_error([&] { with({"optimizer.params.amsgrad=true"}); }, {"optimizer.params.amsgrad"});
  expect_error([&] { with({"scheduler.type=OneCycle"}); }, {"cycle_min_lr"});
  const TrainConfig one = with({"scheduler.type=OneCycle", "scheduler.params.cycle_min_lr=1e-4",
                                "scheduler.params.cycle_max_lr=1e-3", "scheduler.params.cycle_momentum=false",
                                "scheduler.params.cycle_first_step_size=10"});
  EXPECT_EQ(one.schedule.type, "OneCycle");
  EXPECT_DOUBLE_EQ(one.schedule.cycle_second_step_size, 10);  // defaults to the first half's
  EXPECT_FALSE(one.schedule.betas_at(3)) << "cycle_momentum false: the configured betas";
  // DeepSpeed's default cycles the momentum, between its defaults 0.8 and 0.9.
  const std::vector<std::string> cycling = {"scheduler.type=OneCycle", "scheduler.params.cycle_min_lr=1e-4",
                                            "scheduler.params.cycle_max_lr=1e-3",
                                            "scheduler.params.cycle_first_step_size=10", "training.max_steps=100"};
  const TrainConfig mom = with(cycling);
  EXPECT_TRUE(mom.schedule.cycle_momentum);
  EXPECT_DOUBLE_EQ(mom.schedule.cycle_min_mom, 0.8);
  EXPECT_DOUBLE_EQ(mom.schedule.cycle_max_mom, 0.9);
  ASSERT_TRUE(mom.schedule.betas_at(0));
  EXPECT_DOUBLE_EQ(mom.schedule.betas_at(0)->beta1, 0.8);
  EXPECT_DOUBLE_EQ(mom.schedule.betas_at(10)->beta1, 0.8) << "the peak of the learning rate";
  auto plus = [&](std::vector<std::string> more) {
    more.insert(more.begin(), cycling.begin(), cycling.end());
    return more;
  };
  EXPECT_DOUBLE_EQ(with(plus({"scheduler.params.cycle_max_mom=0.95"})).schedule.betas_at(20)->beta1, 0.95);
  expect_error([&] { with(plus({"scheduler.params.cycle_max_mom=1.0"})); }, {"scheduler.params.cycle_max_mom"});
  // The last update (step 99, iteration 98): 0.9 x (1 + 0.01 x (98 - 20 + 1) / 10) = 0.971; 0.02 passes 1.
  EXPECT_NO_THROW(with(plus({"scheduler.params.decay_step_size=10", "scheduler.params.decay_mom_rate=0.01"})));
  expect_error([&] { with(plus({"scheduler.params.decay_step_size=10", "scheduler.params.decay_mom_rate=0.02"})); },
               {"scheduler.params.decay_mom_rate", "training.max_steps = 100"});
  expect_error([&] { with({"scheduler.type=CyclicLR"}); }, {"scheduler.type", "CyclicLR"});
  expect_error([&] { with({"scheduler.params.warmup_type=exp"}); }, {"scheduler.params.warmup_type"});
}

TEST(DeepSpeedConfig, AutoPrecisionFollowsTheDevice) {
  const TrainConfig t = TrainConfig::from(deepspeed_file("hf_ds_config_zero2.json", {"train_micro_batch_size_per_gpu=1"}));
  const TrainConfig cpu = t.resolve_for_place(1, 1, Device::cpu());
  EXPECT_EQ(cpu.dtype, DType::F32);
  EXPECT_FALSE(cpu.fp16);
  if (cuda_device_count() > 0) {
    const TrainConfig gpu = t.resolve_for_place(1, 1, Device::cuda(0));
    EXPECT_EQ(gpu.dtype, cuda_supports_bf16(0) ? DType::BF16 : DType::F16);
    EXPECT_EQ(gpu.fp16, !cuda_supports_bf16(0));
  }
  // An explicit choice is kept whatever the device.
  const TrainConfig fixed = TrainConfig::from(deepspeed_file(
      "hf_ds_config_zero2.json", {"train_micro_batch_size_per_gpu=1", "bf16.enabled=true", "fp16.enabled=false"}));
  EXPECT_EQ(fixed.resolve_for_place(1, 1, Device::cpu()).dtype, DType::BF16);
}

TEST(DeepSpeedKeys, EveryEntryIsASchemaKeyAndEveryWarnedDefaultAsksForNothing) {
  const json& schema = runtime::train_config_schema();
  std::set<std::string_view> seen;
  for (const DeepSpeedKey& k : runtime::deepspeed_keys()) {
    EXPECT_TRUE(seen.insert(k.path).second) << "listed twice: " << k.path;
    EXPECT_FALSE(k.meaning.empty()) << k.path;
    const json* at = &schema;
    std::stringstream path{std::string(k.path)};
    for (std::string part; std::getline(path, part, '.');) {
      ASSERT_TRUE(at->is_object() && at->contains(part)) << k.path << " is not in the schema";
      at = &(*at)[part];
    }
  }
  // The schema itself asks for nothing: the defaults produce no warning and no problem.
  io::Config plain(schema, json{{"model", {{"config", tiny_llama()}}}, {"data", {{"train_files", {"x.bin"}}}}}, "t.json");
  EXPECT_TRUE(TrainConfig::from(plain).warnings.empty());
}

TEST(DeepSpeedKeys, EveryDocumentedTopLevelAndZeroKeyIsClassified) {
  // The keys of DeepSpeed's configuration reference (docs/_pages/config-json.md): top level and
  // zero_optimization; a section counts as classified when it or one of its keys is listed.
  std::ifstream in(kConfigs + "/documented_keys.txt");
  ASSERT_TRUE(in.good());
  std::set<std::string> listed;
  for (const DeepSpeedKey& k : runtime::deepspeed_keys()) {
    std::string p(k.path);
    listed.insert(p);
    for (size_t dot = p.find('.'); dot != std::string::npos; dot = p.find('.', dot + 1)) listed.insert(p.substr(0, dot));
  }
  int count = 0;
  for (std::string key; std::getline(in, key);) {
    if (key.empty() || key[0] == '#') continue;
    ++count;
    EXPECT_TRUE(listed.count(key)) << "DeepSpeed documents '" << key << "' and runtime/deepspeed_keys.cpp does not classify it";
  }
  EXPECT_GT(count, 60);
}

TEST(DeepSpeedKeys, ConfigsReadmeTableMatchesTheCode) {
  std::ifstream in(std::string(ZP_SOURCE_DIR) + "/configs/README.md");
  ASSERT_TRUE(in.good());
  const std::regex row(R"(^\| `([a-z0-9_.]+)` \| (honoured|warned|error) \|)");
  std::map<std::string, std::string> readme;
  for (std::string line; std::getline(in, line);)
    if (std::smatch m; std::regex_search(line, m, row)) readme[m[1]] = m[2];
  for (const DeepSpeedKey& k : runtime::deepspeed_keys()) {
    const std::string want = k.handling == KeyHandling::Honoured ? "honoured"
                             : k.handling == KeyHandling::Warned ? "warned" : "error";
    auto it = readme.find(std::string(k.path));
    ASSERT_NE(it, readme.end()) << k.path << " is missing from configs/README.md's table";
    EXPECT_EQ(it->second, want) << k.path;
    readme.erase(it);
  }
  EXPECT_TRUE(readme.empty()) << "in the README only: " << readme.begin()->first;
}

// DeepSpeed's formulas by hand; update k uses the schedule at iteration k - 1.
TEST(LrSchedule, WarmupLrLogAndLinearAsDeepSpeed) {
  LrSchedule log{.type = "WarmupLR", .warmup_min_lr = 0.0, .warmup_max_lr = 1e-3, .warmup_steps = 100,
                 .warmup_shape = runtime::WarmupShape::Log};
  EXPECT_DOUBLE_EQ(log.at(0), 0.0);  // before the first scheduler step: warmup_min_lr
  EXPECT_DOUBLE_EQ(log.at(1), 0.0);  // log(1) / log(100)
  EXPECT_NEAR(log.at(10), 1e-3 * std::log(10.0) / std::log(100.0), 1e-15);  // iteration 9: log(10)/log(100) = 0.5
  EXPECT_NEAR(log.at(10), 5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(log.at(101), 1e-3);  // iteration 100: warm
  LrSchedule lin = log;
  lin.warmup_shape = runtime::WarmupShape::Linear;
  lin.warmup_min_lr = 1e-4;
  EXPECT_NEAR(lin.at(26), 1e-4 + 9e-4 * 25.0 / 100.0, 1e-15);  // iteration 25
  EXPECT_DOUBLE_EQ(lin.at(500), 1e-3);
  LrSchedule short_warmup = lin;
  short_warmup.warmup_steps = 1;  // DeepSpeed stretches it to 2
  EXPECT_NEAR(short_warmup.at(2), 1e-4 + 9e-4 * 0.5, 1e-15);
}

TEST(LrSchedule, WarmupDecayLrDecaysToWarmupMinLr) {
  LrSchedule s{.type = "WarmupDecayLR", .warmup_min_lr = 0.0, .warmup_max_lr = 1.0, .warmup_steps = 10,
               .total_steps = 110, .warmup_shape = runtime::WarmupShape::Linear};
  EXPECT_DOUBLE_EQ(s.at(6), 0.5);           // iteration 5: 5/10
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);          // iteration 10: (110 - 10) / 100
  EXPECT_DOUBLE_EQ(s.at(61), 0.5);          // iteration 60: (110 - 60) / 100
  EXPECT_DOUBLE_EQ(s.at(111), 0.0);         // iteration 110
  EXPECT_DOUBLE_EQ(s.at(200), 0.0);         // past the end: max(0, ...)
}

TEST(LrSchedule, WarmupCosineLrRatiosAsDeepSpeed) {
  LrSchedule s{.type = "WarmupCosineLR", .lr = 2.0, .warmup_min_ratio = 0.2, .cos_min_ratio = 0.1,
               .warmup_steps = 10, .total_steps = 110, .warmup_shape = runtime::WarmupShape::Linear};
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);                        // DeepSpeed's lr before its first step
  EXPECT_DOUBLE_EQ(s.at(1), 2.0 * 0.2);                  // iteration 0: warmup_min_ratio
  EXPECT_NEAR(s.at(6), 2.0 * (0.2 + 0.5 * 0.8), 1e-15);  // iteration 5: halfway
  // Iteration 59: real step 50 of 100, cosine (1 + cos(pi/2)) / 2 = 0.5 -> 0.1 + 0.9 x 0.5.
  EXPECT_NEAR(s.at(60), 2.0 * 0.55, 1e-12);
  EXPECT_NEAR(s.at(10 + 100), 2.0 * 0.1, 1e-12);  // iteration 109: the end
  EXPECT_NEAR(s.at(500), 2.0 * 0.1, 1e-12);       // stays at cos_min_ratio
  LrSchedule none = s;
  none.warmup_steps = 0;  // zeropipe's no-warmup (DeepSpeed refuses 0)
  EXPECT_DOUBLE_EQ(none.at(0), 2.0);
}

TEST(LrSchedule, OneCycleAndRangeTestAsDeepSpeed) {
  LrSchedule s{.type = "OneCycle", .cycle_min_lr = 0.1, .cycle_max_lr = 1.1, .decay_lr_rate = 0.5,
               .cycle_first_step_size = 10, .cycle_second_step_size = 10, .decay_step_size = 5};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_NEAR(s.at(5), 0.1 + 1.0 * 0.5, 1e-12);   // iteration 4: batch 5 of the 10-step rise
  EXPECT_NEAR(s.at(10), 1.1, 1e-12);              // iteration 9: batch 10, the peak
  EXPECT_NEAR(s.at(15), 0.1 + 1.0 * 0.5, 1e-12);  // iteration 14: batch 15, halfway down
  // After the cycle (iteration 24 >= 20): decay interval (24 - 20 + 1) / 5 = 1 -> 0.1 / (1 + 0.5).
  EXPECT_NEAR(s.at(25), 0.1 / 1.5, 1e-12);
  LrSchedule stairs = s;
  stairs.cycle_first_stair_count = stairs.cycle_second_stair_count = 2;
  EXPECT_NEAR(stairs.at(5), 0.1 + 1.0 * 0.5, 1e-12);  // batch 5: floor(5 x 2 / 10) / 2
  EXPECT_NEAR(stairs.at(4), 0.1, 1e-12);              // batch 4: floor(0.8) / 2 = 0
  LrSchedule r{.type = "LRRangeTest", .range_test_min_lr = 1e-3, .range_test_step_rate = 2.0,
               .range_test_step_size = 10};
  EXPECT_DOUBLE_EQ(r.at(0), 1e-3);
  EXPECT_NEAR(r.at(5), 1e-3 * (1 + 2.0 * 5 / 10.0), 1e-15);  // iteration 4: (4 + 1) / 10
  r.range_test_staircase = true;
  EXPECT_DOUBLE_EQ(r.at(5), 1e-3);
  EXPECT_NEAR(r.at(10), 1e-3 * 3, 1e-15);
}

// OneCycle's momentum, by DeepSpeed's get_mom (lr_schedules.py): beta1 = cycle_max_mom - (cycle_max_mom -
// cycle_min_mom) x the cycle's scale factor, then cycle_max_mom x (1 + decay_mom_rate x decay
// intervals); beta2 0.99 throughout; (cycle_min_mom, 0.99) before the first scheduler step.
TEST(LrSchedule, OneCycleMomentumAsDeepSpeed) {
  LrSchedule s{.type = "OneCycle", .cycle_min_lr = 0.1, .cycle_max_lr = 1.1, .decay_lr_rate = 0.5,
               .cycle_first_step_size = 10, .cycle_second_step_size = 10, .decay_step_size = 5,
               .cycle_momentum = true, .cycle_min_mom = 0.8, .cycle_max_mom = 0.9, .decay_mom_rate = 0.1};
  auto beta1 = [&](int64_t step) { return s.betas_at(step).value().beta1; };
  EXPECT_DOUBLE_EQ(beta1(0), 0.8);                 // before the first step: the minimum
  EXPECT_NEAR(beta1(1), 0.9 - 0.1 * 0.1, 1e-12);   // iteration 0: batch 1, scale 0.05 / 0.5
  EXPECT_NEAR(beta1(5), 0.9 - 0.1 * 0.5, 1e-12);   // iteration 4: batch 5, halfway up the lr
  EXPECT_NEAR(beta1(10), 0.8, 1e-12);              // iteration 9: the lr's peak, the momentum's trough
  EXPECT_NEAR(beta1(15), 0.9 - 0.1 * 0.5, 1e-12);  // iteration 14: (0.75 - 1) / (0.5 - 1) = 0.5
  EXPECT_NEAR(beta1(20), 0.9, 1e-12);              // iteration 19: batch 20, the cycle's end
  // Decay (iteration >= 20): interval (iteration - 20 + 1) / 5.
  EXPECT_NEAR(beta1(21), 0.9 * (1 + 0.1 * 0.2), 1e-12);  // iteration 20
  EXPECT_NEAR(beta1(25), 0.9 * (1 + 0.1 * 1.0), 1e-12);  // iteration 24
  for (int64_t step : {0, 1, 10, 25}) EXPECT_DOUBLE_EQ(s.betas_at(step)->beta2, 0.99) << step;
  LrSchedule flat = s;
  flat.decay_mom_rate = 0;  // DeepSpeed's skip_mom_decay: cycle_max_mom
  EXPECT_DOUBLE_EQ(flat.betas_at(25)->beta1, 0.9);
  LrSchedule stairs = s;  // the momentum takes the learning rate's stairs
  stairs.cycle_first_stair_count = stairs.cycle_second_stair_count = 2;
  EXPECT_NEAR(stairs.betas_at(4)->beta1, 0.9, 1e-12);
  EXPECT_NEAR(stairs.betas_at(5)->beta1, 0.85, 1e-12);
  LrSchedule off = s;
  off.cycle_momentum = false;
  EXPECT_FALSE(off.betas_at(5));
  EXPECT_FALSE(LrSchedule{}.betas_at(5)) << "other schedules leave the betas alone";
}

// The update receives the cycled betas: two AdamW steps of a model with gradients 0.5 then -0.2 on
// every element (no weight decay, so every weight moves alike) against AdamW by hand with the
// schedule's lr and betas; the bias correction uses each update's beta1 and beta2 (1 - beta^t), as
// torch's AdamW and DeepSpeed's Adam do.
TEST(LrSchedule, OneCycleMomentumReachesTheOptimizer) {
  const LrSchedule sched{.type = "OneCycle", .cycle_min_lr = 1e-2, .cycle_max_lr = 2e-2,
                         .cycle_first_step_size = 2, .cycle_second_step_size = 2, .cycle_momentum = true,
                         .cycle_min_mom = 0.8, .cycle_max_mom = 0.9};
  const double grads[2] = {0.5, -0.2};
  const double eps = 1e-8;
  // AdamW by hand, in double: the change of every weight after the two updates.
  auto by_hand = [&](const LrSchedule& s, double beta1, double beta2) {
    double m = 0, v = 0, delta = 0;
    for (int t = 1; t <= 2; ++t) {
      const auto betas = s.betas_at(t - 1);
      const double b1 = betas ? betas->beta1 : beta1, b2 = betas ? betas->beta2 : beta2, g = grads[t - 1];
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g * g;
      delta -= s.at(t - 1) / (1 - std::pow(b1, t)) * m / (std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps);
    }
    return delta;
  };
  // The engine's two updates through the training step's optimizer side (runtime/optimizer_step.h).
  auto engine_delta = [&](const LrSchedule& s) {
    const auto cfg = models::TransformerConfig::from_hub_json(tiny_llama(), "momentum-test");
    models::Transformer model(cfg, Device::cpu(), DType::F32, nullptr, parallel::shard_pad_multiple(1));
    model.init_random(3, 0.02);
    parallel::ZeroEngine engine(model.blocks(), parallel::ShardingPolicy::zero_stage(0), nullptr,
                                {1e-3, 0.9, 0.999, eps, 0.0});
    runtime::LossScaler scaler(false, 1, 1, 1000, 2, false);
    const std::vector<float> before = engine.gather_master();
    for (double g : grads) {
      engine.begin_step();
      runtime::begin_micro_step(engine, s, 0, 1, 1.f);
      for (nn::ParamBlock* b : model.blocks()) {
        engine.acquire_grads(*b);
        float* gp = b->grads().data<float>();
        for (int64_t i = 0; i < b->padded(); ++i) gp[i] = float(g);
        engine.release_grads(*b);
      }
      runtime::finish_step(engine, scaler, s, /*grad_clip=*/0, 1.f);
    }
    const std::vector<float> after = engine.gather_master();
    std::vector<double> d(after.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = double(after[i]) - double(before[i]);
    return d;
  };
  const double want = by_hand(sched, 0, 0);
  LrSchedule fixed = sched;
  fixed.cycle_momentum = false;
  const double want_fixed = by_hand(fixed, 0.9, 0.999);
  ASSERT_GT(std::abs(want - want_fixed), 1e-4) << "the cycled betas change the update";
  for (const auto& [s, w] : {std::pair{sched, want}, std::pair{fixed, want_fixed}}) {
    const std::vector<double> got = engine_delta(s);
    ASSERT_FALSE(got.empty());
    double worst = 0;
    for (double d : got) worst = std::max(worst, std::abs(d - w));
    EXPECT_LT(worst, 1e-6) << "cycle_momentum " << s.cycle_momentum << ": want " << w << ", e.g. got " << got[0];
  }
}

// DeepSpeed's DynamicLossScaler.update_scale, step by step (hysteresis 2, window 3).
TEST(LossScaler, HysteresisAsDeepSpeedWithAndWithoutConsecutiveRefill) {
  runtime::LossScaler ds(true, 1024, 1, 3, 2, /*consecutive_hysteresis=*/false);
  EXPECT_TRUE(ds.update(true));
  EXPECT_EQ(ds.scale(), 1024);  // absorbed: hysteresis 2 -> 1
  EXPECT_FALSE(ds.update(false));  // a clean step does not refill it
  EXPECT_TRUE(ds.update(true));
  EXPECT_EQ(ds.scale(), 512);
  EXPECT_TRUE(ds.update(true));
  EXPECT_EQ(ds.scale(), 256);  // still at 1: every overflow halves
  for (int i = 0; i < 3; ++i) ds.update(false);
  EXPECT_EQ(ds.scale(), 512);  // the window doubles and refills
  EXPECT_TRUE(ds.update(true));
  EXPECT_EQ(ds.scale(), 512);
  EXPECT_EQ(ds.overflows_left(), 1);

  runtime::LossScaler consecutive(true, 1024, 1, 3, 2, /*consecutive_hysteresis=*/true);
  consecutive.update(true);
  consecutive.update(false);  // refilled
  consecutive.update(true);
  EXPECT_EQ(consecutive.scale(), 1024);
  consecutive.update(true);
  EXPECT_EQ(consecutive.scale(), 512);
  consecutive.update(true);
  EXPECT_EQ(consecutive.scale(), 256);

  runtime::LossScaler restored(true, 65536, 1, 3, 2);  // a checkpoint's state goes back exactly
  restored.restore(ds.scale(), ds.overflows_left(), ds.clean_steps());
  restored.update(true);
  ds.update(true);
  EXPECT_EQ(restored.scale(), ds.scale());
  EXPECT_EQ(restored.scale(), 256);
}

TEST(CsvMonitor, WritesDeepSpeedsFilesWithOneHeader) {
  const fs::path dir = fs::temp_directory_path() / "zp_csv_monitor" / "job";
  fs::remove_all(dir.parent_path());
  {
    runtime::CsvMonitor m(dir.string());
    m.write("Train/Samples/train_loss", 32, 2.5);
    m.write("Train/Samples/train_loss", 64, 2.25);
  }
  runtime::CsvMonitor again(dir.string());  // a resumed run appends without a second header
  again.write("Train/Samples/train_loss", 96, 2.0);
  std::ifstream in(dir / "Train_Samples_train_loss.csv");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "step,train_loss\n32,2.5\n64,2.25\n96,2\n");
}

}  // namespace
}  // namespace zp::test
