#!/bin/sh
# Dynamic dependencies of the plugin (docs/cuda.md): libwsync.so has no
# DT_NEEDED on libcudart or libnccl (it loads libwsync_cuda.so with dlopen when a process holds
# CUDA buffers). With a module given, the module is the one that needs libcudart and libnccl, and it exports only
# its entry point wsyncCudaModule_v1.
# Usage: needed_test.sh path/to/libwsync.so [path/to/libwsync_cuda.so]
set -eu
library=${1:?usage: needed_test.sh path/to/libwsync.so [path/to/libwsync_cuda.so]}
module=${2:-}
passed=0
failed=0
fail() {
  echo "needed_test: FAILED: $*" >&2
  failed=$((failed + 1))
}

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

plugin_needed=$(needed "$library")
if [ -z "$plugin_needed" ]; then
  fail "readelf -d $library lists no NEEDED entry at all"
elif echo "$plugin_needed" | grep -E '^lib(cudart|nccl|cuda)\.' >/dev/null; then
  fail "$library needs CUDA libraries: $(echo "$plugin_needed" | grep -E '^lib(cudart|nccl|cuda)\.' | tr '\n' ' ')"
else
  passed=$((passed + 1))
fi

if [ -n "$module" ]; then
  module_needed=$(needed "$module")
  for want in libcudart libnccl; do
    if echo "$module_needed" | grep "^$want\." >/dev/null; then
      passed=$((passed + 1))
    else
      fail "$module does not need $want (NEEDED: $(echo "$module_needed" | tr '\n' ' '))"
    fi
  done
  exported=$(nm -D --defined-only "$module" | awk '$2 != "A" { print $3 }' | sort)
  if [ "$exported" = "wsyncCudaModule_v1" ]; then
    passed=$((passed + 1))
  else
    fail "$module exports other symbols than wsyncCudaModule_v1: $(echo "$exported" | tr '\n' ' ')"
  fi
fi
echo "needed_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
