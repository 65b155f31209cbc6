#!/bin/sh
# Symbol hygiene of libwsync.so: the dynamic symbols it defines are exactly wsyncPlugin_v1 (later
# ABIs add wsyncPlugin_v2, ... here and in plugin/wsync.map). Anything else (a C++ symbol of
# wsync, Abseil, protobuf, UCX or the C++ runtime leaking from a static library) fails the test.
# Usage: symbols_test.sh path/to/libwsync.so
set -eu
library=${1:?usage: symbols_test.sh path/to/libwsync.so}
expected="wsyncPlugin_v1"

# "nm -D --defined-only" prints "<value> <type> <name>"; a version node of a named version script
# would print an absolute symbol ("A") of the node's name, which does not count as an export.
exported=$(nm -D --defined-only "$library" | awk '$2 != "A" { print $3 }' | sort)
if [ "$exported" != "$expected" ]; then
  echo "symbols_test: FAILED: $library exports other symbols than $expected:" >&2
  echo "$exported" | sed 's/^/  /' >&2
  echo "symbols_test: 0 passed, 1 failed"
  exit 1
fi
# The table is constant data (read-only after relocation), not a function or writable data that
# a host could overwrite by accident.
entry=$(objdump -T "$library" | awk -v s="$expected" '$NF == s')
case "$entry" in
  *" .data.rel.ro"*|*" .rodata"*) ;;
  *)
    echo "symbols_test: FAILED: $expected is not in read-only data: $entry" >&2
    echo "symbols_test: 1 passed, 1 failed"
    exit 1
    ;;
esac
echo "symbols_test: 2 passed, 0 failed"
