#include "comm/watchdog.h"

#include <sched.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace zp::comm {

double default_timeout_s() {
  const char* v = std::getenv("ZP_COMM_TIMEOUT_S");
  if (!v || !*v) return 300.0;
  char* end = nullptr;
  double t = std::strtod(v, &end);
  ZP_REQUIRE(end && *end == '\0' && t > 0, "ZP_COMM_TIMEOUT_S=", v, ": expected a positive number of seconds");
  return t;
}

void Backoff::pause() {
  using namespace std::chrono;
  auto waited = steady_clock::now() - start_;
  if (waited < microseconds(50)) return;                  // spin: the answer is usually about to come
  if (waited < milliseconds(20)) { sched_yield(); return; }  // let a co-located rank run
  std::this_thread::sleep_for(microseconds(100));        // a long wait: stop burning the core
}

WaitStatus wait_for(MPI_Request* reqs, int n, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff;
  for (;;) {
    int done = 0;
    // MPI_Testall also drives MPI's progress engine, which non-blocking collectives need.
    ZP_MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return WaitStatus::Done;
    if (std::chrono::steady_clock::now() >= deadline) return WaitStatus::TimedOut;
    backoff.pause();
  }
}

void wait_or_die(MPI_Request* reqs, int n, double timeout_s, std::string_view what) {
  if (wait_for(reqs, n, timeout_s) == WaitStatus::Done) return;
  ZP_FATAL("communication watchdog: ", what, " did not finish within ", timeout_s,
           " s; another rank is dead, stuck or not calling it (ZP_COMM_TIMEOUT_S sets the limit)");
}

}  // namespace zp::comm
