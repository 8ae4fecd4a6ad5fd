#include "parallel/collective_stream.h"

namespace zp::parallel {

CollectiveStream::CollectiveStream(comm::Communicator* dp, StreamHandle compute) : dp_(dp), compute_(compute) {}

CollectiveStream::~CollectiveStream() { synchronize(); }

void CollectiveStream::set_overlap(bool on) {
  const bool device_comm = dp_ && dp_->size() > 1 && dp_->device().is_cuda();
  if (on && device_comm && !stream_) {
    stream_ = std::make_unique<Stream>(dp_->device(), -1);  // high priority: collectives start promptly
    compute_ready_ = std::make_unique<Event>();
    comm_done_ = std::make_unique<Event>();
  } else if (!on && stream_) {
    before_compute();
    stream_synchronize(stream_->handle());
    stream_.reset();
  }
}

void CollectiveStream::after_compute() {
  if (!stream_) return;
  compute_ready_->record(compute_);
  compute_ready_->wait_on(stream_->handle());
}

void CollectiveStream::before_compute() {
  if (!stream_) return;
  comm_done_->record(stream_->handle());
  comm_done_->wait_on(compute_);
}

void CollectiveStream::synchronize() {
  if (stream_) stream_synchronize(stream_->handle());
}

double CollectiveStream::take_ms() {
  double ms = host_ms_;
  for (size_t i = 0; i + 1 < events_used_; i += 2) {
    events_[i + 1]->synchronize();
    ms += events_[i + 1]->elapsed_ms_since(*events_[i]);
  }
  events_used_ = 0;
  host_ms_ = 0;
  return ms;
}

}  // namespace zp::parallel
