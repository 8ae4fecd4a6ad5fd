// ZeRO-3-sharded inference under mpirun (issue 13, item 6): with shard_weights every rank keeps 1/N
// of each block and the blocks are gathered over the world for every forward, so the ranks run their
// forwards in lockstep, a rank out of requests (or without any) joining with empty forwards. Each
// rank's tokens must equal those of a resident one-rank model given the same requests (the same batch
// layout, so the comparison is exact and about the weights alone), evaluation must equal a resident
// model's on one rank, nothing may deadlock when ranks hold unequal numbers or lengths of requests,
// and each rank must hold, and read from the files, about 1/N of the weight bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <sstream>

#include "app/chat_command.h"
#include "app/convert.h"
#include "comm/bootstrap.h"
#include "mpi_test_util.h"
#include "parallel/zero_engine.h"
#include "runtime/eval_tasks.h"
#include "runtime/generation_engine.h"
#include "runtime/inference_model.h"
#include "runtime/lm_evaluation.h"
#include "runtime/loglikelihood_scorer.h"
#include "runtime/until_generator.h"

namespace zp::test {
namespace {
namespace fs = std::filesystem;
using namespace zp::runtime;

std::string golden(const std::string& name) { return (fs::path(ZP_GOLDEN_DIR) / name).string(); }

// Request i of `count`: ragged prompts and lengths; odd ones sampled with their own seed.
GenerationRequest request(int64_t i) {
  GenerationRequest r;
  const int64_t len = 1 + (i * 7) % 23;
  for (int64_t k = 0; k < len; ++k) r.prompt.push_back(int32_t(1 + (i * 13 + k * 5) % 90));
  r.max_new_tokens = 6 + (i * 11) % 29;
  if (i % 2 == 1) r.sampling = {0.8f, 20, 0.9f, 1.f, uint64_t(100 + i), 0};
  return r;
}

// The tokens of requests `which` (in that order) through one engine on `m`; with sharded weights the
// rank then joins the others' forwards.
std::vector<std::vector<int32_t>> generate(InferenceModel& m, const std::vector<int64_t>& which) {
  GenerationOptions o;
  o.block_size = 8;
  o.kv_cache_bytes = 1 << 22;
  // A resident model on a GPU would replay decode steps as CUDA graphs, a sharded one cannot: both
  // launch kernel by kernel, so the comparison is about the weights alone.
  o.max_graph_seqs = 0;
  GenerationEngine engine(m.model(), nullptr, o);
  engine.set_before_forward(m.forward_hook());
  for (int64_t i : which) engine.submit(request(i));
  while (!engine.idle()) engine.step();
  m.join_until_every_rank_is_done();
  std::vector<std::vector<int32_t>> out;
  for (size_t k = 0; k < which.size(); ++k) out.push_back(engine.output(int64_t(k)).ids);
  return out;
}

// This rank's share of `count` requests, dealt by index as `zeropipe generate` deals them.
std::vector<int64_t> my_requests(int64_t count) {
  std::vector<int64_t> mine;
  for (int64_t i = world_rank(); i < count; i += world_size()) mine.push_back(i);
  return mine;
}

InferenceModelOptions sharded(const std::string& name, const std::string& offload = "none",
                              const std::string& device = "cpu", const std::string& dtype = "fp32") {
  InferenceModelOptions o{golden(name), "", device, dtype, offload};
  o.shard_weights = true;
  return o;
}

TEST(MpiShardedInference, GeneratesTheResidentTokens) {
  SharedDir swap("sharded_inference_nvme");
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    InferenceModel resident({golden(name), "", "cpu", "fp32"});
    for (const char* offload : {"none", "cpu", "nvme"}) {
      if (std::string(offload) != "none" && std::string(name) != "llama-tiny") continue;
      InferenceModelOptions o = sharded(name, offload);
      if (std::string(offload) == "nvme") {
        o.nvme_path = swap.str();
        o.nvme_buffer_count = 2;  // blocks come from the file on every forward
      }
      InferenceModel m(o);
      EXPECT_EQ(m.weight_shards(), world_size());
      // 1/N of the weights, give or take each block's padding to a multiple of N x 256 bytes.
      const int64_t all = resident.resident_weight_bytes(), mine = m.resident_weight_bytes();
      const int64_t slack = int64_t(m.model().blocks().size()) * parallel::shard_pad_multiple(world_size()) * 4;
      EXPECT_GE(mine * world_size(), all) << name << " " << offload;
      EXPECT_LE(mine * world_size(), all + slack) << name << " " << offload;
      EXPECT_LT(mine, all) << name << " " << offload;
      // Each rank read its slices from the files, about 1/N of the model: at most a row more at either
      // end of a tensor its slice cuts (a transposed weight reads whole stored rows), and the ranks
      // together read all of it.
      int64_t row_slack = 0;
      for (const nn::ParamBlock* b : m.model().blocks())
        for (const auto& p : b->params()) row_slack += 2 * p->shape.back() * 4;
      const int64_t read_all = resident.weight_bytes_read(), read_mine = m.weight_bytes_read();
      int64_t read_sum = 0;
      MPI_Allreduce(&read_mine, &read_sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
      EXPECT_GE(read_sum, read_all) << name << " " << offload;
      EXPECT_LE(read_mine * world_size(), read_all + row_slack) << name << " " << offload;
      if (world_size() > 1) EXPECT_LT(read_mine, read_all * 3 / 4) << name << " " << offload;
      // 7 requests: unequal counts and lengths on 2 and 3 ranks.
      const std::vector<int64_t> which = my_requests(7);
      EXPECT_EQ(generate(m, which), generate(resident, which)) << name << " offload " << offload << " rank "
                                                               << world_rank();
    }
  }
}

// On GPUs the gathers are NCCL all-gathers on the communication stream, the next block prefetched
// while the current one computes (and with host shards each shard copied up first).
TEST(MpiShardedInferenceGpu, GeneratesTheResidentTokens) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  comm::Runtime rt;  // each rank on its own GPU
  for (const char* name : {"gpt2-tiny", "llama-tiny"})
    for (const char* dtype : {"fp32", "bf16"}) {
      InferenceModel resident({golden(name), "", "cuda", dtype});
      for (const char* offload : {"none", "cpu"}) {
        InferenceModel m(sharded(name, offload, "cuda", dtype));
        EXPECT_LT(m.resident_weight_bytes() * (world_size() - 1), resident.resident_weight_bytes())
            << name << " " << dtype << " " << offload;
        // 7 requests over the ranks, and then one request: the ranks without it join its forwards.
        for (int64_t count : {7, 1}) {
          const std::vector<int64_t> which = my_requests(count);
          EXPECT_EQ(generate(m, which), generate(resident, which))
              << name << " " << dtype << " offload " << offload << " rank " << world_rank() << " of " << count;
        }
      }
    }
  MPI_Barrier(MPI_COMM_WORLD);
}

// From a weights file (zeropipe convert, bf16 on disk, so every slice read converts) each rank reads
// its slices through HDF5 selections and makes the tokens of a resident model loaded from that file;
// no rank reads the whole file, and the ranks together read all of it.
TEST(MpiShardedInference, ReadsItsSlicesFromAWeightsFile) {
  SharedDir dir("sharded_inference_h5");
  const std::string h5 = dir / "llama-tiny.h5";
  int converted = 0;
  if (world_rank() == 0) {
    try {
      app::ConvertOptions c;
      c.from = golden("llama-tiny");
      c.to = h5;
      c.dtype = "bf16";
      converted = app::run_convert(c) == 0;
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  MPI_Bcast(&converted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(converted);
  InferenceModel resident({h5, "", "cpu", "fp32"});
  InferenceModelOptions o{h5, "", "cpu", "fp32"};
  o.shard_weights = true;
  InferenceModel m(o);
  const int64_t read_all = resident.weight_bytes_read(), read_mine = m.weight_bytes_read();
  int64_t read_sum = 0;
  MPI_Allreduce(&read_mine, &read_sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(read_sum, read_all);
  EXPECT_LT(read_mine, read_all) << "rank " << world_rank();
  const std::vector<int64_t> which = my_requests(5);
  EXPECT_EQ(generate(m, which), generate(resident, which)) << "rank " << world_rank();
}

TEST(MpiShardedInference, RanksWithoutRequestsJoinUntilTheOthersFinish) {
  InferenceModel resident({golden("llama-tiny"), "", "cpu", "fp32"});
  InferenceModel m(sharded("llama-tiny"));
  // One request: rank 0 runs it (40 forwards), the other ranks have none and join each of them.
  const std::vector<int64_t> which = my_requests(1);
  EXPECT_EQ(which.size(), world_rank() == 0 ? 1u : 0u);
  const auto tokens = generate(m, which);
  EXPECT_EQ(tokens, generate(resident, which));
  // And the same model goes on serving afterwards: now every rank but the last has one.
  std::vector<int64_t> again;
  if (world_rank() + 1 < world_size()) again.push_back(3 + world_rank());
  EXPECT_EQ(generate(m, again), generate(resident, again)) << "rank " << world_rank();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiShardedInference, EvaluationEqualsTheResidentModel) {
  const fs::path data = ZP_EVAL_DATA_DIR;
  const std::string model = (data / "demo-model").string();
  InferenceModelOptions o{model, "", "cpu", "fp32"};
  o.shard_weights = true;
  InferenceModel m(o);
  const std::vector<EvalTask> tasks = {read_eval_task((data / "licenses_mc.jsonl").string()),
                                       read_eval_task((data / "licenses_rolling.jsonl").string())};
  LmEvaluationOptions opt;
  opt.max_length = m.config().max_positions;
  opt.limit = 7;  // 28 choices and 7 paragraphs: dealt unevenly over 2 and 3 ranks, some long
  // A small batch budget: several forwards per rank, in unequal numbers.
  LoglikelihoodScorer scorer(m.model(), m.stream(), opt.max_length, 256);
  scorer.set_before_forward(m.forward_hook());
  const ScoreLoglikelihood score = [&](const std::vector<LoglikelihoodRequest>& r) {
    std::vector<LoglikelihoodResult> res = scorer.score(r);
    m.join_until_every_rank_is_done();
    return res;
  };
  const auto world = evaluate_tasks(tasks, *m.tokenizer(), opt, score, {}, MPI_COMM_WORLD);

  // generate_until asks, fewer than ranks at np 3: one rank has none.
  std::vector<GenerationAsk> asks;
  for (int64_t i = 0; i < 2; ++i) {
    GenerationAsk a;
    a.context = m.tokenizer()->encode(i == 0 ? "Permission is hereby granted" : "THE SOFTWARE IS", {});
    a.max_new_tokens = 12 + 9 * i;
    asks.push_back(a);
  }
  std::vector<GenerationAsk> my_asks;
  for (int64_t i : my_requests(int64_t(asks.size()))) my_asks.push_back(asks[size_t(i)]);
  const std::vector<std::string> texts = generate_greedy_until(m.model(), *m.tokenizer(), opt.max_length, my_asks,
                                                               m.forward_hook());
  m.join_until_every_rank_is_done();

  if (world_rank() != 0) {
    EXPECT_TRUE(world.is_null());
  } else {
    InferenceModel resident({model, "", "cpu", "fp32"});
    LoglikelihoodScorer alone_scorer(resident.model(), resident.stream(), opt.max_length, 256);
    const auto alone = evaluate_tasks(
        tasks, *resident.tokenizer(), opt, [&](const auto& r) { return alone_scorer.score(r); }, {}, MPI_COMM_SELF);
    EXPECT_EQ(world["n-samples"], alone["n-samples"]);
    for (const char* task : {"licenses_mc", "licenses_rolling"})
      for (auto& [k, v] : alone["results"][task].items())
        EXPECT_EQ(world["results"][task][k], v) << task << " " << k << " at " << world_size() << " ranks";
    EXPECT_EQ(texts, generate_greedy_until(resident.model(), *resident.tokenizer(), opt.max_length, my_asks));
    EXPECT_FALSE(texts.empty());
  }
  if (world_rank() != 0 && !my_asks.empty()) {  // the other ranks' asks, against a resident model too
    InferenceModel resident({model, "", "cpu", "fp32"});
    EXPECT_EQ(texts, generate_greedy_until(resident.model(), *resident.tokenizer(), opt.max_length, my_asks));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiShardedInference, ChatRefusesShardedWeights) {
  app::ChatOptions o;
  o.model = sharded("llama-tiny");
  std::istringstream in("hello\n");
  std::ostringstream out;
  try {
    app::run_chat(o, in, out);
    ADD_FAILURE() << "chat ran with --shard-weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--shard-weights does not apply to chat"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zp::test
