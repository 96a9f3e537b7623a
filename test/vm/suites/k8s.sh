#!/bin/bash
# suites/k8s.sh: a Kubernetes node in the VM with pinrt as its runtime
# (test/k8snode): etcd, kube-apiserver, kube-controller-manager and
# kubelet, driven through the API server with client-go; the pods' images
# (busybox, nginx) are the stand-ins of test/standin, pulled from a
# registry on 127.0.0.1 through pinrt's mirror settings.
#   k8s.sh prepare SHARE      on the host: the Kubernetes binary (cached by
#                             version, test/k8snode/build.sh), the test, the
#                             stand-in images
#   k8s.sh run DRIVER SHARE   in the guest: run the test with DRIVER
#
# It runs under the drivers of PINRT_VM_K8S_DRIVERS only (default systemd;
# see run.sh): kubelet on cgroupfs is tested on the host (make
# test-node-e2e).
#
# Environment (run.sh passes these through SHARE/env):
#   PINRT_VM_K8S_TESTS  -test.run pattern (default: TestNode; the others run on the host, node-e2e.sh)
#   PINRT_VM_K8S_TIME_SCALE  multiplies the test's waits (default 3 in a
#                       guest of one vCPU, else 1)
#   PINRT_VM_STANDIN_REPO  checkout whose test/standin makes the images
#                       (default: this one); with none, busybox from
#                       test/testimage and no nginx
set -euo pipefail

# The stand-in registry's address in the guest (critest's is :5000).
registry=127.0.0.1:5001

case $1 in
prepare)
	share=$2
	repo=$(cd "$(dirname "$0")/../../.." && pwd)
	cache=${PINRT_VM_CACHE:-/var/cache/pinrt-vm}
	cp "$(bash "$repo/test/k8snode/build.sh")" "$share/bin/k8s"
	(cd "$repo/test/k8snode" && go test -c -o "$share/bin/k8snode.test" .)
	standin=${PINRT_VM_STANDIN_REPO:-$repo}
	if [ -d "$standin/test/standin" ]; then
		# Built as critest.sh builds it, so both suites share the cache.
		(cd "$standin" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$share/bin/pinrt-standin" ./test/standin/cmd/pinrt-standin)
		mkdir -p "$share/k8s"
		cp -r "$("$share/bin/pinrt-standin" build -cache "$cache/standin")" "$share/k8s/images"
	else
		echo "k8s: no test/standin in $standin: busybox from test/testimage, no nginx"
	fi
	;;
run)
	driver=$2 share=$3
	out=/tmp/k8s-$driver
	rm -rf "$out"
	mkdir -p "$out"
	# The binary runs four times and more: from the guest's disk rather
	# than through 9p.
	install -m 0755 "$share/bin/k8s" /usr/local/bin/k8s
	if [ -x "$share/bin/pinrt-standin" ]; then
		"$share/bin/pinrt-standin" serve -addr "$registry" -ready "$out/registry.ready" "$share/k8s/images" >"$out/registry.log" 2>&1 &
		regpid=$!
		trap 'kill $regpid 2>/dev/null; wait $regpid 2>/dev/null' EXIT
		for _ in $(seq 300); do
			[ -f "$out/registry.ready" ] && break
			kill -0 "$regpid" 2>/dev/null || { cat "$out/registry.log"; exit 1; }
			sleep 0.2
		done
		[ -f "$out/registry.ready" ] || { echo "k8s: the stand-in registry did not come up"; cat "$out/registry.log"; exit 1; }
		"$share/bin/pinrt-standin" mirrors -addr "$registry" >"$out/mirrors.toml"
		export PINRT_K8S_STANDIN_CONF=$out/mirrors.toml
	fi
	cd /tmp
	# In a guest of one vCPU (PINRT_VM_SMP=1) the control plane, kubelet
	# and the pods share one emulated CPU: the test's waits are tripled.
	scale=${PINRT_VM_K8S_TIME_SCALE:-}
	if [ -z "$scale" ]; then
		scale=1
		[ "$(nproc)" -eq 1 ] && scale=3
	fi
	echo "k8s: $(nproc) vCPU(s), waits scaled by $scale"
	rc=0
	PINRT_K8S_TIME_SCALE=$scale PINRT_K8S_BINARY=/usr/local/bin/k8s PINRT_K8S_PINRT=$share/bin/pinrt PINRT_K8S_CGROUP_DRIVER=$driver \
		"$share/bin/k8snode.test" -test.v -test.timeout=40m -test.run "${PINRT_VM_K8S_TESTS:-^TestNode$}" || rc=$?
	exit $rc
	;;
*)
	echo "usage: $0 prepare SHARE | run DRIVER SHARE" >&2
	exit 2
	;;
esac
