#!/usr/bin/env bash
# Rehearses the GPU bundle on this machine (no GPU) as the GPU machine will run it: Debian's copies
# of every library the bundle carries are hidden, and the runner must reach "no GPU" with every
# load check passing. ctest test bundle_rehearsal_test (label slow); also by hand:
#   tests/gpu/bundle_rehearsal.sh [bundle dir, default gpu-bundle]
# Builds the bundle first (tests/gpu/bundle.sh; incremental) unless WSYNC_REHEARSAL_BUILD=0.
#
# In a private mount namespace (unshare, as root): each directory that holds a carried library
# (Debian's /usr/lib/x86_64-linux-gnu with its ucx/ modules, CUDA's lib with libcudart and
# libnccl) is covered by a tmpfs of links to its entries minus those libraries, so the loader finds
# no Debian or CUDA copy (as on a bare CUDA image). libnccl.so.2 is offered only as the image offers
# it, inside a Python package `nvidia.nccl` (a fake wheel on PYTHONPATH). Then, with a clean
# environment and the dynamic loader's trace (LD_DEBUG=libs), it checks:
#   - run.sh exits 2 with "RESULT: NO GPU": ldd, `wsync --help`, every test's --gtest_list_tests,
#     `import wsync` and a torch CPU sync pass, and `wsync-bench sync --memory cuda` fails with
#     "no CUDA device" (the CUDA module loaded with its libraries);
#   - every library the processes loaded that the bundle carries came from the bundle (UCX's cma
#     module from lib/ucx), libnccl from the fake wheel, libcudart from the bundle's fallback;
#   - run.sh --load-only with WSYNC_BUNDLE_COMPAT=1 (the bundle's libstdc++ and libgcc_s) passes.
# Exit status: 0 all held; 1 a check failed; 77 no mount namespace can be made here (skipped).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUNDLE=${1:-gpu-bundle}
case $BUNDLE in /*) ;; *) BUNDLE=$ROOT/$BUNDLE ;; esac
began=$SECONDS

if ! unshare --mount true 2>/dev/null; then
  echo "bundle_rehearsal: SKIP: cannot make a mount namespace here (needs root)"
  exit 77
fi
if [ "${WSYNC_REHEARSAL_BUILD:-1}" != 0 ]; then
  tests/gpu/bundle.sh "$BUNDLE" >"${TMPDIR:-/tmp}/wsync-bundle-build.log" 2>&1 ||
    { tail -30 "${TMPDIR:-/tmp}/wsync-bundle-build.log"; echo "bundle_rehearsal: bundle.sh failed";
      exit 1; }
  grep -E '^bundle: ' "${TMPDIR:-/tmp}/wsync-bundle-build.log"
fi
[ -x "$BUNDLE/run.sh" ] || { echo "bundle_rehearsal: no bundle at $BUNDLE"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/wsync-rehearsal.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out" "$work/out-compat" "$work/trace" "$work/site/nvidia/nccl/lib"

# The libraries to hide: the real files behind what the bundle carries (lib/, lib/cudart/) and
# behind libnccl; the directories holding them; and Debian's UCX module directory.
awk -F'\t' '$2 == "lib" || $2 == "lib/cudart" || $2 == "image-nccl" { print $3 }' \
  "$BUNDLE/libraries.tsv" >"$work/hidden"
nccl=$(awk -F'\t' '$2 == "image-nccl" { print $3 }' "$BUNDLE/libraries.tsv")
ucs=$(awk -F'\t' '$1 == "libucs.so.0" { print $3 }' "$BUNDLE/libraries.tsv")
if [ -z "$nccl" ] || [ -z "$ucs" ]; then
  echo "bundle_rehearsal: libraries.tsv names no libnccl or libucs"
  exit 1
fi
dirname "$(dirname "$ucs")/ucx/x" >>"$work/hidden"
mapfile -t dirs < <(xargs -n1 dirname <"$work/hidden" | sort -u)

cat >"$work/inside.sh" <<'EOF'
# Runs in the private mount namespace: hides, then runs the bundle with a clean environment.
set -uo pipefail
work=$1 bundle=$2 nccl=$3
shift 3
touch "$work/site/nvidia/nccl/lib/libnccl.so.2"
mount --bind "$nccl" "$work/site/nvidia/nccl/lib/libnccl.so.2"  # Before its directory is hidden.
# First a farm of links per directory (every entry but the hidden ones, pointing into a stash
# that still shows the original), then all farms mounted over the originals at once: the tools
# run in between need the directories intact.
for dir in "$@"; do
  tag=$(echo "$dir" | tr / _)
  mkdir -p "$work/stash$tag" "$work/farm$tag"
  mount --bind "$dir" "$work/stash$tag" || exit 1
  mapfile -t entries < <(find "$dir" -mindepth 1 -maxdepth 1 -printf '%f\n')
  # name<TAB>real path, one per entry; the names whose real path is not hidden get a link.
  paste <(printf '%s\n' "${entries[@]}") <(cd "$dir" && readlink -m -- "${entries[@]}") |
    awk -F'\t' 'NR == FNR { hidden[$0] = 1; next } !($2 in hidden) { print $1 }' \
      "$work/hidden" - | sed "s|^|$work/stash$tag/|" | xargs -r -d '\n' ln -s -t "$work/farm$tag"
done
for dir in "$@"; do
  mount --bind "$work/farm$(echo "$dir" | tr / _)" "$dir" || exit 1
done
clean=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work" TMPDIR="$work"
       WSYNC_PYTHON=/usr/bin/python3 PYTHONPATH="$work/site")
"${clean[@]}" OUT="$work/out" LD_DEBUG=libs LD_DEBUG_OUTPUT="$work/trace/ld" "$bundle/run.sh"
echo "run.sh exit $?" >"$work/out/exit"
"${clean[@]}" OUT="$work/out-compat" WSYNC_BUNDLE_COMPAT=1 "$bundle/run.sh" --load-only \
  >/dev/null 2>&1
echo "run.sh --load-only (bundle libstdc++) exit $?" >"$work/out-compat/exit"
EOF
echo "== hiding the libraries the bundle carries in: ${dirs[*]}"
unshare --mount --propagation private bash "$work/inside.sh" "$work" "$BUNDLE" "$nccl" \
  "${dirs[@]}"

failures=0
check() {  # check DESCRIPTION COMMAND...: one line, PASS or FAIL.
  local what=$1
  shift
  if "$@"; then echo "PASS  $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
echo "== runner summary"
cat "$work/out/summary.txt"
check "run.sh exits 2 (no GPU)" grep -qx "run.sh exit 2" "$work/out/exit"
check "run.sh summary says RESULT: NO GPU" grep -q "RESULT: NO GPU" "$work/out/summary.txt"
check "no load check failed" bash -c "! grep -qE '^(FAIL|SKIP) ' '$work/out/summary.txt'"

# What the processes loaded ("calling init: PATH" in the loader's trace): every carried soname
# from the bundle, libnccl from the fake wheel, libcudart from the bundle's fallback.
grep -h "calling init: " "$work"/trace/ld.* | sed 's/.*calling init: //' | sort -u >"$work/loaded"
echo "== loaded by the runner's processes: $(wc -l <"$work/loaded") objects, of them" \
  "$(grep -c "^$BUNDLE/" "$work/loaded") from the bundle"
carried=$(awk -F'\t' '$2 == "lib" || $2 == "lib/cudart" { print $1 }' "$BUNDLE/libraries.tsv")
stray=$(for soname in $carried libuct_cma.so.0; do
  grep -E "/${soname//./\\.}\$" "$work/loaded" | grep -v "^$BUNDLE/lib/"
done)
check "no carried library loaded from outside the bundle${stray:+: $stray}" test -z "$stray"
check "UCX's cma module loaded from the bundle" grep -qx "$BUNDLE/lib/ucx/libuct_cma.so.0" \
  "$work/loaded"
check "libnccl.so.2 loaded from the image's wheel (nvidia/nccl/lib)" \
  grep -qx "$work/site/nvidia/nccl/lib/libnccl.so.2" "$work/loaded"
check "libcudart.so.13 loaded from the bundle's fallback" \
  grep -qx "$BUNDLE/lib/cudart/libcudart.so.13" "$work/loaded"
check "libwsync_cuda.so loaded" grep -qx "$BUNDLE/lib/libwsync_cuda.so" "$work/loaded"
check "run.sh --load-only with the bundle's libstdc++ exits 0" \
  grep -qx "run.sh --load-only (bundle libstdc++) exit 0" "$work/out-compat/exit"
check "the bundle's libstdc++ was used" grep -q "bundle libstdc++: used" "$work/out-compat/env.txt"
echo "bundle_rehearsal: $failures failed, $((SECONDS - began)) s"
((failures == 0))
