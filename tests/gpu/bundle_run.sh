#!/usr/bin/env bash
# The runner of the GPU bundle (written by tests/gpu/bundle.sh as gpu-bundle/run.sh): every GPU
# check of wsync on a machine with an NVIDIA GPU, from the bundle alone (no network, no build):
#   gpu-bundle/run.sh [--load-only]
# 1. load: the library path (the bundle's lib/, the image's libnccl.so.2 and libcudart.so.13 from
#    its Python wheels or CUDA, the bundle's libstdc++ only when the image's is too old); ldd of
#    every binary, `wsync --help`, `wsync-bench help`, each test binary's --gtest_list_tests,
#    `import wsync`, and a torch sync of CPU tensors between two processes (UCX from the bundle).
# 2. the GPU (nvidia-smi). None: `wsync-bench sync --memory cuda` must fail with "no CUDA device"
#    (the CUDA module and its libraries loaded), and the run ends there with status 2.
# 3. every gpu-labelled test (tests.tsv: as ctest runs them), the torch end-to-end sync of CUDA
#    tensors (python/gpu_torch_sync.py), and `wsync-bench sync --memory cuda` over CUDA IPC between
#    threads and between processes, and with intra_node=nccl (NCCL proper with two GPUs).
# Everything ends within WSYNC_GPU_BUDGET_S seconds (default 470; a step that would not fit is
# skipped and says so). Results: summary.txt, env.txt, load.log, tests.log, python.log, bench.log
# in $OUT when set, else gpu-bundle/results (logs capped at 256 KiB each).
# Exit status: 0 every check passed; 1 a check failed; 2 no GPU (after the load checks passed).
# Environment: WSYNC_PYTHON (default python3), WSYNC_BUNDLE_COMPAT (auto, 1: always use the
# bundle's libstdc++, 0: never), NCCL_DEBUG (default WARN), WSYNC_GPU_TEST_CAP_S (default 180 s
# per test binary).
set -uo pipefail
BUNDLE=$(cd "$(dirname "$0")" && pwd)
RESULTS=${OUT:-$BUNDLE/results}
BUDGET_S=${WSYNC_GPU_BUDGET_S:-470}
PYTHON=${WSYNC_PYTHON:-python3}
COMPAT=${WSYNC_BUNDLE_COMPAT:-auto}
TEST_CAP_S=${WSYNC_GPU_TEST_CAP_S:-180}
LOAD_ONLY=0
[ "${1:-}" = "--load-only" ] && LOAD_ONLY=1
mkdir -p "$RESULTS"
chmod +x "$BUNDLE"/bin/* 2>/dev/null  # In case the copy to the machine lost the modes.
SUMMARY=$RESULTS/summary.txt
for f in summary.txt env.txt load.log tests.log python.log bench.log; do : >"$RESULTS/$f"; done
start=$SECONDS
failures=0

say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - (SECONDS - start))); }

# step NAME CAP_S LOG CMD...: runs CMD with its output appended to LOG, under min(CAP_S, the time
# left); records PASS, FAIL (exit status) or SKIP (under 15 s left) in the summary.
# Returns CMD's exit status (124: timed out; 125: skipped).
step() {
  local name=$1 cap=$2 log=$3 budget rc t0=$SECONDS
  shift 3
  budget=$(left)
  ((cap < budget)) || cap=$budget
  if ((cap < 15)); then
    say "SKIP  $name (${budget} s of the budget left)"
    failures=$((failures + 1))
    return 125
  fi
  echo "=== $name (limit ${cap} s): $*" >>"$log"
  timeout -k 5 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" >>"$log"
  if ((rc == 0)); then
    say "PASS  $name ($((SECONDS - t0)) s)"
  else
    local why="exit $rc"
    ((rc == 124)) && why="timed out after ${cap} s"
    say "FAIL  $name ($((SECONDS - t0)) s, $why; ${log##*/})"
    failures=$((failures + 1))
  fi
  return $rc
}

# The directory of the image's copy of a library: its Python wheels (nvidia.*), CUDA, ldconfig.
image_lib_dir() {
  local dir
  while read -r dir; do
    if [ -n "$dir" ] && [ -e "$dir/$1" ]; then echo "$dir"; return 0; fi
  done < <(
    # With the bundle's libraries, as every Python process of the run (the interpreter may need
    # one the bundle carries, e.g. libz).
    LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      "$PYTHON" - "$1" 2>/dev/null <<'EOF'
import glob, os, sys
try:
    import nvidia  # The namespace of NVIDIA's wheels (nvidia-nccl-cu13, the CUDA runtime).
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
for root in roots:
    for path in sorted(glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True)):
        print(os.path.dirname(path))
EOF
    echo /usr/local/cuda/lib64
    ldconfig -p 2>/dev/null |
      awk -v s="$1" '$1 == s && /x86-64/ { sub(/\/[^\/]*$/, "", $NF); print $NF }'
  )
  return 1
}

finish() {
  local log
  for log in "$RESULTS"/*.log; do  # Small files: keep the head and the tail of a long log.
    if [ "$(stat -c %s "$log")" -gt 262144 ]; then
      { head -c 65536 "$log"; printf '\n[... cut by run.sh ...]\n'; tail -c 196608 "$log"; } \
        >"$log.cut" && mv "$log.cut" "$log"
    fi
  done
  say "elapsed $((SECONDS - start)) s of ${BUDGET_S} s; $1"
  exit "$2"
}

say "wsync GPU bundle: $(grep '^commit=' "$BUNDLE/MANIFEST.txt"), $(date -u +%FT%TZ)"

# -- library path -------------------------------------------------------------------------------
nccl_dir=$(image_lib_dir libnccl.so.2) || nccl_dir=""
cudart_dir=$(image_lib_dir libcudart.so.13) || cudart_dir=""
path=$BUNDLE/lib
[ -n "$nccl_dir" ] && path+=":$nccl_dir"
[ -n "$cudart_dir" ] && [ "$cudart_dir" != "$nccl_dir" ] && path+=":$cudart_dir"
path+=":$BUNDLE/lib/cudart"  # Last: the image's CUDA runtime wins when it has one.
export LD_LIBRARY_PATH=$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export WSYNC_CUDA_MODULE=$BUNDLE/lib/libwsync_cuda.so
export WSYNC_LIBRARY=$BUNDLE/lib/libwsync.so
export PYTHONPATH=$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# libstdc++ and libgcc_s: the image's unless they are older than the binaries need.
probe=$("$BUNDLE/bin/wsync" --help 2>&1 >/dev/null)
use_compat=0
if [ "$COMPAT" = 1 ]; then
  use_compat=1
elif [ "$COMPAT" = auto ] && grep -qE "GLIBCXX|CXXABI|GCC_|libstdc|libgcc_s" <<<"$probe"; then
  use_compat=1
fi
((use_compat)) && export LD_LIBRARY_PATH=$BUNDLE/lib/compat:$LD_LIBRARY_PATH

{
  echo "== bundle"; cat "$BUNDLE/MANIFEST.txt"
  echo "== image"; uname -a; grep -h PRETTY_NAME /etc/os-release 2>&1
  echo "glibc: $(getconf GNU_LIBC_VERSION 2>&1)"
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch",
    torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1
  echo "libnccl.so.2: ${nccl_dir:-not found in the image}"
  echo "libcudart.so.13: ${cudart_dir:-not found in the image, lib/cudart serves}"
  echo "bundle libstdc++: $( ((use_compat)) && echo "used (${probe:-forced})" || echo "not used")"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-unset} (CUDA IPC needs cudaMalloc)"
  echo "== GPU"; nvidia-smi 2>&1; ls -l /dev/nvidia* 2>&1
} >>"$RESULTS/env.txt"

# -- 1. load ------------------------------------------------------------------------------------
LOAD=$RESULTS/load.log
missing=$(for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/*.so "$BUNDLE"/lib/ucx/*; do
  ldd "$f" 2>&1 | grep -E "not found|No such" | sed "s|^|${f#"$BUNDLE"/}: |"
done)
if [ -z "$missing" ]; then
  say "PASS  ldd: every library of bin/ and lib/ resolves"
else
  echo "$missing" >>"$LOAD"
  say "FAIL  ldd: $(wc -l <<<"$missing") unresolved, e.g. $(head -1 <<<"$missing")"
  failures=$((failures + 1))
fi
step "wsync --help" 20 "$LOAD" "$BUNDLE/bin/wsync" --help
step "wsync-bench --help" 20 "$LOAD" "$BUNDLE/bin/wsync-bench" help
while IFS=$'\t' read -r name _; do
  step "$name --gtest_list_tests" 20 "$LOAD" "$BUNDLE/bin/$name" --gtest_list_tests
done <"$BUNDLE/tests.tsv"
step "python: import wsync, load libwsync.so" 60 "$LOAD" "$PYTHON" -c \
  'import wsync; print("loaded", wsync.library_path())'
step "python: torch CPU tensors trainer -> rollout (UCX)" 90 "$RESULTS/python.log" \
  "$PYTHON" "$BUNDLE/python/gpu_torch_sync.py" --device cpu
load_failures=$failures
if ((LOAD_ONLY)); then
  ((failures == 0)) && finish "RESULT: PASS (load checks only)" 0
  finish "RESULT: FAIL ($failures load checks failed)" 1
fi

# -- 2. the GPU ---------------------------------------------------------------------------------
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if ((gpus == 0)); then
  say "no GPU: nvidia-smi lists none"
  bench_out=$(timeout 60 "$BUNDLE/bin/wsync-bench" sync --memory cuda 2>&1)
  echo "$bench_out" >>"$RESULTS/bench.log"
  if grep -q "no CUDA device" <<<"$bench_out"; then
    say "PASS  wsync-bench sync --memory cuda fails with \"no CUDA device\" (module loaded)"
  else
    say "FAIL  wsync-bench sync --memory cuda: $(tail -1 <<<"$bench_out")"
    failures=$((failures + 1))
  fi
  ((failures == 0)) && finish "RESULT: NO GPU (every load check passed)" 2
  finish "RESULT: FAIL ($failures checks failed; no GPU)" 1
fi
say "GPUs: $gpus ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
  head -1))"

# -- 3. the gpu tests, the torch sync, the benchmark --------------------------------------------
TESTS=$RESULTS/tests.log
while IFS=$'\t' read -r name ctest_timeout env args; do
  cap=$TEST_CAP_S
  ((ctest_timeout < cap)) && cap=$ctest_timeout
  envs=()
  [ "$env" != - ] && read -r -a envs <<<"$env"
  argv=()
  [ "$args" != - ] && read -r -a argv <<<"$args"
  mark=$(wc -l <"$TESTS")
  step "$name" "$cap" "$TESTS" env "${envs[@]}" "$BUNDLE/bin/$name" "${argv[@]}"
  # What the tests print about the bytes they checked, where they ran and how they failed.
  tail -n +"$((mark + 1))" "$TESTS" |
    grep -E 'rollout:|survivor:|process [01]:|placement|^quantize |^\[  (FAILED|PASSED|SKIPPED) ' |
    sed 's/^/      /' | tee -a "$SUMMARY"
done <"$BUNDLE/tests.tsv"

step "python: torch CUDA tensors trainer -> rollout, every element checked" 150 \
  "$RESULTS/python.log" "$PYTHON" "$BUNDLE/python/gpu_torch_sync.py" --device cuda
grep -E '^(trainer|rollout|sync)' "$RESULTS/python.log" | tail -6 | sed 's/^/      /' |
  tee -a "$SUMMARY"

for flags in "" "--cuda_forked" "--cuda_path_transports=intra_node=nccl"; do
  mark=$(wc -l <"$RESULTS/bench.log")
  # shellcheck disable=SC2086
  step "wsync-bench sync --memory cuda $flags" 90 "$RESULTS/bench.log" \
    "$BUNDLE/bin/wsync-bench" sync --memory cuda $flags
  tail -n +"$((mark + 1))" "$RESULTS/bench.log" |
    grep -E '^(placement|wsync \(transfer|cudaMemcpy D2D|bytes per)' | sed 's/^/      /' |
    tee -a "$SUMMARY"
done

((failures == 0)) && finish "RESULT: PASS (every GPU check; $gpus GPU(s))" 0
finish "RESULT: FAIL ($failures checks failed, $load_failures of them load checks)" 1
