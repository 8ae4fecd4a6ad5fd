#include "parallel/delayed_update.h"

#include "core/log.h"
#include "parallel/host_buffer.h"

namespace zp::parallel {

DelayedUpdate::DelayedUpdate(ShardedAdamW& opt, bool weights_on_host, bool pinned, StreamHandle s)
    : opt_(opt), s_(s) {
  const std::vector<OwnedRange>& ranges = opt_.ranges();
  if (ranges.empty()) return;
  dev_ = ranges[0].block->device();
  dt_ = ranges[0].block->dtype();
  // On a CPU device the blocks are host memory already.
  weights_dev_ = weights_on_host ? Device::cpu() : dev_;
  for (const OwnedRange& r : ranges) {
    grads_.push_back(Tensor::empty({r.size()}, DType::F32, dev_, "delayed_update", s_));
    if (weights_dev_.is_cpu() && dev_.is_cuda())
      weights_.push_back(host_buffer(r.size(), dt_, pinned, "delayed_update", "the delayed update's weights"));
    else
      weights_.push_back(Tensor::empty({r.size()}, dt_, weights_dev_, "delayed_update", s_));
    spare_.push_back({spare_.size(), grads_.back().data<float>(), weights_.back().data()});
  }
  if (dev_.is_cuda()) {
    stream_ = std::make_unique<Stream>(dev_);
    ready_ = std::make_unique<Event>();
  }
}

DelayedUpdate::~DelayedUpdate() {
  if (thread_.joinable()) thread_.join();
  if (error_) ZP_LOG_WARN("the delayed optimizer update in flight at shutdown failed; its error was not reported");
}

size_t DelayedUpdate::device_bytes_for(int64_t elements, DType dt, bool weights_on_host) {
  return size_t(elements) * (sizeof(float) + (weights_on_host ? 0 : dtype_size(dt)));
}

size_t DelayedUpdate::host_bytes_for(int64_t elements, DType dt, bool weights_on_host) {
  return weights_on_host ? size_t(elements) * dtype_size(dt) : 0;
}

void DelayedUpdate::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    pending_ = false;  // its weights are not to be trusted
    std::rethrow_exception(e);
  }
}

void DelayedUpdate::run_update() noexcept {
  try {
    set_current_device(dev_);  // a new thread starts on device 0
    opt_.update_with(spare_, cfg_, stream_ ? stream_->handle() : nullptr);
    if (stream_) stream_->synchronize();  // the new weights are in weights_ when wait() returns
  } catch (...) {
    error_ = std::current_exception();
  }
}

bool DelayedUpdate::install(std::span<const RangeUpdate> updates, std::span<Tensor* const> weight_tensors) {
  ZP_CHECK(updates.size() == spare_.size(), "DelayedUpdate: ", updates.size(), " updates for ", spare_.size(),
           " ranges");
  ZP_CHECK(weight_tensors.empty() || weight_tensors.size() == updates.size(), "DelayedUpdate: ",
           weight_tensors.size(), " weight tensors for ", updates.size(), " updates");
  wait();
  for (const RangeUpdate& u : updates)
    ZP_CHECK(u.range < spare_.size(), "DelayedUpdate: range ", u.range, " of ", spare_.size());
  if (!pending_) return false;
  pending_ = false;
  // Host-side copies (the parameter tier's shards) must not run ahead of the step that reads them.
  if (weights_dev_.is_cpu() && dev_.is_cuda()) stream_synchronize(s_);
  const size_t esz = dtype_size(dt_);
  for (size_t j = 0; j < updates.size(); ++j) {
    const RangeUpdate& u = updates[j];
    const int64_t n = opt_.ranges()[u.range].size();
    Tensor* whole = weight_tensors.empty() ? nullptr : weight_tensors[j];
    Tensor& spare = weights_[u.range];
    if (whole && whole->data() == u.weights_out && whole->numel() == n && whole->dtype() == dt_ &&
        whole->device() == spare.device()) {
      // The step that read the old weights has ended (host weights: the wait above) or comes before
      // the next update's writes (device weights: the host thread's stream waits for ready_).
      std::swap(*whole, spare);
      spare_[u.range].weights_out = spare.data();
    } else {
      copy_bytes_async(u.weights_out, weights_dev_, spare.data(), weights_dev_, size_t(n) * esz, s_);
    }
  }
  return true;
}

bool DelayedUpdate::skip(std::span<const RangeUpdate> updates, std::span<Tensor* const> weight_tensors) {
  return install(updates, weight_tensors);
}

bool DelayedUpdate::step(std::span<const RangeUpdate> updates, const kernels::AdamWConfig& cfg,
                         std::span<Tensor* const> weight_tensors) {
  const bool installed = install(updates, weight_tensors);
  for (const RangeUpdate& u : updates)
    copy_bytes_async(grads_[u.range].data(), dev_, u.grad, dev_, size_t(opt_.ranges()[u.range].size()) * sizeof(float),
                     s_);
  if (spare_.empty()) return installed;
  cfg_ = cfg;
  if (stream_) {  // the host thread's stream (and the staging ring behind it) starts when the copies are done
    ready_->record(s_);
    ready_->wait_on(stream_->handle());
  }
  thread_ = std::thread([this] { run_update(); });
  pending_ = true;
  return installed;
}

void DelayedUpdate::stage_master_weights() {
  ZP_CHECK(!thread_.joinable(), "DelayedUpdate::stage_master_weights with an update in flight");
  for (size_t i = 0; i < weights_.size(); ++i) opt_.state().write_weights(i, weights_[i].data(), s_);
  pending_ = !weights_.empty();
}

}  // namespace zp::parallel
