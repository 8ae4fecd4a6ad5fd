#!/usr/bin/env bash
# Failure test: SIGKILL one rank of a 3-rank training job mid-run; every rank must be gone and the
# job must exit non-zero within 60 seconds. Usage: kill_rank_test.sh ZEROPIPE_BINARY SOURCE_DIR [SET...]
# (SET: further --set assignments, e.g. a pipeline of three stages, where the victim is stage 1; a
# pipeline runs with ZP_PIPELINE_TRACE=1, and the log must say where each surviving stage stopped)
set -u
bin=$1 src=$2
shift 2
extra=()
pipeline=0
for a in "$@"; do extra+=(--set "$a"); [[ $a == pipeline.stages=* ]] && pipeline=1; done
[ $pipeline = 1 ] && export ZP_PIPELINE_TRACE=1
tmp=$(mktemp -d /tmp/zp_kill.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cd "$src"
mpirun --oversubscribe --bind-to none -np 3 "$bin" train --config configs/demo-tiny.json \
  --set training.max_steps=1000000 --set train_micro_batch_size_per_gpu=2 --set training.device=cpu \
  --set "training.metrics_file=\"$tmp/metrics.jsonl\"" "${extra[@]}" > "$tmp/out.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do  # up to 60 s for three steps to complete
  [ -f "$tmp/metrics.jsonl" ] && [ "$(wc -l < "$tmp/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
[ "$(wc -l < "$tmp/metrics.jsonl" 2>/dev/null || echo 0)" -ge 3 ] || { echo "FAIL: training did not start"; cat "$tmp/out.log"; kill -9 $job; exit 1; }
victim=$(pgrep -f "$tmp/metrics.jsonl" | while read -r p; do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = zeropipe ] && echo "$p"; done | sed -n 2p)
[ -n "$victim" ] || { echo "FAIL: no rank process found"; kill -9 $job; exit 1; }
start=$(date +%s)
kill -9 "$victim"
for _ in $(seq 1 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then
  echo "FAIL: job still running 60 s after rank pid $victim was killed"; pkill -9 -f "$tmp/metrics.jsonl"; exit 1
fi
wait $job; rc=$?
left=$(pgrep -f "$tmp/metrics.jsonl" | wc -l)
echo "killed pid $victim; job exited with $rc after $(( $(date +%s) - start )) s; $left processes left"
[ "$rc" -ne 0 ] && [ "$left" -eq 0 ] || { echo FAIL; exit 1; }
if [ $pipeline = 1 ]; then
  for r in 0 2; do
    last=$(grep -a "^\[zp info r$r\] pipeline trace: " "$tmp/out.log" | tail -1)
    [ -n "$last" ] || { echo "FAIL: no pipeline trace from rank $r"; tail -20 "$tmp/out.log"; exit 1; }
    echo "last trace of rank $r: $last"
  done
  grep -aq "pipeline trace: step [0-9]* pass [0-9]*/[0-9]*: F of micro-batch 0, chunk 0" "$tmp/out.log" ||
    { echo "FAIL: no pass trace"; exit 1; }
fi
echo PASS
