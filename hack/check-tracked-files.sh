#!/bin/bash
# check-tracked-files.sh [DIR]: fails when the git tree in DIR (default:
# the current directory) tracks a build output: any file over 1 MiB, or
# any executable (ELF) of any size, unless it is test data named as such,
# i.e. lives under a directory called testdata. Every clone downloads a
# tracked file forever, so make lint runs this before anything is
# committed.
set -euo pipefail
cd "${1:-.}"
limit=$((1024 * 1024))
bad=0
while IFS= read -r -d '' f; do
	case "/$f" in */testdata/*) continue ;; esac
	[ -f "$f" ] || continue # deleted in the work tree, not yet committed
	size=$(stat -c %s "$f")
	if [ "$size" -gt "$limit" ]; then
		echo "tracked file over 1 MiB: $f ($size bytes); build outputs belong in .gitignore, test data under testdata/" >&2
		bad=1
	elif [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
		echo "tracked executable: $f; build outputs belong in .gitignore" >&2
		bad=1
	fi
done < <(git ls-files -z)
exit $bad
