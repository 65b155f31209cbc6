#!/usr/bin/env bash
# `wsync settings` (plugin/settings.h): every setting with its default and WSYNC_* variable; with
# no variable set every value comes from the default; a variable that is set is the value and says
# so; the secret is never printed (only whether WSYNC_SECRET is set); a variable whose value would
# be refused is printed with the reason and the command exits 1; arguments are a usage error.
# Usage: cli_settings_test.sh WSYNC_BINARY
set -euo pipefail
wsync=$1
# No variable of the table from the caller's environment.
for variable in $(env | sed -n 's/^\(WSYNC_[A-Z_]*\)=.*/\1/p'); do unset "$variable"; done

out=$("$wsync" settings)
echo "$out" | grep -Fxq 'WSYNC_STAGING_BUDGET_BYTES=67108864'
echo "$out" | grep -Fxq '# default 67108864 (64 MiB); value from the default'
echo "$out" | grep -Fxq 'WSYNC_DEADLINE_SECONDS=60'
echo "$out" | grep -Fxq 'WSYNC_HEARTBEAT_INTERVAL_SECONDS=0.25'
echo "$out" | grep -Fxq 'WSYNC_SILENCE_LIMIT_SECONDS=3'
echo "$out" | grep -Fxq 'WSYNC_DELTA_BUDGET_BYTES=17179869184'
echo "$out" | grep -Fxq 'WSYNC_REPLICA_POLICY=local_first_least_loaded'
echo "$out" | grep -Fxq 'WSYNC_DELTA=off'
echo "$out" | grep -q '^# secret_env (text): '
echo "$out" | grep -Fq 'default WSYNC_SECRET; WSYNC_SECRET is not set here'
# 18 settings, 15 of them with a variable; none from the environment.
[ "$(echo "$out" | grep -c '^# [a-z_]* ([a-z]*): ')" -eq 18 ]
[ "$(echo "$out" | grep -c '^WSYNC_[A-Z_]*=')" -eq 15 ]
! echo "$out" | grep -q 'value from the environment'

secret=settings-test-secret-0123456789abcdef
out=$(WSYNC_DEADLINE_SECONDS=5 WSYNC_DELTA=2 WSYNC_SECRET=$secret "$wsync" settings)
echo "$out" | grep -Fxq 'WSYNC_DEADLINE_SECONDS=5'
echo "$out" | grep -B1 -Fx 'WSYNC_DEADLINE_SECONDS=5' | grep -Fxq '# default 60; value from the environment'
echo "$out" | grep -Fxq 'WSYNC_DELTA=on'
echo "$out" | grep -Fxq 'WSYNC_STAGING_BUDGET_BYTES=67108864'
echo "$out" | grep -Fq 'WSYNC_SECRET is set here'
! echo "$out" | grep -q "$secret"

set +e
err=$(WSYNC_DEADLINE_SECONDS=soon "$wsync" settings 2>&1 > "${TMPDIR:-/tmp}/cli_settings_$$")
rc=$?
set -e
out=$(cat "${TMPDIR:-/tmp}/cli_settings_$$")
rm -f "${TMPDIR:-/tmp}/cli_settings_$$"
[ "$rc" -eq 1 ]
echo "$err" | grep -Fq "WSYNC_DEADLINE_SECONDS='soon'"
echo "$out" | grep -Fxq 'WSYNC_DEADLINE_SECONDS=soon'
echo "$out" | grep -q "^# default 60; refused: WSYNC_DEADLINE_SECONDS='soon'"

set +e
"$wsync" settings --verbose > /dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ]
"$wsync" help settings | grep -q '^usage: wsync settings'
echo "cli_settings_test: ok"
