#!/bin/bash
# suites/critest.sh: critest, the CRI conformance suite, against pinrt run
# from contrib/pinrt.service, pulling stand-ins of every image it needs
# (test/standin) from a registry on 127.0.0.1 through pinrt's own mirror
# settings with skip_origin, as on an air-gapped node. By default only the
# specs only the VM can show: cgroups under both drivers on cgroup v2, the
# stats and metrics read from them, the OOM kill. The host runs critest
# in full (TestCritest, make test-e2e).
#   critest.sh prepare SHARE      on the host: critest, pinrt-standin and the images into SHARE
#   critest.sh run DRIVER SHARE   in the guest: start pinrt with DRIVER, run critest; exit code is the result
#
# critest and the images are cached outside the checkout ($PINRT_VM_CACHE,
# default /var/cache/pinrt-vm): critest by its version, the images by a
# hash of their .debs and recipes (see test/critest/build.sh and package
# test/standin).
#
# Environment (run.sh passes these through SHARE/env):
#   PINRT_VM_CRITEST_FULL   1: every spec (make critest), not the subset
#   PINRT_CRITEST_FOCUS     -ginkgo.focus regexp (default: the subset,
#                           $subset below; none with PINRT_VM_CRITEST_FULL=1)
#   PINRT_CRITEST_PARALLEL  critest processes (default 2: one per vCPU; the
#                           specs spend much of their time waiting)
#   PINRT_CRITEST_TIMEOUT, PINRT_CRITEST_ARGS: see test/critest/run.sh
set -euo pipefail

# The stand-in registry's address in the guest.
registry=127.0.0.1:5000

# The subset: the specs of cri-tools v1.37.0 (pkg/validate) that place
# pods and containers in cgroups and read them back. "basic operations on
# PodSandbox": pod cgroups made and removed, critest's own cgroup parent
# ("/test.slice" under systemd); "stats": ContainerStats and
# ListContainerStats, filtered four ways; "metrics": the metric
# descriptors and ListPodSandboxMetrics of a container with CPU and
# memory limits; "OOM": a container killed by its memory limit, reported
# OOMKilled. 12 of 127 specs; v1.37.0 has no UpdateContainerResources
# spec (pinrt's e2e UpdateResources runs in the VM's e2e suite).
subset='basic operations on PodSandbox|stats|metrics|OOM'

case $1 in
prepare)
	share=$2
	repo=$(cd "$(dirname "$0")/../../.." && pwd)
	cache=${PINRT_VM_CACHE:-/var/cache/pinrt-vm}
	critest=$(bash "$repo/test/critest/build.sh" "$cache")
	cp "$critest" "$(dirname "$critest")/ginkgo" "$share/bin/"
	# -trimpath and -buildvcs=false: the same sources give the same
	# binary in any checkout and at any commit, and the binary is part of
	# the images' cache key.
	(cd "$repo" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$share/bin/pinrt-standin" ./test/standin/cmd/pinrt-standin)
	images=$("$share/bin/pinrt-standin" build -cache "$cache/standin")
	mkdir -p "$share/critest"
	cp -r "$images" "$share/critest/images"
	cp "$repo/test/critest/run.sh" "$repo/test/critest/skip.txt" "$repo/contrib/pinrt.service" "$share/critest/"
	;;
run)
	driver=$2 share=$3
	# critest's log and JUnit report land in the share, where they can
	# be read while it runs and after a VM that went down.
	out=$share/out/critest-$driver
	mkdir -p "$out"

	"$share/bin/pinrt-standin" serve -addr "$registry" -ready "$out/registry.ready" "$share/critest/images" >"$out/registry.log" 2>&1 &
	regpid=$!
	cleanup() {
		systemctl stop pinrt.service || true
		# KillMode=process leaves containers running; none may outlive
		# this driver's run.
		if [ -d /run/pinrt/runtime/runc ]; then
			for c in $(runc --root /run/pinrt/runtime/runc list -q 2>/dev/null); do
				runc --root /run/pinrt/runtime/runc delete -f "$c" || true
			done
		fi
		grep -oE ' (/run/pinrt|/var/lib/pinrt)[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l || true
		rm -rf /run/pinrt /var/lib/pinrt /etc/pinrt
		kill "$regpid" 2>/dev/null || true
		wait "$regpid" 2>/dev/null || true
	}
	trap cleanup EXIT
	for _ in $(seq 300); do
		[ -f "$out/registry.ready" ] && break
		kill -0 "$regpid" 2>/dev/null || { cat "$out/registry.log"; exit 1; }
		sleep 0.2
	done
	[ -f "$out/registry.ready" ] || { echo "critest: the stand-in registry did not come up"; cat "$out/registry.log"; exit 1; }
	cat "$out/registry.log"

	# pinrt runs from the unit as shipped; only its configuration is ours.
	install -m 0755 "$share/bin/pinrt" /usr/local/bin/pinrt
	install -m 0755 "$share/bin/pinrt-exec" /usr/local/bin/pinrt-exec
	install -m 0644 "$share/critest/pinrt.service" /etc/systemd/system/pinrt.service
	mkdir -p /etc/pinrt
	{
		printf '[runtime]\n  cgroup_driver = %s\n\n' "\"$driver\""
		# critest's plugin-synchronization spec holds its plugin's
		# Synchronize for 2 s, as long as the default request timeout, so
		# the plugin would be dropped and the spec skip itself.
		printf '[nri]\n  plugin_request_timeout = "5s"\n\n'
		"$share/bin/pinrt-standin" mirrors -addr "$registry"
	} >/etc/pinrt/pinrt.toml
	echo "critest: /etc/pinrt/pinrt.toml:"
	sed 's/^/  /' /etc/pinrt/pinrt.toml
	systemctl daemon-reload
	systemctl start pinrt.service

	# pinrt serves NRI on its default socket; critest's NRI specs run
	# against it (without -nri-socket they skip themselves).
	nri=()
	[ -S /var/run/nri/nri.sock ] && nri=(-nri-socket /var/run/nri/nri.sock)
	focus=${PINRT_CRITEST_FOCUS-$subset}
	[ "${PINRT_VM_CRITEST_FULL:-0}" = 1 ] && focus=${PINRT_CRITEST_FOCUS:-}
	if [ -n "$focus" ]; then echo "critest: the specs matching $focus"; else echo "critest: every spec"; fi
	rc=0
	PINRT_CRITEST_FOCUS=$focus PINRT_CRITEST_ARGS="${nri[*]} ${PINRT_CRITEST_ARGS:-}" PINRT_CRITEST_PARALLEL=${PINRT_CRITEST_PARALLEL:-2} \
		bash "$share/critest/run.sh" "$share/bin/critest" unix:///run/pinrt/pinrt.sock "$out" || rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "critest: pinrt's journal (last 150 lines):"
		journalctl -u pinrt.service --no-pager -n 150 || true
	fi
	exit $rc
	;;
*)
	echo "usage: $0 prepare SHARE | run DRIVER SHARE" >&2
	exit 2
	;;
esac
