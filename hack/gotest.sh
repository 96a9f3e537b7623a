#!/bin/bash
# gotest.sh: run `go test ARGS...` and, when it fails, repeat at the very
# end of the output what failed: each failed test's report (its `--- FAIL`
# line and the lines the test logged), then a line per failed test. A
# long suite's failure is otherwise buried under daemon logs that CI
# shows only the tail of.
#
# A failed test is run once more, as node conformance retries a failed
# spec (--flake-attempts): one that then passes is named as flaked, here
# and in $GOTEST_FLAKED if set; one that fails again fails the run. Only
# a run whose every failure is a named top-level test is retried, and only
# when at most $GOTEST_RETRY_MAX (3) failed: a panic, a build error or a
# timeout stops the tests after it from running, and many failures are
# no flake.
#
#   gotest.sh [go test flags] PACKAGES...
set -uo pipefail
go=${GO:-go}
retry_max=${GOTEST_RETRY_MAX:-3}
log=$(mktemp /tmp/gotest.XXXXXX.log)
trap 'rm -f "$log"' EXIT

# summary LOG RC: what failed in LOG, again.
summary() {
	echo
	echo "=== gotest.sh: go test failed (exit $2); what failed, again:"
	# A report is a `--- FAIL` line and the indented lines after it;
	# panics and build errors are kept with the lines that follow them.
	awk '
		/^[[:space:]]*--- FAIL/ { keep = 1; print; next }
		/^panic: / || /^# / || /\[build failed\]/ || /^FAIL[[:space:]]/ { keep = 1; print; next }
		keep && /^[[:space:]]/ { print; next }
		{ keep = 0 }
	' "$1" | head -n 400
	echo "=== gotest.sh: failed tests:"
	grep -E '^[[:space:]]*--- FAIL' "$1" | sed 's/^[[:space:]]*--- FAIL: /  /' | head -n 100
	grep -E '^(FAIL|ok)[[:space:]]' "$1" | grep '^FAIL' | sed 's/^/  /'
}

# retryable LOG: print the failed top-level tests of LOG, one per line,
# if every failed package names its failed tests and nothing stopped a
# package's tests early; fail otherwise.
retryable() {
	awk -v max="$retry_max" '
		/^panic: |^fatal error: |test timed out after|\[build failed\]|\[setup failed\]|^# / { bad = 1 }
		/^--- FAIL: / { pending[$3] = 1; n++; next }
		/^FAIL[[:space:]]+[^[:space:]]+[[:space:]]/ {
			if (length(pending) == 0) bad = 1
			for (t in pending) names[t] = 1
			delete pending
			next
		}
		/^ok[[:space:]]/ { delete pending }
		END {
			if (bad || n == 0 || n > max) exit 1
			for (t in names) print t
		}
	' "$1"
}

"$go" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0
summary "$log" "$rc"

if ! failed=$(retryable "$log") || [ -z "$failed" ]; then
	echo "=== gotest.sh: not retried (a panic, build error or timeout, or more than $retry_max failed tests)"
	exit "$rc"
fi
pattern="^($(echo "$failed" | paste -sd'|'))\$"
echo "=== gotest.sh: running the failed tests once more: $pattern"
retry_log=$(mktemp /tmp/gotest.XXXXXX.log)
trap 'rm -f "$log" "$retry_log"' EXIT
"$go" test "$@" -run "$pattern" 2>&1 | tee "$retry_log"
retry_rc=${PIPESTATUS[0]}
if [ "$retry_rc" -ne 0 ]; then
	summary "$retry_log" "$retry_rc"
	echo "=== gotest.sh: failed again on a retry: $(echo "$failed" | paste -sd' ')"
	exit "$retry_rc"
fi
for t in $failed; do
	echo "=== gotest.sh: FLAKED (failed, then passed on a retry): $t"
	if [ -n "${GOTEST_FLAKED:-}" ]; then
		echo "$t ($*)" >>"$GOTEST_FLAKED"
	fi
done
exit 0
