# Sourced by the "nothing lost" shell tests: a scratch folder removed at exit, MPI as root, and the
# training run they interrupt (the demo GPT-2 on the bundled text, on CPUs, in fp32, so a resumed run
# is bit-exact). Each test sets `bin` and `src` first (its two arguments).
set -u
tmp=$(mktemp -d /tmp/zp_lost.XXXXXX)
cleanup() { [ -n "${ZP_KEEP_TMP:-}" ] && return; pkill -9 -f "$tmp" 2>/dev/null; mountpoint -q "$tmp/disk" 2>/dev/null && umount "$tmp/disk"; rm -rf "$tmp"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
cd "$src"

fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done; exit 1; }

# train NP DIR [zeropipe train options...]: the demo model, checkpoints in DIR. NP 0 runs without mpirun.
train() {
  local np=$1 dir=$2
  shift 2
  local launch=(mpirun --oversubscribe --bind-to none -np "$np")
  [ "$np" = 0 ] && launch=()
  "${launch[@]}" "$bin" train --config configs/demo-tiny.json --set training.device=cpu \
    --set training.eval_every=0 --set steps_per_print=1 --set train_micro_batch_size_per_gpu=2 \
    --set data.seq_len=32 --set "checkpoint.dir=\"$dir\"" "$@"
}

# The rank processes of runs writing under $tmp.
rank_pids() {
  pgrep -f "$tmp" | while read -r p; do [ "$(cat /proc/$p/comm 2>/dev/null)" = zeropipe ] && echo "$p"; done
}

# The SLURM tests. start_slurm SOURCE_DIR: a one-node SLURM from ../shared/slurm-local unless one runs.
start_slurm() {
  local setup=$1/../shared/slurm-local/setup-slurm.sh
  sinfo -h -o %T 2> /dev/null | grep -qE '^(idle|mix|alloc)' && return 0
  [ -x "$setup" ] || [ -f "$setup" ] || fail "no SLURM running and no $setup to start one"
  bash "$setup" > "$tmp/setup.log" 2>&1 || fail "setting up SLURM failed: $(tail -n 5 "$tmp/setup.log")"
}
# state [JOB]: the SLURM state of JOB (default $job). fail_with_output: fail, keeping $out, the job's
# output file, beside the other logs.
state() { scontrol show job "${1:-$job}" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
fail_with_output() { cp "$out" "$tmp/job.log" 2> /dev/null; fail "$@"; }

# requeue_and_restart WHAT: after the ranks of job $job were told to stop (WHAT names how), waits
# until SLURM requeues the job and its batch script, writing to $out, saw status 75; then until the
# stopped step is gone (else slurmd refuses the rerun: "Job credential revoked"), and starts the rerun
# at once (a requeued job otherwise waits about two minutes).
requeue_and_restart() {
  for _ in $(seq 1 600); do
    case "$(state)" in PENDING|REQUEUED|REQUEUE_HOLD|COMPLETED) break ;; esac
    sleep 0.1
  done
  case "$(state)" in PENDING|REQUEUED|REQUEUE_HOLD) ;; *) fail_with_output "the job did not requeue after $1 (state $(state))" ;; esac
  grep -q "zeropipe stopped with a checkpoint (status 75): requeueing" "$out" || fail_with_output "the batch script did not see status 75"
  for _ in $(seq 1 300); do [ -z "$(rank_pids)" ] && ! scontrol listpids "$job" > /dev/null 2>&1 && break; sleep 0.1; done
  sleep 3
  scontrol release "$job" 2> /dev/null
  scontrol update JobId="$job" StartTime=now 2> /dev/null
}

# wait_for_line FILE PATTERN SECONDS
wait_for_line() {
  for _ in $(seq 1 $(( $3 * 20 ))); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}

# The training data and optimizer state of two checkpoints are identical, byte for byte.
same_checkpoint() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
assert names, "no datasets"
for n in names:
    x, y = a[n][()], b[n][()]
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), n
for k in ("step", "optimizer_steps", "data_position"):
    assert a.attrs[k] == b.attrs[k], k
print(f"{len(names)} datasets identical")
PY
}
