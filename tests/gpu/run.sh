#!/usr/bin/env bash
# Builds wsync with the NCCL backend and runs every gpu-labelled test, then prints a summary. This
# is the one script to run when a machine with an NVIDIA GPU is lent:
#   tests/gpu/run.sh [build dir, default build-gpu]
# It needs CUDA and NCCL under /usr/local/cuda (WSYNC_CUDA_ROOT) and at least one GPU; two test
# processes share GPU 0. Exit status: 0 when every gpu test passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build-gpu}
JOBS=${JOBS:-$(nproc)}
summary=()
status=0

echo "== GPU"
if ! nvidia-smi -L; then
  echo "run.sh: no GPU visible (nvidia-smi failed); gpu tests cannot run" >&2
  exit 2
fi

echo "== configure and build (${BUILD_DIR})"
if ! cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSYNC_WITH_NCCL=ON >/dev/null ||
   ! cmake --build "$BUILD_DIR" -j"$JOBS" --target gpu_nccl_test nccl_test; then
  echo "run.sh: build failed" >&2
  exit 1
fi

echo "== nccl_test (unit, fake NcclApi)"
if ctest --test-dir "$BUILD_DIR" --output-on-failure -R '^nccl_test$'; then
  summary+=("PASS nccl_test (unit)")
else
  summary+=("FAIL nccl_test (unit)"); status=1
fi

echo "== gpu-labelled tests"
gpu_tests=$(ctest --test-dir "$BUILD_DIR" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p')
for t in $gpu_tests; do
  start=$SECONDS
  if NCCL_DEBUG=${NCCL_DEBUG:-WARN} ctest --test-dir "$BUILD_DIR" --output-on-failure -R "^${t}\$"; then
    result=PASS
  else
    result=FAIL; status=1
  fi
  summary+=("$result $t ($((SECONDS - start)) s)")
done
# The test binary prints per-test lines (bytes verified, abort latency) with -V; show them too.
"$BUILD_DIR/tests/gpu/gpu_nccl_test" 2>&1 | grep -E 'rollout:|survivor:|^\[  (PASSED|FAILED)' || true

# Not yet here: `wsync bench sync --memory cuda` (the CLI has no CUDA memory path yet).
if "$BUILD_DIR/integration/cli/wsync" bench sync --help 2>&1 | grep -q -- '--memory'; then
  if "$BUILD_DIR/integration/cli/wsync" bench sync --memory cuda; then
    summary+=("PASS wsync bench sync --memory cuda")
  else
    summary+=("FAIL wsync bench sync --memory cuda"); status=1
  fi
else
  summary+=("SKIP wsync bench sync --memory cuda (not implemented in this build)")
fi

echo "== summary"
printf '  %s\n' "${summary[@]}"
exit $status
