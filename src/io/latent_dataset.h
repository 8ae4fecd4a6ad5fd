// Latent datasets for diffusion training: one HDF5 file of pre-encoded samples (VAE latents and text
// encoder outputs), read lazily one sample at a time (never the whole file).
//
//   latents                [N, C, H, W]  float (f32, f16 or bf16): VAE latents, already scaled
//                                        (SD: x 0.18215, SDXL: x 0.13025)
//   encoder_hidden_states  [N, L, D]     float: the text encoder's last hidden states
//   text_embeds            [N, E]        float: SDXL only, the pooled text embedding
//   time_ids               [N, 6]        float: SDXL only, (original h, w, crop top, left, target h, w)
//
// Every dataset must have the same N. The file is opened serially on each rank (reads are
// independent, not collective), and samples come back as fp32 whatever the stored type.
// Like TokenDataset, an epoch visits the samples of the selected range in a seeded order that
// depends only on (seed, epoch), so every rank can compute its share of a global batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zp::io {

class H5File;

// Width of time_ids: SDXL's micro-conditioning, models::kTimeIdsPerSample (which io cannot see;
// app/make_latents.cpp, which writes these files for a model, checks that the two agree).
inline constexpr int64_t kTimeIdsPerSample = 6;

// What the model needs from the file (the UNet config's in_channels, cross_attention_dim, ...).
struct LatentRequirements {
  int64_t channels = 4;          // in_channels
  int64_t context_dim = 768;     // cross_attention_dim
  int64_t spatial_multiple = 1;  // H and W must divide by it (2^(down blocks - 1))
  int64_t text_embeds_dim = 0;   // > 0: text_embeds [N, E] and time_ids [N, 6] are required (SDXL)
};

class LatentDataset {
 public:
  // Opens `path` and checks the datasets' presence, ranks and sample counts; throws zp::Error naming
  // the file and the dataset. [from, to) selects a fraction of the samples (e.g. [0, 0.95) for
  // training and [0.95, 1) for validation).
  explicit LatentDataset(const std::string& path, double from = 0.0, double to = 1.0);
  ~LatentDataset();
  LatentDataset(const LatentDataset&) = delete;
  LatentDataset& operator=(const LatentDataset&) = delete;

  // Throws zp::Error naming the file, the dataset and the model key when a shape does not fit.
  void require(const LatentRequirements& r) const;

  const std::string& path() const { return path_; }
  int64_t size() const { return end_ - begin_; }  // samples in the selected range
  int64_t channels() const { return C_; }
  int64_t height() const { return H_; }
  int64_t width() const { return W_; }
  int64_t text_len() const { return L_; }
  int64_t text_dim() const { return D_; }
  int64_t text_embeds_dim() const { return E_; }  // 0 when the file has no text_embeds
  bool has_time_ids() const { return has_time_ids_; }
  int64_t latent_numel() const { return C_ * H_ * W_; }
  int64_t context_numel() const { return L_ * D_; }

  // Sample i (0 <= i < size()) of the range into fp32 buffers of latent_numel(), context_numel(),
  // text_embeds_dim() and kTimeIdsPerSample floats; text_embeds and time_ids may be nullptr (then not read).
  void read(int64_t i, float* latents, float* context, float* text_embeds = nullptr, float* time_ids = nullptr) const;
  // The sample at position `i` of epoch `epoch`'s shuffled order (shuffle=false: identity).
  int64_t epoch_order(uint64_t seed, int64_t epoch, int64_t i, bool shuffle = true) const;

 private:
  std::string path_;
  std::unique_ptr<H5File> file_;
  int64_t begin_ = 0, end_ = 0;
  int64_t C_ = 0, H_ = 0, W_ = 0, L_ = 0, D_ = 0, E_ = 0;
  bool has_time_ids_ = false;
  mutable int64_t cached_epoch_ = -1;
  mutable uint64_t cached_seed_ = 0;
  mutable std::vector<int64_t> order_;
};

}  // namespace zp::io
