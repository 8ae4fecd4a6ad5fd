// ZeRO equivalence for diffusion training: the tiny UNet at stages 0-3, at the world size this binary
// runs with, follows the single-rank loss trajectory over 5 steps and ends with the same parameters
// (fp32, relative 1e-5) for the same global batch: the same samples, timesteps and noise reach the
// model whatever the world size. The reference runs on rank 0 alone (MPI_COMM_SELF).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "app/make_latents.h"
#include "comm/bootstrap.h"
#include "core/device.h"
#include "io/config.h"
#include "mpi_test_util.h"
#include "runtime/diffusion_training.h"
#include "tiny_unet_config.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;

namespace {

constexpr int kUNetGlobalBatch = 30;  // divisible by 1, 2, 3 and 5
constexpr int kUNetSteps = 5;

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return a.size() != b.size() ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
}

nlohmann::json tiny_unet(bool sdxl) { return tiny_unet_config(sdxl, 4); }  // 4x4 latents: every path runs, and fast

std::string shared_latent_file(bool sdxl) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const fs::path p = fs::temp_directory_path() / (sdxl ? "zp_unet_zero_sdxl.h5" : "zp_unet_zero.h5");
  if (rank == 0) app::make_latents(p.string(), tiny_unet(sdxl).dump(), 2 * kUNetGlobalBatch, 3);
  MPI_Barrier(MPI_COMM_WORLD);
  return p.string();
}

UNetTrainConfig unet_config(const std::string& data, bool sdxl, int stage, int world, const std::string& device) {
  nlohmann::json user = {{"train_micro_batch_size_per_gpu", kUNetGlobalBatch / world},
                         {"steps_per_print", 1000},
                         {"gradient_clipping", 0.5},  // small enough to clip: the global norm must agree
                         {"optimizer", {{"params", {{"lr", 2e-3}, {"weight_decay", 0.1}}}}},
                         {"scheduler", {{"params", {{"warmup_num_steps", 2}}}}},
                         {"zero_optimization", {{"stage", stage}}},
                         {"model", {{"type", "unet"}, {"config", tiny_unet(sdxl)}, {"init_std", 0.05}}},
                         {"data", {{"train_files", {data}}}},
                         {"diffusion", {{"snr_gamma", 5.0}}},
                         {"training", {{"max_steps", kUNetSteps}, {"device", device}}}};
  if (sdxl) user["diffusion"]["prediction_type"] = "v_prediction";
  return UNetTrainConfig::from(io::Config(train_schema_with_diffusion(), user, "unet-zero-test"));
}

void check_unet(bool sdxl, const std::string& device = "cpu") {
  comm::Runtime rt;
  const int world = rt.world_size(), rank = rt.rank();
  if (kUNetGlobalBatch % world != 0)
    GTEST_SKIP() << "global batch " << kUNetGlobalBatch << " does not divide by " << world;
  const std::string data = shared_latent_file(sdxl);
  const char* what = sdxl ? "sdxl" : "sd";

  TrainResult ref;
  if (rank == 0) ref = train_unet(unet_config(data, sdxl, 0, 1, device), rt, MPI_COMM_SELF, true);
  int n_params = int(ref.final_params.size());
  MPI_Bcast(&n_params, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ref.losses.resize(kUNetSteps);
  ref.final_params.resize(size_t(n_params));
  MPI_Bcast(ref.losses.data(), kUNetSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(ref.final_params.data(), n_params, MPI_FLOAT, 0, MPI_COMM_WORLD);

  for (int stage = 0; stage <= 3; ++stage) {
    TrainResult r = train_unet(unet_config(data, sdxl, stage, world, device), rt, MPI_COMM_WORLD, true);
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i)
      EXPECT_NEAR(r.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i]))
          << what << " stage " << stage << " world " << world << " step " << i + 1;
    EXPECT_LE(rel_l2(r.final_params, ref.final_params), 1e-5)
        << what << " stage " << stage << " world " << world << ": final parameters";
  }
}

}  // namespace

TEST(UNetZeroEquivalence, SdStages0To3MatchSingleRank) { check_unet(false); }
TEST(UNetZeroEquivalence, SdxlVPredictionStages0To3MatchSingleRank) { check_unet(true); }

// The same on GPUs with NCCL (fp32).
TEST(UNetZeroEquivalenceGpu, SdAndSdxlStages0To3MatchSingleRank) {
  if (!every_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  check_unet(false, "cuda");
  check_unet(true, "cuda");
}

}  // namespace zp::test
