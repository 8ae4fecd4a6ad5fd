#!/usr/bin/env bash
# Builds ZeRO-Pipe and runs the main job: a small GPT-2-style model trained from scratch on the
# bundled byte-level text (data/tiny) under `mpirun -np 2`, on the GPU when there is one (bf16), else
# on the CPU (fp32). The loss falls from ~5.5 to ~3 in 200 steps. Extra arguments go to
# `zeropipe train` (e.g. --set training.max_steps=500).
set -euo pipefail
cd "$(dirname "$0")"
source launch/prepare-build.sh
extra=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extra=(--set bf16.enabled=true); fi
exec mpirun --oversubscribe --bind-to none -np 2 "$ZP_BUILD_DIR/bin/zeropipe" train --config configs/demo-tiny.json \
  --set train_micro_batch_size_per_gpu=4 "${extra[@]}" "$@"
