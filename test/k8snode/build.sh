#!/bin/bash
# build.sh: build the Kubernetes node binary the VM test runs (kubelet,
# kube-apiserver, kube-controller-manager and etcd in one static binary, see
# build/main.go) from the Go module proxy, and cache it by version and by a
# hash of the build module's files, as the VM image is cached.
#
#   build.sh          print the path of the binary, building it if the cache has none
#
# Environment:
#   PINRT_K8S_CACHE   cache directory (default /var/cache/pinrt-vm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$here/build/go.mod")
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in build/go.mod" >&2; exit 1; }
hash=$(cd "$here/build" && cat go.mod go.sum main.go "$here/build.sh" | sha256sum | cut -c1-12)
dir=${PINRT_K8S_CACHE:-/var/cache/pinrt-vm}/k8s-$version-$hash
out=$dir/k8s
if [ ! -x "$out" ]; then
	mkdir -p "$dir"
	start=$(date +%s)
	echo "build.sh: building Kubernetes $version into $out (cold: about 20 minutes on 2 cores)" >&2
	pkg=k8s.io/component-base/version
	minor=${version#v1.}
	minor=${minor%%.*}
	ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
	(cd "$here/build" && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$ldflags" -o "$out.tmp" .)
	mv "$out.tmp" "$out"
	echo "build.sh: built in $(($(date +%s) - start))s" >&2
fi
echo "$out"
