#!/usr/bin/env bash
# `wsync plan --delta_changed_fraction F` (docs/delta.md): the predicted delta sync next to the
# dense one, every figure checked against what this script computes from the synthetic links and
# the plan's bytes: over a 1 GB/s inter_node link delta pays below 50 % changed (delta=auto runs
# it at 2 %, not at 60 %); over 10 GB/s shared memory it never pays (delta=auto stays dense, and
# delta=on is slower). A calibration without delta rates gets no prediction and the command that
# measures them; `wsync calibrate --show` prints the rates or that there are none; a fraction out
# of [0, 1] or without a calibration is a usage error.
# Usage: cli_plan_delta_test.sh WSYNC_BINARY
set -euo pipefail
wsync=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
links='local=0us,20GB/s;intra_node=0us,10GB/s;inter_node=0us,1GB/s'
"$wsync" calibrate --synthetic "$links;delta_encode=0us,4GB/s;delta_apply=0us,4GB/s" \
  --out "$dir/rates" > /dev/null
"$wsync" calibrate --synthetic "$links" --out "$dir/none" > /dev/null
shown=$("$wsync" calibrate --show "$dir/rates")
echo "$shown" | grep -Eq '^  delta encode \(stated\) +alpha +0\.00 us +4\.000 GB/s'
echo "$shown" | grep -Eq '^  delta apply \(stated\) +alpha +0\.00 us +4\.000 GB/s'
echo "$shown" | grep -Fxq '  delta rates (the slowest process'"'"'s): encode 4.000 GB/s, apply 4.000 GB/s of the dense chunk'
"$wsync" calibrate --show "$dir/none" | grep -q '^  delta rates: not measured'

# qwen2.5-0.5b in bf16, megatron(tp=2) -> vllm(tp=2): 988153344 B. Rollout rank r receives
# x = 494076672 B (half): from trainer r, but for the 64 vocabulary padding rows of rollout 1
# (64 x 896 x 2 = 114688 B), which come from trainer 0. Trainer 0 sends x + 114688 B: the busiest
# sender, whose egress binds the dense sync (alpha 0: no latency term).
all=988153344
x=494076672
s0=$((x + 114688))
plan() {
  "$wsync" plan --model qwen2.5-0.5b --to 'vllm(tp=2)' --segments 0 --calibration "$@"
}
# The expected lines of one setting: dense seconds = s0 / link rate; delta=on keeps f of the wire
# bytes (PredictDeltaSync: the saved bytes are all x (1 - f), truncated) and adds trainer 0's
# encoding of s0 and rollout 0's patching of x at 4 GB/s; a setting that runs no delta is dense.
expect() {  # LABEL LINK_BYTES_PER_SECOND FRACTION DELTA(1|0)
  awk -v label="$1" -v rate="$2" -v f="$3" -v delta="$4" -v all=$all -v x=$x -v s0=$s0 'BEGIN {
    dense = s0 / rate
    saved = delta ? int(all * (1 - f)) : 0
    encode = delta ? s0 / 4e9 : 0
    apply = delta ? x / 4e9 : 0
    seconds = dense * (all - saved) / all + encode + apply
    printf "  %-11s predicted %.4f s (dense %.4f s, %.2fx): encode %.4f s + apply %.4f s\n",
           label, seconds, dense, seconds / dense, encode, apply
    printf "  %-11s on the wire %d B of %d B dense\n", "", all - saved, all
  }'
}
# The report's setting lines, with the bytes' binary units left out (the exact counts stay).
settings() { echo "$1" | grep -A1 -E '^  delta=(on|auto) ' | sed -E 's/[0-9.]+ [KMG]iB \(([0-9]+ B)\)/\1/g'; }

# check FROM FRACTION LINK_BYTES_PER_SECOND AUTO_RUNS_DELTA(1|0) CLASS_LINE...: the class lines
# as given, the settings' lines as computed.
check() {
  local from=$1 f=$2 rate=$3 auto=$4
  shift 4
  local out
  out=$(plan "$dir/rates" --from "$from" --delta_changed_fraction "$f")
  echo "$out" | sed -n '/^delta sync/,/^$/p'
  for line in "$@"; do echo "$out" | grep -Fxq "$line"; done
  diff <(settings "$out") <(expect delta=on "$rate" "$f" 1; expect delta=auto "$rate" "$f" "$auto")
}
pays='  inter_node     1.000 GB/s   942.38 MiB  delta pays below 50.00 % changed; delta=auto'
echo "== separate nodes: inter_node at 1 GB/s, 2 % changed, then 60 % (above the threshold)"
check 'megatron(tp=2)' 0.02 1e9 1 "$pays runs delta"
check 'megatron(tp=2)' 0.6 1e9 0 "$pays stays dense"
echo "== colocated: same_device and intra_node at 10 GB/s"
check 'megatron(tp=2,colocated=1)' 0.02 10e9 0 \
  '  same_device   10.000 GB/s   942.27 MiB  delta never pays; delta=auto stays dense' \
  '  intra_node    10.000 GB/s   112.00 KiB  delta never pays; delta=auto stays dense'

echo "== a calibration without delta rates"
out=$(plan "$dir/none" --from 'megatron(tp=2)' --delta_changed_fraction 0.02)
echo "$out" | sed -n '/^delta sync/,/^$/p'
echo "$out" | grep -Fxq 'delta sync at 2.00 % changed: no prediction: the calibration has no delta_encode and delta_apply rates'
echo "$out" | grep -Fq "  measure them (on every process, with the links) with: wsync calibrate --processes 4 --nodes a,a,b,b --netns --out $dir/none"
if echo "$out" | grep -q '^  delta=on'; then exit 1; fi
# Without the flag, no delta section.
if plan "$dir/rates" --from 'megatron(tp=2)' | grep -q '^delta sync'; then exit 1; fi

echo "== usage errors"
for bad in "--delta_changed_fraction 1.5 --calibration $dir/rates" "--delta_changed_fraction 0.5"; do
  rc=0
  # shellcheck disable=SC2086
  "$wsync" plan --model qwen2.5-0.5b --from 'megatron(tp=2)' --to 'vllm(tp=2)' $bad \
    > /dev/null 2> "$dir/err" || rc=$?
  test "$rc" -eq 2
  grep -q 'takes a fraction in \[0, 1\], with --calibration or --simulate' "$dir/err"
done
echo PASS
