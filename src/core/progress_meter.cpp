#include "core/progress_meter.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "core/log.h"

namespace zp {

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string human_duration(double seconds) {
  char b[32];
  if (seconds < 100) std::snprintf(b, sizeof(b), "%.0f s", seconds);
  else if (seconds < 100 * 60) std::snprintf(b, sizeof(b), "%.1f min", seconds / 60);
  else std::snprintf(b, sizeof(b), "%.1f h", seconds / 3600);
  return b;
}

ProgressMeter::ProgressMeter(std::string what, double total, std::string unit, double every_s, Clock clock, Sink sink)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), every_s_(every_s),
      clock_(clock ? std::move(clock) : Clock(steady_seconds)),
      sink_(sink ? std::move(sink) : Sink([](const std::string& l) { ZP_LOG_INFO(l); })) {
  start_s_ = last_s_ = clock_();
}

std::string ProgressMeter::line(double done, double elapsed_s) const {
  done = std::clamp(done, 0.0, total_);
  const double fraction = total_ > 0 ? done / total_ : 1.0;
  char amount[96];
  if (unit_ == "GB")
    std::snprintf(amount, sizeof(amount), "%.1f of %.1f GB", done / 1e9, total_ / 1e9);
  else
    std::snprintf(amount, sizeof(amount), "%.0f of %.0f %s", done, total_, unit_.c_str());
  // The rate so far carries the rest: the remaining work at the mean speed since the start.
  const std::string eta = done > 0 ? human_duration(elapsed_s * (total_ - done) / done) : std::string("unknown");
  char b[256];
  std::snprintf(b, sizeof(b), "%s: %.0f%% (%s), ETA %s", what_.c_str(), 100 * fraction, amount, eta.c_str());
  return b;
}

void ProgressMeter::update(double done) {
  if (done >= total_) return;  // finished: the caller reports the result
  const double now = clock_();
  if (now - last_s_ < every_s_) return;
  last_s_ = now;
  ++printed_;
  sink_(line(done, now - start_s_));
}

}  // namespace zp
