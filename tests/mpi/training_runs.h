// Small training runs shared by the MPI suites (checkpoint resume, offload): the data of each model
// (tokens for the LMs, latents for the demo UNet), its config, and a run of the training loop on a
// group of ranks. A global batch of kGlobalBatch samples whatever the world size or accumulation.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "app/make_latents.h"
#include "comm/bootstrap.h"
#include "io/checkpoint_file.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "mpi_test_util.h"
#include "runtime/diffusion_config.h"
#include "runtime/diffusion_training.h"
#include "runtime/lm_training.h"
#include "runtime/train_config.h"
#include "test_util.h"

namespace zp::test {

inline constexpr int kGlobalBatch = 30;  // divisible by 1, 2, 3 and 5
inline constexpr int kSteps = 6, kSaveAt = 3;

inline const std::string kUNetDemo =
    (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "configs" / "unet-demo-tiny.json").string();

// The training data of `model`: tokens for an LM, latents for "unet" (make-latents for the demo
// config's UNet, at 8x8 rather than its 16x16 to keep the test short; two global batches' worth, so
// the order wraps into a second epoch).
inline std::string data_file(const SharedDir& dir, const std::string& model) {
  const std::string p = dir / (model == "unet" ? "latents.h5" : "tokens.bin");
  if (world_rank() == 0) {
    if (model == "unet") {
      std::ifstream in(kUNetDemo);
      io::json unet = io::json::parse(in)["model"]["config"];
      unet["sample_size"] = 8;
      app::make_latents(p, unet.dump(), 2 * kGlobalBatch, 5);
    } else {
      std::mt19937_64 g(11);
      std::vector<int32_t> t(kGlobalBatch * kSteps * 16 + 1);
      for (auto& x : t) x = int32_t(g() % 64);
      io::write_token_file(p, t, 64);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p;
}

inline io::json model_json(const std::string& type) {
  return type == "gpt2" ? io::json{{"model_type", "gpt2"}, {"vocab_size", 64}, {"n_positions", 32}, {"n_embd", 32},
                                   {"n_layer", 2}, {"n_head", 2}}
                        : io::json{{"model_type", "llama"}, {"vocab_size", 64}, {"hidden_size", 32},
                                   {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                   {"num_key_value_heads", 2}, {"max_position_embeddings", 32}};
}

struct TrainingRun {
  std::string model = "llama";  // llama | gpt2 | unet
  int stage = 0, world = 1;
  int64_t max_steps = kSteps, save_every = 0;
  std::string dir, resume;
  std::string device = "cpu";
  bool activation_checkpointing = false;
  std::string offload = "none";  // zero_optimization.offload_optimizer.device
  // zero_optimization.offload_optimizer.nvme_path with offload "nvme" and offload_param.nvme_path with
  // offload_param "nvme"; "" picks the temporary directory (the swap files are unlinked as they are
  // opened, so nothing is left there).
  std::string nvme_path;
  std::string offload_param = "none";  // zero_optimization.offload_param.device (stage 3)
  int grad_accum = 1;            // the micro-batch shrinks to keep the global batch
  // pipeline.* (issue 12): `world` = stages x data-parallel size
  int stages = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  io::json partition = "parameters";
  int64_t layers = 2;  // the LMs' layers
  bool delayed_update = false;   // zero_optimization.offload_optimizer.delayed_update
  bool bf16 = false;             // bf16.enabled (else fp32)
  bool keep_gathered = false;    // pipeline.keep_gathered
  io::json lora;                 // the lora section (null: no LoRA)
  double init_std = 0.02;        // model.init_std
  double lr = 3e-3;              // optimizer.params.lr
  io::json scheduler;            // the scheduler section instead of the suites' warmup (null: that)
  int param_buffer_count = 0;    // zero_optimization.offload_param.buffer_count with offload_param "nvme" (0: default)
  bool async_save = false;       // checkpoint.async
  int global_batch = kGlobalBatch;
  std::string data_format = "tokens";  // data.format: "instruct" for instruction_data_file()'s records
  io::json fp16;                 // the fp16 section (null: none, so bf16 or fp32 as above)
  // Validation: training.eval_every (0: none) and eval_batches (per data rank), on data.val_files
  // = {val_file} (the training data when empty).
  int64_t eval_every = 0, eval_batches = 4;
  std::string val_file;
  double offload_ratio = 1.0;  // zero_optimization.offload_optimizer.ratio
  // New fields go last: suites build runs with positional initialisers.
};

// The LMs' config is written here; the UNet's is the demo config with the same overrides.
inline io::Config user_config(const std::string& data, const TrainingRun& r) {
  io::json user = {{"train_micro_batch_size_per_gpu", r.global_batch / (r.world / r.stages * r.grad_accum)},
                   {"gradient_accumulation_steps", r.grad_accum},
                   {"steps_per_print", 1000},
                   {"gradient_clipping", 0.5},
                   {"optimizer", {{"params", {{"lr", r.lr}, {"weight_decay", 0.1}}}}},
                   // The schedule's length is fixed: a 3-step run that saves is the start of the 6-step one.
                   {"scheduler", {{"params", {{"warmup_num_steps", 2}, {"total_num_steps", kSteps}}}}},
                   {"zero_optimization",
                    {{"stage", r.stage},
                     {"offload_optimizer", {{"device", r.offload}}},
                     {"offload_param", {{"device", r.offload_param}}}}},
                   {"model", {{"activation_checkpointing", r.activation_checkpointing}}},
                   {"data", {{"train_files", {data}}, {"val_fraction", 0.0}}},
                   {"checkpoint", {{"dir", r.dir}, {"save_every", r.save_every}, {"keep_last", 0}}},
                   {"pipeline", {{"stages", r.stages}, {"schedule", r.schedule}, {"virtual_stages", r.virtual_stages},
                                 {"partition", r.partition}, {"keep_gathered", r.keep_gathered}}},
                   {"training",
                    {{"max_steps", r.max_steps},
                     {"device", r.device},
                     {"eval_every", r.eval_every},
                     {"eval_batches", r.eval_batches}}}};
  if (r.delayed_update) user["zero_optimization"]["offload_optimizer"]["delayed_update"] = true;
  if (r.offload_ratio != 1.0) user["zero_optimization"]["offload_optimizer"]["ratio"] = r.offload_ratio;
  if (r.async_save) user["checkpoint"]["async"] = true;
  if (r.bf16) user["bf16"] = {{"enabled", true}};
  if (!r.fp16.is_null()) user["fp16"] = r.fp16;
  if (r.data_format != "tokens") user["data"]["format"] = r.data_format;
  if (r.eval_every > 0) user["data"]["val_files"] = {r.val_file.empty() ? data : r.val_file};
  if (!r.lora.is_null()) user["lora"] = r.lora;
  user["model"]["init_std"] = r.init_std;
  if (!r.scheduler.is_null()) user["scheduler"] = r.scheduler;
  const std::string nvme_path = r.nvme_path.empty() ? std::filesystem::temp_directory_path().string() : r.nvme_path;
  if (r.offload == "nvme") user["zero_optimization"]["offload_optimizer"]["nvme_path"] = nvme_path;
  if (r.offload_param == "nvme") {
    user["zero_optimization"]["offload_param"]["nvme_path"] = nvme_path;
    if (r.param_buffer_count > 0) user["zero_optimization"]["offload_param"]["buffer_count"] = r.param_buffer_count;
  }
  if (r.model == "unet") {
    std::ifstream in(kUNetDemo);
    io::json demo = io::json::parse(in);
    demo.merge_patch(user);
    return io::Config(runtime::train_schema_with_diffusion(), demo, kUNetDemo);
  }
  user["model"]["config"] = model_json(r.model);
  user["model"]["config"][r.model == "gpt2" ? "n_layer" : "num_hidden_layers"] = r.layers;
  user["data"]["seq_len"] = 16;
  return io::Config(runtime::train_config_schema(), user, "resume-test");
}

inline runtime::TrainResult run(const std::string& data, const TrainingRun& r, comm::Runtime& rt, MPI_Comm group,
                bool return_params = false) {
  const io::Config c = user_config(data, r);
  if (r.model == "unet") {
    runtime::UNetTrainConfig u = runtime::UNetTrainConfig::from(c);
    u.common.resume = r.resume;
    return runtime::train_unet(u, rt, group, return_params);
  }
  runtime::TrainConfig t = runtime::TrainConfig::from(c);
  t.resume = r.resume;
  return runtime::train(t, rt, group, return_params);
}

// The first `n` ranks of the world, or MPI_COMM_NULL on the others.
inline MPI_Comm first_ranks(int n) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &c);
  return c;
}

// Run `r` (its world 1) on world rank 0 alone and broadcast its losses and final parameters: the
// trajectory every layout must follow.
inline runtime::TrainResult single_rank_reference(const std::string& data, const TrainingRun& r, comm::Runtime& rt) {
  runtime::TrainResult res;
  if (MPI_Comm one = first_ranks(1); one != MPI_COMM_NULL) {
    res = run(data, r, rt, one, true);
    MPI_Comm_free(&one);
  }
  int n[2] = {int(res.losses.size()), int(res.final_params.size())};
  MPI_Bcast(n, 2, MPI_INT, 0, MPI_COMM_WORLD);
  res.losses.resize(size_t(n[0]));
  res.final_params.resize(size_t(n[1]));
  MPI_Bcast(res.losses.data(), n[0], MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(res.final_params.data(), n[1], MPI_FLOAT, 0, MPI_COMM_WORLD);
  return res;
}

// The message of the zp::Error a run throws on every rank; "" when it runs.
inline std::string error_of(const std::string& data, const TrainingRun& r, comm::Runtime& rt) {
  return error_message([&] { run(data, r, rt, MPI_COMM_WORLD); });
}

inline std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return from <= v.size() ? std::vector<double>(v.begin() + long(from), v.end()) : std::vector<double>{};
}

// Two runs on one trajectory up to float rounding: every loss within 1e-5 relative, and the final
// fp32 parameters within 1e-5 relative RMS. `first_step`: the step before got's first loss (messages).
inline void expect_same_trajectory(const runtime::TrainResult& got, const runtime::TrainResult& want,
                                   const std::string& what, int64_t first_step = 0) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i]))
        << what << " step " << first_step + int64_t(i) + 1;
  ASSERT_EQ(got.final_params.size(), want.final_params.size()) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.final_params.size(); ++i) {
    const double d = double(got.final_params[i]) - want.final_params[i];
    num += d * d;
    den += double(want.final_params[i]) * want.final_params[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-5) << what << ": final parameters";
}

// Runs `r` for kSaveAt steps on the first r.world ranks, saving the last one under `dir`; returns the
// checkpoint's path on every rank.
inline std::string save_at_half(const std::string& data, TrainingRun r, const std::string& dir, comm::Runtime& rt) {
  r.dir = dir;
  r.max_steps = kSaveAt;
  r.save_every = kSaveAt;
  if (MPI_Comm g = first_ranks(r.world); g != MPI_COMM_NULL) {
    run(data, r, rt, g);
    MPI_Comm_free(&g);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return r.dir + "/" + io::checkpoint_filename(kSaveAt);
}

// Resumes `r` from `resume` (save_at_half's file, or "latest" in r.dir) on the first r.world ranks: it
// must go on from step kSaveAt and follow `want`, the whole run's trajectory from there.
inline void expect_resume_follows(const std::string& data, TrainingRun r, const std::string& resume,
                                  const runtime::TrainResult& want, const std::string& what, comm::Runtime& rt) {
  r.resume = resume;
  if (MPI_Comm g = first_ranks(r.world); g != MPI_COMM_NULL) {
    const runtime::TrainResult got = run(data, r, rt, g, true);
    EXPECT_EQ(got.first_step, kSaveAt) << what;
    expect_same_trajectory(got, want, what, kSaveAt);
    MPI_Comm_free(&g);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace zp::test
