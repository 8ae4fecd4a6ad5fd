// Strict configuration reading: integer keys take integers, every number has its range, all of a
// configuration's problems come back in one error, messages quote bounded excerpts, deep or huge
// values are named errors (never an abort), --set edits one key of an inline model.config, and the
// shipped configs load.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "io/bounded_json.h"
#include "io/config.h"
#include "models/transformer.h"
#include "models/unet.h"
#include "runtime/diffusion_config.h"
#include "runtime/optimizer_step.h"
#include "runtime/train_config.h"
#include "test_util.h"
#include "tiny_llama_config.h"
#include "tiny_unet_config.h"

namespace zp::test {
namespace {
using io::json;
using runtime::TrainConfig;
using runtime::UNetTrainConfig;
namespace fs = std::filesystem;


// A valid LM training config (parsing only: the data file need not exist).
json valid_user() {
  return {{"train_micro_batch_size_per_gpu", 4},
          {"model", {{"config", tiny_llama()}}},
          {"data", {{"train_files", {"unused.bin"}}, {"seq_len", 16}}},
          {"training", {{"device", "cpu"}}}};
}

io::Config keep_config(const json& user) {
  return io::Config(runtime::train_schema_with_diffusion(), user, "t.json", io::Config::OnProblem::Keep);
}

// TrainConfig::from of the valid config with `assignment` applied through --set.
TrainConfig with_set(const std::string& assignment) {
  io::Config c = keep_config(valid_user());
  c.set(assignment);
  return TrainConfig::from(c);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string p = (fs::temp_directory_path() / name).string();
  std::ofstream(p) << text;
  return p;
}


}  // namespace

TEST(ConfigRules, IntegerKeysTakeOnlyIntegers) {
  // The schema's integer default makes the key an integer key; 2.5 used to become 2.
  expect_error([] { with_set("gradient_accumulation_steps=2.5"); },
               {"gradient_accumulation_steps", "2.5", "must be an integer"});
  expect_error([] { with_set("zero_optimization.stage=1.5"); }, {"zero_optimization.stage", "1.5", "integer"});
  expect_error([] { with_set("training.max_steps=1e30"); }, {"training.max_steps", "must be an integer"});
  // Integral numbers written as doubles are integers (1e3 steps, 2.0 micro-batches).
  EXPECT_EQ(with_set("training.max_steps=1e3").max_steps, 1000);
  EXPECT_EQ(with_set("gradient_accumulation_steps=2.0").grad_accum, 2);
  // Keys whose default is a double still take any number.
  EXPECT_DOUBLE_EQ(with_set("fp16.min_loss_scale=0.5").min_scale, 0.5);
  EXPECT_DOUBLE_EQ(with_set("gradient_clipping=2").grad_clip, 2.0);
}

TEST(ConfigRules, NullDefaultIntegersTakeAutoNullOrAPositiveInteger) {
  EXPECT_EQ(with_set("train_batch_size=auto").train_batch_size, 0);
  EXPECT_EQ(with_set("train_batch_size=null").train_batch_size, 0);
  EXPECT_EQ(with_set("train_batch_size=16").train_batch_size, 16);
  EXPECT_EQ(with_set("scheduler.params.total_num_steps=500").schedule.total_steps, 500);
  EXPECT_EQ(with_set("scheduler.params.total_num_steps=auto").schedule.total_steps, 100);  // training.max_steps
  // A string other than "auto" used to be ignored silently.
  expect_error([] { with_set("train_batch_size=lots"); }, {"train_batch_size", "\"lots\"", "integer >= 1", "auto"});
  expect_error([] { with_set("scheduler.params.total_num_steps=\"1000\""); },
               {"scheduler.params.total_num_steps", "\"1000\"", "integer >= 1"});
  expect_error([] { with_set("train_batch_size=0"); }, {"train_batch_size", "= 0", ">= 1"});
  expect_error([] { with_set("train_batch_size=2.5"); }, {"train_batch_size", "2.5"});
  expect_error([] { with_set("scheduler.params.total_num_steps=[1]"); }, {"scheduler.params.total_num_steps", "[1]"});
}

TEST(ConfigRules, NumbersOutOfRangeNameKeyValueAndRange) {
  struct Case {
    std::string set, key, value, allowed;
  };
  const std::vector<Case> cases = {
      {"optimizer.params.lr=0", "optimizer.params.lr", "= 0", "> 0"},
      {"optimizer.params.lr=-0.001", "optimizer.params.lr", "-0.001", "> 0"},
      {"optimizer.params.betas=[0.9,1.0]", "optimizer.params.betas", "[0.9,1.0]", "in [0, 1)"},
      {"optimizer.params.betas=[-0.1,0.9]", "optimizer.params.betas", "-0.1", "in [0, 1)"},
      {"optimizer.params.betas=[0.9]", "optimizer.params.betas", "[0.9]", "2 numbers"},
      {"optimizer.params.betas=[0.9,0.95,0.99]", "optimizer.params.betas", "0.99", "2 numbers"},
      {"optimizer.params.eps=0", "optimizer.params.eps", "= 0", "> 0"},
      {"optimizer.params.weight_decay=-0.1", "optimizer.params.weight_decay", "-0.1", ">= 0"},
      {"gradient_clipping=-1", "gradient_clipping", "-1", ">= 0"},
      {"train_micro_batch_size_per_gpu=0", "train_micro_batch_size_per_gpu", "= 0", ">= 1"},
      {"gradient_accumulation_steps=-3", "gradient_accumulation_steps", "-3", ">= 1"},
      {"data.seq_len=0", "data.seq_len", "= 0", ">= 1"},
      {"training.max_steps=-1", "training.max_steps", "-1", ">= 0"},
      {"scheduler.params.warmup_num_steps=-5", "scheduler.params.warmup_num_steps", "-5", ">= 0"},
      {"training.eval_every=-1", "training.eval_every", "-1", ">= 0"},
      {"training.eval_batches=0", "training.eval_batches", "= 0", "in [1, 1000000]"},
      {"training.eval_batches=2147483648", "training.eval_batches", "2147483648", "in [1, 1000000]"},
      {"training.eval_batches=9223372036854775808", "training.eval_batches", "9223372036854775808", "in [1, 1000000]"},
      {"steps_per_print=0", "steps_per_print", "= 0", ">= 1"},
      {"checkpoint.keep_last=-1", "checkpoint.keep_last", "-1", ">= 0"},
      {"checkpoint.save_every=-2", "checkpoint.save_every", "-2", ">= 0"},
      {"fp16.initial_scale_power=64", "fp16.initial_scale_power", "64", "in [0, 63]"},
      {"fp16.initial_scale_power=-1", "fp16.initial_scale_power", "-1", "in [0, 63]"},
      {"fp16.loss_scale_window=0", "fp16.loss_scale_window", "= 0", ">= 1"},
      {"fp16.hysteresis=0", "fp16.hysteresis", "= 0", ">= 1"},
      {"fp16.min_loss_scale=0", "fp16.min_loss_scale", "= 0", "> 0"},
      {"fp16.loss_scale=-1", "fp16.loss_scale", "-1", ">= 0"},
      {"scheduler.params.cos_min_ratio=1.5", "scheduler.params.cos_min_ratio", "1.5", "in [0, 1]"},
      {"model.init_std=0", "model.init_std", "= 0", "> 0"},
      {"seed=-1", "seed", "-1", "[0, 2^64)"},
      {"data.val_fraction=1", "data.val_fraction", "= 1", "in [0, 1)"},
      {"data.val_fraction=-0.5", "data.val_fraction", "-0.5", "in [0, 1)"},
      {"training.max_bad_steps=0", "training.max_bad_steps", "= 0", ">= 1"},
      {"zero_optimization.stage=4", "zero_optimization.stage", "= 4", "in [0, 3]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.set);
    expect_error([&] { with_set(c.set); }, {"--set " + c.set, "'" + c.key + "'", c.value, c.allowed});
  }
  // The ends of the ranges are allowed.
  EXPECT_EQ(with_set("training.eval_batches=1000000").eval_batches, 1000000);
  EXPECT_DOUBLE_EQ(with_set("fp16.initial_scale_power=63").initial_scale, std::ldexp(1.0, 63));
  EXPECT_EQ(with_set("seed=18446744073709551615").seed, UINT64_MAX);
  EXPECT_DOUBLE_EQ(with_set("scheduler.params.cos_min_ratio=1").schedule.cos_min_ratio, 1.0);
  EXPECT_DOUBLE_EQ(with_set("optimizer.params.betas=[0,0.999]").beta1, 0.0);
}

TEST(ConfigRules, DiffusionKeysHaveRanges) {
  json user = valid_user();
  user["model"] = {{"type", "unet"}, {"config", tiny_unet_config()}};
  auto with = [&](const std::string& set) {
    io::Config c = keep_config(user);
    c.set(set);
    return UNetTrainConfig::from(c);
  };
  EXPECT_EQ(with("diffusion.num_train_timesteps=500").diffusion.num_train_timesteps, 500);
  expect_error([&] { with("diffusion.num_train_timesteps=2.5"); }, {"diffusion.num_train_timesteps", "2.5"});
  expect_error([&] { with("diffusion.num_train_timesteps=10000000"); },
               {"diffusion.num_train_timesteps", "in [1, 1000000]"});
  expect_error([&] { with("diffusion.beta_start=0"); }, {"diffusion.beta_start", "in (0, 1)"});
  expect_error([&] { with("diffusion.snr_gamma=0"); }, {"diffusion.snr_gamma", "> 0"});
  // The UNet's backward splits too: ZB-H1 is every model's.
  {
    io::Config z = keep_config(user);
    for (const char* set : {"pipeline.stages=2", "gradient_accumulation_steps=2", "pipeline.schedule=zb-h1"}) z.set(set);
    EXPECT_EQ(UNetTrainConfig::from(z).common.pipeline_schedule, "zb-h1");
  }
  // Shared and diffusion problems come back together.
  io::Config c = keep_config(user);
  c.set("diffusion.beta_schedule=cosine");
  c.set("optimizer.params.lr=-1");
  expect_error([&] { UNetTrainConfig::from(c); }, {"2 problems", "diffusion.beta_schedule", "optimizer.params.lr"});
}

TEST(ConfigRules, MaxBadStepsIsReadAndChecked) {
  EXPECT_EQ(runtime::train_config_schema()["training"]["max_bad_steps"], 20);
  EXPECT_EQ(with_set("training.device=cpu").max_bad_steps, 20);
  EXPECT_EQ(with_set("training.max_bad_steps=5").max_bad_steps, 5);
  expect_error([] { with_set("training.max_bad_steps=2.5"); }, {"training.max_bad_steps", "2.5", "integer"});
  expect_error([] { with_set("training.max_bad_steps=\"many\""); }, {"training.max_bad_steps", "must be a number"});
}

TEST(ConfigRules, HugeAndNonFiniteNumbersAreNamedErrors) {
  // nlohmann throws out_of_range for a number beyond a double: it must become a zp::Error naming the file.
  const std::string file = write_file("zp_cfg_huge.json", R"({"optimizer": {"params": {"lr": -1e400}}})");
  expect_error([&] { io::Config::from_file(runtime::train_config_schema(), file); }, {file, "1e400"});
  expect_error([&] { io::read_json_file(file); }, {file, "1e400"});
  expect_error([] { with_set("optimizer.params.lr=1e400"); }, {"--set optimizer.params.lr=1e400", "1e400"});
  expect_error([] { with_set("training.max_steps=1e400"); }, {"training.max_steps", "1e400"});
  // Values built in code can hold infinities and NaN, which JSON cannot.
  for (double bad : {INFINITY, -INFINITY, NAN}) {
    json user = valid_user();
    user["optimizer"] = {{"params", {{"lr", bad}}}};
    expect_error([&] { TrainConfig::from(keep_config(user)); }, {"optimizer.params.lr", "finite"});
    user = valid_user();
    user["optimizer"] = {{"params", {{"betas", {0.9, bad}}}}};
    expect_error([&] { TrainConfig::from(keep_config(user)); }, {"optimizer.params.betas"});
  }
  // Beyond int64: 2^64 - 1 parses as unsigned, 1e19 and 2^64 as doubles.
  expect_error([] { with_set("checkpoint.keep_last=18446744073709551615"); }, {"checkpoint.keep_last", ">= 0"});
  expect_error([] { with_set("checkpoint.keep_last=18446744073709551616"); }, {"checkpoint.keep_last", "integer"});
}

TEST(ConfigRules, EveryProblemOfAConfigIsReportedAtOnce) {
  // Unknown keys, wrong types, fractions, ranges and combinations, from the file and from --set.
  const std::string file = write_file("zp_cfg_many.json", R"({
    "train_micro_batch_size_per_gpu": 0,
    "gradient_accumulation_steps": 2.5,
    "zero_optimisation": {"stage": 2},
    "optimizer": {"params": {"lr": -1, "betas": [0.9]}},
    "bf16": {"enabled": true}, "fp16": {"enabled": true},
    "model": {"config": {"model_type": "gpt2"}},
    "data": {"train_files": ["x.bin"], "seq_len": "long"},
    "training": {"eval_batches": 2147483648}
  })");
  io::Config c = io::Config::from_file(runtime::train_schema_with_diffusion(), file, io::Config::OnProblem::Keep);
  c.set("checkpoint.keep_last=-1");
  c.set("training.devise=cpu");
  c.set("nonsense");
  const std::string m = error_message([&] { TrainConfig::from(c); });
  for (const char* key : {"'train_micro_batch_size_per_gpu'", "'gradient_accumulation_steps'", "'zero_optimisation'",
                          "'optimizer.params.lr'", "'optimizer.params.betas'", "bf16.enabled and fp16.enabled",
                          "'data.seq_len'", "'training.eval_batches'", "'checkpoint.keep_last'", "'training.devise'",
                          "expected key.path=value", "model.config: missing key 'n_embd'"})
    EXPECT_NE(m.find(key), std::string::npos) << key << " not in:\n" << m;
  EXPECT_NE(m.find("12 problems in the configuration:"), std::string::npos) << m;
  // One line per problem, each naming where it came from.
  std::istringstream lines(m);
  std::string line;
  std::getline(lines, line);
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_TRUE(line.find(file) != std::string::npos || line.find("--set") != std::string::npos) << line;
  }
  EXPECT_EQ(n, 12);
  // The inline model.config is checked with the rest.
  io::Config hub = keep_config(valid_user());
  hub.set("model.config.intermediate_size=-3");
  hub.set("optimizer.params.eps=0");
  expect_error([&] { TrainConfig::from(hub); },
               {"2 problems", "model.config: key 'intermediate_size' = -3", "'optimizer.params.eps'"});
  // Constructing with the default (Throw) reports every structural problem of the file together.
  expect_error([] { io::Config(runtime::train_config_schema(), json::parse(R"({"a": 1, "b": 2, "seed": "x"})"), "u.json"); },
               {"3 problems", "unknown key 'a'", "unknown key 'b'", "'seed' must be a number"});
}

TEST(ConfigRules, MessagesQuoteBoundedExcerpts) {
  const std::string long_text(100000, 'x');
  json user = valid_user();
  user["seed"] = long_text;
  const std::string m = error_message([&] { TrainConfig::from(keep_config(user)); });
  EXPECT_NE(m.find("'seed'"), std::string::npos) << m.substr(0, 300);
  EXPECT_NE(m.find("xxx..."), std::string::npos) << m.substr(0, 300);
  EXPECT_LT(m.size(), 300u);
  json big = json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  EXPECT_LE(io::json_excerpt(big).size(), 83u);
  EXPECT_EQ(io::json_excerpt(json::parse(R"({"a":[1,2],"b":"c"})")), R"({"a":[1,2],"b":"c"})");
  EXPECT_EQ(io::json_excerpt(json(INFINITY)), "inf");
  expect_error([&] { io::Config(runtime::train_config_schema(), json{{long_text, 1}}, "t.json"); },
               {"unknown key 'xxxx"});
  EXPECT_LT(error_message([&] { io::Config(runtime::train_config_schema(), json{{long_text, 1}}, "t.json"); }).size(), 300u);
  // A typed read of the wrong type names where the value came from.
  io::Config c = keep_config(valid_user());
  c.set("model.config.hidden_size=\"" + long_text + "\"");
  const std::string typed = error_message([&] { c.get<int>("model.config.hidden_size"); });
  EXPECT_NE(typed.find("--set model.config.hidden_size=\"xxx"), std::string::npos) << typed.substr(0, 300);
  EXPECT_LT(typed.size(), 400u);
}

TEST(ConfigRules, DeeplyNestedValuesAreRejectedWithoutRecursion) {
  constexpr int kDeep = 100000;
  const std::string deep = std::string(kDeep, '[') + std::string(kDeep, ']');
  // In a file: rejected while parsing, with the file named.
  const std::string file = write_file("zp_cfg_deep.json", R"({"model": {"config": )" + deep + "}}");
  expect_error([&] { io::Config::from_file(runtime::train_config_schema(), file); }, {file, "nested deeper than 64"});
  expect_error([&] { io::read_json_file(file); }, {file, "nested deeper than 64"});
  // On the command line.
  io::Config c(runtime::train_config_schema(), valid_user(), "t.json");
  expect_error([&] { c.set("model.config=" + deep); }, {"--set model.config=[[[", "nested deeper than 64"});
  // Already parsed (nlohmann's parser itself is iterative): the merge measures depth before copying,
  // and the message quotes a bounded excerpt.
  json user = valid_user();
  user["model"]["config"] = json::parse(deep);
  const std::string m = error_message([&] { io::Config(runtime::train_config_schema(), user, "t.json"); });
  EXPECT_NE(m.find("'model.config' nests deeper than 64"), std::string::npos) << m.substr(0, 300);
  EXPECT_LT(m.size(), 300u);
  EXPECT_LE(io::json_excerpt(user["model"]["config"]).size(), 83u);
  EXPECT_TRUE(io::nested_deeper_than(user["model"]["config"], 64));
  EXPECT_FALSE(io::nested_deeper_than(tiny_unet_config(), 64));
  // Exactly the limit is fine.
  const std::string at_limit = std::string(63, '[') + std::string(63, ']');
  EXPECT_NO_THROW(io::parse_json_bounded(R"({"a": )" + at_limit + "}", "limit"));
}

TEST(ConfigRules, SetGoesInsideTheInlineModelConfig) {
  io::Config c = keep_config(valid_user());
  c.set("model.config.num_hidden_layers=3");
  c.set("model.config.rope_parameters.rope_theta=500000");
  const json& m = c.at("model.config");
  EXPECT_EQ(m["num_hidden_layers"], 3);
  EXPECT_EQ(m["hidden_size"], 32) << "the other keys stay";
  EXPECT_EQ(m["rope_parameters"]["rope_theta"], 500000);
  EXPECT_TRUE(c.problems().empty());
  EXPECT_EQ(TrainConfig::from(c).hub_config["num_hidden_layers"], 3);
  // Naming the key itself still replaces the whole object.
  c.set(R"(model.config={"model_type": "gpt2", "n_layer": 1})");
  EXPECT_EQ(c.at("model.config"), json::parse(R"({"model_type": "gpt2", "n_layer": 1})"));
  // With no inline config yet, the object is created.
  json user = valid_user();
  user["model"].erase("config");
  io::Config fresh = keep_config(user);
  fresh.set("model.config.n_layer=2");
  EXPECT_EQ(fresh.at("model.config"), json::parse(R"({"n_layer": 2})"));
  // A key below a value that is not an object is an error naming the path.
  io::Config thrower(runtime::train_config_schema(), valid_user(), "t.json");
  expect_error([&] { thrower.set("model.config.model_type.x=1"); },
               {"--set model.config.model_type.x=1", "model.config.model_type", "not an object"});
  expect_error([&] { thrower.set("model.confi.n_layer=1"); }, {"unknown key 'model.confi'"});
}

// The shipped configs load and validate, their inline hub configs included (data files may be absent).
TEST(ConfigRules, ShippedConfigsLoad) {
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() / "configs";
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    io::Config c = io::Config::from_file(runtime::train_schema_with_diffusion(), path, io::Config::OnProblem::Keep);
    EXPECT_TRUE(c.problems().empty());
    if (c.get<std::string>("model.type") == "unet") {
      const UNetTrainConfig u = UNetTrainConfig::from(c);
      if (u.common.hub_config.is_object()) models::UNetConfig::from_hub_json(u.common.hub_config, path);
    } else {
      const TrainConfig t = TrainConfig::from(c);
      if (t.hub_config.is_object()) models::TransformerConfig::from_hub_json(t.hub_config, path);
    }
    ++loaded;
  }
  EXPECT_GE(loaded, 16);
}

TEST(ConfigRules, HubDirConfigWithAHugeNumberIsANamedError) {
  // A config.json with a number beyond a double is named, not an abort.
  const std::string dir = (fs::temp_directory_path() / "zp_hub_huge").string();
  fs::create_directories(dir);
  write_file("zp_hub_huge/config.json", R"({"model_type": "llama", "rope_theta": 1e400})");
  TrainConfig t;
  t.hub_dir = dir;
  std::string source;
  expect_error([&] { t.hub_config_json(source); }, {"config.json", "1e400"});
}

}  // namespace zp::test

namespace zp::test {
namespace {

runtime::TrainConfig with_sets(const std::vector<std::string>& assignments) {
  io::Config c = keep_config(valid_user());
  for (const std::string& a : assignments) c.set(a);
  return runtime::TrainConfig::from(c);
}

}  // namespace

// DeepSpeed's offload keys as they are: the devices, pin_memory and the NVMe keys are read; keys that
// mean nothing for the chosen devices are accepted with one warning naming them; impossible
// combinations are errors naming the keys.
TEST(ConfigRules, OffloadKeysAreDeepSpeeds) {
  const std::string opt = "zero_optimization.offload_optimizer.", par = "zero_optimization.offload_param.";
  runtime::TrainConfig t = with_sets({"zero_optimization.stage=2", opt + "device=cpu", opt + "pin_memory=false"});
  EXPECT_EQ(t.offload_optimizer, "cpu");
  EXPECT_FALSE(t.offload_optimizer_pin_memory);
  t = with_sets({"zero_optimization.stage=3", opt + "device=nvme", opt + "nvme_path=/tmp", par + "device=cpu",
                 "aio.queue_depth=32"});
  EXPECT_EQ(t.offload_optimizer_nvme_path, "/tmp");
  EXPECT_EQ(t.offload_param, "cpu");
  EXPECT_EQ(t.aio_queue_depth, 32);

  expect_error([&] { with_sets({"zero_optimization.stage=2", par + "device=cpu"}); },
               {par + "device = \"cpu\"", "zero_optimization.stage 3", "got stage 2"});
  expect_error([&] { with_sets({opt + "device=cpu"}); }, {opt + "device = \"cpu\"", "stage 1, 2 or 3", "got stage 0"});
  expect_error([&] { with_sets({"zero_optimization.stage=1", opt + "device=nvme"}); },
               {opt + "device = \"nvme\" needs " + opt + "nvme_path"});
  expect_error([&] { with_sets({"zero_optimization.stage=1", opt + "device=disk"}); }, {opt + "device", "disk"});
  expect_error([&] { with_sets({"aio.queue_depth=0"}); }, {"aio.queue_depth", "in [1, 4096]"});
  expect_error([&] { with_sets({opt + "ratio=2"}); }, {opt + "ratio", "in [0, 1]"});

  testing::internal::CaptureStderr();
  const runtime::TrainConfig partial = with_sets({"zero_optimization.stage=1", opt + "device=cpu", opt + "ratio=0.5",
                                                  opt + "nvme_path=/x", "aio.thread_count=4"});
  const std::string log = testing::internal::GetCapturedStderr();
  for (const std::string& key : {opt + "nvme_path", std::string("aio.thread_count")})
    EXPECT_NE(log.find(key), std::string::npos) << key << " not named in: " << log;
  EXPECT_EQ(log.find(opt + "pin_memory"), std::string::npos) << "pin_memory means something with device cpu: " << log;
  EXPECT_EQ(log.find(opt + "ratio"), std::string::npos) << "ratio means something with device cpu: " << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "one warning: " << log;
  EXPECT_EQ(partial.offload_optimizer_ratio, 0.5);
  EXPECT_EQ(runtime::sharding_policy(partial).offload_ratio(), 0.5);
  // Without an offloaded optimizer the ratio means nothing: one warning naming it.
  testing::internal::CaptureStderr();
  with_sets({"zero_optimization.stage=1", opt + "ratio=0.5"});
  const std::string none_log = testing::internal::GetCapturedStderr();
  EXPECT_NE(none_log.find(opt + "ratio"), std::string::npos) << none_log;
  expect_error([&] { with_sets({"zero_optimization.stage=2", opt + "device=cpu", opt + "ratio=0.5",
                                opt + "delayed_update=true"}); },
               {opt + "delayed_update needs " + opt + "ratio 1"});

  // With the NVMe tier, block_size and queue_depth shape its I/O; the libaio knobs still mean nothing.
  testing::internal::CaptureStderr();
  with_sets({"zero_optimization.stage=1", opt + "device=nvme", opt + "nvme_path=/tmp", "aio.block_size=65536",
             "aio.queue_depth=16", "aio.thread_count=4"});
  const std::string nvme_log = testing::internal::GetCapturedStderr();
  EXPECT_NE(nvme_log.find("aio.thread_count"), std::string::npos) << nvme_log;
  EXPECT_EQ(nvme_log.find("aio.block_size"), std::string::npos) << nvme_log;
  EXPECT_EQ(nvme_log.find("aio.queue_depth"), std::string::npos) << nvme_log;
}

// The delayed update (ours: zero_optimization.offload_optimizer.delayed_update) is read where the
// optimizer runs on the CPU, with fp32, bf16 or fp16, and refused, naming the keys, where it cannot work.
TEST(ConfigRules, DelayedUpdateNeedsAnOffloadedOptimizerAndOneUpdatePerStep) {
  const std::string opt = "zero_optimization.offload_optimizer.", key = opt + "delayed_update";
  EXPECT_FALSE(with_sets({"zero_optimization.stage=2", opt + "device=cpu"}).offload_optimizer_delayed_update);
  EXPECT_TRUE(with_sets({"zero_optimization.stage=2", opt + "device=cpu", key + "=true"}).offload_optimizer_delayed_update);
  EXPECT_TRUE(with_sets({"zero_optimization.stage=1", opt + "device=nvme", opt + "nvme_path=/tmp", key + "=true",
                         "bf16.enabled=true"})
                  .offload_optimizer_delayed_update);
  EXPECT_TRUE(runtime::sharding_policy(with_sets({"zero_optimization.stage=3", opt + "device=cpu", key + "=true"}))
                  .delays_update());

  expect_error([&] { with_sets({"zero_optimization.stage=2", key + "=true"}); },
               {key + " needs " + opt + "device = \"cpu\" or \"nvme\"", "got \"none\""});
  expect_error([&] { with_sets({"zero_optimization.stage=2", opt + "device=cpu", key + "=true",
                                "optimizer.step_in_backward=true", "gradient_clipping=0"}); },
               {key + " and optimizer.step_in_backward cannot both be true"});
  // fp16 with dynamic loss scaling: an overflowed step skips its delayed update (parallel/delayed_update.h).
  const runtime::TrainConfig fp16 =
      with_sets({"zero_optimization.stage=2", opt + "device=cpu", key + "=true", "fp16.enabled=true"});
  EXPECT_TRUE(fp16.offload_optimizer_delayed_update && fp16.fp16 && fp16.dtype == DType::F16);
  EXPECT_TRUE(with_sets({"zero_optimization.stage=3", opt + "device=nvme", opt + "nvme_path=/tmp", key + "=true",
                         "fp16.enabled=true", "fp16.loss_scale=128"})
                  .offload_optimizer_delayed_update)
      << "a fixed loss scale skips non-finite steps too";
  // Still refused with fp16: the optimizer in the backward, which cannot skip (named by either key).
  expect_error([&] { with_sets({"zero_optimization.stage=2", opt + "device=cpu", key + "=true", "fp16.enabled=true",
                                "optimizer.step_in_backward=true", "gradient_clipping=0"}); },
               {"optimizer.step_in_backward"});
  expect_error([&] { with_sets({"zero_optimization.stage=2", opt + "device=cpu", key + "=1"}); }, {key});
}

}  // namespace zp::test

namespace zp::test {

// The pipeline section (issue 12): what the configuration alone can tell.
TEST(ConfigRules, PipelineKeys) {
  io::Config c = keep_config(valid_user());
  c.set("pipeline.stages=4");
  c.set("gradient_accumulation_steps=8");
  c.set("pipeline.partition=[2,5,7]");
  TrainConfig t = TrainConfig::from(c);
  EXPECT_EQ(t.pipeline_stages, 4);
  EXPECT_EQ(t.pipeline_partition, "layers");
  EXPECT_EQ(t.partition_layers, (std::vector<int64_t>{2, 5, 7}));
  EXPECT_EQ(with_set("pipeline.partition=compute").pipeline_partition, "compute");
  EXPECT_EQ(with_set("pipeline.stages=1").pipeline_partition, "parameters");  // the default
  auto with = [](std::vector<std::string> sets) {
    io::Config c = keep_config(valid_user());
    for (const std::string& s : sets) c.set(s);
    return TrainConfig::from(c);
  };
  EXPECT_EQ(with({"pipeline.stages=2", "gradient_accumulation_steps=2", "pipeline.schedule=zb-h1"}).pipeline_schedule,
            "zb-h1");
  expect_error([&] { with({"pipeline.stages=3", "gradient_accumulation_steps=2", "pipeline.schedule=zb-h1"}); },
               {"pipeline.schedule = \"zb-h1\" needs gradient_accumulation_steps", "(the micro-batches per step, 2) "
                ">= pipeline.stages (3)"});
  expect_error([&] { with({"pipeline.stages=2", "gradient_accumulation_steps=4", "pipeline.schedule=zb-h1",
                           "pipeline.virtual_stages=2"}); },
               {"pipeline.virtual_stages = 2 needs pipeline.schedule = \"interleaved\" (zb-h1 runs one model chunk"});
  expect_error([&] { with({"pipeline.schedule=gpipe"}); }, {"pipeline.schedule", "\"1f1b\"", "\"zb-h1\""});
  expect_error([&] { with({"pipeline.partition=balanced"}); }, {"pipeline.partition", "\"uniform\""});
  expect_error([&] { with({"pipeline.stages=4", "gradient_accumulation_steps=4", "pipeline.partition=[3,2,5]"}); },
               {"pipeline.partition", "strictly increasing"});
  expect_error([&] { with({"pipeline.stages=4", "gradient_accumulation_steps=4", "pipeline.partition=[3]"}); },
               {"pipeline.partition lists 1 layer boundaries", "need 3"});
  expect_error([&] { with({"pipeline.stages=4", "gradient_accumulation_steps=2"}); },
               {"gradient_accumulation_steps (the micro-batches per step, 2) >= pipeline.stages (4)"});
  expect_error([&] { with({"pipeline.stages=4", "gradient_accumulation_steps=6", "pipeline.schedule=interleaved",
                           "pipeline.virtual_stages=2"}); },
               {"gradient_accumulation_steps (6) must be a multiple of it"});
  expect_error([&] { with({"pipeline.stages=2", "gradient_accumulation_steps=2", "pipeline.virtual_stages=2"}); },
               {"pipeline.virtual_stages = 2 needs pipeline.schedule = \"interleaved\""});
  EXPECT_FALSE(with({}).keep_gathered);
  EXPECT_TRUE(with({"pipeline.keep_gathered=true", "zero_optimization.stage=3"}).keep_gathered);
  expect_error([&] { with({"pipeline.keep_gathered=yes"}); }, {"pipeline.keep_gathered"});
  expect_error([&] { with({"pipeline.stages=2", "gradient_accumulation_steps=2", "zero_optimization.stage=2",
                           "gradient_clipping=0", "optimizer.step_in_backward=true"}); },
               {"optimizer.step_in_backward with pipeline.stages > 1"});
}

}  // namespace zp::test
