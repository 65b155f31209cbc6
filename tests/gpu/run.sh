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
   ! cmake --build "$BUILD_DIR" -j"$JOBS" --target gpu_nccl_test gpu_session_test \
       gpu_cuda_ipc_test nccl_test cuda_ipc_test cuda_ipc_executor_test nccl_executor_test \
       cuda_job_test session_cuda_test wsync \
       wsync_plugin wsync_cuda cuda_module_test \
       gpu_fp8_quant_test gpu_quant_executor_test quant_device_executor_test fp8_device_test; then
  echo "run.sh: build failed" >&2
  exit 1
fi

echo "== unit tests of the NCCL backend (fake NcclApi) and of loading libwsync_cuda.so"
for t in nccl_test cuda_ipc_test cuda_ipc_executor_test nccl_executor_test cuda_job_test \
    session_cuda_test needed_test cuda_module_test quant_device_executor_test fp8_device_test; do
  if ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -R "^${t}(_shard[0-9]+)?$"; then
    summary+=("PASS $t (unit)")
  else
    summary+=("FAIL $t (unit)"); status=1
  fi
done

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
# The test binaries print per-test lines (bytes verified, placement, abort latency, FP8 kernel
# throughput); show them.
for b in gpu_nccl_test gpu_session_test gpu_cuda_ipc_test gpu_fp8_quant_test; do
  "$BUILD_DIR/tests/gpu/$b" 2>&1 |
    grep -E 'rollout:|survivor:|process [01]:|^quantize |^\[  (PASSED|FAILED)' || true
done

# CUDA IPC between threads (direct device pointers), between forked processes (mapped
# allocations), and NCCL (with one GPU the trainers then keep host memory: placement printed).
for flags in "" "--cuda_forked" "--cuda_path_transports=intra_node=nccl"; do
  echo "== wsync-bench sync --memory cuda $flags"
  # shellcheck disable=SC2086
  if "$BUILD_DIR/integration/bench/wsync-bench" sync --memory cuda $flags; then
    summary+=("PASS wsync-bench sync --memory cuda $flags")
  else
    summary+=("FAIL wsync-bench sync --memory cuda $flags"); status=1
  fi
done

echo "== summary"
printf '  %s\n' "${summary[@]}"
exit $status
