#!/usr/bin/env bash
# Preemption under a real SLURM (../shared/slurm-local/setup-slurm.sh makes this machine a one-node
# cluster): slurm/train-1node-5gpu.sbatch runs the demo model on 5 CPU ranks; mid-run the ranks get
# SIGUSR1 (what `#SBATCH --signal=USR1@120` sends before the time limit), save and exit 75, the job
# requeues itself and its rerun resumes; then SIGTERM sent to the ranks (what preemption does) does
# the same; the third run finishes all steps. One output file holds all three runs (--open-mode=append).
# Usage: slurm_requeue_test.sh ZEROPIPE_BINARY SOURCE_DIR
bin=$1 src=$2
source "$(dirname "$0")/nothing_lost_lib.sh"
start_slurm "$src"
export ZEROPIPE_BIN=$bin ZP_CHECKPOINT_DIR=$tmp/ckpt
steps=150
out=$tmp/job.out
job=$(sbatch --parsable -O -o "$out" slurm/train-1node-5gpu.sbatch configs/demo-tiny.json --set training.device=cpu \
  --set training.max_steps=$steps --set data.seq_len=32 --set train_micro_batch_size_per_gpu=2 \
  --set steps_per_print=1 --set training.eval_every=0) || fail "sbatch failed"
echo "job $job"
trap 'scancel "$job" 2> /dev/null; cleanup' EXIT

# interrupt SIGNAL RUN: waits for run RUN to train 15 steps, signals its ranks, waits for the requeue
# and starts the rerun at once (a requeued job otherwise waits about two minutes).
interrupt() {
  local sig=$1 run=$2 seen
  for _ in $(seq 1 2400); do
    seen=$(sed -n "/ run $run on /,\$p" "$out" 2> /dev/null | grep -cE '^step +[0-9]+/')
    [ "${seen:-0}" -ge 15 ] && break
    sleep 0.05
  done
  [ "${seen:-0}" -ge 15 ] || fail_with_output "run $run never trained 15 steps (job state $(state))"
  if [ "$sig" = USR1 ]; then  # as --signal=USR1@T delivers it: slurmd signals the tasks
    scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 failed"
  else  # preemption's SIGTERM to the tasks (scancel --signal=TERM is not that: it cancels the step)
    # shellcheck disable=SC2046
    kill -"$sig" $(rank_pids)
  fi
  requeue_and_restart "SIG$sig"
}
interrupt USR1 1
interrupt TERM 2
for _ in $(seq 1 1800); do [ "$(state)" = COMPLETED ] && break; sleep 0.1; done
[ "$(state)" = COMPLETED ] || fail_with_output "the job did not complete (state $(state))"
cp "$out" "$tmp/job.log"
runs=$(grep -c "zeropipe job $job run " "$out")
[ "$runs" -eq 3 ] || fail "$runs runs in the output, expected 3 (one output file across requeues)"
[ "$(grep -c 'resumed from' "$out")" -eq 2 ] || fail "the reruns did not both resume"
grep -q "SIGUSR1 received" "$out" && grep -q "SIGTERM received" "$out" || fail "a signal was not reported"
grep -qE "^step +$steps/$steps" "$out" || fail "the last run did not reach step $steps"
[ -f "$ZP_CHECKPOINT_DIR/$(printf 'step-%08d.h5' $steps)" ] || fail "no final checkpoint"
echo "resumed at: $(grep -o 'resumed from [^ ]*' "$out" | sed 's/.*step-0*//' | tr '\n' ' ')"
echo PASS
