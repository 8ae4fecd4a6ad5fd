// Diffusion training: the DDPM schedule against hand-computed values, the v-prediction target and
// min-SNR weights, the counter-based draws, the weighted MSE kernels (CPU against finite differences,
// CUDA against the CPU), the latent file (lazy reads, errors naming file and dataset), the demo
// generator, UNet training on the CPU with a falling loss, and config errors that name the key.
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/make_latents.h"
#include "comm/bootstrap.h"
#include "io/config.h"
#include "io/h5file.h"
#include "io/latent_dataset.h"
#include "kernels/mse.h"
#include "models/unet.h"
#include "models/unet_flops.h"
#include "runtime/diffusion_draws.h"
#include "runtime/diffusion_training.h"
#include "runtime/noise_schedule.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiny_unet_config.h"

namespace zp::test {
using namespace zp::runtime;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

TrainResult train_with_runtime(const io::Config& c) {
  TrainResult r;
  with_runtime([&](comm::Runtime& rt) { r = train_unet(UNetTrainConfig::from(c), rt); });
  return r;
}


// A tiny SD-layout UNet (golden unet-sd-tiny's shape) on 8x8 latents.
json tiny_unet(bool sdxl = false) { return tiny_unet_config(sdxl); }

std::string demo_file(const std::string& name, int64_t n, bool sdxl = false, uint64_t seed = 1) {
  const std::string p = (fs::temp_directory_path() / name).string();
  app::make_latents(p, tiny_unet(sdxl).dump(), n, seed);
  return p;
}

io::Config tiny_train_config(const std::string& data, bool sdxl = false) {
  json user = {{"train_micro_batch_size_per_gpu", 8},
               {"steps_per_print", 1000},
               {"gradient_clipping", 1.0},
               {"optimizer", {{"params", {{"lr", 2e-3}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.0}}}}},
               {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}}}}},
               {"model", {{"type", "unet"}, {"config", tiny_unet(sdxl)}, {"init_std", 0.05}}},
               {"data", {{"train_files", {data}}}},
               {"training", {{"max_steps", 40}, {"device", "cpu"}}}};
  return io::Config(train_schema_with_diffusion(), user, "test");
}

}  // namespace

// ---- schedule

TEST(Diffusion, ScaledLinearScheduleMatchesHandComputedValues) {
  NoiseSchedule s{DiffusionConfig{}};
  ASSERT_EQ(s.num_timesteps(), 1000);
  EXPECT_NEAR(s.beta(0), 0.00085, 1e-15);
  EXPECT_NEAR(s.beta(999), 0.012, 1e-15);
  const double mid = std::sqrt(0.00085) + 500.0 / 999.0 * (std::sqrt(0.012) - std::sqrt(0.00085));
  EXPECT_NEAR(s.beta(500), mid * mid, 1e-15);
  EXPECT_NEAR(s.alphas_cumprod(0), 1 - 0.00085, 1e-15);
  EXPECT_NEAR(s.alphas_cumprod(1), (1 - 0.00085) * (1 - s.beta(1)), 1e-15);
  double prod = 1;
  for (int64_t t = 0; t < 1000; ++t) prod *= 1 - s.beta(t);
  EXPECT_NEAR(s.alphas_cumprod(999), prod, 1e-15);
  EXPECT_NEAR(s.alphas_cumprod(999), 0.0046601, 1e-6);  // diffusers' SD scheduler: alphas_cumprod[-1]
  EXPECT_NEAR(s.alphas_cumprod(499), 0.2776697, 1e-6);
}

TEST(Diffusion, LinearSchedule) {
  DiffusionConfig c;
  c.beta_schedule = "linear";
  c.beta_start = 1e-4;
  c.beta_end = 0.02;
  NoiseSchedule s(c);
  EXPECT_NEAR(s.beta(0), 1e-4, 1e-15);
  EXPECT_NEAR(s.beta(999), 0.02, 1e-15);
  EXPECT_NEAR(s.beta(333), 1e-4 + 333.0 / 999.0 * (0.02 - 1e-4), 1e-15);
  EXPECT_NEAR(s.alphas_cumprod(999), 4.0358e-5, 1e-8);  // DDPM's linear schedule
}

TEST(Diffusion, VPredictionTargetIdentity) {
  DiffusionConfig c;
  c.prediction_type = "v_prediction";
  NoiseSchedule v(c), e{DiffusionConfig{}};
  const int64_t n = 37;
  auto x0 = randn(n, 1), eps = randn(n, 2);
  for (int64_t t : {0, 17, 500, 999}) {
    std::vector<float> xt(n), tv(n), xt_e(n), te(n);
    v.noisy_and_target(t, x0.data(), eps.data(), n, xt.data(), tv.data());
    e.noisy_and_target(t, x0.data(), eps.data(), n, xt_e.data(), te.data());
    const double a = std::sqrt(v.alphas_cumprod(t)), b = std::sqrt(1 - v.alphas_cumprod(t));
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_FLOAT_EQ(xt[i], xt_e[i]);  // the noisy input does not depend on the prediction type
      EXPECT_FLOAT_EQ(te[i], eps[i]);
      EXPECT_NEAR(xt[i], a * x0[i] + b * eps[i], 1e-6);
      EXPECT_NEAR(tv[i], a * eps[i] - b * x0[i], 1e-6);
      // v and x_t give back both x0 and eps (a^2 + b^2 = 1).
      EXPECT_NEAR(a * xt[i] - b * tv[i], x0[i], 1e-5);
      EXPECT_NEAR(b * xt[i] + a * tv[i], eps[i], 1e-5);
    }
  }
}

TEST(Diffusion, MinSnrWeights) {
  DiffusionConfig c;
  NoiseSchedule none(c);
  c.snr_gamma = 5.0;
  NoiseSchedule eps(c);
  c.prediction_type = "v_prediction";
  NoiseSchedule v(c);
  for (int64_t t : {0, 100, 300, 600, 999}) {
    const double acp = eps.alphas_cumprod(t), snr = acp / (1 - acp);
    EXPECT_DOUBLE_EQ(eps.snr(t), snr);
    EXPECT_EQ(none.loss_weight(t), 1.0);
    EXPECT_NEAR(eps.loss_weight(t), std::min(snr, 5.0) / snr, 1e-12) << t;
    EXPECT_NEAR(v.loss_weight(t), std::min(snr, 5.0) / (snr + 1), 1e-12) << t;
  }
  EXPECT_GT(eps.snr(0), 5.0);
  EXPECT_NEAR(eps.loss_weight(0), 5.0 / eps.snr(0), 1e-12);  // clipped: low noise counts less
  EXPECT_LT(eps.snr(999), 5.0);
  EXPECT_DOUBLE_EQ(eps.loss_weight(999), 1.0);
}

TEST(Diffusion, DrawsDependOnlyOnSeedStepAndIndex) {
  std::vector<int64_t> counts(10, 0);
  for (int64_t i = 0; i < 20000; ++i) {
    const int64_t t = draw_timestep(7, 3, i, 10);
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 10);
    ++counts[size_t(t)];
  }
  for (int64_t c : counts) EXPECT_NEAR(double(c), 2000.0, 200.0);  // uniform
  EXPECT_EQ(draw_timestep(7, 3, 5, 1000), draw_timestep(7, 3, 5, 1000));
  int differ = 0;
  for (int64_t i = 0; i < 50; ++i) differ += draw_timestep(7, 3, i, 1000) != draw_timestep(7, 4, i, 1000);
  EXPECT_GT(differ, 40) << "another step draws other timesteps";
  // Noise of sample i is the same whether drawn alone or next to others.
  std::vector<float> a(3 * 16), b(16);
  for (int64_t i = 0; i < 3; ++i) draw_noise(9, 2, 10 + i, 16, &a[size_t(i * 16)]);
  draw_noise(9, 2, 11, 16, b.data());
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + 16));
  std::vector<float> big(100000);
  draw_noise(9, 2, 0, int64_t(big.size()), big.data());
  double m = 0, v = 0;
  for (float x : big) m += x;
  m /= double(big.size());
  for (float x : big) v += (x - m) * (x - m);
  v /= double(big.size());
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(v, 1.0, 0.02);
}

// ---- MSE kernels

TEST(Mse, CpuHandCheckedAndFiniteDifferences) {
  {
    // Two samples of two: losses = w_b * mean (p - t)^2.
    std::vector<float> p = {1, 2, 3, 5}, t = {0, 0, 3, 3}, w = {1, 0.5f}, losses(2), d(4);
    kernels::cpu::mse_forward(nullptr, DType::F32, losses.data(), p.data(), t.data(), w.data(), 2, 2);
    EXPECT_FLOAT_EQ(losses[0], 2.5f);   // (1 + 4) / 2
    EXPECT_FLOAT_EQ(losses[1], 1.0f);   // 0.5 * (0 + 4) / 2
    kernels::cpu::mse_backward(nullptr, DType::F32, d.data(), p.data(), t.data(), w.data(), 1.f, 2, 2);
    EXPECT_FLOAT_EQ(d[0], 0.5f);        // 2 * 1 * 1 / 4
    EXPECT_FLOAT_EQ(d[3], 0.5f);        // 2 * 0.5 * 2 / 4
  }
  const int64_t B = 3, n = 7;
  auto pr = randn(size_t(B * n), 11), tr = randn(size_t(B * n), 12);
  std::vector<double> pred(pr.begin(), pr.end());
  std::vector<float> w = {0.3f, 1.f, 2.5f};
  auto loss = [&] {
    std::vector<float> losses(B);
    kernels::cpu::mse_forward(nullptr, DType::F64, losses.data(), pred.data(), tr.data(), w.data(), B, n);
    double mean = 0;
    for (float l : losses) mean += l;
    return 1.7 * mean / double(B);
  };
  std::vector<double> grad(pred.size());
  kernels::cpu::mse_backward(nullptr, DType::F64, grad.data(), pred.data(), tr.data(), w.data(), 1.7f, B, n);
  // The per-sample losses are fp32, so the differences use a wider step and tolerance.
  expect_grad_matches_fd(pred, grad, loss, "dpred", 1e-3, 1e-4);
}

TEST(MseGpu, MatchesCpu) {
  ZP_SKIP_WITHOUT_GPU();
  for (auto [B, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 7}, {8, 16384}, {2, 65536}, {5, 1001}}) {
    for (DType dt : gpu_float_dtypes()) {
      auto p = round_to(randn(size_t(B * n), 1 + n), dt), t = randn(size_t(B * n), 2 + n);
      auto w = randu(size_t(B), 3 + n, 0.1f, 2.f);
      std::vector<float> ref_l(static_cast<size_t>(B)), ref_d(static_cast<size_t>(B * n));
      kernels::cpu::mse_forward(nullptr, DType::F32, ref_l.data(), p.data(), t.data(), w.data(), B, n);
      kernels::cpu::mse_backward(nullptr, DType::F32, ref_d.data(), p.data(), t.data(), w.data(), 1024.f, B, n);
      Tensor dp = upload(p, dt), dtg = upload(t, DType::F32), dw = upload(w, DType::F32);
      Tensor l = Tensor::empty({B}, DType::F32, Device::cuda()), d = Tensor::empty({B * n}, dt, Device::cuda());
      kernels::cuda::mse_forward(nullptr, dt, l.data<float>(), dp.data(), dtg.data<float>(), dw.data<float>(), B, n);
      kernels::cuda::mse_backward(nullptr, dt, d.data(), dp.data(), dtg.data<float>(), dw.data<float>(), 1024.f, B, n);
      // The loss is fp32 math on inputs the CPU saw identically: fp32 tolerance whatever dt.
      EXPECT_LE(rel_error(download(l), ref_l), 1e-5) << dtype_name(dt) << " B=" << B << " n=" << n;
      EXPECT_LE(rel_error(download(d), ref_d), tolerance(dt)) << dtype_name(dt) << " B=" << B << " n=" << n;
      // Without weights: every weight is one.
      kernels::cuda::mse_forward(nullptr, dt, l.data<float>(), dp.data(), dtg.data<float>(), nullptr, B, n);
      kernels::cpu::mse_forward(nullptr, DType::F32, ref_l.data(), p.data(), t.data(), nullptr, B, n);
      EXPECT_LE(rel_error(download(l), ref_l), 1e-5) << dtype_name(dt) << " unweighted";
    }
  }
}

// ---- latent files

TEST(LatentDataset, ReadsSamplesLazilyAndChecksTheModel) {
  const std::string p = demo_file("zp_latents_sdxl.h5", 20, /*sdxl=*/true);
  io::LatentDataset all(p);
  EXPECT_EQ(all.size(), 20);
  EXPECT_EQ(all.channels(), 4);
  EXPECT_EQ(all.height(), 8);
  EXPECT_EQ(all.text_dim(), 16);
  EXPECT_EQ(all.text_embeds_dim(), 8);
  EXPECT_TRUE(all.has_time_ids());
  io::LatentDataset tail(p, 0.75, 1.0);
  EXPECT_EQ(tail.size(), 5);
  std::vector<float> a(size_t(all.latent_numel())), b(a.size()), ca(size_t(all.context_numel())), cb(ca.size()),
      te(8), ti(6);
  all.read(17, a.data(), ca.data(), te.data(), ti.data());
  tail.read(2, b.data(), cb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(ca, cb);
  EXPECT_EQ(ti[0], 64.f);
  all.require({4, 16, 2, 8});
  auto msg = [&](io::LatentRequirements r) { return error_message([&] { all.require(r); }); };
  EXPECT_NE(msg({3, 16, 2, 8}).find("in_channels"), std::string::npos);
  EXPECT_EQ(msg({4, 16, 2, 8}), "");
  EXPECT_NE(msg({4, 768, 2, 8}).find("cross_attention_dim"), std::string::npos);
  EXPECT_NE(msg({4, 16, 16, 8}).find("not divisible by 16"), std::string::npos);
  EXPECT_NE(msg({4, 16, 2, 9}).find("text_embeds"), std::string::npos);
  // The epoch order is a permutation that depends on (seed, epoch) only.
  std::vector<int64_t> seen;
  for (int64_t i = 0; i < 20; ++i) seen.push_back(all.epoch_order(5, 1, i));
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(sorted[size_t(i)], i);
  EXPECT_EQ(all.epoch_order(5, 1, 3), seen[3]);
}

TEST(LatentDataset, ErrorsNameFileAndDataset) {
  const std::string p = (fs::temp_directory_path() / "zp_latents_bad.h5").string();
  auto write = [&](bool with_ctx, Shape lat, Shape ctx, DType dt = DType::F32) {
    io::H5File f = io::H5File::create(p);
    f.create_dataset("latents", dt, lat);
    if (with_ctx) f.create_dataset("encoder_hidden_states", DType::F32, ctx);
    f.close();
  };
  write(false, {4, 4, 8, 8}, {});
  std::string e = error_message([&] { io::LatentDataset d(p); });
  EXPECT_NE(e.find(p), std::string::npos) << e;
  EXPECT_NE(e.find("'encoder_hidden_states'"), std::string::npos) << e;
  write(true, {4, 8, 8}, {4, 2, 16});
  e = error_message([&] { io::LatentDataset d(p); });
  EXPECT_NE(e.find("'latents'"), std::string::npos) << e;
  EXPECT_NE(e.find("[N, C, H, W]"), std::string::npos) << e;
  write(true, {4, 4, 8, 8}, {5, 2, 16});
  e = error_message([&] { io::LatentDataset d(p); });
  EXPECT_NE(e.find("'encoder_hidden_states' holds 5 samples"), std::string::npos) << e;
  // bf16 latents on disk are read as fp32.
  write(true, {4, 4, 8, 8}, {4, 2, 16}, DType::BF16);
  {
    io::H5File f = io::H5File::open(p, true);
    std::vector<float> v(4 * 8 * 8, 1.5f);
    f.write_slice("latents", DType::F32, v.data(), 4 * 8 * 8, int64_t(v.size()));
    f.close();
  }
  io::LatentDataset d(p);
  std::vector<float> lat(size_t(d.latent_numel())), ctx(size_t(d.context_numel()));
  d.read(1, lat.data(), ctx.data());
  EXPECT_EQ(lat[0], 1.5f);
  EXPECT_NE(error_message([] { io::LatentDataset d("/nonexistent/zp.h5"); }).find("/nonexistent/zp.h5"), std::string::npos);
}

TEST(MakeLatents, ResolvesConfigsAndRejectsBadSizes) {
  const fs::path dir = fs::temp_directory_path() / "zp_make_latents_hub";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << tiny_unet().dump();
  }
  std::string source;
  EXPECT_EQ(app::resolve_unet_config(dir.string(), source)["block_out_channels"], json({16, 32}));
  const fs::path train = dir / "train.json";
  {
    std::ofstream(train) << json{{"model", {{"type", "unet"}, {"config", tiny_unet()}}}}.dump();
  }
  EXPECT_EQ(app::resolve_unet_config(train.string(), source)["sample_size"], 8);
  json odd = tiny_unet();
  odd["sample_size"] = 7;
  const std::string e = error_message([&] { app::make_latents((dir / "x.h5").string(), odd.dump(), 4, 1); });
  EXPECT_NE(e.find("'sample_size'"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "x.h5"));
}

// ---- training

TEST(DiffusionTraining, DemoLossFallsOnCpu) {
  const std::string data = demo_file("zp_demo_latents.h5", 64);
  io::Config c = tiny_train_config(data);
  TrainResult r = train_with_runtime(c);
  ASSERT_EQ(r.losses.size(), 40u);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += r.losses[size_t(i)] / 5;
    last += r.losses[r.losses.size() - 1 - size_t(i)] / 5;
  }
  EXPECT_GT(first, 0.5) << "random init predicts noise badly";
  EXPECT_LT(last, 0.7 * first) << "the loss must fall: first 5 steps " << first << ", last 5 " << last;
}

TEST(DiffusionTraining, SdxlVPredictionMinSnrAndValidationRun) {
  const std::string data = demo_file("zp_demo_latents_sdxl.h5", 40, true);
  io::Config c = tiny_train_config(data, true);
  c.set("diffusion.prediction_type=v_prediction");
  c.set("diffusion.snr_gamma=5");
  c.set("data.val_fraction=0.2");
  c.set("training.max_steps=6");
  c.set("training.eval_every=3");
  c.set("training.eval_batches=2");
  c.set("gradient_accumulation_steps=2");
  TrainResult r = train_with_runtime(c);
  ASSERT_EQ(r.losses.size(), 6u);
  ASSERT_EQ(r.val_losses.size(), 2u);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l) && l > 0);
  EXPECT_TRUE(std::isfinite(r.val_losses[0]));
}

// model.activation_checkpointing re-runs the same kernels on the same values: the loop's losses and
// final weights are those of the plain run, bit for bit (SD and SDXL layouts, gradient accumulation).
TEST(DiffusionTraining, ActivationCheckpointingKeepsTheTrajectory) {
  for (bool sdxl : {false, true}) {
    const std::string data = demo_file(sdxl ? "zp_ckpt_latents_sdxl.h5" : "zp_ckpt_latents.h5", 32, sdxl);
    auto run = [&](bool checkpointing) {
      io::Config c = tiny_train_config(data, sdxl);
      c.set("training.max_steps=3");
      c.set("gradient_accumulation_steps=2");
      c.set(std::string("model.activation_checkpointing=") + (checkpointing ? "true" : "false"));
      TrainResult r;
      with_runtime([&](comm::Runtime& rt) { r = train_unet(UNetTrainConfig::from(c), rt, MPI_COMM_NULL, true); });
      return r;
    };
    const TrainResult plain = run(false), ckpt = run(true);
    ASSERT_EQ(plain.losses.size(), 3u);
    EXPECT_EQ(ckpt.losses, plain.losses) << (sdxl ? "sdxl" : "sd");
    EXPECT_TRUE(ckpt.final_params == plain.final_params) << (sdxl ? "sdxl" : "sd") << ": final weights differ";
  }
}

TEST(DiffusionTraining, ConfigErrorsNameTheKey) {
  const std::string data = demo_file("zp_cfg_latents.h5", 8);
  auto error = [&](const std::string& set) {
    return error_message([&] {
      io::Config c = tiny_train_config(data);
      c.set(set);
      UNetTrainConfig::from(c);
    });
  };
  EXPECT_NE(error("diffusion.beta_schedule=cosine").find("diffusion.beta_schedule"), std::string::npos);
  EXPECT_NE(error("diffusion.prediction_type=sample").find("diffusion.prediction_type"), std::string::npos);
  EXPECT_NE(error("diffusion.snr_gamma=-1").find("diffusion.snr_gamma"), std::string::npos);
  EXPECT_NE(error("diffusion.snr_gamma=\"big\"").find("diffusion.snr_gamma"), std::string::npos);
  EXPECT_NE(error("diffusion.num_train_timesteps=0").find("diffusion.num_train_timesteps"), std::string::npos);
  EXPECT_NE(error("diffusion.beta_end=0.0001").find("diffusion.beta_end"), std::string::npos);
  EXPECT_NE(error("diffusion.betas=1").find("unknown key 'diffusion.betas'"), std::string::npos);
  EXPECT_NE(error("model.type=transformer").find("model.type"), std::string::npos);
  EXPECT_EQ(error("model.activation_checkpointing=true"), "");
  EXPECT_NE(error("data.train_files=[\"a.h5\",\"b.h5\"]").find("data.train_files"), std::string::npos);
  EXPECT_NE(error("zero_optimization.stage=4").find("zero_optimization.stage"), std::string::npos);
  EXPECT_EQ(error("diffusion.snr_gamma=5"), "");
  // A latent file that does not fit the model is named with the dataset and the model key.
  io::Config c = tiny_train_config(data);
  json wide = tiny_unet();
  wide["cross_attention_dim"] = 24;
  c.set("model.config=" + wide.dump());
  c.set("training.max_steps=1");
  const std::string e = error_message([&] { train_with_runtime(c); });
  EXPECT_NE(e.find("encoder_hidden_states"), std::string::npos) << e;
  EXPECT_NE(e.find("cross_attention_dim"), std::string::npos) << e;
  // Every stage of the tiny model's FLOPs counter covers the convs and the attention.
  models::UNet m(models::UNetConfig::from_hub_json(tiny_unet(), "tiny"), Device::cpu(), DType::F32);
  EXPECT_GT(models::unet_train_flops_per_sample(m, 8, 8, 8), 6.0 * double(m.num_parameters()));
}

}  // namespace zp::test

namespace zp::test {

// The shipped presets parse (keys, diffusers configs), and the demo trains from a file that
// make-latents writes from the demo config itself: the path `zeropipe make-latents` + `train` takes.
TEST(DiffusionTraining, PresetsParseAndTheDemoConfigTrains) {
  const fs::path configs = fs::path(__FILE__).parent_path().parent_path() / "configs";
  for (const char* name : {"unet-demo-tiny.json", "sd15-unet.json", "sd15-unet-zero3.json", "sdxl-unet.json",
                           "sdxl-unet-zero2.json"}) {
    const std::string path = (configs / name).string();
    SCOPED_TRACE(path);
    io::Config c = io::Config::from_file(train_schema_with_diffusion(), path);
    UNetTrainConfig u = UNetTrainConfig::from(c);
    models::UNetConfig m = models::UNetConfig::from_hub_json(u.common.hub_config, name);
    EXPECT_EQ(m.in_channels, 4);
  }
  const std::string demo = (configs / "unet-demo-tiny.json").string();
  const std::string data = (fs::temp_directory_path() / "zp_demo_from_config.h5").string();
  ASSERT_EQ(app::make_latents(data, demo, 24, 7), 0);
  io::Config c = io::Config::from_file(train_schema_with_diffusion(), demo);
  c.set("data.train_files=[\"" + data + "\"]");
  c.set("training.max_steps=2");
  c.set("training.eval_every=2");
  c.set("training.device=cpu");
  TrainResult r = train_with_runtime(c);
  EXPECT_EQ(r.losses.size(), 2u);
  EXPECT_EQ(r.val_losses.size(), 1u);
}

}  // namespace zp::test

namespace zp::test {

// On the GPU: fp32 follows the CPU trajectory (other conv and GEMM algorithms, so 1e-3 rather than
// rounding-exact), ZeRO-3's gather/release path at world 1 gives the stage-0 trajectory, and bf16
// learns the demo.
TEST(DiffusionTrainingGpu, MatchesCpuFp32AndLearnsInBf16) {
  ZP_SKIP_WITHOUT_GPU();
  const std::string data = demo_file("zp_demo_latents_gpu.h5", 64, /*sdxl=*/true);
  auto run = [&](const std::string& device, int stage, bool bf16, int steps) {
    io::Config c = tiny_train_config(data, true);
    c.set("training.device=" + device);
    c.set("zero_optimization.stage=" + std::to_string(stage));
    c.set("training.max_steps=" + std::to_string(steps));
    if (bf16) c.set("bf16.enabled=true");
    return train_with_runtime(c).losses;
  };
  const auto cpu = run("cpu", 0, false, 5), gpu = run("cuda", 0, false, 5), gpu3 = run("cuda", 3, false, 5);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * cpu[i]) << "fp32 step " << i + 1;
    EXPECT_NEAR(gpu3[i], gpu[i], 1e-5 * gpu[i]) << "ZeRO-3 at world 1, step " << i + 1;
  }
  const auto bf = run("cuda", 0, true, 40);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += bf[size_t(i)] / 5;
    last += bf[bf.size() - 1 - size_t(i)] / 5;
  }
  EXPECT_LT(last, 0.8 * first) << "bf16: first 5 steps " << first << ", last 5 " << last;
}

}  // namespace zp::test
