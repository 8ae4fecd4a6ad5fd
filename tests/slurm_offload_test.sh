#!/usr/bin/env bash
# slurm/train-offload.sbatch under a real SLURM (../shared/slurm-local/setup-slurm.sh makes this
# machine a one-node cluster): configs/zero3-offload-nvme.json (ZeRO-3, optimizer state and parameter
# shards in swap files on "NVMe", here a folder under the test's scratch) shrunk to the demo model on
# 2 CPU ranks. The job must print `zeropipe plan`'s output for the node before it trains, rank 0's
# banner must name the NVMe tiers under $ZP_NVME_DIR/zeropipe-<job id>, the ranks must hold their swap
# files (unlinked) there and nothing may be left there afterwards. Mid-run the ranks get SIGUSR1 (what
# `#SBATCH --signal=USR1@120` sends), save and exit 75, the job requeues itself and the rerun resumes
# from that checkpoint and completes: its loss trajectory and final checkpoint equal those of an
# uninterrupted `mpirun -np 2 zeropipe train` of the same configuration, bit for bit (fp32).
# Then the same job on a node whose memory cannot hold it (sbatch --mem=1): the plan says it does not
# fit, and the job stops there with status 1 (no requeue), before any rank starts or any checkpoint.
# Usage: slurm_offload_test.sh ZEROPIPE_BINARY SOURCE_DIR
bin=$1 src=$2
source "$(dirname "$0")/nothing_lost_lib.sh"
start_slurm "$src"
export ZEROPIPE_BIN=$bin ZP_CHECKPOINT_DIR=$tmp/ckpt ZP_NVME_DIR=$tmp/nvme
mkdir -p "$ZP_NVME_DIR"
steps=200
config=configs/zero3-offload-nvme.json
# The preset's 1.3B GPT becomes the demo model on the bundled text, on CPUs, in fp32; the NVMe tiers
# and their paths stay the script's.
tiny=(--set training.device=cpu --set bf16.enabled=false --set "training.max_steps=$steps"
  --set training.eval_every=0 --set steps_per_print=1 --set train_micro_batch_size_per_gpu=2
  --set data.seq_len=32 --set 'data.train_files=["data/tiny/licenses.bin"]'
  --set model.config.vocab_size=256 --set model.config.n_positions=128 --set model.config.n_embd=64
  --set model.config.n_layer=2 --set model.config.n_head=4)
grep -q '"device": "nvme"' "$config" || fail "$config has no NVMe tier"

# The uninterrupted reference, without SLURM, its swap files in a folder of its own.
mkdir -p "$tmp/ref-nvme"
mpirun --oversubscribe --bind-to none -np 2 "$bin" train --config "$config" "${tiny[@]}" \
  --set "zero_optimization.offload_optimizer.nvme_path=\"$tmp/ref-nvme\"" \
  --set "zero_optimization.offload_param.nvme_path=\"$tmp/ref-nvme\"" \
  --set "checkpoint.dir=\"$tmp/ref\"" > "$tmp/ref.out" 2>&1 \
  || { cp "$tmp/ref.out" "$tmp/ref.log"; fail "the uninterrupted reference run failed"; }
ckpt_name=$(printf 'step-%08d.h5' $steps)
[ -f "$tmp/ref/$ckpt_name" ] || fail "the reference run did not save at its end"

out=$tmp/job.out
job=$(sbatch --parsable -O -n 2 --ntasks-per-node=2 -o "$out" slurm/train-offload.sbatch "$config" "${tiny[@]}") \
  || fail "sbatch failed"
echo "job $job"
trap 'scancel "$job" 2> /dev/null; cleanup' EXIT
nvme=$ZP_NVME_DIR/zeropipe-$job

# The trajectory of a log: "step | loss | lr | grad norm" of every progress line (no timings).
trajectory() { grep -E '^step +[0-9]+/' "$1" | sed -E 's/^(step +[0-9]+\/[0-9]+ \| loss [^|]*\| lr [^|]*\| grad norm [^ |]*).*/\1/'; }

# Run 1: wait for 20 steps; the ranks' swap files must be open, unlinked, in $nvme, one for the
# optimizer state and one for the parameter shards per rank, and none elsewhere.
for _ in $(seq 1 2400); do
  seen=$(grep -cE '^step +[0-9]+/' "$out" 2> /dev/null)
  [ "${seen:-0}" -ge 20 ] && break
  sleep 0.05
done
[ "${seen:-0}" -ge 20 ] || fail_with_output "run 1 never trained 20 steps (job state $(state))"
pids=$(rank_pids)
[ "$(echo "$pids" | grep -c .)" -eq 2 ] || fail_with_output "expected 2 rank processes, found: $pids"
swaps=$(for p in $pids; do readlink /proc/"$p"/fd/* 2> /dev/null; done | grep '\.swap')
echo "swap files open:"; echo "$swaps" | sed 's/^/  /'
for tier in optimizer params; do
  for r in 0 1; do
    echo "$swaps" | grep -qE "^$nvme/zeropipe-$tier-rank$r-[^/]*\.swap \(deleted\)$" \
      || fail_with_output "rank $r holds no unlinked $tier swap file in $nvme"
  done
done
[ "$(echo "$swaps" | grep -c .)" -eq 4 ] || fail_with_output "expected 4 swap files (2 tiers x 2 ranks), found: $swaps"

# Preemption warning: SIGUSR1 to the tasks, as --signal=USR1@T delivers it.
scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 failed"
requeue_and_restart SIGUSR1
for _ in $(seq 1 1800); do case "$(state)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac; sleep 0.1; done
[ "$(state)" = COMPLETED ] || fail_with_output "the job did not complete (state $(state))"
cp "$out" "$tmp/job.log"
run1=$tmp/run1.out run2=$tmp/run2.out
sed -n "/^zeropipe job $job run 1 on /,/^zeropipe job $job run 2 on /p" "$out" > "$run1"
sed -n "/^zeropipe job $job run 2 on /,\$p" "$out" > "$run2"

# 1. Two runs in one output file; together they trained every step once, the last one all of them.
runs=$(grep -c "^zeropipe job $job run " "$out")
[ "$runs" -eq 2 ] || fail "$runs runs in the output, expected 2 (one requeue)"
n=$(grep -cE '^step +[0-9]+/' "$out")
[ "$(grep -oE '^step +[0-9]+/' "$out" | tr -dc '0-9\n' | sort -n | uniq | tr '\n' ' ')" = "$(seq -s ' ' 1 $steps) " ] \
  || fail "the runs did not train steps 1..$steps"
[ "$n" -eq $steps ] || fail "$n progress lines for $steps steps (a step trained twice)"
grep -qE "^step +$steps/$steps " "$run2" || fail "the rerun did not reach step $steps"
grep -q "^run done: .* of $steps)" "$run2" || fail "the rerun did not end with its summary"
[ -f "$ZP_CHECKPOINT_DIR/$ckpt_name" ] || fail "no final checkpoint"

# 2. Each run printed the plan for the node (both tiers on NVMe under $nvme, and the verdict)
# before rank 0's banner and the first step; the banner names the NVMe tiers and the path.
for f in "$run1" "$run2"; do
  fits=$(grep -n -m1 -xF 'fits' "$f" | cut -d: -f1)
  banner=$(grep -n -m1 -F '[zp info r0] ZeRO stage 3 (' "$f" | cut -d: -f1)
  first=$(grep -n -m1 -E '^step +[0-9]+/' "$f" | cut -d: -f1)
  [ -n "$fits" ] || fail "$(basename "$f" .out): no \`zeropipe plan\` verdict (\"fits\") in the job output"
  [ -n "$banner" ] && [ -n "$first" ] || fail "$(basename "$f" .out): no banner or no step"
  [ "$fits" -lt "$banner" ] && [ "$fits" -lt "$first" ] || fail "$(basename "$f" .out): the plan came after the training started"
  grep -qE '^model: gpt2, ' "$f" || fail "$(basename "$f" .out): the plan did not name the model"
  grep -qxE "    optimizer state .* per rank under $nvme" "$f" || fail "$(basename "$f" .out): the plan does not put the optimizer state under $nvme"
  grep -qxE "    parameter shards .* per rank under $nvme" "$f" || fail "$(basename "$f" .out): the plan does not put the parameter shards under $nvme"
  grep -F '[zp info r0] ZeRO stage 3 (' "$f" | grep -qF 'optimizer state on NVMe, parameters on NVMe)' \
    || fail "$(basename "$f" .out): rank 0's banner does not name the NVMe tiers"
  grep -F '[zp info r0] memory plan' "$f" | grep -F "on NVMe under $nvme: optimizer" | grep -qF "on NVMe under $nvme: parameters" \
    || fail "$(basename "$f" .out): rank 0's memory plan does not put both swap files under $nvme"
done

# 3. Nothing left in the swap folder, and nothing else made under $ZP_NVME_DIR.
[ -d "$nvme" ] || fail "$nvme was never made"
[ -z "$(ls -A "$nvme")" ] || fail "files left in $nvme: $(ls -A "$nvme")"
[ "$(ls -A "$ZP_NVME_DIR")" = "zeropipe-$job" ] || fail "unexpected entries in $ZP_NVME_DIR: $(ls -A "$ZP_NVME_DIR")"

# 4. The preemption: SIGUSR1 seen, a checkpoint before the end, the rerun resumed from it, and the
# whole trajectory and the final checkpoint are the uninterrupted run's.
grep -q "SIGUSR1 received" "$run1" || fail "run 1 did not report SIGUSR1"
at=$(sed -n 's/.*stopped by signal 10 after step \([0-9]*\).*/\1/p' "$run1" | head -n 1)
[ -n "$at" ] && [ "$at" -lt $steps ] || fail "run 1 did not stop early on SIGUSR1 (step '${at}')"
saved=$ZP_CHECKPOINT_DIR/$(printf 'step-%08d.h5' "$at")
[ -f "$saved" ] || fail "no checkpoint at step $at"
grep -qF "resumed from $saved" "$run2" || fail "the rerun did not resume from $saved"
grep -qE "^step +$((at + 1))/$steps " "$run2" || fail "the rerun did not continue at step $((at + 1))"
trajectory "$tmp/ref.out" > "$tmp/ref.traj"
trajectory "$out" > "$tmp/job.traj"
[ "$(wc -l < "$tmp/ref.traj")" -eq $steps ] || fail "the reference printed $(wc -l < "$tmp/ref.traj") steps"
diff "$tmp/ref.traj" "$tmp/job.traj" > "$tmp/traj.diff" || fail "the interrupted job's trajectory differs from the uninterrupted one: $(head -n 6 "$tmp/traj.diff")"
same_checkpoint "$tmp/ref/$ckpt_name" "$ZP_CHECKPOINT_DIR/$ckpt_name" || fail "the job ends elsewhere than the uninterrupted run"
echo "stopped after step $at, resumed from $saved; final: $(tail -n 1 "$tmp/job.traj")"

# 5. The same job on a node too small: --mem=1 makes SLURM_MEM_PER_NODE, the host memory the script
# gives the plan, 1 MiB against the few MiB the plan counts for the node. The plan's verdict must stop
# the job before training: FAILED with exit code 1 (not 75: no requeue), the plan's "does not fit" line
# then the script's message, nothing from the ranks (banner, steps) and no checkpoint.
rm -f "$tmp"/*.log  # the first job passed: a failure shows this job's output only
out2=$tmp/small.out ckpt2=$tmp/small-ckpt
job2=$(ZP_CHECKPOINT_DIR=$ckpt2 sbatch --parsable -O -n 2 --ntasks-per-node=2 --mem=1 -o "$out2" \
  slurm/train-offload.sbatch "$config" "${tiny[@]}") || fail "sbatch --mem=1 failed"
echo "job $job2 (--mem=1)"
trap 'scancel "$job" "$job2" 2> /dev/null; cleanup' EXIT
fail2() { cp "$out2" "$tmp/small.log" 2> /dev/null; fail "job $job2 (--mem=1): $*"; }
# Until it ends, or until it trains (then it did not stop: no need to wait for its 200 steps).
for _ in $(seq 1 600); do
  case "$(state "$job2")" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  grep -qE '^step +[0-9]+/' "$out2" 2> /dev/null && break
  sleep 0.1
done
grep -qE '^step +[0-9]+/' "$out2" && fail2 "it trained although the plan says it does not fit"
grep -qF '[zp ' "$out2" && fail2 "the ranks started although the plan says it does not fit"
info=$(scontrol show job "$job2")
[ "$(state "$job2")" = FAILED ] || fail2 "state $(state "$job2"), expected FAILED"
echo "$info" | grep -qw 'ExitCode=1:0' || fail2 "$(echo "$info" | grep -o 'ExitCode=[^ ]*'), expected ExitCode=1:0"
echo "$info" | grep -qw 'Restarts=0' || fail2 "it was requeued"
verdict=$(grep -n -m1 -E '^does not fit: host memory per node \(2 ranks\) needs .*, 1 MiB available$' "$out2" | cut -d: -f1)
stop=$(grep -n -m1 -F 'the plan printed above says this run does not fit this node' "$out2" | cut -d: -f1)
[ -n "$verdict" ] || fail2 "no \`zeropipe plan\` verdict \"does not fit: host memory ... 1 MiB available\""
[ -n "$stop" ] || fail2 "no message that the plan stopped the job"
[ "$verdict" -lt "$stop" ] || fail2 "the stop message came before the plan's verdict"
sed -n "${stop},\$p" "$out2" | grep -qF 'nothing was started' || fail2 "the stop message does not say that nothing was started"
grep -qxF 'fits' "$out2" && fail2 "the plan said \"fits\""
[ "$(grep -c "^zeropipe job $job2 run " "$out2")" -eq 1 ] || fail2 "not exactly one run"
[ -z "$(ls -A "$ckpt2" 2> /dev/null)" ] || fail2 "it wrote to its checkpoint folder: $(ls -A "$ckpt2")"
echo "job $job2 stopped by its plan: $(sed -n "${verdict}p" "$out2")"
echo PASS
