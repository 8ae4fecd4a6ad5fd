// Preemption (SLURM's SIGTERM on preemption and at the time limit, SIGUSR1 from `--signal`, Ctrl-C):
// while a training loop runs, SIGTERM, SIGINT and SIGUSR1 only raise a flag. At the next step
// boundary the ranks agree (one tiny all-reduce: a rank that got no signal stops with the rest),
// write a checkpoint and return; `zeropipe train` then exits with kExitStopped. A second signal
// exits at once with 128 + the signal's number, as an unhandled one would; once the checkpoint is
// written (stop_completed()), with kExitStopped: srun --kill-on-bad-exit answers the first rank to
// exit 75 by signalling the others, which must not turn their status into 143 while they finalize.
#pragma once

namespace zp::runtime {

// `zeropipe train`'s exit status after a stop requested by a signal, with the checkpoint written:
// EX_TEMPFAIL from sysexits.h ("try again later"), which the sbatch scripts answer with a requeue.
inline constexpr int kExitStopped = 75;

class StopSignals {
 public:
  StopSignals();   // installs the handlers; at most one StopSignals at a time
  // Restores the previous handlers, unless a signal is stopping the run: then they stay until the
  // process exits.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal received since construction, 0 if none.
  int received() const;
  // The stop's checkpoint is written: a later signal exits at once with kExitStopped.
  void stop_completed();
};

}  // namespace zp::runtime
