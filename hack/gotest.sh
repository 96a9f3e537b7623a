#!/bin/bash
# gotest.sh: run `go test ARGS...` and, when it fails, repeat at the very
# end of the output what failed: each failed test's report (its `--- FAIL`
# line and the lines the test logged), then a line per failed test. A
# long suite's failure is otherwise buried under daemon logs that CI
# shows only the tail of.
#
#   gotest.sh [go test flags] PACKAGES...
set -uo pipefail
go=${GO:-go}
log=$(mktemp /tmp/gotest.XXXXXX.log)
trap 'rm -f "$log"' EXIT
"$go" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
	echo
	echo "=== gotest.sh: go test failed (exit $rc); what failed, again:"
	# A report is a `--- FAIL` line and the indented lines after it;
	# panics and build errors are kept with the lines that follow them.
	awk '
		/^[[:space:]]*--- FAIL/ { keep = 1; print; next }
		/^panic: / || /^# / || /\[build failed\]/ || /^FAIL[[:space:]]/ { keep = 1; print; next }
		keep && /^[[:space:]]/ { print; next }
		{ keep = 0 }
	' "$log" | head -n 400
	echo "=== gotest.sh: failed tests:"
	grep -E '^[[:space:]]*--- FAIL' "$log" | sed 's/^[[:space:]]*--- FAIL: /  /' | head -n 100
	grep -E '^(FAIL|ok)[[:space:]]' "$log" | grep '^FAIL' | sed 's/^/  /'
fi
exit "$rc"
