#!/bin/bash
# node-e2e.sh: Kubernetes' node conformance, SIG Node and SIG CLI specs
# against pinrt, on this host.
# Builds (cached by version, see build.sh) the node binary, the e2e specs
# (build/conformance), the node e2e specs (e2e_node.test), the ginkgo CLI
# and agnhost; builds and serves the stand-in images of test/standin on
# 127.0.0.1; then runs TestNodeConformance (conformance_test.go, its
# suites one after the other on one node: conformance.test, e2e_node.test,
# and e2e_node.test's serial specs one at a time) once per mode: every pod in
# the host's user namespace ("host"), then every pod that can have one in
# its own ("userns", a MutatingAdmissionPolicy sets hostUsers: false).
# Each run brings up its own node and removes it. A last run
# ("sigpolicy", TestNodeSignaturePolicy in sigpolicy_test.go) gives pinrt
# a signature policy and checks what kubelet reports of a pod whose image
# it refuses; another ("checkpoint", TestNodeCheckpoint in
# checkpoint_test.go) has kubelet checkpoint a container of a pod in a
# user namespace. The exit code is 0 only when every run passed.
#
# Environment:
#   PINRT_NODE_E2E_MODES    the runs, in order (default "host userns sigpolicy checkpoint")
#   PINRT_NODE_E2E_FOCUS    ginkgo --focus within [NodeConformance], SIG Node, SIG CLI and SIG
#                           Network (default: all of the first three, and the host port spec)
#   PINRT_NODE_E2E_NODE_FOCUS  the same for e2e_node.test's own specs (default: all of
#                           its [NodeConformance] and SIG Node specs but serial ones)
#   PINRT_NODE_E2E_SUITES   the suites each conformance mode runs (default
#                           "conformance.test e2e_node.test e2e_node.serial"; the
#                           subset's host mode runs the first two)
#   PINRT_NODE_E2E_SERIAL_FOCUS  the same for e2e_node.test's serial specs (default: the
#                           runtime SIGKILLed under 100 pods, garbage collection, OOM scores)
#   PINRT_NODE_E2E_SUBSET   "ci": the subset make test runs (the focus below), unless
#                           PINRT_NODE_E2E_FOCUS is set
#   PINRT_NODE_E2E_SKIP     a regexp of specs to leave out as well (the subset's default:
#                           the probe specs that watch for minutes)
#   PINRT_NODE_E2E_PROCS    ginkgo processes (default 8: the specs mostly wait)
#   PINRT_NODE_E2E_FLAKE_ATTEMPTS  ginkgo --flake-attempts (default 1; the subset's 2, and a
#                           spec that passes only on its retry is named in the summary)
#   PINRT_NODE_E2E_TIMEOUT  ginkgo --timeout per run (default 60m, the serial suite's 90m)
#   PINRT_NODE_E2E_OUT      where each run's log and JUnit report go
#                           (default a temporary directory, removed at the end)
#   PINRT_VM_CACHE          the build cache (default /var/cache/pinrt-vm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${PINRT_VM_CACHE:-/var/cache/pinrt-vm}
modes=${PINRT_NODE_E2E_MODES:-host userns sigpolicy checkpoint}
# CI's subset: what kubelet does with every pod (pods, pods extended,
# container runtime, lifecycle and pre-stop hooks, probes, security
# context, downward API, variable expansion, kubelet, sysctls, in-place
# resize), the volumes every pod has (emptyDir, configMap, secret,
# projected, downward API), image volumes, and what kubectl does with a
# pod (exec, attach, cp, logs, port-forward, debug), and host ports.
ci_focus='\[sig-node\] (Pods|PodOSRejection|Container Runtime|Container Lifecycle Hook|PreStop|Probing container|Security Context|Downward API|Variable Expansion|Kubelet|kubelet|Sysctls|ConfigMap|Secrets|Pod InPlace Resize|ImageVolume)|\[sig-storage\] (EmptyDir|ConfigMap|Secrets|Projected|Downward API)|\[sig-cli\] (Kubectl Port forwarding|Kubectl logs|Kubectl exec|Kubectl client (Simple pod|Kubectl copy|Update Demo)|kubectl debug)|\[sig-network\] HostPort '
# Less the probe specs that watch a container for minutes to see it is
# not restarted, and the 500 pod spec updates that only the API server
# and kubelet see: the full run has them.
ci_skip='should \*not\* be restarted|issue 500 podspec updates'
# Of e2e_node.test's own specs: what the runtime does for them (proc
# mounts, recursive read-only mounts, the FQDN hostname, static pods,
# metrics and the summary API, pod conditions, IPs and termination, the
# security context, image volumes, kubelet's cgroups) and the sidecar
# specs that change a container's image, which read the image back from
# the status; not the other 90 sidecar and init container lifecycle specs
# (kubelet's logic, 7 minutes a mode), which the full run has.
ci_node_focus='\[sig-node\] (ProcMount|DefaultProcMount|Mount recursive read-only|Hostname of Pod|MirrorPod|Summary API|ContainerMetrics|Pod conditions|Deleted pods|ImageVolume|Kubelet|Pod SIGKILL|Security Context|Terminate Pods|Containers Lifecycle .*(image changed after its liveness|updated with a new image|has its image updated after a failed liveness))|\[sig-network\] Pod (Host )?IPs'
# Of its serial specs: pinrt SIGKILLed six times under 100 pods, which
# must all stay running with their IPs, and the OOM score adjustments;
# not kubelet's garbage collection of dead containers (5 minutes a mode).
# In the userns mode only (3 minutes): the host mode's run is the full
# one's.
ci_serial_focus='\[sig-node\] (Restart Container Runtime Network should recover from ip leak|Container Manager Misc)'
ci_suites=
if [ "${PINRT_NODE_E2E_SUBSET:-}" = ci ] && [ -z "${PINRT_NODE_E2E_FOCUS:-}" ]; then
	export PINRT_NODE_E2E_FOCUS=$ci_focus PINRT_NODE_E2E_SKIP=${PINRT_NODE_E2E_SKIP:-$ci_skip}
	export PINRT_NODE_E2E_NODE_FOCUS=${PINRT_NODE_E2E_NODE_FOCUS:-$ci_node_focus}
	export PINRT_NODE_E2E_SERIAL_FOCUS=${PINRT_NODE_E2E_SERIAL_FOCUS:-$ci_serial_focus}
	ci_suites=1
	# A failed spec is run once more: one that then passes is named in
	# the summary as flaked; one that fails again fails the run.
	export PINRT_NODE_E2E_FLAKE_ATTEMPTS=${PINRT_NODE_E2E_FLAKE_ATTEMPTS:-2}
	# Measured at 4-5 minutes a mode; a hung suite must not eat CI's time.
	export PINRT_NODE_E2E_TIMEOUT=${PINRT_NODE_E2E_TIMEOUT:-20m}
fi
[ "$(id -u)" = 0 ] || { echo "node-e2e: needs root (kubelet, pinrt, namespaces, mounts)" >&2; exit 1; }

t0=$(date +%s)
dir=$(PINRT_K8S_CACHE=$cache bash "$here/build.sh" conformance)
work=$(mktemp -d /var/tmp/pinrt-node-e2e.XXXXXX)
regpid=
cleanup() {
	[ -n "$regpid" ] && kill "$regpid" 2>/dev/null && wait "$regpid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
out=${PINRT_NODE_E2E_OUT:-$work/out}

(cd "$repo" && CGO_ENABLED=0 go build -o "$work/pinrt" ./cmd/pinrt)
# The streaming exec helper goes beside pinrt, where the daemon looks for it.
(cd "$repo" && CGO_ENABLED=0 go build -o "$work/pinrt-exec" ./cmd/pinrt-exec)
# The signature policy helper (mode sigpolicy), a module of its own, goes
# beside pinrt, where the daemon looks for it.
(cd "$repo/cmd/pinrt-sigpolicy" && CGO_ENABLED=0 go build -tags containers_image_openpgp -o "$work/pinrt-sigpolicy" .)
# As the VM suites build it, so every suite shares the images' cache.
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$work/pinrt-standin" ./test/standin/cmd/pinrt-standin)
busybox=$(bash "$repo/test/standin/busybox.sh" "$cache")
images=$("$work/pinrt-standin" build -cache "$cache/standin" -set node-e2e -agnhost "$dir/agnhost" -busybox "$busybox")
# Port 0: the registry writes the address it got into its ready file.
"$work/pinrt-standin" serve -addr 127.0.0.1:0 -ready "$work/registry.ready" "$images" >"$work/registry.log" 2>&1 &
regpid=$!
for _ in $(seq 600); do
	[ -s "$work/registry.ready" ] && break
	kill -0 "$regpid" 2>/dev/null || { cat "$work/registry.log"; exit 1; }
	sleep 0.2
done
[ -s "$work/registry.ready" ] || { echo "node-e2e: the stand-in registry did not come up"; cat "$work/registry.log"; exit 1; }
"$work/pinrt-standin" mirrors -set node-e2e -addr "$(head -1 "$work/registry.ready")" >"$work/mirrors.toml"
(cd "$here" && go test -c -o "$work/k8snode.test" .)
# The harness's own tests (how the runs' reports are read, which suites a
# name picks, the service supervisor), checked before they are relied on:
# all but the nodes.
(cd "$here" && "$work/k8snode.test" -test.skip '^TestNode')
echo "node-e2e: built and ready in $(($(date +%s) - t0))s (Kubernetes binaries in $dir)"

status=0
summary=()
for mode in $modes; do
	test=TestNodeConformance
	suites=${PINRT_NODE_E2E_SUITES:-}
	case $mode in
	host)
		userns=0
		if [ -n "$ci_suites" ] && [ -z "$suites" ]; then suites="conformance.test e2e_node.test"; fi
		;;
	userns) userns=1 ;;
	sigpolicy) userns=0 test=TestNodeSignaturePolicy ;;
	checkpoint) userns=0 test=TestNodeCheckpoint ;;
	*) echo "node-e2e: unknown mode $mode (host, userns, sigpolicy, checkpoint)" >&2; exit 2 ;;
	esac
	start=$(date +%s)
	rc=0
	# The test reads node-e2e-skip.txt from its own directory.
	(cd "$here" && PINRT_NODE_E2E_DIR=$dir PINRT_NODE_E2E_USERNS=$userns PINRT_NODE_E2E_OUT=$out/$mode \
		PINRT_NODE_E2E_SUITES=$suites \
		PINRT_K8S_BINARY=$dir/k8s PINRT_K8S_PINRT=$work/pinrt PINRT_K8S_CGROUP_DRIVER=cgroupfs \
		PINRT_K8S_STANDIN_CONF=$work/mirrors.toml \
		"$work/k8snode.test" -test.v -test.timeout=180m -test.run "^$test\$") 2>&1 |
		tee "$work/$mode.log" || rc=$?
	# A failed test leaves the node's logs above; the lines that matter
	# are gathered at the end.
	line="node-e2e[$mode]: exit $rc in $(($(date +%s) - start))s"
	summary+=("$line" "$(grep -E 'node conformance \(|: [0-9]+ passed \([0-9]+ flaked\), [0-9]+ failed|: FAILED: |: FLAKED |: UNLISTED SKIP|ginkgo: (Ran|SUCCESS|FAIL)|pod unsigned: |kubelet.s archive: ' "$work/$mode.log" | sed 's/^ *[a-z_]*\.go:[0-9]*: /  /')")
	[ "$rc" -eq 0 ] || status=1
done
echo "node-e2e: ===== summary ($(($(date +%s) - t0))s in all; focus: ${PINRT_NODE_E2E_FOCUS:-all of [NodeConformance], SIG Node and SIG CLI, and the host port spec})"
printf '%s\n' "${summary[@]}"
exit $status
