#!/usr/bin/env bash
# Checks that every include points to a lower layer, builds ZeRO-Pipe and runs its whole test suite:
# CPU tests, MPI tests at 2, 3 and 5 ranks, and the GPU tests (which skip themselves, saying why, where
# there is no GPU). Installs what the build needs on Debian/Ubuntu first. Used by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")"
python3 launch/check-layers.py  # an include that points to a higher layer fails the run
source launch/prepare-build.sh
ctest --test-dir "$ZP_BUILD_DIR" --output-on-failure --timeout 1200
