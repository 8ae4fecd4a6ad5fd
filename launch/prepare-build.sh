# Sourced by run.sh and test.sh: installs the Debian/Ubuntu packages the build needs (when missing),
# configures and builds into $ZP_BUILD_DIR (default build/). CUDA is built when nvcc exists: for the
# local GPU's architecture when there is one, else for $ZP_CUDA_ARCH (default 90) alone to keep the
# build short; set ZP_CUDA_ARCH="80;86;89;90" for a portable build.
ZP_PACKAGES="cmake g++ make libopenmpi-dev openmpi-bin libhdf5-openmpi-dev libboost-program-options-dev \
nlohmann-json3-dev liburing-dev libpcre2-dev libdeflate-dev pkg-config libgtest-dev libbenchmark-dev python3-h5py"
missing=""
for p in $ZP_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
if [ -n "$missing" ]; then
  echo "installing:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# The report's browser test (tests/report_browser_test.sh) needs a headless Chromium. Debian packages
# chromium-headless-shell; where the distribution has none (Ubuntu ships Chromium as a snap) the build
# goes on and that one test fails, saying so, until a Chromium is on PATH.
if ! command -v chromium-headless-shell >/dev/null && ! command -v chromium >/dev/null; then
  { [ -n "$missing" ] || $SUDO apt-get update -qq; } &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium-headless-shell ||
    echo "note: no chromium-headless-shell package here; install a headless Chromium for the report's browser test"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
ZP_BUILD_DIR=${ZP_BUILD_DIR:-build}
if [ -z "${ZP_CUDA_ARCH:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ZP_CUDA_ARCH=native; else ZP_CUDA_ARCH=90; fi
fi
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B "$ZP_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ZP_CUDA_ARCH" ${ZP_CMAKE_ARGS:-}
cmake --build "$ZP_BUILD_DIR" -j "$(nproc)"
