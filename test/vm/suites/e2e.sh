#!/bin/bash
# suites/e2e.sh: pinrt's own e2e tests (cgroup and daemon tests) in the VM.
#   e2e.sh prepare SHARE      on the host: build what the guest runs into SHARE/bin
#   e2e.sh run DRIVER SHARE   in the guest: run the tests with DRIVER; exit code is the result
#
# Environment (run.sh passes these through SHARE/env):
#   PINRT_VM_TESTS    -test.run pattern (default: the cgroup and daemon tests)
#   PINRT_VM_SKIP     -test.skip pattern (default: subtests that need a Go
#                     toolchain or crun, which the guest lacks, and those
#                     that do not touch cgroups, to keep TCG time down)
#   PINRT_VM_COUNT    -test.count, to repeat a flaky test in one boot (default 1)
set -euo pipefail
case $1 in
prepare)
	share=$2
	repo=$(cd "$(dirname "$0")/../../.." && pwd)
	(cd "$repo" && go test -c -o "$share/bin/pinrt-e2e.test" ./test/)
	# The NRI tests' plugin, which the guest cannot build.
	(cd "$repo" && CGO_ENABLED=0 go build -o "$share/bin/nriplugin" ./test/nriplugin)
	;;
run)
	driver=$2 share=$3
	tests=${PINRT_VM_TESTS:-'^(TestVersionAndStatus|TestRestore|TestContainers|TestCgroupV2|TestStats|TestSystemdUnit|TestUpdateFinishedAfterCrash)$'}
	skip=${PINRT_VM_SKIP:-'^(TestContainers|TestStats)$/^(ManyPods|ReopenLog|UsernsPod|IDMappedVolume|RuntimeWithoutIDMap|RuntimeHandlers|Stop|ExecSync|Security|Seccomp|SharedPID|List|BadInput)$'}
	cd /tmp
	PINRT_E2E_BINARY=$share/bin/pinrt PINRT_E2E_CGROUP_DRIVER=$driver PINRT_E2E_NRIPLUGIN=$share/bin/nriplugin \
		exec "$share/bin/pinrt-e2e.test" -test.v -test.count="${PINRT_VM_COUNT:-1}" -test.timeout=40m \
		-test.run "$tests" -test.skip "$skip"
	;;
*)
	echo "usage: $0 prepare SHARE | run DRIVER SHARE" >&2
	exit 2
	;;
esac
