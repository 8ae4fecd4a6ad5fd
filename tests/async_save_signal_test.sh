#!/usr/bin/env bash
# Nothing lost with asynchronous saves (checkpoint.async = true): SIGTERM to every rank while a save
# is being written in the background (its *.h5.tmp exists). The ranks finish and commit that save,
# write the stop's checkpoint and exit with status 75; no temporary file is left, every checkpoint
# verifies, and `--resume latest` continues from the stop's checkpoint.
# Usage: async_save_signal_test.sh ZEROPIPE_BINARY SOURCE_DIR RANKS   (RANKS 1 runs without mpirun)
bin=$1 src=$2 np=$3
source "$(dirname "$0")/nothing_lost_lib.sh"
[ "$np" = 1 ] && np=0
# A GPT-2 of 3.2M parameters (a 38 MB checkpoint: its background write takes a while) saving every
# other step.
big=(--set 'model.config={"model_type": "gpt2", "vocab_size": 256, "n_positions": 128, "n_embd": 256, "n_layer": 4, "n_head": 4}'
     --set train_micro_batch_size_per_gpu=1 --set checkpoint.async=true --set checkpoint.save_every=2
     --set checkpoint.keep_last=3)
dir=$tmp/run

train "$np" "$dir" "${big[@]}" --set training.max_steps=1000000 > "$tmp/run.log" 2>&1 &
job=$!
caught=""
for _ in $(seq 1 12000); do  # up to 120 s: a committed checkpoint, then a background save in flight
  if ls "$dir"/step-*.h5 > /dev/null 2>&1 && ls "$dir"/*.tmp > /dev/null 2>&1; then caught=1; break; fi
  kill -0 $job 2>/dev/null || break
  sleep 0.01
done
[ -n "$caught" ] || { kill -9 $job; fail "never saw a save in flight after a committed checkpoint"; }
in_flight=$(cd "$dir" && ls ./*.tmp | head -n 1)
# shellcheck disable=SC2046
kill -TERM $(rank_pids)
wait $job
status=$?
[ $status -eq 75 ] || fail "exit status $status after SIGTERM during a background save, expected 75"
ls "$dir"/*.tmp > /dev/null 2>&1 && fail "a temporary file is left: $(ls "$dir")"
at=$(grep -oE "stopped by signal 15 after step [0-9]+" "$tmp/run.log" | grep -oE "[0-9]+$")
[ -n "$at" ] || fail "no message naming the step the signal stopped at"
saved=$dir/$(printf 'step-%08d.h5' "$at")
[ -f "$saved" ] || fail "no checkpoint of step $at (the stop's): $(ls "$dir")"
# The save that was in flight was finished and committed (keep_last 3 keeps it beside the stop's).
[ -f "$dir/$(basename "$in_flight" .tmp)" ] || fail "the save in flight ($in_flight) was not committed: $(ls "$dir")"
grep -q "$(basename "$in_flight" .tmp) (asynchronously)" "$tmp/run.log" || fail "no message of the asynchronous save"
for f in "$dir"/step-*.h5; do
  "$bin" inspect --verify "$f" > "$tmp/inspect.log" 2>&1 || fail "inspect --verify $f"
done
echo "SIGTERM with $in_flight in flight: status 75, stopped after step $at, $(ls "$dir" | tr '\n' ' ')verify"

end=$((at + 2))
train "$np" "$dir" "${big[@]}" --set training.max_steps=$end --resume latest > "$tmp/resume.log" 2>&1 ||
  fail "the resumed run failed"
grep -q "resumed from $saved" "$tmp/resume.log" || fail "did not resume from $saved"
[ -f "$dir/$(printf 'step-%08d.h5' $end)" ] || fail "the resumed run did not save at its end"
echo "resumed from $saved"

# A background save that fails (the fault injector's full disk, on the last rank, about the second
# save): every rank stops with the error naming it, status 1; no temporary file is left and the
# checkpoints committed before stay and verify.
fdir=$tmp/fault
fault="write:200"  # one rank writes all of a save's ~150 slices
[ "$np" = 0 ] || fault="write:100@$((np - 1))"
ZP_FAULT="$fault" train "$np" "$fdir" "${big[@]}" --set training.max_steps=1000000 > "$tmp/fault.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "exit status $status after a failed background save, expected 1"
grep -q "in the background failed: .*No space left on device (injected by ZP_FAULT)" "$tmp/fault.log" ||
  fail "the rank that failed did not say so at once"
grep -q "asynchronous checkpoint save failed (the checkpoints committed before are kept)" "$tmp/fault.log" ||
  fail "the run's error does not say that the asynchronous save failed"
ls "$fdir"/*.tmp > /dev/null 2>&1 && fail "a temporary file is left after the failed save: $(ls "$fdir")"
ls "$fdir"/step-*.h5 > /dev/null 2>&1 || fail "no checkpoint from before the failed save is left"
for f in "$fdir"/step-*.h5; do
  "$bin" inspect --verify "$f" > "$tmp/inspect.log" 2>&1 || fail "inspect --verify $f after the failed save"
done
echo "failed background save: status 1, kept $(ls "$fdir" | tr '\n' ' ')"
echo PASS
