// The sharding policy (parallel/sharding_policy.h): what each ZeRO stage shards, the configuration's
// offload devices as tiers, and the refusal, naming the key, of tiers that do not exist yet
// (parameter offload).
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/transformer.h"
#include "parallel/zero_engine.h"
#include "test_util.h"
#include "tiny_llama_config.h"

namespace zp::test {
using parallel::ShardingPolicy;
using parallel::StateTier;

TEST(ShardingPolicy, EachStageShardsWhatZeroSays) {
  struct Want {
    bool optimizer, gradients, parameters, gathers_updated;
  };
  const Want want[4] = {{false, false, false, false},
                        {true, false, false, true},
                        {true, true, false, true},
                        {true, true, true, false}};
  for (int stage = 0; stage <= 3; ++stage) {
    const ShardingPolicy p = ShardingPolicy::zero_stage(stage);
    EXPECT_EQ(p.stage(), stage);
    EXPECT_EQ(p.shards_optimizer_state(), want[stage].optimizer) << "stage " << stage;
    EXPECT_EQ(p.shards_gradients(), want[stage].gradients) << "stage " << stage;
    EXPECT_EQ(p.shards_parameters(), want[stage].parameters) << "stage " << stage;
    EXPECT_EQ(p.gathers_updated_weights(), want[stage].gathers_updated) << "stage " << stage;
    EXPECT_EQ(p.optimizer_tier(), StateTier::Device);
    EXPECT_EQ(p.parameter_tier(), StateTier::Device);
    EXPECT_NO_THROW(p.require_implemented());
  }
  EXPECT_EQ(ShardingPolicy().stage(), 0);
  EXPECT_THROW(ShardingPolicy::zero_stage(4), Error);
}

TEST(ShardingPolicy, OffloadDevicesAreTiers) {
  EXPECT_EQ(ShardingPolicy::from_config(2, "none", "none").optimizer_tier(), StateTier::Device);
  EXPECT_EQ(ShardingPolicy::from_config(2, "cpu", "none").optimizer_tier(), StateTier::PinnedHost);
  EXPECT_EQ(ShardingPolicy::from_config(1, "nvme", "none").optimizer_tier(), StateTier::Nvme);
  EXPECT_EQ(ShardingPolicy::from_config(3, "cpu", "nvme").parameter_tier(), StateTier::Nvme);
  EXPECT_EQ(ShardingPolicy::from_config(3, "none", "cpu").parameter_tier(), StateTier::PinnedHost);
  EXPECT_EQ(ShardingPolicy::from_config(3, "cpu", "nvme").str(),
            "ZeRO stage 3 (optimizer state, gradients and parameters sharded; optimizer state on pinned host memory, "
            "parameters on NVMe)");
  EXPECT_EQ(ShardingPolicy::zero_stage(1).str(), "ZeRO stage 1 (optimizer state sharded; optimizer state on device)");
  ShardingPolicy pageable = ShardingPolicy::from_config(2, "cpu", "none");
  EXPECT_TRUE(pageable.pin_host_memory());
  pageable.set_pin_host_memory(false);
  EXPECT_EQ(pageable.str(),
            "ZeRO stage 2 (optimizer state and gradients sharded; optimizer state on pageable host memory)");
}

TEST(ShardingPolicy, ImpossibleCombinationsNameTheKeys) {
  std::string m = error_message([] { ShardingPolicy::from_config(2, "none", "cpu"); });
  EXPECT_NE(m.find("zero_optimization.offload_param.device"), std::string::npos) << m;
  EXPECT_NE(m.find("stage 3"), std::string::npos) << m;
  m = error_message([] { ShardingPolicy::from_config(0, "cpu", "none"); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.device"), std::string::npos) << m;
  m = error_message([] { ShardingPolicy::from_config(1, "disk", "none"); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.device = \"disk\""), std::string::npos) << m;
}

// Every tier is implemented; the one combination the engine does not run, the delayed update with the
// parameters on NVMe, is refused naming both keys, by the engine before it allocates or fills anything.
TEST(ShardingPolicy, CombinationsNotRunAreRefusedByKey) {
  EXPECT_EQ(error_message([] { ShardingPolicy::from_config(2, "cpu", "none").require_implemented(); }), "")
      << "optimizer state in host memory is implemented";
  EXPECT_EQ(error_message([] { ShardingPolicy::from_config(2, "nvme", "none").require_implemented(); }), "")
      << "optimizer state on NVMe is implemented";
  EXPECT_EQ(error_message([] { ShardingPolicy::from_config(3, "cpu", "cpu").require_implemented(); }), "")
      << "parameters in host memory are implemented";
  EXPECT_EQ(error_message([] { ShardingPolicy::from_config(3, "none", "cpu").require_implemented(); }), "");
  EXPECT_EQ(error_message([] { ShardingPolicy::from_config(3, "none", "nvme").require_implemented(); }), "")
      << "parameters on NVMe are implemented";
  ShardingPolicy delayed = ShardingPolicy::from_config(3, "cpu", "nvme");
  delayed.set_delayed_update(true);
  std::string m = error_message([&] { delayed.require_implemented(); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.delayed_update"), std::string::npos) << m;
  EXPECT_NE(m.find("zero_optimization.offload_param.device = \"nvme\""), std::string::npos) << m;

  auto cfg = models::TransformerConfig::from_hub_json(tiny_llama(), "policy-test");
  models::Transformer lazy(cfg, Device::cpu(), DType::F32, nullptr, parallel::shard_pad_multiple(1),
                           /*allocate=*/false);
  int filled = 0;
  m = error_message([&] {
    parallel::ZeroEngine engine(lazy.blocks(), delayed, nullptr, {}, nullptr, [&](nn::ParamBlock&) { ++filled; });
  });
  EXPECT_NE(m.find("zero_optimization.offload_param.device"), std::string::npos) << m;
  EXPECT_EQ(filled, 0);
  for (nn::ParamBlock* b : lazy.blocks()) EXPECT_FALSE(b->values().defined()) << b->name();
}

}  // namespace zp::test

namespace zp::test {

// The delayed update is the CPU optimizer's: the engine refuses it with the optimizer state on the
// device, naming both keys, before it allocates anything; its pool leaves the rank's own thread a core.
TEST(ShardingPolicy, DelayedUpdateNeedsTheOptimizerOnTheCpu) {
  ShardingPolicy on_device = ShardingPolicy::from_config(2, "none", "none");
  on_device.set_delayed_update(true);
  std::string m = error_message([&] { on_device.require_implemented(); });
  EXPECT_NE(m.find("zero_optimization.offload_optimizer.delayed_update needs "
                   "zero_optimization.offload_optimizer.device = \"cpu\" or \"nvme\""), std::string::npos) << m;
  EXPECT_NE(m.find("got \"none\""), std::string::npos) << m;

  auto cfg = models::TransformerConfig::from_hub_json(tiny_llama(), "policy-test");
  models::Transformer lazy(cfg, Device::cpu(), DType::F32, nullptr, parallel::shard_pad_multiple(1),
                           /*allocate=*/false);
  int filled = 0;
  m = error_message([&] {
    parallel::ZeroEngine engine(lazy.blocks(), on_device, nullptr, {}, nullptr, [&](nn::ParamBlock&) { ++filled; });
  });
  EXPECT_NE(m.find("delayed_update"), std::string::npos) << m;
  EXPECT_EQ(filled, 0);

  ShardingPolicy offloaded = ShardingPolicy::from_config(2, "cpu", "none");
  offloaded.set_host_threads(8);
  EXPECT_EQ(offloaded.optimizer_threads(), 8);
  offloaded.set_delayed_update(true);
  EXPECT_EQ(offloaded.optimizer_threads(), 7);
  offloaded.set_host_threads(1);
  EXPECT_EQ(offloaded.optimizer_threads(), 1);
  EXPECT_NE(offloaded.str().find("update delayed one step"), std::string::npos) << offloaded.str();
  EXPECT_EQ(error_message([&] { offloaded.require_implemented(); }), "");
}

}  // namespace zp::test

namespace zp::test {

// zero_optimization.offload_optimizer.ratio: the leading ranges that come nearest the device's share
// keep their state there; all stay with the device tier, none with the whole state offloaded.
TEST(ShardingPolicy, OffloadRatioKeepsTheLeadingShareOnTheDevice) {
  const std::vector<int64_t> sizes = {10, 10, 10, 10};
  auto kept = [&](const char* tier, double ratio) {
    ShardingPolicy p = ShardingPolicy::from_config(2, tier, "none");
    p.set_offload_ratio(ratio);
    return p.keeps_on_device(sizes);
  };
  using V = std::vector<char>;
  EXPECT_EQ(kept("cpu", 1.0), (V{0, 0, 0, 0}));
  EXPECT_EQ(kept("cpu", 0.0), (V{1, 1, 1, 1}));
  EXPECT_EQ(kept("cpu", 0.5), (V{1, 1, 0, 0}));
  EXPECT_EQ(kept("nvme", 0.75), (V{1, 0, 0, 0}));
  EXPECT_EQ(kept("cpu", 0.7), (V{1, 0, 0, 0})) << "12 of 40 wanted: one range (10) is nearer than two (20)";
  EXPECT_EQ(kept("cpu", 0.6), (V{1, 1, 0, 0})) << "16 of 40 wanted: two ranges (20) are nearer than one (10)";
  EXPECT_EQ(kept("none", 0.5), (V{1, 1, 1, 1})) << "the device tier holds everything whatever the ratio";
  ShardingPolicy p = ShardingPolicy::from_config(3, "cpu", "none");
  EXPECT_EQ(p.offload_ratio(), 1.0);
  p.set_offload_ratio(0.25);
  EXPECT_NE(p.str().find("optimizer state on pinned host memory for 25% of it, the rest on the device"),
            std::string::npos) << p.str();
  EXPECT_NE(error_message([&] { p.set_offload_ratio(1.5); }).find("zero_optimization.offload_optimizer.ratio"),
            std::string::npos);
  EXPECT_EQ(error_message([&] { p.require_implemented(); }), "");
  // The delayed update runs the whole update on a host thread: refused, naming both keys.
  p.set_delayed_update(true);
  const std::string m = error_message([&] { p.require_implemented(); });
  EXPECT_NE(m.find("delayed_update needs zero_optimization.offload_optimizer.ratio 1"), std::string::npos) << m;
}

}  // namespace zp::test
