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

// Which collective a timed() call runs, for the busy time per kind in the step-time breakdown.
enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, Count };
const char* collective_kind_name(CollectiveKind k);  // "all_reduce", "reduce_scatter", "all_gather"

// Communication time since the last take(), in milliseconds.
struct CommTimes {
  double busy_ms[int(CollectiveKind::Count)] = {};  // per kind, the collectives' own duration
  // How long compute waited for communication: a collective on the compute stream (no overlap, or
  // the CPU, where the host runs it) is all exposed; with overlap, the compute stream's waits in
  // before_compute() that actually blocked it (an event recorded before and after the wait; the
  // difference is the stall). Measured, not estimated.
  double exposed_ms = 0;
  double busy_total_ms() const {
    double t = 0;
    for (double v : busy_ms) t += v;
    return t;
  }
};

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
  // it runs on (or timed on the host for MPI), and so is every wait of the compute stream in
  // before_compute(); take() returns the times since its last call (CommTimes), take_ms() their busy
  // total. With overlap the busy time is the communication stream's, mostly hidden behind compute.
  void set_timing(bool on) { timing_ = on; }
  template <class F> void timed(CollectiveKind kind, StreamHandle s, F&& collective);
  CommTimes take();
  double take_ms() { return take().busy_total_ms(); }

 private:
  comm::Communicator* dp_;
  StreamHandle compute_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Event> compute_ready_, comm_done_;  // with stream_
  bool timing_ = false;
  // Recorded event pairs: a collective of a kind (exposed when it ran on the compute stream), or a
  // wait of the compute stream (kind Count).
  struct TimedSpan {
    CollectiveKind kind;
    bool exposed;
  };
  Event& next_event();
  std::vector<std::unique_ptr<Event>> events_;
  std::vector<TimedSpan> spans_;  // one per pair of events_
  size_t events_used_ = 0;
  CommTimes host_;  // host-timed collectives (MPI on the CPU): all exposed
};

template <class F>
void CollectiveStream::timed(CollectiveKind kind, StreamHandle s, F&& collective) {
  if (!timing_) return collective();
  if (!dp_ || dp_->device().is_cpu()) {
    const auto t0 = std::chrono::steady_clock::now();
    collective();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    host_.busy_ms[int(kind)] += ms;
    host_.exposed_ms += ms;  // the host waited for it
    return;
  }
  next_event().record(s);
  collective();
  next_event().record(s);
  spans_.push_back({kind, s == compute_});
}

}  // namespace zp::parallel
