#!/usr/bin/env bash
# Builds the GPU targets with the NCCL backend (Release, stripped) and writes a self-contained
# folder that runs every GPU check on a machine with an NVIDIA GPU and no build tools or Debian
# packages (tests/gpu/README.md, "The bundle"):
#   tests/gpu/bundle.sh [bundle dir, default gpu-bundle]
# Environment: BUILD_DIR (default build-gpubundle), JOBS (compile jobs, default 2),
# WSYNC_CUDA_ROOT (CUDA 13 and NCCL, default /usr/local/cuda), BUNDLE_LIMIT_MIB (default 48).
#
# Contract: on success (exit 0) the folder holds bin/ (the gpu-labelled test binaries, `wsync` and
# `wsync-bench`), lib/ (libwsync.so, libwsync_cuda.so and the ldd closure of everything in bin/ and
# lib/ minus what the GPU image provides: glibc, the CUDA driver, libnccl, libstdc++ and libgcc_s),
# lib/ucx/ (UCX's cma module), lib/cudart/ (a fallback libcudart.so.13), lib/compat/ (libstdc++ and
# libgcc_s, used only when the image's are older than the binaries need), python/ (the wsync package
# and the torch end-to-end check), tests.tsv (the gpu tests as ctest runs them), MANIFEST.txt,
# run.sh and README.md, at most BUNDLE_LIMIT_MIB MiB; it prints the size and the library list. Exit
# 1 when the build fails, a dependency cannot be resolved here, or the folder is over the limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUNDLE=${1:-gpu-bundle}
BUILD_DIR=${BUILD_DIR:-build-gpubundle}
JOBS=${JOBS:-2}
CUDA_ROOT=${WSYNC_CUDA_ROOT:-/usr/local/cuda}
LIMIT_MIB=${BUNDLE_LIMIT_MIB:-48}
case $BUNDLE in /*) ;; *) BUNDLE=$ROOT/$BUNDLE ;; esac

die() { echo "bundle.sh: $*" >&2; exit 1; }

echo "== configure ${BUILD_DIR} (Release, NCCL from ${CUDA_ROOT})"
mkdir -p "$BUILD_DIR"
generator=()
if [ ! -e "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DWSYNC_WITH_NCCL=ON \
  -DWSYNC_CUDA_ROOT="$CUDA_ROOT" >"$BUILD_DIR/bundle-configure.log" 2>&1 ||
  { tail -20 "$BUILD_DIR/bundle-configure.log"; die "configure failed"; }

# The gpu-labelled tests (ctest names them before their binaries exist, but gives their commands
# only after they are built).
gpu_json() { ctest --test-dir "$BUILD_DIR" --show-only=json-v1 -L gpu; }
mapfile -t gpu_tests < <(gpu_json | python3 -c '
import json, sys
for test in json.load(sys.stdin)["tests"]:
    print(test["name"])')
[ "${#gpu_tests[@]}" -gt 0 ] || die "no gpu-labelled test is registered (no NCCL backend?)"
echo "gpu tests: ${gpu_tests[*]}"

echo "== build (nice -n 19, -j${JOBS})"
nice -n 19 cmake --build "$BUILD_DIR" -j"$JOBS" --target wsync wsync-bench wsync_plugin wsync_cuda \
  "${gpu_tests[@]}" || die "build failed"

# Each gpu test exactly as ctest runs it: name, binary, timeout, environment, arguments.
gpu_json >"$BUILD_DIR/bundle-tests.json"
python3 - "$BUILD_DIR/bundle-tests.json" "$ROOT" "$BUILD_DIR/bundle-tests.tsv" <<'EOF'
import json, sys
tests = json.load(open(sys.argv[1]))["tests"]
root = sys.argv[2]
rows = []
for test in tests:
    props = {p["name"]: p["value"] for p in test.get("properties", [])}
    command = test.get("command")
    if not command:
        sys.exit(f"test {test['name']}: ctest gives no command (not built?)")
    env = props.get("ENVIRONMENT", [])
    for word in command[1:] + env:
        # The bundle has no build or source tree: an argument naming one cannot be carried.
        if root in word or any(c in word for c in " \t\n"):
            sys.exit(f"test {test['name']}: argument {word!r} cannot be carried")
    rows.append("\t".join([test["name"], command[0], str(int(props.get("TIMEOUT", 300))),
                           " ".join(env) or "-", " ".join(command[1:]) or "-"]))
open(sys.argv[3], "w").write("\n".join(rows) + "\n")
EOF

echo "== assemble ${BUNDLE}"
# Only ever replaces an earlier bundle (or an empty folder).
if [ -e "$BUNDLE" ] && [ ! -e "$BUNDLE/MANIFEST.txt" ] && [ -n "$(ls -A "$BUNDLE")" ]; then
  die "$BUNDLE exists and is not a bundle: not replacing it"
fi
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"/{bin,lib/ucx,lib/cudart,lib/compat,python}
echo "incomplete: bundle.sh did not finish" >"$BUNDLE/MANIFEST.txt"
while IFS=$'\t' read -r name binary timeout env args; do
  strip --strip-unneeded -o "$BUNDLE/bin/$name" "$binary"
  printf '%s\t%s\t%s\t%s\n' "$name" "$timeout" "$env" "$args" >>"$BUNDLE/tests.tsv"
done <"$BUILD_DIR/bundle-tests.tsv"
strip --strip-unneeded -o "$BUNDLE/bin/wsync" "$BUILD_DIR/integration/cli/wsync"
strip --strip-unneeded -o "$BUNDLE/bin/wsync-bench" "$BUILD_DIR/integration/bench/wsync-bench"
strip --strip-unneeded -o "$BUNDLE/lib/libwsync.so" "$BUILD_DIR/plugin/libwsync.so"
strip --strip-unneeded -o "$BUNDLE/lib/libwsync_cuda.so" "$BUILD_DIR/plugin/libwsync_cuda.so"

# UCX loads its transports from <directory of libucs.so.0>/ucx; only cma is carried (shared
# memory and TCP are in libuct itself; the InfiniBand modules would need rdma-core).
ucs=$(ldd "$BUNDLE/lib/libwsync.so" | awk '$1 == "libucs.so.0" { print $3 }')
[ -n "$ucs" ] || die "libwsync.so does not link UCX's libucs.so.0"
ucx_modules=$(dirname "$(readlink -f "$ucs")")/ucx
cp -L "$ucx_modules/libuct_cma.so.0" "$BUNDLE/lib/ucx/"

# The ldd closure, sorted into where each library goes. glibc (the image has its own; a copy
# cannot be mixed with the image's loader), the CUDA driver (mounted from the host) and libnccl
# (208 MiB; the image has the nvidia-nccl-cu13 wheel) are never carried.
: >"$BUNDLE/libraries.tsv"
declare -A seen=()
for elf in "$BUNDLE"/bin/* "$BUNDLE"/lib/libwsync*.so "$BUNDLE"/lib/ucx/*; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [ "$path" != "not" ] || die "$elf: $soname not found here"
    [ -z "${seen[$soname]:-}" ] || continue
    seen[$soname]=1
    case $soname in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*| \
        libanl.so.*|ld-linux*) where=image-glibc ;;
      libcuda.so.*|libnvidia-*) where=image-driver ;;
      libnccl.so.*) where=image-nccl ;;
      libcudart.so.*) where=lib/cudart ;;
      libstdc++.so.*|libgcc_s.so.*) where=lib/compat ;;
      libwsync*) continue ;;
      *) where=lib ;;
    esac
    real=$(readlink -f "$path")
    if [[ $where == lib* ]]; then cp -L "$real" "$BUNDLE/$where/$soname"; fi
    printf '%s\t%s\t%s\n' "$soname" "$where" "$real" >>"$BUNDLE/libraries.tsv"
  done < <(ldd "$elf")
done
sort -o "$BUNDLE/libraries.tsv" "$BUNDLE/libraries.tsv"

# The Python package, the end-to-end check and the two helpers of tests/python it uses.
cp -r integration/python/wsync "$BUNDLE/python/"
find "$BUNDLE/python" -name __pycache__ -prune -exec rm -rf {} +
cp tests/gpu/gpu_torch_sync.py tests/python/harness.py tests/python/tiny_qwen.py "$BUNDLE/python/"
cp tests/gpu/bundle_run.sh "$BUNDLE/run.sh"
cp tests/gpu/bundle_README.md "$BUNDLE/README.md"
chmod +x "$BUNDLE/run.sh"

# Versions the runner checks against the image: the newest glibc, libstdc++ and libgcc_s symbol
# versions any carried object needs.
newest() {
  find "$BUNDLE/bin" "$BUNDLE/lib" -path "$BUNDLE/lib/compat" -prune -o -type f -print0 |
    xargs -0 objdump -T 2>/dev/null | grep -oE "\\b$1_[0-9.]+[0-9]" | sort -uV | tail -1
}
{
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!gpu-bundle' || echo -dirty)"
  echo "built=$(date -u +%Y-%m-%dT%H:%MZ) on $(grep -h PRETTY_NAME /etc/os-release)"
  echo "cuda=$("$CUDA_ROOT/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "nccl_headers=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
    "$CUDA_ROOT/include/nccl.h" | paste -sd.)"
  echo "needs_glibc=$(newest GLIBC)"
  echo "needs_glibcxx=$(newest GLIBCXX)"
  echo "needs_cxxabi=$(newest CXXABI)"
  echo "needs_libgcc=$(newest GCC)"
} >"$BUNDLE/MANIFEST.txt"

echo "== libraries (soname, where, carried from)"
column -t -s $'\t' "$BUNDLE/libraries.tsv"
echo "== contents"
(cd "$BUNDLE" && find . -type f -printf '%s\t%p\n' | sort -k2 | numfmt --field=1 --to=iec |
  column -t -s $'\t')
cat "$BUNDLE/MANIFEST.txt"
bytes=$(du -sb "$BUNDLE" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "bundle: ${BUNDLE#"$ROOT"/} ${bytes} bytes (${mib} MiB, limit ${LIMIT_MIB} MiB)"
[ "$bytes" -le $((LIMIT_MIB * 1048576)) ] || die "the bundle is over ${LIMIT_MIB} MiB"
