// Where a data group's collectives run, shared by the parameter gatherer and the gradient reducer so
// that their collectives keep one order. On GPUs with overlap on, that is one high-priority
// communication stream, ordered against the compute stream by two events: after_compute() before a
// collective reads what compute wrote, before_compute() before compute reads what a collective
// wrote. NCCL then sees one stream per communicator, and the compute stream never waits for a
// collective until it needs the result. Without overlap (or on the CPU) collectives run on the
// compute stream and both orderings are no-ops.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/device.h"

namespace zp::parallel {

class CollectiveStream {
 public:
  // `dp` may be nullptr (a single rank). Overlap starts off: set_overlap(true) creates the stream.
  CollectiveStream(comm::Communicator* dp, StreamHandle compute);
  ~CollectiveStream();  // waits for everything in flight on the communication stream
  CollectiveStream(const CollectiveStream&) = delete;
  CollectiveStream& operator=(const CollectiveStream&) = delete;

  // On only for a device communicator of more than one rank; turning it off waits for the stream.
  void set_overlap(bool on);
  bool overlaps() const { return stream_ != nullptr; }
  StreamHandle compute() const { return compute_; }
  // The stream collectives run on: the communication stream, or the compute stream without overlap.
  StreamHandle handle() const { return stream_ ? stream_->handle() : compute_; }
  void after_compute();
  void before_compute();
  void synchronize();

  // With timing on, every collective run through timed() is bracketed by CUDA events on the stream
  // it runs on (or timed on the host for MPI); take_ms() returns the total since its last call. With
  // overlap this is time the communication stream is busy, mostly hidden behind compute.
  void set_timing(bool on) { timing_ = on; }
  template <class F> void timed(StreamHandle s, F&& collective);
  double take_ms();

 private:
  comm::Communicator* dp_;
  StreamHandle compute_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Event> compute_ready_, comm_done_;  // with stream_
  bool timing_ = false;
  std::vector<std::unique_ptr<Event>> events_;
  size_t events_used_ = 0;
  double host_ms_ = 0;
};

template <class F>
void CollectiveStream::timed(StreamHandle s, F&& collective) {
  if (!timing_) return collective();
  if (!dp_ || dp_->device().is_cpu()) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  while (events_.size() < events_used_ + 2) events_.push_back(std::make_unique<Event>());
  events_[events_used_]->record(s);
  collective();
  events_[events_used_ + 1]->record(s);
  events_used_ += 2;
}

}  // namespace zp::parallel
