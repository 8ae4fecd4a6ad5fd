# Sourced by the sbatch scripts: where checkpoints go, and the requeue after a stop by a signal.
# `zeropipe train` exits with 75 when a signal (SIGUSR1 from --signal before the time limit, SIGTERM
# on preemption) made it save a checkpoint and stop; the job then requeues itself, and the rerun of
# this script resumes from that checkpoint (--resume latest). The job id, and so the default
# checkpoint folder, stays the same across requeues.
ZP_CHECKPOINT_DIR=${ZP_CHECKPOINT_DIR:-checkpoints/${SLURM_JOB_ID:-local}}
mkdir -p "$ZP_CHECKPOINT_DIR"
echo "zeropipe job ${SLURM_JOB_ID:-?} run $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on $(hostname) at $(date -Is): checkpoints in $ZP_CHECKPOINT_DIR"

requeue_if_stopped() {
  local status=$1
  if [ "$status" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "zeropipe stopped with a checkpoint (status 75): requeueing job $SLURM_JOB_ID"
    # Under preemption SLURM requeues the job itself; a second request is harmless.
    scontrol requeue "$SLURM_JOB_ID" || true
  fi
  exit "$status"
}
