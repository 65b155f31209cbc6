#!/usr/bin/env bash
# FP8 rollouts priced with a calibration file (`wsync plan --calibration`): the quantize term at
# the calibration's quantize rate when it has one, else at the stand-in constant, which the
# report names; `wsync calibrate --show` prints the rate or that there is none.
# Usage: cli_plan_calibration_quantize_test.sh WSYNC_BINARY
set -euo pipefail
wsync=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
links='local=1us,20GB/s;intra_node=5us,4GB/s;inter_node=10us,2GB/s'
"$wsync" calibrate --synthetic "$links;quantize=0us,3GB/s" --out "$dir/measured" |
  grep -q 'quantize rate (the slowest process.s): 3.000 GB/s of bf16 input'
"$wsync" calibrate --synthetic "$links" --out "$dir/none" |
  grep -q 'quantize rate: not measured; predictions use the stand-in 5.500 GB/s'
plan() {
  "$wsync" plan --model qwen2.5-0.5b --from 'megatron(tp=2)' --to 'vllm(tp=1,quant=fp8_block)' \
    --segments 0 --calibration "$1"
}
out=$(plan "$dir/measured")
echo "$out" | grep -q '+ quantize 0\.[0-9]* s (3 GB/s of input per process, calibrated)'
if echo "$out" | grep -q 'stand-in: quantize'; then exit 1; fi
out=$(plan "$dir/none")
echo "$out" | grep -q '+ quantize 0\.[0-9]* s (5.5 GB/s of input per process, stand-in)'
echo "$out" | grep -q 'stand-in: quantize priced at 5.50 GB/s of input per process, a constant'
