#include "core/host_wait.h"

#include <sched.h>

#include <cstdlib>
#include <thread>

#include "core/error.h"

namespace zp {

double wait_timeout_s() {
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

WaitStatus poll_until(const std::function<bool()>& done, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  Backoff backoff;
  for (;;) {
    if (done()) return WaitStatus::Done;
    // The deadline is checked after a poll, so a wait that ends while the thread was descheduled
    // past it still counts as done.
    if (std::chrono::steady_clock::now() >= deadline) return done() ? WaitStatus::Done : WaitStatus::TimedOut;
    backoff.pause();
  }
}

}  // namespace zp
