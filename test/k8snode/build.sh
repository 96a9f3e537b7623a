#!/bin/bash
# build.sh: build the Kubernetes node binary the node tests run (kubelet,
# kube-apiserver, kube-controller-manager, kube-scheduler and etcd in one
# static binary, see build/main.go) from the Go module proxy, and cache it
# by version and by a hash of the build module's files, as the VM image is
# cached.
#
#   build.sh              print the path of the node binary, building it if the cache has none
#   build.sh conformance  also build, beside it, what make node-e2e runs:
#                         conformance.test (Kubernetes' e2e specs, see
#                         build/conformance), e2e_node.test (its node e2e
#                         specs), the ginkgo CLI and agnhost;
#                         print the directory
#
# Environment:
#   PINRT_K8S_CACHE   cache directory (default /var/cache/pinrt-vm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$here/build/go.mod")
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in build/go.mod" >&2; exit 1; }
hash=$(cd "$here/build" && cat go.mod go.sum main.go tools.go conformance/*.go | sha256sum | cut -c1-12)
dir=${PINRT_K8S_CACHE:-/var/cache/pinrt-vm}/k8s-$version-$hash
mkdir -p "$dir"
# One build at a time per cache entry: make test starts one in the
# background (hack/prebuild.sh) that a later step waits for here.
exec 9>"$dir/.lock"
flock 9
pkg=k8s.io/component-base/version
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

# build NAME CMD...: run CMD (a go build writing to $out.tmp) unless NAME is there.
build() {
	local name=$1 start
	shift
	out=$dir/$name
	[ -x "$out" ] && return 0
	start=$(date +%s)
	echo "build.sh: building $name (Kubernetes $version) into $dir" >&2
	(cd "$here/build" && CGO_ENABLED=0 "$@")
	mv "$out.tmp" "$out"
	echo "build.sh: $name built in $(($(date +%s) - start))s" >&2
}
# Cold, the node binary takes about 20 minutes on 2 cores; the others
# share most of its packages.
build k8s go build -trimpath -ldflags "$ldflags" -o "$dir/k8s.tmp" .
if [ "${1:-}" != conformance ]; then
	echo "$dir/k8s"
	exit 0
fi
build conformance.test go test -c -trimpath -ldflags "$ldflags" -o "$dir/conformance.test.tmp" ./conformance
# test/e2e_node's own specs (proc mounts, recursive read-only mounts,
# image volumes, sidecars, ...), which e2e.test does not link; go.sum
# holds its test-only modules (go get -t k8s.io/kubernetes/test/e2e_node).
build e2e_node.test go test -c -trimpath -ldflags "$ldflags" -o "$dir/e2e_node.test.tmp" k8s.io/kubernetes/test/e2e_node
build ginkgo go build -trimpath -o "$dir/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo
build agnhost go build -trimpath -ldflags "-s -w" -o "$dir/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost
echo "$dir"
