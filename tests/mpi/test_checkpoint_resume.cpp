// Checkpoints in the training loops (issue 5), at any world size (mpirun -np 2, 3, 5), for the LMs
// and for the UNet (the demo config, configs/unet-demo-tiny.json, on its own latents):
//  - 6 steps straight vs 3 steps, save, resume, 3 steps at the same world size and ZeRO stage: the
//    same losses and final fp32 parameters, bit for bit (the UNet also with activation checkpointing,
//    Llama also with OneCycle cycling AdamW's betas);
//  - resharding: saved by 3 ranks at stage 2 (sub-communicators emulate the world sizes of one
//    mpirun), resumed by 2 ranks at stage 3 and by all ranks at stage 1, steps 4-6 follow the
//    single-rank reference to 1e-5;
//  - h5py (no ZeRO-Pipe code) reads a parameter of a checkpoint: the engine's fp32 master values.
// Every rank takes the same branches: no rank is ever left alone in a collective.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "mpi_test_util.h"
#include "training_runs.h"
#include "app/make_latents.h"
#include "comm/bootstrap.h"
#include "core/device.h"
#include "io/checkpoint_file.h"
#include "io/config.h"
#include "io/token_dataset.h"
#include "models/transformer.h"
#include "runtime/diffusion_training.h"
#include "runtime/lm_training.h"
#include "runtime/train_config.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

namespace {

// On GPUs the embedding's backward adds rows with fp32 atomics, whose order (and so the last bits)
// varies from run to run: there the resumed run must agree to 1e-5 instead of bit for bit.
void check_same_world(const std::string& model, int stage, const std::string& device = "cpu",
                      bool activation_checkpointing = false, const io::json& scheduler = nullptr) {
  comm::Runtime rt;
  const bool bitwise = device == "cpu";
  const int world = world_size();
  SharedDir dir("resume_same_" + model + std::to_string(stage));
  const std::string data = data_file(dir, model);
  const std::string ckpt = dir / "ckpt";
  const std::string what = model + " stage " + std::to_string(stage) + " world " + std::to_string(world) +
                           (activation_checkpointing ? " with activation checkpointing" : "") +
                           (scheduler.is_null() ? "" : " scheduler " + scheduler.dump());
  auto with = [&](int64_t steps, int64_t save_every, const std::string& dir, const std::string& resume) {
    TrainingRun r{model, stage, world, steps, save_every, dir, resume, device, activation_checkpointing};
    r.scheduler = scheduler;
    return r;
  };

  const TrainResult straight = run(data, with(kSteps, 0, "", ""), rt, MPI_COMM_WORLD, true);
  const TrainResult first = run(data, with(kSaveAt, kSaveAt, ckpt, ""), rt, MPI_COMM_WORLD);
  const TrainResult second = run(data, with(kSteps, kSaveAt, ckpt, "latest"), rt, MPI_COMM_WORLD, true);

  ASSERT_EQ(straight.losses.size(), size_t(kSteps));
  ASSERT_EQ(first.saved.size(), 1u) << what;
  EXPECT_EQ(first.saved[0], ckpt + "/" + io::checkpoint_filename(kSaveAt));
  EXPECT_EQ(second.resumed_from, first.saved[0]) << what;
  EXPECT_EQ(second.first_step, kSaveAt) << what;
  ASSERT_EQ(second.final_params.size(), straight.final_params.size());
  if (bitwise) {
    EXPECT_EQ(first.losses, std::vector<double>(straight.losses.begin(), straight.losses.begin() + kSaveAt)) << what;
    EXPECT_EQ(second.losses, tail(straight.losses, kSaveAt)) << what << ": losses after the resume, bit for bit";
    size_t differ = 0;
    for (size_t i = 0; i < straight.final_params.size(); ++i)
      differ += std::memcmp(&second.final_params[i], &straight.final_params[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what << ": final parameters, bit for bit";
  } else {
    TrainResult after = straight;
    after.losses = tail(straight.losses, kSaveAt);
    expect_same_trajectory(second, after, what, kSaveAt);
  }
  ASSERT_EQ(second.saved.size(), 1u) << what << ": the end of training saves";
  EXPECT_EQ(second.saved[0], ckpt + "/" + io::checkpoint_filename(kSteps));
  EXPECT_TRUE(io::verify_checksums(second.saved[0], MPI_COMM_WORLD).ok());
}

}  // namespace

TEST(CheckpointResume, LlamaStage0BitwiseAtSameWorld) { check_same_world("llama", 0); }
TEST(CheckpointResume, LlamaStage3BitwiseAtSameWorld) { check_same_world("llama", 3); }
TEST(CheckpointResume, Gpt2Stage2BitwiseAtSameWorld) { check_same_world("gpt2", 2); }
TEST(CheckpointResume, UNetStage0BitwiseAtSameWorld) { check_same_world("unet", 0); }
TEST(CheckpointResume, UNetStage3WithActivationCheckpointingBitwiseAtSameWorld) {
  check_same_world("unet", 3, "cpu", true);
}
// OneCycle cycles AdamW's betas as a function of the step: a resumed run takes the same ones (the
// resumed steps 4-6 are the second half of the 2 + 2-step cycle and the decay's first step).
TEST(CheckpointResume, LlamaOneCycleMomentumBitwiseAtSameWorld) {
  check_same_world("llama", 1, "cpu", false,
                   {{"type", "OneCycle"},
                    {"params",
                     {{"cycle_min_lr", 1e-3}, {"cycle_max_lr", 3e-3}, {"cycle_first_step_size", 2},
                      {"cycle_min_mom", 0.8}, {"cycle_max_mom", 0.9}, {"decay_step_size", 1},
                      {"decay_mom_rate", 0.01}}}});
}

// The same save and resume on GPUs with NCCL (one GPU per rank).
TEST(CheckpointResumeGpu, Stages0And3OnGpus) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  check_same_world("llama", 0, "cuda");
  check_same_world("gpt2", 3, "cuda");
  check_same_world("unet", 3, "cuda", true);
}

namespace {

// Saved by 3 ranks at stage 2 (2 when that is all there is), resumed by 2 ranks at stage 3 and by
// every rank at stage 1: at np = 5 that is the "np=3 stage 2 -> np=2 stage 3 and np=5 stage 1".
void check_reshard(const std::string& model) {
  comm::Runtime rt;
  const int world = world_size(), rank = world_rank();
  SharedDir dir("resume_reshard_" + model);
  const std::string data = data_file(dir, model);
  const std::string ckpt = dir / "ckpt";

  std::vector<double> ref(kSteps);
  if (rank == 0) ref = run(data, {model, 0, 1}, rt, MPI_COMM_SELF).losses;
  ref.resize(kSteps);
  MPI_Bcast(ref.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);

  const int savers = std::min(3, world);
  if (MPI_Comm g = first_ranks(savers); g != MPI_COMM_NULL) {
    const TrainResult r = run(data, {model, 2, savers, kSaveAt, kSaveAt, ckpt}, rt, g);
    EXPECT_EQ(r.losses.size(), size_t(kSaveAt));  // EXPECT: an ASSERT would skip the barrier below
    for (size_t i = 0; i < r.losses.size() && i < size_t(kSaveAt); ++i)
      EXPECT_NEAR(r.losses[i], ref[i], 1e-5 * ref[i]);
    MPI_Comm_free(&g);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string file = ckpt + "/" + io::checkpoint_filename(kSaveAt);

  struct Resume {
    int world, stage;
  };
  for (const Resume& to : {Resume{2, 3}, Resume{world, 1}}) {
    if (MPI_Comm g = first_ranks(to.world); g != MPI_COMM_NULL) {
      const TrainResult r = run(data, {model, to.stage, to.world, kSteps, 0, "", file}, rt, g);
      EXPECT_EQ(r.first_step, kSaveAt);
      EXPECT_EQ(r.losses.size(), size_t(kSteps - kSaveAt));
      for (int i = kSaveAt; i < kSteps && size_t(i - kSaveAt) < r.losses.size(); ++i)
        EXPECT_NEAR(r.losses[size_t(i - kSaveAt)], ref[size_t(i)], 1e-5 * ref[size_t(i)])
            << model << " saved by " << savers << " ranks at stage 2, resumed by " << to.world << " at stage "
            << to.stage << ": step " << i + 1;
      MPI_Comm_free(&g);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace

TEST(CheckpointResume, ReshardsAcrossWorldSizesAndStages) { check_reshard("llama"); }
TEST(CheckpointResume, UNetReshardsAcrossWorldSizesAndStages) { check_reshard("unet"); }

// h5py reads /model/<name> of a checkpoint: the master weights the engine ended with. GPT-2 has
// Conv1D weights, which the file keeps [out, in] with hub_transposed = 1.
TEST(CheckpointResume, H5pyReadsMasterWeights) {
  comm::Runtime rt;
  const int world = world_size(), rank = world_rank();
  int have = rank == 0 && std::system("/usr/bin/python3 -c 'import h5py' > /dev/null 2>&1") == 0;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have) GTEST_SKIP() << "needs /usr/bin/python3 with h5py";
  SharedDir dir("resume_h5py");
  const std::string data = data_file(dir, "gpt2");
  const TrainResult r = run(data, {"gpt2", 1, world, kSaveAt, kSaveAt, dir / "ckpt"}, rt, MPI_COMM_WORLD, true);
  ASSERT_EQ(r.saved.size(), 1u);
  if (rank != 0) return;

  // Where each parameter sits in final_params (blocks in order, parameters in order, no padding).
  const auto mcfg = models::TransformerConfig::from_hub_json(model_json("gpt2"), "test");
  models::Transformer m(mcfg, Device::cpu(), DType::F32);
  int64_t offset = 0;
  int checked = 0;
  for (nn::Parameter* p : m.parameters()) {
    const bool wanted = p->file_transposed || p->name.find("h.1.ln_2.weight") != std::string::npos;
    if (wanted && (checked == 0 || !p->file_transposed)) {
      const std::string out = dir / "h5py.json";
      const std::string cmd = "/usr/bin/python3 -c \"import h5py, json, sys\n"
                              "f = h5py.File(sys.argv[1], 'r')\n"
                              "d = f['/model/' + sys.argv[2]]\n"
                              "json.dump({'kind': f.attrs['kind'].decode() if isinstance(f.attrs['kind'], bytes) else "
                              "str(f.attrs['kind']), 'dtype': str(d.dtype), 'shape': list(d.shape), "
                              "'transposed': int(d.attrs.get('hub_transposed', 0)), "
                              "'values': [float(x) for x in d[...].reshape(-1)]}, sys.stdout)\" '" +
                              r.saved[0] + "' '" + p->name + "' > '" + out + "'";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      std::ifstream in(out);
      const io::json j = io::json::parse(in);
      EXPECT_EQ(j["kind"], "checkpoint");
      EXPECT_EQ(j["dtype"], "float32") << p->name;
      EXPECT_EQ(j["shape"].get<std::vector<int64_t>>(), p->shape) << p->name;
      EXPECT_EQ(j["transposed"].get<int>(), p->file_transposed ? 1 : 0) << p->name;
      const auto values = j["values"].get<std::vector<double>>();
      ASSERT_EQ(int64_t(values.size()), p->numel());
      int differ = 0;
      for (int64_t i = 0; i < p->numel(); ++i) differ += float(values[size_t(i)]) != r.final_params[size_t(offset + i)];
      EXPECT_EQ(differ, 0) << p->name << ": h5py's values vs the engine's master weights";
      ++checked;
    }
    offset += p->numel();
  }
  EXPECT_EQ(offset, int64_t(r.final_params.size()));
  EXPECT_EQ(checked, 2);
}

}  // namespace zp::test

namespace zp::test {

namespace {

// Every dataset of `f` below `group`, in name order.
void datasets_of(const io::H5File& f, const std::string& group, std::vector<std::string>& out) {
  for (const std::string& c : f.children(group)) {
    const std::string p = group == "/" ? "/" + c : group + "/" + c;
    if (f.is_group(p)) datasets_of(f, p, out);
    else out.push_back(p);
  }
}

// An attribute's value as text, whatever its kind; the run's configuration without the keys that
// differ between the two runs by design (checkpoint.dir, checkpoint.async).
std::string attr_text(const io::H5File& f, const std::string& obj, const std::string& name) {
  switch (f.attr_kind(obj, name)) {
    case io::AttrKind::String: {
      if (obj != "/" || name != "config") return f.attr_string(obj, name);
      io::json c = io::json::parse(f.attr_string(obj, name));
      c["checkpoint"].erase("dir");
      c["checkpoint"].erase("async");
      return c.dump();
    }
    case io::AttrKind::Int64: return std::to_string(f.attr_int(obj, name));
    case io::AttrKind::Double: return std::to_string(f.attr_double(obj, name));
    case io::AttrKind::Int64Array: return io::json(f.attr_ints(obj, name)).dump();
    case io::AttrKind::Bytes: return io::json(f.attr_bytes(obj, name)).dump();
    default: return "?";
  }
}

// The same tensors (bit for bit) and the same attributes; returns what differs ("" when nothing).
std::string checkpoint_difference(const std::string& a_path, const std::string& b_path) {
  const io::H5File a = io::H5File::open(a_path), b = io::H5File::open(b_path);
  std::vector<std::string> ours, theirs;
  datasets_of(a, "/", ours);
  datasets_of(b, "/", theirs);
  if (ours != theirs) return "the dataset lists differ";
  ours.insert(ours.begin(), "/");
  for (const std::string& ds : ours) {
    if (a.attr_names(ds) != b.attr_names(ds)) return ds + ": the attribute names differ";
    for (const std::string& n : a.attr_names(ds))
      if (attr_text(a, ds, n) != attr_text(b, ds, n)) return ds + ": attribute " + n + " differs";
    if (ds == "/") continue;
    const io::DatasetInfo ia = a.dataset_info(ds), ib = b.dataset_info(ds);
    if (ia.dtype != ib.dtype || ia.shape != ib.shape) return ds + ": dtype or shape differ";
    std::vector<char> da(size_t(ia.numel()) * dtype_size(ia.dtype)), db(da.size());
    a.read_slice(ds, ia.dtype, da.data(), 0, ia.numel());
    b.read_slice(ds, ib.dtype, db.data(), 0, ib.numel());
    if (da != db) return ds + ": the data differ";
  }
  return "";
}

// checkpoint.async: the periodic save at kSaveAt is written by a thread while steps 4..6 run; its
// file holds what the synchronous run's holds, the run's losses do not change, and it resumes onto
// the uninterrupted trajectory.
// On GPUs (the snapshot in pinned memory) runs differ in the last bits (fp32 atomics): there the
// asynchronous run must follow the synchronous one's trajectory, and its files verify and resume.
void check_async_save(const std::string& model, int stage, const std::string& device = "cpu") {
  comm::Runtime rt;
  const int world = world_size();
  const bool bitwise = device == "cpu";
  SharedDir dir("resume_async_" + model + std::to_string(stage));
  const std::string data = data_file(dir, model);
  const std::string what = model + " stage " + std::to_string(stage) + " world " + std::to_string(world) + " " + device;
  TrainingRun sync{model, stage, world, kSteps, kSaveAt, dir / "sync", "", device};
  TrainingRun async = sync;
  async.dir = dir / "async";
  async.async_save = true;
  const TrainResult want = run(data, sync, rt, MPI_COMM_WORLD, true);
  const TrainResult got = run(data, async, rt, MPI_COMM_WORLD, true);
  if (bitwise) EXPECT_EQ(got.losses, want.losses) << what << ": an asynchronous save changes nothing in training";
  else expect_same_trajectory(got, want, what);
  const std::vector<std::string> files = {io::checkpoint_filename(kSaveAt), io::checkpoint_filename(kSteps)};
  ASSERT_EQ(got.saved.size(), 2u) << what;
  ASSERT_EQ(want.saved.size(), 2u) << what;
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(got.saved[i], async.dir + "/" + files[i]) << what;
    if (world_rank() == 0 && bitwise)
      EXPECT_EQ(checkpoint_difference(want.saved[i], got.saved[i]), "") << what << ": " << files[i];
  }
  EXPECT_TRUE(io::verify_checksums(got.saved[0], MPI_COMM_WORLD).ok()) << what;
  if (world_rank() == 0)
    for (const auto& e : std::filesystem::directory_iterator(async.dir))
      EXPECT_EQ(e.path().extension(), ".h5") << what << ": " << e.path() << " left behind";
  TrainResult after = want;
  after.losses = tail(want.losses, kSaveAt);
  expect_resume_follows(data, async, got.saved[0], after, what + ", resumed from the asynchronous save", rt);
}

}  // namespace

TEST(CheckpointResume, AsyncSaveWritesWhatSyncSaveWrites) { check_async_save("llama", 3); }
TEST(CheckpointResume, UNetAsyncSaveWritesWhatSyncSaveWrites) { check_async_save("unet", 1); }
TEST(CheckpointResumeGpu, AsyncSaveFromPinnedSnapshot) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  check_async_save("llama", 3, "cuda");
  check_async_save("gpt2", 1, "cuda");
}

}  // namespace zp::test
