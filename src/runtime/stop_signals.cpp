#include "runtime/stop_signals.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

#include "core/error.h"

namespace zp::runtime {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile std::sig_atomic_t g_received = 0, g_completed = 0;
bool g_installed = false;
struct sigaction g_previous[3];

// Async-signal-safe: a flag, write(2) and _exit only.
void on_signal(int sig) {
  if (g_completed != 0) _exit(kExitStopped);
  if (g_received != 0) _exit(128 + sig);
  g_received = sig;
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGUSR1";
  char line[200] = "zeropipe: ";
  std::strcat(line, name);
  std::strcat(line, " received: stopping after this step with a checkpoint (a second signal exits at once)\n");
  ssize_t ignored = ::write(STDERR_FILENO, line, std::strlen(line));
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals() {
  ZP_CHECK(!g_installed, "one StopSignals at a time");
  g_installed = true;
  g_received = 0;
  g_completed = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) ZP_CHECK(sigaction(kSignals[i], &sa, &g_previous[i]) == 0, "sigaction: ", std::strerror(errno));
}

StopSignals::~StopSignals() {
  if (g_received == 0 && g_completed == 0)
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int StopSignals::received() const { return g_received; }

void StopSignals::stop_completed() { g_completed = 1; }

}  // namespace zp::runtime
