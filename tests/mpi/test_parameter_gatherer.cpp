// The ZeRO-3 parameter gatherer on its own (parallel/parameter_gatherer.h), as a pipeline stage or an
// inference run would use it: with only its shard of every block on each rank, it serves a model's
// forward with the same logits and loss as the unsharded model, step after step, and a block's full
// buffer exists only while the model holds it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/topology.h"
#include "io/config.h"
#include "models/transformer.h"
#include "parallel/collective_stream.h"
#include "parallel/parameter_gatherer.h"
#include "parallel/zero_engine.h"
#include "runtime/causal_lm_loss.h"

namespace zp::test {

TEST(ParameterGatherer, ServesAForwardAlone) {
  comm::Runtime rt;
  const int world = rt.world_size();
  io::json hub = {{"model_type", "llama"}, {"vocab_size", 70}, {"hidden_size", 32}, {"intermediate_size", 48},
                  {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                  {"max_position_embeddings", 32}};
  auto cfg = models::TransformerConfig::from_hub_json(hub, "gatherer-test");
  auto dp = comm::make_communicator(comm::Backend::Mpi, MPI_COMM_WORLD);
  const int64_t pad = parallel::shard_pad_multiple(world);
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[size_t(i)] = int32_t((i * 7 + 3) % 70);
    targets[size_t(i)] = int32_t((i * 5 + 1) % 70);
  }

  models::Transformer full(cfg, Device::cpu(), DType::F32, nullptr, pad);
  full.init_random(11, 0.02);
  // An inference forward: the gatherer serves forwards that no backward follows.
  models::TransformerActivations want;
  full.forward(ids.data(), B, T, want, models::ForwardMode::Inference);
  const double want_loss = runtime::CausalLmLoss(want.logits, cfg.vocab, targets.data(), B * T).mean();

  models::Transformer sharded(cfg, Device::cpu(), DType::F32, nullptr, pad);
  sharded.init_random(11, 0.02);
  parallel::CollectiveStream comm(dp.get(), nullptr);
  parallel::ParameterGatherer gatherer(dp.get(), comm);
  for (nn::ParamBlock* b : sharded.blocks()) {
    gatherer.add(*b);
    EXPECT_FALSE(b->values().defined()) << b->name() << ": the full buffer is freed";
  }
  ASSERT_EQ(gatherer.size(), sharded.blocks().size());
  EXPECT_EQ(gatherer.shard(0).numel(), sharded.blocks()[0]->padded() / world);
  sharded.set_block_access(&gatherer);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass follows the order the first one learned
    gatherer.begin_step();
    models::TransformerActivations got;
    sharded.forward(ids.data(), B, T, got, models::ForwardMode::Inference);
    const Tensor &g = got.logits, &w = want.logits;
    ASSERT_EQ(g.numel(), w.numel());
    EXPECT_EQ(std::vector<float>(g.data<float>(), g.data<float>() + g.numel()),
              std::vector<float>(w.data<float>(), w.data<float>() + w.numel()))
        << "pass " << pass;
    EXPECT_EQ(runtime::CausalLmLoss(got.logits, cfg.vocab, targets.data(), B * T).mean(), want_loss) << "pass " << pass;
    for (nn::ParamBlock* b : sharded.blocks()) EXPECT_FALSE(b->values().defined()) << b->name() << " released";
  }

  // Kept gathered (pipeline.keep_gathered): the second micro-batch uses the buffers the first
  // gathered, and they go only when the weights would change.
  gatherer.set_keep_gathered(true);
  gatherer.begin_step();
  std::vector<const void*> buffers;
  for (int micro = 0; micro < 2; ++micro) {
    models::TransformerActivations got;
    sharded.forward(ids.data(), B, T, got, models::ForwardMode::Inference);
    EXPECT_EQ(std::vector<float>(got.logits.data<float>(), got.logits.data<float>() + got.logits.numel()),
              std::vector<float>(want.logits.data<float>(), want.logits.data<float>() + want.logits.numel()))
        << "micro-batch " << micro;
    for (size_t i = 0; i < sharded.blocks().size(); ++i) {
      const nn::ParamBlock& b = *sharded.blocks()[i];
      ASSERT_TRUE(b.values().defined()) << b.name() << " kept after micro-batch " << micro;
      if (micro == 0) buffers.push_back(b.values().data());
      else EXPECT_EQ(b.values().data(), buffers[i]) << b.name() << ": gathered again";
    }
  }
  gatherer.release_kept();
  for (nn::ParamBlock* b : sharded.blocks()) EXPECT_FALSE(b->values().defined()) << b->name() << " released";
}

}  // namespace zp::test
