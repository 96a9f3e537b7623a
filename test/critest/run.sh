#!/bin/bash
# run.sh runs critest against a running pinrt with the checked-in skip
# list and prints critest's summary, the skips and the slowest specs.
#
#   run.sh CRITEST ENDPOINT [OUTDIR]
#
# CRITEST is the critest binary (test/critest/build.sh), ENDPOINT pinrt's
# CRI socket (unix:///run/pinrt/pinrt.sock), OUTDIR where the JUnit report
# goes (default: a temporary directory). It exits 0 only when no spec
# failed, no spec skipped itself without an entry in skip.txt (an
# UNLISTED SKIP, which fails the run) and at least one spec passed;
# otherwise with critest's exit code, or 1.
#
# Environment:
#   PINRT_CRITEST_FOCUS    -ginkgo.focus regexp, to run some specs only (the
#                          VM's subset); a focused spec that skips itself
#                          is still an unlisted skip
#   PINRT_CRITEST_TIMEOUT  -ginkgo.timeout for the whole suite (default 60m)
#   PINRT_CRITEST_PARALLEL critest -parallel: specs run by that many
#                          processes (ginkgo, next to CRITEST); default 1
#   PINRT_CRITEST_ARGS     more critest flags
set -uo pipefail

critest=$1 endpoint=$2
out=${3:-$(mktemp -d /tmp/critest-out.XXXXXX)}
here=$(cd "$(dirname "$0")" && pwd)
skipfile=$here/skip.txt
mkdir -p "$out"

# Each entry is "REGEXP # reason"; an entry without a reason is an error.
patterns=()
while IFS= read -r line; do
	case $line in '' | '#'*) continue ;; esac
	pat=${line%% # *}
	reason=${line#* # }
	if [ "$pat" = "$line" ] || [ -z "$reason" ]; then
		echo "critest: $skipfile: entry without a reason: $line" >&2
		exit 2
	fi
	patterns+=("$pat")
done <"$skipfile"
skip=$(
	IFS='|'
	echo "${patterns[*]}"
)

args=(
	-runtime-endpoint "$endpoint" -image-endpoint "$endpoint"
	-ginkgo.no-color -ginkgo.timeout "${PINRT_CRITEST_TIMEOUT:-60m}"
	-ginkgo.junit-report "$out/junit.xml"
	-ginkgo.skip "$skip"
)
[ -n "${PINRT_CRITEST_FOCUS:-}" ] && args+=(-ginkgo.focus "$PINRT_CRITEST_FOCUS")
# critest -parallel runs the ginkgo CLI, which build.sh puts next to critest.
[ "${PINRT_CRITEST_PARALLEL:-1}" -gt 1 ] && args+=(-parallel "$PINRT_CRITEST_PARALLEL")
PATH=$(cd "$(dirname "$critest")" && pwd):$PATH
# shellcheck disable=SC2206 # word splitting is the point
[ -n "${PINRT_CRITEST_ARGS:-}" ] && args+=($PINRT_CRITEST_ARGS)

echo "critest: $("$critest" -version 2>/dev/null | head -1); endpoint $endpoint; skip list $skipfile (${#patterns[@]} entries)"
start=$(date +%s)
"$critest" "${args[@]}" >"$out/critest.log" 2>&1
rc=$?
end=$(date +%s)

# The log in full when something failed; otherwise the summary is enough.
if [ "$rc" -ne 0 ]; then
	cat "$out/critest.log"
fi

# JUnit: one <testcase name=".." status=".." time=".."> per spec, a
# skipped one followed by <skipped message="skipped"> when the focus or
# skip regexps left it out, or "skipped - REASON" when it called Skip.
cases=$out/cases.tsv
if [ -f "$out/junit.xml" ]; then
	awk '
	function attr(s, a, i, r) {
		i = index(s, " " a "=\"")
		if (!i) return ""
		r = substr(s, i + length(a) + 3)
		return substr(r, 1, index(r, "\"") - 1)
	}
	function flush() {
		if (name != "") print status "\t" time "\t" name "\t" msg
		name = ""
	}
	/<testcase / { flush(); name = attr($0, "name"); status = attr($0, "status"); time = attr($0, "time"); msg = "" }
	/<skipped message="/ { if (name != "") msg = attr($0, "message") }
	END { flush() }
	' "$out/junit.xml" |
		sed 's/&#39;/'"'"'/g; s/&#34;/"/g; s/&quot;/"/g; s/&#xA;/ /g; s/&amp;/\&/g; s/&lt;/</g; s/&gt;/>/g' >"$cases"
else
	: >"$cases"
fi
# Skipped specs: by skip.txt, critest's benchmarks (never validation
# specs), or unlisted: a spec that skipped itself, which fails the run.
# A focused run leaves every other spec out with the plain message
# "skipped"; a spec the focus selected that skipped itself still counts.
listed=0 benchmarks=0
unlisted=()
while IFS=$'\t' read -r status _ name msg; do
	[ "$status" = skipped ] || continue
	case $name in *benchmark*)
		benchmarks=$((benchmarks + 1))
		continue
		;;
	esac
	if printf '%s\n' "$name" | grep -Eq -- "$skip"; then
		listed=$((listed + 1))
	elif [ -z "${PINRT_CRITEST_FOCUS:-}" ] || [ "$msg" != skipped ]; then
		unlisted+=("$name: $msg")
	fi
done <"$cases"

echo "critest: ===== summary ($((end - start))s) ====="
grep -E '^(Ran [0-9]+ of [0-9]+ Specs|SUCCESS!|FAIL!)' "$out/critest.log" | sort -u
awk -F'\t' '$1 == "failed" { print "critest: FAILED: " $3 }' "$cases"
echo "critest: skipped by skip.txt: $listed; benchmarks (not run by design): $benchmarks; unlisted skips: ${#unlisted[@]}"
for n in "${unlisted[@]}"; do
	echo "critest: UNLISTED SKIP (the spec skipped itself): $n"
done
if [ "$rc" -eq 0 ] && [ "${#unlisted[@]}" -gt 0 ]; then
	echo "critest: FAIL: ${#unlisted[@]} spec(s) skipped themselves with no entry in $skipfile"
	rc=1
fi
# A focus that matches nothing, or a report that lists no spec run, would
# pass having checked nothing.
if [ "$rc" -eq 0 ] && ! awk -F'\t' '$1 == "passed" { found = 1 } END { exit !found }' "$cases"; then
	echo "critest: FAIL: no spec passed${PINRT_CRITEST_FOCUS:+ (focus: $PINRT_CRITEST_FOCUS)}"
	rc=1
fi
echo "critest: slowest specs:"
awk -F'\t' '$1 == "passed" || $1 == "failed"' "$cases" | sort -t$'\t' -k2,2 -rn | head -8 |
	awk -F'\t' '{ printf "critest:   %6.1fs %s\n", $2, $3 }'
exit $rc
