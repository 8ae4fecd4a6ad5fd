#include "io/config.h"
#include "test_util.h"

namespace zp::test {
using namespace zp::io;

static json schema() {
  return json::parse(R"({
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "none", "nvme_path": ""}},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}},
    "model": {"config": null}
  })");
}


TEST(Config, MergesOverDefaultsAndOverrides) {
  Config c(schema(), json::parse(R"({"zero_optimization": {"stage": 2}, "optimizer": {"params": {"lr": 6e-4}}})"), "t.json");
  EXPECT_EQ(c.get<int>("zero_optimization.stage"), 2);
  EXPECT_EQ(c.get<std::string>("zero_optimization.offload_optimizer.device"), "none");
  EXPECT_DOUBLE_EQ(c.get<double>("optimizer.params.lr"), 6e-4);
  c.set("zero_optimization.offload_optimizer.device=cpu");
  c.set("gradient_accumulation_steps=4");
  EXPECT_EQ(c.get<std::string>("zero_optimization.offload_optimizer.device"), "cpu");
  EXPECT_EQ(c.get<int>("gradient_accumulation_steps"), 4);
  c.set("train_micro_batch_size_per_gpu=auto");
  EXPECT_TRUE(c.is_auto("train_micro_batch_size_per_gpu"));
  c.set(R"(model.config={"n_layer": 2})");
  EXPECT_EQ(c.at("model.config")["n_layer"], 2);
}

TEST(Config, ErrorsNameTheKey) {
  std::string m = error_message([] { Config(schema(), json::parse(R"({"zero_optimisation": {}})"), "t.json"); });
  EXPECT_NE(m.find("unknown key 'zero_optimisation'"), std::string::npos) << m;
  EXPECT_NE(m.find("t.json"), std::string::npos) << m;
  m = error_message([] { Config(schema(), json::parse(R"({"zero_optimization": {"stage": "two"}})"), "t.json"); });
  EXPECT_NE(m.find("'zero_optimization.stage' must be a number"), std::string::npos) << m;
  m = error_message([] { Config(schema(), json::parse(R"({"optimizer": {"params": {"bogus": 1}}})"), "t.json"); });
  EXPECT_NE(m.find("'optimizer.params.bogus'"), std::string::npos) << m;
  Config c(schema(), json::object(), "t.json");
  m = error_message([&] { c.set("zero_optimization.stag=1"); });
  EXPECT_NE(m.find("--set zero_optimization.stag=1"), std::string::npos) << m;
  m = error_message([&] { c.set("nonsense"); });
  EXPECT_NE(m.find("key.path=value"), std::string::npos) << m;
  EXPECT_THROW(Config::from_file(schema(), "/nonexistent.json"), Error);
}

}  // namespace zp::test
