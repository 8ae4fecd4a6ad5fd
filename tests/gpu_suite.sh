#!/usr/bin/env bash
# Every GPU test in one call on a lent GPU machine (where binaries arrive packed, without a build tree
# or ctest): zp_tests' *Gpu* suites on one GPU, zp_mpi_tests' *Gpu* suites at one rank and, where the
# machine has two GPUs or more, at two ranks (NCCL, one GPU per rank; pipelines traced). Each group runs under its own
# time limit, so a hang in one (reported as "TIMED OUT") does not hide the others' results; each
# group's log goes to OUT_DIR, and the last lines summarise them. Exits 1 when a group failed or timed out.
# Usage: gpu_suite.sh BIN_DIR OUT_DIR [SECONDS_PER_GROUP (default 240)] [GTEST_FILTER (default *Gpu*)]
set -u
bin=$1 out=$2 limit=${3:-240} filter=${4:-*Gpu*}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
summary=()
status=0
group() {  # group NAME COMMAND...
  local name=$1
  shift
  timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local passed failed
  passed=$(grep -ac '\[       OK \]' "$out/$name.log")
  failed=$(grep -a '\[  FAILED  \]' "$out/$name.log" | grep -av 'listed below' | sed 's/.*\] *//' | sort -u | tr '\n' ' ')
  case $rc in
    0) summary+=("$name: $passed passed") ;;
    124|137) summary+=("$name: TIMED OUT after ${limit} s ($passed passed before; running: $(grep -a '\[ RUN' "$out/$name.log" | tail -1 | sed 's/.*\] *//'))"); status=1 ;;
    *) summary+=("$name: exit $rc, $passed passed, failed: ${failed:-?}"); status=1 ;;
  esac
}
echo "GPUs: $gpus"
group unit_gpu "$bin/zp_tests" --gtest_filter="$filter"
group mpi_np1_gpu mpirun --bind-to none -np 1 "$bin/zp_mpi_tests" --gtest_filter="$filter"
if [ "$gpus" -ge 2 ]; then
  # Traced: if a pipeline hangs, its log says which pass and message each stage stopped at.
  group mpi_np2_gpu mpirun --bind-to none -np 2 -x ZP_PIPELINE_TRACE=1 "$bin/zp_mpi_tests" --gtest_filter="$filter"
else
  summary+=("mpi_np2_gpu: not run ($gpus GPU)")
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
