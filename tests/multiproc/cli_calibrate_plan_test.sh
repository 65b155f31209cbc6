#!/bin/bash
# The newcomer's flow on this machine: `wsync calibrate` -> `wsync plan --calibration`.
# - A one-node calibration prices a colocated layout in full (--require_prediction passes); its
#   same-GPU pairs (same_device) are priced with intra_node's fit, and the report says so.
# - A separate-nodes layout is priced in part: the report names inter_node, its bytes and the
#   `wsync calibrate` command that measures it; --require_prediction then exits 1 naming it.
# - Where network namespaces can be made (root), `--nodes a,a,b,b --netns` measures inter_node and
#   the separate-nodes plan is priced in full; elsewhere that step says it was skipped and why.
set -euo pipefail
wsync=${1:?usage: cli_calibrate_plan_test.sh path/to/wsync}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
probe=(--probe_sizes 64K,1M,4M --probe_repeats 2 --probe_warmup 1)
plan=("$wsync" plan --model qwen2.5-0.5b --segments 0)
colocated=(--from 'megatron(tp=2,dp=2,colocated=1)' --to 'vllm(tp=2)')
separate=(--from 'megatron(tp=2,dp=2)' --to 'vllm(tp=2)')
full='^predicted \(calibration .*\): [0-9.]+ s = transfer'

"$wsync" calibrate --processes 4 "${probe[@]}" --out "$dir/one.pb" > "$dir/calibrate.txt"
grep -q '^  path intra_node ' "$dir/calibrate.txt"

echo "== colocated, one-node calibration"
out=$("${plan[@]}" "${colocated[@]}" --calibration "$dir/one.pb" --require_prediction)
echo "$out" | grep -E "^placement|^predicted|binding|not priced|measure|stand-in|^  same_device"
echo "$out" | grep -q '^placement  *colocated: 1 node holds both sides'
echo "$out" | grep -Eq "$full"
echo "$out" | grep -Eq "^  stand-in: same_device, .* priced with intra_node's fit"
if echo "$out" | grep -q 'not priced'; then echo "FAIL: colocated plan left traffic unpriced"; exit 1; fi

echo "== separate nodes, one-node calibration"
out=$("${plan[@]}" "${separate[@]}" --calibration "$dir/one.pb")
echo "$out" | grep -E "^placement|^predicted|binding|not priced|measure"
echo "$out" | grep -q '^placement  *separate: no node holds both sides'
echo "$out" | grep -Eq '^predicted \(calibration .*\): none of the traffic could be priced'
echo "$out" | grep -Eq '^  not priced: inter_node, 942\.38 MiB \(988153344 B\): the calibration has no fit'
echo "$out" | grep -Fq "measure it with: wsync calibrate --processes 4 --nodes a,a,b,b --netns --out $dir/one.pb"
rc=0
"${plan[@]}" "${separate[@]}" --calibration "$dir/one.pb" --require_prediction \
  > /dev/null 2> "$dir/err.txt" || rc=$?
cat "$dir/err.txt"
test "$rc" -eq 1
grep -q 'no fit: inter_node' "$dir/err.txt"

echo "== separate nodes, two-node calibration in network namespaces"
if "$wsync" calibrate --processes 4 --nodes a,a,b,b --netns "${probe[@]}" --out "$dir/two.pb" \
  > "$dir/calibrate2.txt" 2>&1; then
  grep -q '^  path inter_node ' "$dir/calibrate2.txt"
  out=$("${plan[@]}" "${separate[@]}" --calibration "$dir/two.pb" --require_prediction)
  echo "$out" | grep -E "^predicted|binding|not priced"
  echo "$out" | grep -Eq "$full"
elif grep -q 'cannot create network namespaces' "$dir/calibrate2.txt"; then
  echo "skipped: $(grep -o 'cannot create network namespaces.*' "$dir/calibrate2.txt")"
else
  cat "$dir/calibrate2.txt"
  exit 1
fi
echo "PASS"
