#include "parallel/split_state_store.h"

#include "core/error.h"

namespace zp::parallel {

SplitStateStore::SplitStateStore(std::vector<OwnedRange> ranges, const std::vector<char>& on_device,
                                 StateTier offloaded, const InitialValues& initial, const MakePart& make_part)
    : OptimizerStateStore(std::move(ranges)), on_device_(on_device) {
  ZP_CHECK(on_device_.size() == ranges_.size(), "SplitStateStore: ", on_device_.size(), " placements for ",
           ranges_.size(), " ranges");
  ZP_CHECK(offloaded != StateTier::Device, "SplitStateStore: the offloaded part on the device");
  std::vector<OwnedRange> parts[2];
  std::vector<size_t> global[2];  // each part's ranges' global indices
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const int k = on_device_[i] ? 0 : 1;
    local_.push_back(parts[k].size());
    parts[k].push_back(ranges_[i]);
    global[k].push_back(i);
  }
  // The device part holds the leading ranges, so the initial values are asked for in order.
  for (size_t i = 1; i < on_device_.size(); ++i)
    ZP_CHECK(on_device_[i - 1] || !on_device_[i], "SplitStateStore: the device part's ranges must lead");
  auto initial_of = [&](int k) {
    return InitialValues([&initial, &g = global[k]](size_t j) { return initial(g.at(j)); });
  };
  device_ = make_part(StateTier::Device, std::move(parts[0]), initial_of(0));
  offloaded_ = make_part(offloaded, std::move(parts[1]), initial_of(1));
}

std::pair<OptimizerStateStore*, size_t> SplitStateStore::part_of(size_t i) {
  ZP_CHECK(i < ranges_.size(), "optimizer state of range ", i, " of ", ranges_.size());
  return {on_device_[i] ? device_.get() : offloaded_.get(), local_[i]};
}

void SplitStateStore::update(std::span<const RangeUpdate> updates, const AdamWHyper& h,
                             const kernels::AdamWConfig& cfg, StreamHandle s) {
  device_ups_.clear();
  host_ups_.clear();
  for (const RangeUpdate& u : updates) {
    ZP_CHECK(u.range < ranges_.size(), "update of range ", u.range, " of ", ranges_.size());
    (on_device_[u.range] ? device_ups_ : host_ups_).push_back({local_[u.range], u.grad, u.weights_out});
  }
  // The device's part is enqueued first: the GPU runs it while the host thread runs the CPU's.
  device_->update(device_ups_, h, cfg, s);
  offloaded_->update(host_ups_, h, cfg, s);
}

void SplitStateStore::read(size_t i, OptimizerState which, int64_t offset, int64_t count, float* host,
                           StreamHandle s) {
  const auto [part, j] = part_of(i);
  part->read(j, which, offset, count, host, s);
}

void SplitStateStore::write(size_t i, OptimizerState which, int64_t offset, int64_t count, const float* host,
                            StreamHandle s) {
  const auto [part, j] = part_of(i);
  part->write(j, which, offset, count, host, s);
}

void SplitStateStore::write_weights(size_t i, void* weights_out, StreamHandle s) {
  const auto [part, j] = part_of(i);
  part->write_weights(j, weights_out, s);
}

}  // namespace zp::parallel
