// Progress of a long operation that is not a training step (checkpoint save and load, `convert`,
// `make-latents`, the start-up of a large model): a line with the percentage done and an ETA, at
// most every `every_s` seconds and never before the first `every_s` have passed, so an operation
// that finishes quickly prints nothing. Lines go through ZP_LOG_INFO (rank 0 only) unless a sink is
// given; the clock is injectable for tests.
#pragma once
#include <functional>
#include <string>

namespace zp {

class ProgressMeter {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  using Sink = std::function<void(const std::string&)>;

  // `total` units of work; `unit` "GB" counts bytes (shown in GB), anything else names a count
  // ("tensors", "images"). An empty clock is the steady clock, an empty sink ZP_LOG_INFO.
  ProgressMeter(std::string what, double total, std::string unit, double every_s = 10, Clock clock = {},
                Sink sink = {});

  // `done` units finished so far (not more than total): prints a line when one is due.
  void update(double done);
  // The line for `done` units after `elapsed_s` seconds: "<what>: 45% (3.1 of 6.9 GB), ETA 12 s".
  std::string line(double done, double elapsed_s) const;
  int lines_printed() const { return printed_; }

 private:
  std::string what_, unit_;
  double total_, every_s_;
  Clock clock_;
  Sink sink_;
  double start_s_, last_s_;
  int printed_ = 0;
};

// "12 s", "4.5 min", "2.1 h": a duration as a person reads it.
std::string human_duration(double seconds);

}  // namespace zp
