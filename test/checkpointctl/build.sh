#!/bin/bash
# build.sh builds checkpointctl, the CRIU project's reader of checkpoint
# archives (what operators and forensic tools open kubelet's checkpoints
# with), caches it by version outside the checkout and prints its path.
# test/checkpoint_test.go reads pinrt's archives with it.
#
#   build.sh [CACHE]    CACHE defaults to $PINRT_VM_CACHE or /var/cache/pinrt-vm
set -euo pipefail
# v1.7.0 needs a go-criu the module proxy does not serve.
version=v1.6.0
cache=${1:-${PINRT_VM_CACHE:-/var/cache/pinrt-vm}}
dir=$cache/checkpointctl-$version
if [ ! -x "$dir/checkpointctl" ]; then
	echo "checkpointctl: building $version into $dir" >&2
	mkdir -p "$dir"
	tmp=$(mktemp -d "$dir/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-trimpath go install "github.com/checkpoint-restore/checkpointctl@$version" >&2
	mv -f "$tmp/checkpointctl" "$dir/checkpointctl"
fi
echo "$dir/checkpointctl"
