#!/bin/bash
# prebuild.sh: start, in the background, the long builds of make test's
# later suites, so they overlap the unit and host e2e tests, which spend
# much of their time waiting on runc, conmon and the network: the
# Kubernetes binaries of node-e2e (test/k8snode/build.sh conformance,
# about 20 minutes of compiling on a cold cache) and the VM image
# (debootstrap: downloads and disk, a few minutes). Each build holds a
# lock its suite takes too, so a suite that starts first waits for it;
# one that failed here is run again, with its error, by its suite.
#
#   prebuild.sh LOGDIR    logs go to LOGDIR/prebuild-*.log
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
logs=${1:-/tmp}
mkdir -p "$logs"
echo "prebuild: Kubernetes binaries and the VM image in the background (logs in $logs/prebuild-*.log)"
nohup bash "$repo/test/k8snode/build.sh" conformance >"$logs/prebuild-k8s.log" 2>&1 </dev/null &
PINRT_VM_IMAGE_ONLY=1 nohup bash "$repo/test/vm/run.sh" >"$logs/prebuild-vm.log" 2>&1 </dev/null &
