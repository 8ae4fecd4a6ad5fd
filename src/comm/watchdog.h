// The collective watchdog (DESIGN decision 9): one dead or stuck rank must never leave the others
// hanging. There is no watchdog thread: every wait polls its operation with a deadline instead of
// blocking. MpiComm starts each operation non-blocking (MPI_Iallreduce, ...) and polls MPI_Testall;
// NcclComm::wait polls a CUDA event and ncclCommGetAsyncError. When the deadline passes, the caller
// fatals with the op's name, which MPI_Aborts the whole job. The deadline is ZP_COMM_TIMEOUT_S
// seconds (default 300), or a per-communicator value (set_timeout).
//
// Polling backs off from spinning (lowest latency) to yielding (oversubscribed CPUs, e.g. 5 ranks on
// 2 cores, where a spinning rank would steal the core the peer needs) to short sleeps (long waits,
// e.g. a pipeline stage idling), so a waiting rank does not burn a core for minutes.
#pragma once
#include <mpi.h>

#include <chrono>
#include <string_view>

namespace zp::comm {

// ZP_COMM_TIMEOUT_S (seconds, > 0), default 300. A malformed value throws zp::Error.
double default_timeout_s();

enum class WaitStatus { Done, TimedOut };

// Polls until all `n` requests complete (Done) or `timeout_s` passes (TimedOut). Never aborts:
// on TimedOut the requests are still pending and the caller may keep waiting or give up.
WaitStatus wait_for(MPI_Request* reqs, int n, double timeout_s);
// wait_for, then ZP_FATAL naming `what` on TimedOut.
void wait_or_die(MPI_Request* reqs, int n, double timeout_s, std::string_view what);

// The polling back-off described above: call pause() between two polls.
class Backoff {
 public:
  void pause();

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace zp::comm
