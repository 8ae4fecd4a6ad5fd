#!/usr/bin/env bash
# A full disk while a checkpoint is written: the error says "no space left on device" with the path
# and the bytes the checkpoint needs, every rank exits with status 1 (no crash, no abort), no
# temporary file is left, and the previous checkpoint is intact (inspect --verify). Twice: on a real
# full file system (a small tmpfs filled up mid-run; skipped where mounting is not permitted) and
# through the fault injector (ZP_FAULT=write:1 on the resumed run's first save).
# Usage: full_disk_test.sh ZEROPIPE_BINARY SOURCE_DIR RANKS   (RANKS 1 runs without mpirun)
bin=$1 src=$2 np=$3
source "$(dirname "$0")/nothing_lost_lib.sh"
[ "$np" = 1 ] && np=0

check_failed_save() {  # LOG STATUS DIR: the failed save's aftermath
  [ "$2" -eq 1 ] || fail "exit status $2 after a full disk, expected 1"
  grep -q "no space left on device" "$1" || fail "the error does not say the disk is full"
  grep -q "this file needs about" "$1" || fail "the error does not say how much room the checkpoint needs"
  ls "$3"/*.tmp > /dev/null 2>&1 && fail "a temporary file is left: $(ls "$3")"
  local prev
  prev=$(ls "$3"/step-*.h5 | tail -n 1)
  [ -n "$prev" ] || fail "no previous checkpoint left"
  "$bin" inspect --verify "$prev" > "$tmp/inspect.log" 2>&1 || fail "the previous checkpoint $prev does not verify"
  echo "full disk: status 1, no temporary file, $prev intact"
}

# Through the fault injector.
train "$np" "$tmp/inj" --set training.max_steps=5 > "$tmp/inj1.log" 2>&1 || fail "the first run failed"
ZP_FAULT=write:1 train "$np" "$tmp/inj" --set training.max_steps=10 --resume latest > "$tmp/inj2.log" 2>&1
check_failed_save "$tmp/inj2.log" $? "$tmp/inj"
grep -q "injected by ZP_FAULT" "$tmp/inj2.log" || fail "the injected failure is not the one reported"

# A real full file system.
mkdir -p "$tmp/disk"
if ! mount -t tmpfs -o size=12m tmpfs "$tmp/disk" 2> /dev/null; then
  echo "cannot mount a tmpfs here: the real full-disk case is skipped (the injected one ran)"
  echo PASS
  exit 0
fi
train "$np" "$tmp/disk/ckpt" --set training.max_steps=100000 --set checkpoint.save_every=20 \
  --set checkpoint.keep_last=1 > "$tmp/disk.log" 2>&1 &
job=$!
for _ in $(seq 1 1200); do ls "$tmp/disk/ckpt"/step-*.h5 > /dev/null 2>&1 && break; sleep 0.05; done
ls "$tmp/disk/ckpt"/step-*.h5 > /dev/null 2>&1 || fail "no first checkpoint"
# Leave less room than one more checkpoint needs.
free_kb=$(df -k --output=avail "$tmp/disk" | tail -n 1)
dd if=/dev/zero of="$tmp/disk/filler" bs=1k count=$(( free_kb - 256 )) status=none 2> /dev/null
wait $job
check_failed_save "$tmp/disk.log" $? "$tmp/disk/ckpt"
echo PASS
