#!/usr/bin/env bash
# `wsync plan --model CONFIG.json` (issue 45): a Hugging Face config.json plans like a built-in
# model (its count on the model line, --include_mtp adds the MTP layer), and a config the mapping
# cannot read fails with exit 1 naming the key.
# Usage: cli_plan_config_json_test.sh WSYNC_BINARY CONFIG_DIR
set -euo pipefail
wsync=$1
dir=$2
plan() {
  "$wsync" plan --from 'fsdp(2)' --to 'vllm(tp=2)' --segments 0 "$@"
}
plan --model "$dir/qwen3-8b.json" | grep -q '^model .*qwen3-8b.json: 399 parameters, 8190735360 elements'
plan --model "$dir/deepseek-v3.json" | grep -q ': 1025 parameters, 671026419200 elements'
plan --model "$dir/deepseek-v3.json" --include_mtp | grep -q ': 1048 parameters, 684489845504 elements'
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
sed 's/"model_type": "qwen3"/"model_type": "bert"/' "$dir/qwen3-8b.json" > "$bad"
set +e
err=$(plan --model "$bad" 2>&1)
status=$?
set -e
test "$status" -eq 1
echo "$err" | grep -q 'key "model_type" is "bert", not a known family'
set +e
err=$(plan --model /nonexistent/config.json 2>&1)
status=$?
set -e
test "$status" -eq 1
echo "$err" | grep -q 'neither a built-in model'
