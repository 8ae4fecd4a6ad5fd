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
  // With timing, events on the compute stream before and after the wait: the second completes
  // later than the first only by the time the wait held the compute stream back.
  if (timing_) next_event().record(compute_);
  comm_done_->wait_on(compute_);
  if (timing_) {
    next_event().record(compute_);
    spans_.push_back({CollectiveKind::Count, true});
  }
}

Event& CollectiveStream::next_event() {
  if (events_.size() <= events_used_) events_.push_back(std::make_unique<Event>());
  return *events_[events_used_++];
}

const char* collective_kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGather: return "all_gather";
    default: return "other";
  }
}

void CollectiveStream::synchronize() {
  if (stream_) stream_synchronize(stream_->handle());
}

CommTimes CollectiveStream::take() {
  CommTimes t = host_;
  for (size_t p = 0; p < spans_.size(); ++p) {
    Event& end = *events_[2 * p + 1];
    end.synchronize();
    const double ms = end.elapsed_ms_since(*events_[2 * p]);
    if (spans_[p].kind != CollectiveKind::Count) t.busy_ms[int(spans_[p].kind)] += ms;
    if (spans_[p].exposed) t.exposed_ms += ms;
  }
  spans_.clear();
  events_used_ = 0;
  host_ = CommTimes();
  return t;
}

}  // namespace zp::parallel
