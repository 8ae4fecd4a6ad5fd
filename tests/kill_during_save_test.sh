#!/usr/bin/env bash
# Failure test: SIGKILL every rank of a 2-rank CPU training job while it is writing a checkpoint
# (a *.h5.tmp exists before the kill and is still there after it). `--resume latest` must then pick the newest COMPLETE checkpoint (never the
# temporary file), train on and save again, and `zeropipe inspect --verify` must pass on both.
# With a third argument "async" the saves are asynchronous (checkpoint.async = true): the kill lands
# while a thread writes the checkpoint.
# Usage: kill_during_save_test.sh ZEROPIPE_BINARY SOURCE_DIR [async]
set -u
bin=$1 src=$2
extra=()
[ "${3:-}" = async ] && extra=(--set checkpoint.async=true)
tmp=$(mktemp -d /tmp/zp_killsave.XXXXXX)
ckpt=$tmp/ckpt
trap 'pkill -9 -f "$ckpt" 2>/dev/null; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cd "$src"
# A GPT-2 of 3.2M parameters (a 38 MB checkpoint: the save takes a while) on a short sequence (the
# step does not), saving after every step.
train() {
  mpirun --oversubscribe --bind-to none -np 2 "$bin" train --config configs/demo-tiny.json \
    --set training.device=cpu --set training.eval_every=0 --set steps_per_print=1 \
    --set train_micro_batch_size_per_gpu=1 --set data.seq_len=32 \
    --set 'model.config={"model_type": "gpt2", "vocab_size": 256, "n_positions": 128, "n_embd": 256, "n_layer": 4, "n_head": 4}' \
    --set "checkpoint.dir=\"$ckpt\"" --set checkpoint.save_every=1 --set checkpoint.keep_last=3 "${extra[@]}" "$@"
}

train --set training.max_steps=1000000 > "$tmp/first.log" 2>&1 &
job=$!
rank_pids() { pgrep -f "$ckpt" | while read -r p; do [ "$(cat /proc/$p/comm 2>/dev/null)" = zeropipe ] && echo "$p"; done; }
caught="" ranks=""
for _ in $(seq 1 12000); do  # up to 120 s: two complete checkpoints, then a save in progress
  complete=$(ls "$ckpt"/step-*.h5 2>/dev/null | wc -l)
  if [ "$complete" -ge 2 ] && ls "$ckpt"/*.tmp > /dev/null 2>&1; then
    # Freeze the ranks, then look again: a save still in progress now is one the kill lands in.
    ranks=$(rank_pids)
    # shellcheck disable=SC2086
    [ -n "$ranks" ] && kill -STOP $ranks
    if ls "$ckpt"/*.tmp > /dev/null 2>&1; then caught=1; break; fi
    # shellcheck disable=SC2086
    kill -CONT $ranks
  fi
  kill -0 $job 2>/dev/null || break
  sleep 0.01
done
if [ -z "$caught" ]; then
  echo "FAIL: never saw a save in progress after two complete checkpoints"; cat "$tmp/first.log"; kill -9 $job; exit 1
fi
[ -n "$ranks" ] || { echo "FAIL: no rank process found"; kill -9 $job; exit 1; }
# shellcheck disable=SC2086
kill -9 $ranks
echo "killed ranks $(echo $ranks) with $(cd "$ckpt" && ls | tr '\n' ' ')in $ckpt"
for _ in $(seq 1 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
kill -9 $job 2>/dev/null
wait $job 2>/dev/null
pkill -9 -f "$ckpt" 2>/dev/null
sleep 0.5
# The kill must have landed while the save was in progress: its temporary file is still there
# (a save that had finished would have renamed it).
ls "$ckpt"/*.tmp > /dev/null 2>&1 || { echo "FAIL: no temporary file left: the kill did not land during a save"; ls -la "$ckpt"; exit 1; }

latest=$(ls "$ckpt"/step-*.h5 | sort | tail -n 1)
step=$(basename "$latest" .h5 | sed 's/^step-0*//')
[ -n "$step" ] || { echo "FAIL: no complete checkpoint left in $ckpt"; ls -la "$ckpt"; exit 1; }
echo "newest complete checkpoint: $latest (step $step); left over: $(cd "$ckpt" && ls ./*.tmp 2>/dev/null | tr '\n' ' ')"
"$bin" inspect --verify "$latest" > "$tmp/inspect1.log" 2>&1 || { echo "FAIL: inspect --verify $latest"; cat "$tmp/inspect1.log"; exit 1; }

# Resume: two more steps from the newest complete checkpoint.
end=$((step + 2))
if ! train --set training.max_steps=$end --resume latest > "$tmp/resume.log" 2>&1; then
  echo "FAIL: the resumed run failed"; cat "$tmp/resume.log"; exit 1
fi
grep -q "resumed from $latest" "$tmp/resume.log" || { echo "FAIL: did not resume from $latest"; cat "$tmp/resume.log"; exit 1; }
grep -q "step *$end/$end" "$tmp/resume.log" || { echo "FAIL: no step $end in the resumed run"; cat "$tmp/resume.log"; exit 1; }
final=$ckpt/$(printf 'step-%08d.h5' $end)
[ -f "$final" ] || { echo "FAIL: $final was not saved"; ls -la "$ckpt"; exit 1; }
ls "$ckpt"/*.tmp > /dev/null 2>&1 && { echo "FAIL: a temporary file is left after the resumed run"; ls -la "$ckpt"; exit 1; }
"$bin" inspect --verify "$final" > "$tmp/inspect2.log" 2>&1 || { echo "FAIL: inspect --verify $final"; cat "$tmp/inspect2.log"; exit 1; }
grep -q "kind = checkpoint" "$tmp/inspect2.log" || { echo "FAIL: inspect does not show kind = checkpoint"; cat "$tmp/inspect2.log"; exit 1; }
echo "resumed from step $step, trained to $end, saved $final; inspect --verify passes"
echo PASS
