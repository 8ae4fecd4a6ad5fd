// Bounded host waits (DESIGN decision 9, the watchdog): a host thread never blocks for ever on
// another party: an MPI operation, NCCL work, or the device itself, whose queued work may wait on a
// pipeline peer's NCCL send that never comes. Every such wait polls with a deadline instead: comm's
// waits (comm/watchdog.h) and the device's (Stream::synchronize, Event::synchronize, a copy to the
// host), all with the same limit, ZP_COMM_TIMEOUT_S seconds (default 300). When it passes, the
// caller fatals naming what it waited for, which MPI_Aborts the whole job.
//
// Polling backs off from spinning (lowest latency) to yielding (oversubscribed CPUs, e.g. 5 ranks on
// 2 cores, where a spinning rank would steal the core the peer needs) to short sleeps (long waits,
// e.g. a pipeline stage idling), so a waiting rank does not burn a core for minutes.
#pragma once
#include <chrono>
#include <functional>

namespace zp {

// ZP_COMM_TIMEOUT_S (seconds, > 0), default 300. A malformed value throws zp::Error.
double wait_timeout_s();

// The polling back-off described above: call pause() between two polls.
class Backoff {
 public:
  void pause();

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

enum class WaitStatus { Done, TimedOut };

// Calls `done` until it returns true (Done) or `timeout_s` passes (TimedOut), backing off between
// calls; `done` is called at least once, and once more after the deadline.
WaitStatus poll_until(const std::function<bool()>& done, double timeout_s);

}  // namespace zp
