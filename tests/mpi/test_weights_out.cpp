// Nothing lost at any world size (mpirun -np 2, 3, 5):
//  - weights out: a checkpoint written by every rank at ZeRO stage 3 exports (`zeropipe convert`) to
//    the hub layout, and the safetensors reader reads back exactly the engine's final fp32 master
//    weights (GPT-2: its Conv1D weights transposed back to [in, out]);
//  - verified resume: a damaged slice in the newest checkpoint makes every rank skip it together
//    (`--resume latest`) and resume from the previous one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "app/convert.h"
#include "comm/bootstrap.h"
#include "io/checkpoint_file.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/token_dataset.h"
#include "models/transformer.h"
#include "mpi_test_util.h"
#include "runtime/train_config.h"
#include "runtime/lm_training.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

namespace {

const io::json kGpt2 = {{"model_type", "gpt2"}, {"vocab_size", 64}, {"n_positions", 32}, {"n_embd", 32},
                        {"n_layer", 2},         {"n_head", 2}};

std::string tokens(const SharedDir& dir) {
  const std::string p = dir / "tokens.bin";
  if (world_rank() == 0) {
    std::mt19937_64 g(3);
    std::vector<int32_t> t(30 * 16 * 8 + 1);
    for (auto& x : t) x = int32_t(g() % 64);
    io::write_token_file(p, t, 64);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p;
}

TrainConfig gpt2_config(const std::string& data, const std::string& ckpt, int stage, int64_t steps, int64_t save_every,
                        const std::string& resume = "") {
  const io::json user = {{"train_micro_batch_size_per_gpu", 2},
                         {"steps_per_print", 1000},
                         {"zero_optimization", {{"stage", stage}}},
                         {"model", {{"config", kGpt2}}},
                         {"data", {{"train_files", {data}}, {"seq_len", 16}}},
                         {"checkpoint", {{"dir", ckpt}, {"save_every", save_every}, {"keep_last", 0}}},
                         {"training", {{"max_steps", steps}, {"device", "cpu"}}}};
  TrainConfig c = TrainConfig::from(io::Config(train_config_schema(), user, "weights-out-test"));
  c.resume = resume;
  return c;
}

}  // namespace

TEST(WeightsOut, Stage3CheckpointExportsTheEnginesWeightsToTheHubLayout) {
  comm::Runtime rt;
  SharedDir dir("weights_out");
  const std::string data = tokens(dir), ckpt = dir / "ckpt";
  const TrainResult r = train(gpt2_config(data, ckpt, 3, 3, 0), rt, MPI_COMM_WORLD, /*return_params=*/true);
  ASSERT_EQ(r.saved.size(), 1u);
  if (world_rank() == 0) {
    app::ConvertOptions o;
    o.from = r.saved[0];
    o.to = dir / "hub";
    ASSERT_EQ(app::run_convert(o), 0);
    const io::SafetensorsCollection hub = io::SafetensorsCollection::open_dir(o.to, "model");
    // The gathered master weights: every block's parameters, in block and parameter order.
    const models::TransformerConfig mc = models::TransformerConfig::from_hub_json(kGpt2, "gpt2");
    models::Transformer layout(mc, Device::cpu(), DType::F32, nullptr, 1, /*allocate=*/false);
    int64_t at = 0, checked = 0;
    for (nn::ParamBlock* b : layout.blocks()) {
      for (const auto& p : b->params()) {
        ASSERT_TRUE(hub.contains(p->name)) << p->name;
        const Tensor t = hub.file_of(p->name).read_as(p->name, DType::F32);
        ASSERT_LE(at + p->numel(), int64_t(r.final_params.size()));
        const float* engine = r.final_params.data() + at;
        at += p->numel();
        const int64_t rows = p->shape[0], cols = p->numel() / p->shape[0];
        size_t differ = 0;
        for (int64_t i = 0; i < p->numel(); ++i) {
          // A transposed weight: engine [out, in] element (o, k) is hub [in, out] element (k, o).
          const int64_t h = p->file_transposed ? (i % cols) * rows + i / cols : i;
          differ += t.data<float>()[h] != engine[i];
        }
        EXPECT_EQ(differ, 0u) << p->name << (p->file_transposed ? " (transposed)" : "");
        ++checked;
      }
    }
    EXPECT_EQ(at, int64_t(r.final_params.size()));
    EXPECT_EQ(int64_t(hub.names().size()), checked) << "the export holds exactly the model's parameters";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(WeightsOut, EveryRankSkipsADamagedNewestCheckpointTogether) {
  comm::Runtime rt;
  SharedDir dir("latest_fallback");
  const std::string data = tokens(dir), ckpt = dir / "ckpt";
  const TrainResult first = train(gpt2_config(data, ckpt, 2, 2, 1), rt, MPI_COMM_WORLD);
  ASSERT_EQ(first.saved.size(), 2u);
  if (world_rank() == 0) {  // flip bytes inside the newest checkpoint's first optimizer moment
    int64_t at = 0;
    {
      io::H5File f = io::H5File::open(first.saved[1]);
      at = f.dataset_info("/optimizer/" + f.children("/optimizer").front() + "/exp_avg").file_offset;
    }
    std::fstream io(first.saved[1], std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(at);
    io.write("garbage!", 8);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const TrainResult r = train(gpt2_config(data, ckpt, 3, 3, 1, "latest"), rt, MPI_COMM_WORLD);
  EXPECT_EQ(r.resumed_from, first.saved[0]);
  EXPECT_EQ(r.first_step, 1);
  EXPECT_TRUE(fs::exists(first.saved[1] + ".damaged"));
}

}  // namespace zp::test
