#!/bin/bash
# build.sh builds critest, the CRI conformance suite, and prints the path
# of the binary. critest is the test binary of sigs.k8s.io/cri-tools'
# cmd/critest, built static (it runs in the VM guest too) from the scratch
# module in test/critest/build, which pins its version. The binary is
# cached by that version outside the checkout, as the VM image is, so only
# the first run on a machine (or a version bump) compiles it.
#
#   build.sh [CACHE]    CACHE defaults to $PINRT_VM_CACHE or /var/cache/pinrt-vm
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${PINRT_VM_CACHE:-/var/cache/pinrt-vm}}
version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" { print $3 }' "$here/build/go.mod")
[ -n "$version" ] || { echo "build.sh: no cri-tools version in $here/build/go.mod" >&2; exit 1; }
bin=$cache/critest-$version/critest
if [ ! -x "$bin" ]; then
	mkdir -p "$(dirname "$bin")"
	tmp=$(mktemp "$bin.XXXXXX")
	trap 'rm -f "$tmp"' EXIT
	echo "critest: building critest $version (cached in $bin)" >&2
	(cd "$here/build" && CGO_ENABLED=0 go test -c -trimpath -o "$tmp" sigs.k8s.io/cri-tools/cmd/critest)
	chmod 0755 "$tmp"
	mv -f "$tmp" "$bin"
fi
echo "$bin"
