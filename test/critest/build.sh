#!/bin/bash
# build.sh builds critest, the CRI conformance suite, and prints the path
# of the binary. critest is the test binary of sigs.k8s.io/cri-tools'
# cmd/critest, built static (it runs in the VM guest too) from the scratch
# module in test/critest/build, which pins its version. Next to it goes
# the ginkgo CLI, which critest runs for -parallel. Both are cached by
# version outside the checkout, as the VM image is, so only the first run
# on a machine (or a version bump) compiles them.
#
#   build.sh [CACHE]    CACHE defaults to $PINRT_VM_CACHE or /var/cache/pinrt-vm
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${PINRT_VM_CACHE:-/var/cache/pinrt-vm}}
modversion() { awk -v m="$1" '($1 == "require" && $2 == m) || $1 == m { print ($1 == m ? $2 : $3); exit }' "$here/build/go.mod"; }
version=$(modversion sigs.k8s.io/cri-tools)
ginkgo=$(modversion github.com/onsi/ginkgo/v2)
[ -n "$version" ] && [ -n "$ginkgo" ] || { echo "build.sh: no cri-tools or ginkgo version in $here/build/go.mod" >&2; exit 1; }
dir=$cache/critest-$version-ginkgo-$ginkgo
tmp=
trap 'rm -f "$tmp"' EXIT
# build PACKAGE NAME [go test -c]: compile into $dir/NAME unless it is there.
build() {
	[ -x "$dir/$2" ] && return 0
	mkdir -p "$dir"
	tmp=$(mktemp "$dir/.$2.XXXXXX")
	echo "critest: building $2 (cri-tools $version, ginkgo $ginkgo) into $dir" >&2
	if [ "${3:-}" = test ]; then
		(cd "$here/build" && CGO_ENABLED=0 go test -c -trimpath -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$version" -o "$tmp" "$1")
	else
		(cd "$here/build" && CGO_ENABLED=0 go build -trimpath -o "$tmp" "$1")
	fi
	chmod 0755 "$tmp"
	mv -f "$tmp" "$dir/$2"
}
build sigs.k8s.io/cri-tools/cmd/critest critest test
build github.com/onsi/ginkgo/v2/ginkgo ginkgo
# crictl, of the same cri-tools, for the tests that drive pinrt as an
# operator does (test/sigpolicy_test.go).
build sigs.k8s.io/cri-tools/cmd/crictl crictl
echo "$dir/critest"
