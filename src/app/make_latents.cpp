#include "app/make_latents.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/progress_meter.h"
#include "io/atomic_file.h"
#include "io/bounded_json.h"
#include "io/config.h"
#include "io/h5file.h"
#include "io/latent_dataset.h"
#include "models/unet.h"
#include "nn/init.h"

namespace zp::app {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kClasses = 8, kPhases = 4, kTokens = 8;
static_assert(io::kTimeIdsPerSample == models::kTimeIdsPerSample,
              "the latent files' time_ids must hold the UNet's time ids");
constexpr uint64_t kEmbeddingSeed = 20240601;  // fixed: the conditioning means the same in every file

std::vector<float> fixed_vector(const std::string& name, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  nn::counter_normal(kEmbeddingSeed, name, 0, n, 1.0, v.data());
  return v;
}

}  // namespace

json resolve_unet_config(const std::string& spec, std::string& source) {
  const size_t first = spec.find_first_not_of(" \t\r\n");
  json j;
  if (first != std::string::npos && spec[first] == '{') {
    source = "inline UNet config";
    j = io::parse_json_bounded(spec, source);
  } else if (fs::is_directory(spec)) {
    source = (fs::path(spec) / "config.json").string();
    j = io::read_json_file(source);
  } else {
    source = spec;
    j = io::read_json_file(spec);
  }
  if (j.is_object() && j.contains("model") && j["model"].is_object()) {  // a training config
    const json& m = j["model"];
    if (m.contains("config") && m["config"].is_object()) {
      source += ": model.config";
      return m["config"];
    }
    ZP_REQUIRE(m.contains("hub_dir") && m["hub_dir"].is_string() && !m["hub_dir"].get<std::string>().empty(), source,
               ": a training config needs model.config or model.hub_dir to name the UNet");
    source = (fs::path(m["hub_dir"].get<std::string>()) / "config.json").string();
    return io::read_json_file(source);
  }
  return j;
}

int make_latents(const std::string& path, const std::string& unet_config_json_or_dir, int64_t n, uint64_t seed) {
  ZP_REQUIRE(n >= 1, "make-latents: the number of samples must be >= 1, got ", n);
  std::string source;
  const json hub = resolve_unet_config(unet_config_json_or_dir, source);
  const models::UNetConfig cfg = models::UNetConfig::from_hub_json(hub, source);
  int64_t size = 16;
  if (hub.contains("sample_size") && !hub["sample_size"].is_null()) {
    const json& ss = hub["sample_size"];
    if (ss.is_number_integer()) size = ss.get<int64_t>();
    else if (ss.is_array() && ss.size() == 2 && ss[0] == ss[1] && ss[0].is_number_integer()) size = ss[0].get<int64_t>();
    else throw Error(source + ": key 'sample_size' = " + ss.dump() + " must be an integer (square latents)");
  }
  const int64_t multiple = int64_t(1) << (cfg.num_blocks() - 1);
  ZP_REQUIRE(size > 0 && size % multiple == 0, source, ": key 'sample_size' = ", size, " is not divisible by ",
             multiple, " (one halving per down block but the last)");
  const int64_t C = cfg.in_channels, H = size, W = size, L = kTokens, D = cfg.cross_dim.back();
  const int64_t E = cfg.text_embeds_dim();
  constexpr int64_t K = models::kTimeIdsPerSample;

  io::write_file_atomically(path, [&](const std::string& tmp) {
    io::H5File f = io::H5File::create(tmp);
    f.create_dataset("latents", DType::F32, {n, C, H, W});
    f.create_dataset("encoder_hidden_states", DType::F32, {n, L, D});
    if (E > 0) {
      f.create_dataset("text_embeds", DType::F32, {n, E});
      f.create_dataset("time_ids", DType::F32, {n, K});
    }
    f.set_attr_string("/", "generator", "zeropipe make-latents (synthetic demo data)");
    f.set_attr_int("/", "seed", int64_t(seed));
    f.set_attr_int("/", "num_classes", kClasses);

    std::vector<std::vector<float>> cls(kClasses), pooled(kClasses), phase(kPhases);
    for (int64_t k = 0; k < kClasses; ++k) {
      cls[size_t(k)] = fixed_vector("demo.class." + std::to_string(k), D);
      if (E > 0) pooled[size_t(k)] = fixed_vector("demo.pooled." + std::to_string(k), E);
    }
    for (int64_t q = 0; q < kPhases; ++q) phase[size_t(q)] = fixed_vector("demo.phase." + std::to_string(q), D);

    std::vector<float> lat(size_t(C * H * W)), ctx(size_t(L * D));
    const double two_pi = 2.0 * M_PI;
    // Progress for a big set (a line every 10 s with an ETA; nothing for a quick one).
    ProgressMeter progress("make-latents " + path, double(n), "samples");
    for (int64_t s = 0; s < n; ++s) {
      progress.update(double(s));
      const uint64_t r = nn::splitmix64(nn::splitmix64(seed) + uint64_t(s));
      const int64_t k = int64_t(r % kClasses), q = int64_t((r >> 8) % kPhases);
      const double amp = 0.75 + 0.5 * double((r >> 16) & 0xffff) / 65535.0;
      for (int64_t c = 0; c < C; ++c) {
        const double fx = double(1 + (k + c) % 3), fy = double(1 + (k / 3 + 2 * c) % 3);
        const double offset = two_pi * double(k * C + c) / double(kClasses * C) + double(q) * M_PI / 2;
        for (int64_t y = 0; y < H; ++y)
          for (int64_t x = 0; x < W; ++x)
            lat[size_t((c * H + y) * W + x)] =
                float(amp * std::sin(two_pi * (fx * double(x) / double(W) + fy * double(y) / double(H)) + offset));
      }
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < D; ++d)
          ctx[size_t(t * D + d)] = t % 2 == 0 ? cls[size_t(k)][size_t(d)] : float(amp) * phase[size_t(q)][size_t(d)];
      f.write_slice("latents", DType::F32, lat.data(), s * C * H * W, C * H * W);
      f.write_slice("encoder_hidden_states", DType::F32, ctx.data(), s * L * D, L * D);
      if (E > 0) {
        // original size, crop origin, target size: the image the latents (1/8 of its size) stand for
        const float ids[K] = {float(8 * H), float(8 * W), 0.f, 0.f, float(8 * H), float(8 * W)};
        f.write_slice("text_embeds", DType::F32, pooled[size_t(k)].data(), s * E, E);
        f.write_slice("time_ids", DType::F32, ids, s * K, K);
      }
    }
    f.close();
  });
  std::printf("wrote %lld samples to %s: latents [%lld, %lld, %lld, %lld], encoder_hidden_states [%lld, %lld, %lld]%s\n",
              (long long)n, path.c_str(), (long long)n, (long long)C, (long long)H, (long long)W, (long long)n,
              (long long)L, (long long)D, E > 0 ? ", text_embeds and time_ids" : "");
  return 0;
}

}  // namespace zp::app
