#include "comm/watchdog.h"

#include <string>

#include "core/error.h"

namespace zp::comm {

WaitStatus wait_for(MPI_Request* reqs, int n, double timeout_s) {
  return poll_until(
      [&] {
        int done = 0;
        // MPI_Testall also drives MPI's progress engine, which non-blocking collectives need.
        ZP_MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      timeout_s);
}

void wait_or_die(MPI_Request* reqs, int n, double timeout_s, std::string_view what) {
  if (wait_for(reqs, n, timeout_s) == WaitStatus::Done) return;
  ZP_FATAL("communication watchdog: ", what, " did not finish within ", timeout_s,
           " s; another rank is dead, stuck or not calling it (ZP_COMM_TIMEOUT_S sets the limit)");
}

}  // namespace zp::comm
