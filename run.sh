#!/usr/bin/env bash
# Builds ZeRO-Pipe and runs the main job under `mpirun -np 2`, on the GPU when there is one.
# Until the training path lands, the main job is the engine's test suite.
set -euo pipefail
cd "$(dirname "$0")"
source launch/prepare-build.sh
ctest --test-dir "$ZP_BUILD_DIR" --output-on-failure --timeout 1200
