#!/usr/bin/env bash
# Preemption: SIGTERM to every rank of a running job (what SLURM sends) makes the ranks agree at the
# next step boundary, save a checkpoint and exit with status 75; `--resume latest` then continues to
# the end, and the final checkpoint equals an uninterrupted run's byte for byte. A second signal
# exits at once (128 + 15).
# Usage: signal_resume_test.sh ZEROPIPE_BINARY SOURCE_DIR RANKS   (RANKS 1 runs without mpirun)
bin=$1 src=$2 np=$3
source "$(dirname "$0")/nothing_lost_lib.sh"
[ "$np" = 1 ] && np=0
steps=60

train "$np" "$tmp/ref" --set training.max_steps=$steps > "$tmp/ref.log" 2>&1 || fail "the uninterrupted run failed"
ref=$tmp/ref/$(printf 'step-%08d.h5' $steps)
[ -f "$ref" ] || fail "the uninterrupted run did not save at its end"

train "$np" "$tmp/run" --set training.max_steps=$steps > "$tmp/run.log" 2>&1 &
job=$!
wait_for_line "$tmp/run.log" "step +10/" 120 || fail "the run never reached step 10"
# shellcheck disable=SC2046
kill -TERM $(rank_pids)
wait $job
status=$?
[ $status -eq 75 ] || fail "exit status $status after SIGTERM, expected 75"
saved=$(ls "$tmp/run"/step-*.h5 2>/dev/null | tail -n 1)
[ -n "$saved" ] || fail "no checkpoint written on SIGTERM"
at=$(basename "$saved" .h5 | sed 's/^step-0*//')
[ "$at" -lt $steps ] || fail "the checkpoint is from step $at: the signal did not stop the run early"
grep -q "SIGTERM received" "$tmp/run.log" || fail "no message about the signal"
grep -q "stopped by signal 15 after step $at" "$tmp/run.log" || fail "no message naming the step"
echo "stopped at step $at with status 75, saved $saved"

train "$np" "$tmp/run" --set training.max_steps=$steps --resume latest > "$tmp/resume.log" 2>&1 || fail "the resumed run failed"
grep -q "resumed from $saved" "$tmp/resume.log" || fail "did not resume from $saved"
final=$tmp/run/$(printf 'step-%08d.h5' $steps)
same_checkpoint "$ref" "$final" || fail "the resumed run ends elsewhere than the uninterrupted one"

# A second signal: exit at once, without waiting for the step. (Two different signals: two of one
# kind sent back to back may reach the process as one.)
train "$np" "$tmp/twice" --set training.max_steps=100000 > "$tmp/twice.log" 2>&1 &
job=$!
wait_for_line "$tmp/twice.log" "step +3/" 120 || fail "the run never reached step 3"
pids=$(rank_pids)
# shellcheck disable=SC2086
kill -TERM $pids; kill -INT $pids
wait $job
status=$?
[ $status -ne 0 ] && [ $status -ne 75 ] || fail "exit status $status after two signals"
if [ "$np" = 0 ]; then [ $status -eq 130 ] || [ $status -eq 143 ] || fail "exit status $status after two signals, expected 128 + the second"; fi
ls "$tmp/twice"/*.h5 > /dev/null 2>&1 && fail "a checkpoint was written although the second signal came at once"
echo "two signals: exit status $status"
echo PASS
