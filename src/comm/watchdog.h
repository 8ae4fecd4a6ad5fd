// The collective watchdog (DESIGN decision 9): one dead or stuck rank must never leave the others
// hanging. There is no watchdog thread: every wait polls its operation with a deadline instead of
// blocking (core/host_wait.h, whose back-off and limit these share). MpiComm starts each operation
// non-blocking (MPI_Iallreduce, ...) and polls MPI_Testall; NcclComm::wait polls a CUDA event and
// ncclCommGetAsyncError. When the deadline passes, the caller fatals with the op's name, which
// MPI_Aborts the whole job. The deadline is ZP_COMM_TIMEOUT_S seconds (default 300), or a
// per-communicator value (set_timeout).
#pragma once
#include <mpi.h>

#include <string_view>

#include "core/host_wait.h"

namespace zp::comm {

// ZP_COMM_TIMEOUT_S (seconds, > 0), default 300 (zp::wait_timeout_s).
inline double default_timeout_s() { return wait_timeout_s(); }

// Polls until all `n` requests complete (Done) or `timeout_s` passes (TimedOut). Never aborts:
// on TimedOut the requests are still pending and the caller may keep waiting or give up.
WaitStatus wait_for(MPI_Request* reqs, int n, double timeout_s);
// wait_for, then ZP_FATAL naming `what` on TimedOut.
void wait_or_die(MPI_Request* reqs, int n, double timeout_s, std::string_view what);

}  // namespace zp::comm
