#include "io/latent_dataset.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "io/h5file.h"

namespace zp::io {

namespace {
// One sample's latents or text states beyond this (8 GiB as fp32) are a damaged shape, not data: the
// caller allocates a buffer of that size per sample.
constexpr int64_t kMaxSampleElements = int64_t(1) << 31;
}  // namespace

LatentDataset::~LatentDataset() = default;

LatentDataset::LatentDataset(const std::string& path, double from, double to) : path_(path) {
  ZP_REQUIRE(from >= 0 && from <= to && to <= 1, path, ": sample range [", from, ", ", to, ") is not within [0, 1]");
  file_ = std::make_unique<H5File>(H5File::open(path));
  // Shape of a dataset that must exist with `rank` dimensions.
  auto shape_of = [&](const char* name, size_t rank, const char* layout) {
    ZP_REQUIRE(file_->is_dataset(name), path, ": no dataset '", name, "' (a latent file holds ", layout, ")");
    const DatasetInfo info = file_->dataset_info(name);
    ZP_REQUIRE(info.shape.size() == rank, path, ": dataset '", name, "' has shape ", shape_str(info.shape),
               ", expected ", layout);
    ZP_REQUIRE(dtype_is_float(info.dtype), path, ": dataset '", name, "' holds ", dtype_name(info.dtype),
               ", expected floats");
    for (int64_t d : info.shape) ZP_REQUIRE(d > 0, path, ": dataset '", name, "' is empty: ", shape_str(info.shape));
    // dataset_info has checked that the element count fits int64, and every dimension is at least 1,
    // so the count of any subset of the dimensions fits too.
    const int64_t per_sample = info.numel() / info.shape[0];
    ZP_REQUIRE(per_sample <= kMaxSampleElements, path, ": dataset '", name, "' has shape ", shape_str(info.shape),
               ": ", per_sample, " elements per sample, more than ", kMaxSampleElements, " (a damaged file?)");
    return info.shape;
  };
  const Shape lat = shape_of("latents", 4, "latents [N, C, H, W]");
  const Shape ctx = shape_of("encoder_hidden_states", 3, "encoder_hidden_states [N, L, D]");
  const int64_t N = lat[0];
  C_ = lat[1];
  H_ = lat[2];
  W_ = lat[3];
  L_ = ctx[1];
  D_ = ctx[2];
  auto same_n = [&](const char* name, int64_t n) {
    ZP_REQUIRE(n == N, path, ": dataset '", name, "' holds ", n, " samples, 'latents' holds ", N);
  };
  same_n("encoder_hidden_states", ctx[0]);
  if (file_->exists("text_embeds")) {
    const Shape te = shape_of("text_embeds", 2, "text_embeds [N, E]");
    same_n("text_embeds", te[0]);
    E_ = te[1];
  }
  if (file_->exists("time_ids")) {
    const Shape ti = shape_of("time_ids", 2, "time_ids [N, 6]");
    same_n("time_ids", ti[0]);
    ZP_REQUIRE(ti[1] == kTimeIdsPerSample, path, ": dataset 'time_ids' has shape ", shape_str(ti), ", expected [N, ",
               kTimeIdsPerSample, "]");
    has_time_ids_ = true;
  }
  // Clamped before converting: above 2^53 samples double(N) rounds up, possibly past int64's range.
  auto sample_at = [&](double fraction) {
    const double x = std::floor(fraction * double(N));
    return x >= double(N) ? N : int64_t(x);
  };
  begin_ = sample_at(from);
  end_ = sample_at(to);
  ZP_REQUIRE(end_ > begin_, path, ": the sample range [", from, ", ", to, ") of ", N, " samples is empty");
}

void LatentDataset::require(const LatentRequirements& r) const {
  ZP_REQUIRE(C_ == r.channels, path_, ": dataset 'latents' has ", C_, " channels, the model's in_channels is ",
             r.channels);
  ZP_REQUIRE(r.spatial_multiple > 0 && H_ % r.spatial_multiple == 0 && W_ % r.spatial_multiple == 0, path_,
             ": dataset 'latents' is ", H_, "x", W_, ", not divisible by ", r.spatial_multiple,
             " (the model halves the size once per down block but the last: block_out_channels)");
  ZP_REQUIRE(D_ == r.context_dim, path_, ": dataset 'encoder_hidden_states' has width ", D_,
             ", the model's cross_attention_dim is ", r.context_dim);
  if (r.text_embeds_dim > 0) {
    ZP_REQUIRE(E_ > 0, path_, ": no dataset 'text_embeds' [N, ", r.text_embeds_dim,
               "] (the model's addition_embed_type is text_time)");
    ZP_REQUIRE(E_ == r.text_embeds_dim, path_, ": dataset 'text_embeds' has width ", E_, ", the model needs ",
               r.text_embeds_dim, " (projection_class_embeddings_input_dim - 6 x addition_time_embed_dim)");
    ZP_REQUIRE(has_time_ids_, path_, ": no dataset 'time_ids' [N, 6] (the model's addition_embed_type is text_time)");
  }
}

void LatentDataset::read(int64_t i, float* latents, float* context, float* text_embeds, float* time_ids) const {
  ZP_CHECK(i >= 0 && i < size(), "sample ", i, " of ", size());
  const int64_t s = begin_ + i;
  file_->read_slice("latents", DType::F32, latents, s * latent_numel(), latent_numel());
  file_->read_slice("encoder_hidden_states", DType::F32, context, s * context_numel(), context_numel());
  if (text_embeds) {
    ZP_CHECK(E_ > 0, path_, ": no text_embeds to read");
    file_->read_slice("text_embeds", DType::F32, text_embeds, s * E_, E_);
  }
  if (time_ids) {
    ZP_CHECK(has_time_ids_, path_, ": no time_ids to read");
    file_->read_slice("time_ids", DType::F32, time_ids, s * kTimeIdsPerSample, kTimeIdsPerSample);
  }
}

int64_t LatentDataset::epoch_order(uint64_t seed, int64_t epoch, int64_t i, bool shuffle) const {
  ZP_CHECK(i >= 0 && i < size(), "position ", i, " of ", size());
  if (!shuffle) return i;
  if (cached_epoch_ != epoch || cached_seed_ != seed) {
    order_.resize(size_t(size()));
    std::iota(order_.begin(), order_.end(), 0);
    // Fisher-Yates with our own draws (std::shuffle's algorithm is not fixed by the standard), as
    // TokenDataset does.
    std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
    for (size_t k = order_.size(); k > 1; --k) std::swap(order_[k - 1], order_[size_t(g() % k)]);
    cached_epoch_ = epoch;
    cached_seed_ = seed;
  }
  return order_[size_t(i)];
}

}  // namespace zp::io
