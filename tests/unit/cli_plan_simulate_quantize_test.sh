#!/usr/bin/env bash
# FP8 rollouts on a cluster file (`wsync plan --simulate`): the quantize term at the file's stated
# GPU rate; a rate that is not a positive bandwidth is refused naming the key.
# Usage: cli_plan_simulate_quantize_test.sh WSYNC_BINARY CLUSTER_FILE
set -euo pipefail
wsync=$1
cluster=$2
plan() {
  "$wsync" plan --model qwen2.5-0.5b --from 'megatron(tp=2)' --to 'vllm(tp=1,quant=fp8_block)' \
    --segments 0 --simulate "$1"
}
out=$(plan "$cluster")
echo "$out" | grep -q '+ quantize 0\.[0-9]* s (2000 GB/s of input per process, stated by the'
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
sed 's/^quantize: .*/quantize: -5GB\/s/' "$cluster" > "$bad"
set +e
err=$(plan "$bad" 2>&1)
status=$?
set -e
test "$status" -ne 0
echo "$err" | grep -q 'quantize must be a positive rate'
