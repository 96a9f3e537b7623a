#!/usr/bin/env bash
# run.sh — the standard pinrt benchmark set (what `make bench` runs).
#
# Starts bin/pinrt on a private root/runroot with its own CNI bridge, serves
# a busybox test image from an in-process registry, runs the standard
# scenarios with bin/pinrt-bench, prints every table and keeps the JSON in
# bench/out/<timestamp>/. Everything it creates (pods, mounts, the bridge,
# the temp dir) is removed on exit, also after a failure or Ctrl-C.
#
# Needs root and a machine prepared by `make deps` (runc, conmon, CNI
# plugins in /opt/cni/bin, busybox-static).
#
# Environment:
#   BENCH_N=200               pods per sandbox/pod scenario
#   BENCH_P=8                 parallelism of the parallel runs (P=1 always runs too)
#   BENCH_DENSITY_N=100       pods kept alive by density
#   BENCH_IDLE=60s            density: window over which the runtime's idle CPU is measured
#   BENCH_EXEC_N=             exec: ExecSync calls (default: BENCH_N if set, else 100)
#   BENCH_EXEC_STREAMS=100    exec: streaming Execs, whose p50 is the Exec(stream) headline
#   BENCH_RESTORE_N=100       pods alive across the restore restart
#   BENCH_STATUS_N=100        status: running pods whose status is read
#   BENCH_STATUS_CONTAINERS=1 status: containers in each; BENCH_STATUS_ROUNDS=5 rounds of reads
#   BENCH_PULL_N=3            pull: pulls of the generated 345 MB image (kept in /var/tmp/pinrt-bench-pull)
#   BENCH_PULL_MBPS=125       pull: the registry's bandwidth in MB/s (125: a 1 Gbit/s link; 0: unlimited)
#   BENCH_PULL_SCALE=1        pull: image size relative to the 345 MB
#   BENCH_PULL_SETTLE=0s      pull: wait this long after each removal (with BENCH_ROOT_FS=host)
#   BENCH_ROOT_FS=ext4        the daemon's root on a fresh journaled ext4 in a file (host: on /tmp's fs)
#   BENCH_ROOT_FS_SIZE=32G    that file's (sparse) size
#   BENCH_RESTORE_CONTAINERS= set to 1 to give each restore pod a container
#   BENCH_ALLOW_ERRORS=       set to 1 to exit 0 even when scenarios had errors
#   BENCH_BRIDGE=pbench0      bridge name; BENCH_SUBNET=10.200.0.0/16
#   BENCH_TIMEOUT=60s         per-RPC timeout
#   PINRT_BIN=bin/pinrt       the daemon binary to benchmark
#   BENCH_SCENARIOS=          space-separated subset to run, e.g. "sandbox-netns-p1
#                             sandbox-userns-p8" (names as in the summary; empty: all)
#   BENCH_NRI=1               0 disables NRI (its socket is always in the temp dir)
#   BENCH_PPROF=             host:port: serve pinrt's /debug/pprof there while the bench runs
#   BENCH_LOG_LEVEL=debug     pinrt's log level; at debug pinrt logs the phase timings
#                             (namespaces, cni_add, state, cni_del, unpin) the tables show
#   BENCH_CONTAINERD=1        compare with containerd (Debian's package, make deps-bench):
#                             1 requires it, 0 skips the comparison
#   BENCH_COMPARE_ROUNDS=2    comparison rounds, each containerd then pinrt (A B A B)
#   BENCH_NODE_PODS=110       compare-node: pods (kubelet's default maximum) ...
#   BENCH_NODE_CONTAINERS=2   ... and containers in each
#   BENCH_CTD_BRIDGE=cbench0  containerd's bridge; BENCH_CTD_SUBNET=10.201.0.0/16
#
# The daemon runs in its own cgroup (cgroup v1 cpuacct or v2), and every
# scenario reports the CPU time of the daemon and all it started (namespace
# helper, CNI plugins, runc, conmon) per pod: cpu_ms_per_pod; and, counted
# through the kernel's process events connector, the processes it started
# per pod (procs_per_pod) and the commands it ran (execs_per_pod.<cmd>).
#
# Then containerd, the anchor: Debian's containerd with its CRI plugin, on
# its own socket, root and state directories (in the same filesystem as
# pinrt's), its own bridge, the same runc and CNI plugins and the same
# images, in a cgroup of its own. The compare-* scenarios run the sandbox,
# pod, node (kubelet's 110 pods with two containers), exec and pull scenarios
# on both, containerd then pinrt, alternately, and print pinrt/containerd.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$REPO/bin
PINRT=${PINRT_BIN:-$BIN/pinrt}
N=${BENCH_N:-200}
PAR=${BENCH_P:-8}
DENSITY_N=${BENCH_DENSITY_N:-100}
IDLE=${BENCH_IDLE:-60s}
EXEC_N=${BENCH_EXEC_N:-${BENCH_N:-100}}
EXEC_STREAMS=${BENCH_EXEC_STREAMS:-100}
RESTORE_N=${BENCH_RESTORE_N:-100}
STATUS_N=${BENCH_STATUS_N:-100}
PULL_N=${BENCH_PULL_N:-3}
PULL_MBPS=${BENCH_PULL_MBPS:-125}
PULL_SCALE=${BENCH_PULL_SCALE:-1}
PULL_SETTLE=${BENCH_PULL_SETTLE:-0s}
BRIDGE=${BENCH_BRIDGE:-pbench0}
SUBNET=${BENCH_SUBNET:-10.200.0.0/16}
CONTAINERD=${BENCH_CONTAINERD:-1}
ROUNDS=${BENCH_COMPARE_ROUNDS:-2}
NODE_PODS=${BENCH_NODE_PODS:-110}
NODE_CONTAINERS=${BENCH_NODE_CONTAINERS:-2}
CTD_BRIDGE=${BENCH_CTD_BRIDGE:-cbench0}
CTD_SUBNET=${BENCH_CTD_SUBNET:-10.201.0.0/16}
TIMEOUT=${BENCH_TIMEOUT:-60s}
SCENARIOS=${BENCH_SCENARIOS:-}
LOG_LEVEL=${BENCH_LOG_LEVEL:-debug}

log() { echo "run.sh: $*" >&2; }
die() { log "$*"; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (pinrt creates namespaces, mounts and a bridge)"
for f in "$PINRT" "$BIN/pinrt-bench"; do
	[ -x "$f" ] || die "$f missing; run 'make build' (make bench does)"
done
[ -x /opt/cni/bin/bridge ] && [ -x /opt/cni/bin/host-local ] || die "CNI plugins missing in /opt/cni/bin; run 'make deps'"
[ -x /bin/busybox ] || die "/bin/busybox missing; install busybox-static ('make deps')"
# Refuse to touch a bridge or subnet someone else uses: cleanup deletes the
# bridge, and an overlapping route would break the host's networking.
ip link show "$BRIDGE" >/dev/null 2>&1 && die "interface $BRIDGE already exists; set BENCH_BRIDGE"
ip -4 route show to match "${SUBNET%/*}" | grep -qv '^default' && die "a route already covers $SUBNET; set BENCH_SUBNET"
case $CONTAINERD in
1)
	for b in containerd containerd-shim-runc-v2; do
		command -v "$b" >/dev/null || die "$b missing: make deps-bench installs Debian's containerd (BENCH_CONTAINERD=0 runs without the comparison)"
	done
	ip link show "$CTD_BRIDGE" >/dev/null 2>&1 && die "interface $CTD_BRIDGE already exists; set BENCH_CTD_BRIDGE"
	ip -4 route show to match "${CTD_SUBNET%/*}" | grep -qv '^default' && die "a route already covers $CTD_SUBNET; set BENCH_CTD_SUBNET"
	;;
0) ;;
*) die "BENCH_CONTAINERD: 1 or 0, not $CONTAINERD" ;;
esac

TMP=$(mktemp -d /tmp/pinrt-bench.XXXXXX)
OUT=$REPO/bench/out/$(date +%Y%m%d-%H%M%S)
SOCK=$TMP/run/pinrt.sock
PIDFILE=$TMP/pinrt.pid
PINRT_LOG=$TMP/pinrt.log
REG_PID=
CTD=$TMP/containerd
CTD_SOCK=$CTD/containerd.sock
CTD_PIDFILE=$CTD/containerd.pid
# The daemon's cgroup, for its CPU accounting: cgroup v2 if the unified
# hierarchy is mounted, else v1's cpuacct controller.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	CGROUP=/sys/fs/cgroup/pinrt-bench-$$
elif [ -d /sys/fs/cgroup/cpuacct ]; then
	CGROUP=/sys/fs/cgroup/cpuacct/pinrt-bench-$$
else
	CGROUP=/sys/fs/cgroup/cpu,cpuacct/pinrt-bench-$$
fi
mkdir "$CGROUP" || die "cannot create cgroup $CGROUP"
CTD_CGROUP=${CGROUP%-$$}-containerd-$$
# containerd puts pods without a cgroup parent under k8s.io; cleanup
# removes the k8s.io directories it made, never one that was there.
CTD_K8SIO_BEFORE=$(ls -d /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io 2>/dev/null)
# containerd 1.6's shims put their sockets in /run/containerd/s whatever
# the state directory: removed after, unless it was there before.
CTD_RUN_BEFORE=$(ls -d /run/containerd 2>/dev/null)
[ "$CONTAINERD" = 1 ] && { mkdir "$CTD_CGROUP" || die "cannot create cgroup $CTD_CGROUP"; }
mkdir -p "$TMP/fs" "$TMP/run" "$TMP/cni/net.d" "$TMP/cni/ipam" "$TMP/logs" "$TMP/conf.d" "$OUT"
: >"$TMP/pinrt.toml"
# NRI and CDI look in the temp dir, never at the host's /var/run/nri or
# /etc/cdi. BENCH_NRI=0 runs with NRI disabled, to compare. A pinrt older
# than NRI (issue 22's starting commit, say) refuses the keys: it gets none.
if "$PINRT" config --default 2>/dev/null | grep -q '^\[nri\]'; then
cat >"$TMP/conf.d/50-nri-cdi.toml" <<EOF
[nri]
enable = $([ "${BENCH_NRI:-1}" = 0 ] && echo false || echo true)
socket_path = "$TMP/nri/nri.sock"
plugin_path = "$TMP/nri/plugins"
plugin_config_path = "$TMP/nri/conf.d"
[cdi]
spec_dirs = ["$TMP/cdi"]
EOF
fi
# BENCH_PPROF=127.0.0.1:6061 serves pinrt's /debug/pprof there, to profile
# a scenario while it runs.
if [ -n "${BENCH_PPROF:-}" ]; then
	printf '[metrics]\naddress = "%s"\nenable_pprof = true\n' "$BENCH_PPROF" >"$TMP/conf.d/60-pprof.toml"
fi

# Stop pinrt: TERM, then KILL after 10s. Works for a daemon started by the
# restart helper too, since both go through the pid file.
stop_pinrt() {
	local pid
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 0
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && return 0
		sleep 0.1
	done
	log "pinrt $pid ignored SIGTERM; killing"
	kill -KILL "$pid" 2>/dev/null
}

# write_conflist FILE NAME BRIDGE SUBNET IPAM_DIR: a bridge network with
# host-local IPAM in IPAM_DIR, no ipMasq and no portmap, so the host's
# firewall is never touched.
write_conflist() {
	cat >"$1" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$2",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$3",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$5",
        "ranges": [[{ "subnet": "$4" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
EOF
}

# wait_socket WHAT SOCKET ALIVE LOG: wait up to 30 s for the daemon WHAT
# to create SOCKET while the function ALIVE says it runs; else show LOG.
wait_socket() {
	for _ in $(seq 300); do
		[ -S "$2" ] && return 0
		"$3" || break
		sleep 0.1
	done
	log "$1 did not create $2; last log lines:"
	tail -n 20 "$4" >&2
	return 1
}

ctd_alive() {
	local pid
	pid=$(cat "$CTD_PIDFILE" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}

# Stop containerd (TERM, KILL after 10 s) and the shims it left in its
# cgroup (with their pods removed first, there are none).
stop_containerd() {
	local pid p
	pid=$(cat "$CTD_PIDFILE" 2>/dev/null) || return 0
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null
	fi
	if [ -f "$CTD_CGROUP/cgroup.procs" ]; then
		while read -r p; do kill -KILL "$p" 2>/dev/null; done <"$CTD_CGROUP/cgroup.procs"
	fi
}

# containerd's configuration: everything under $CTD or the shared ext4,
# network namespaces in its state directory, runc's state in $CTD/runc;
# the sandbox image is the test registry's pause image. This host lacks
# CAP_SYS_RESOURCE: restrict_oom_score_adj. containerd speaks plain HTTP
# to a registry on 127.0.0.1 by itself.
write_containerd_config() {
	mkdir -p "$CTD/state" "$CTD/opt" "$CTD/runc" "$CTD/net.d" "$CTD/ipam" "$CTD/certs.d"
	cat >"$CTD/config.toml" <<EOF
version = 2
root = "$TMP/fs/containerd"
state = "$CTD/state"
[grpc]
  address = "$CTD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$CTD/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$1"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$CTD/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "$CTD/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CTD/certs.d"
EOF
	# The same network as pinrt's on a bridge of its own; containerd adds
	# the loopback plugin itself.
	write_conflist "$CTD/net.d/10-cbench.conflist" cbench "$CTD_BRIDGE" "$CTD_SUBNET" "$CTD/ipam"
}

start_containerd() {
	write_containerd_config "$1"
	sh -c 'echo $$ >"$1/cgroup.procs" && exec setsid containerd --config "$2" --log-level warn' sh \
		"$CTD_CGROUP" "$CTD/config.toml" >>"$CTD/containerd.log" 2>&1 </dev/null &
	echo $! >"$CTD_PIDFILE"
	wait_socket containerd "$CTD_SOCK" ctd_alive "$CTD/containerd.log"
}

cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	log "cleaning up"
	if pinrt_alive; then
		"$BIN/pinrt-bench" cleanup --endpoint "unix://$SOCK" --all --timeout 20s >&2
	fi
	stop_pinrt
	if ctd_alive; then
		"$BIN/pinrt-bench" cleanup --endpoint "unix://$CTD_SOCK" --all --timeout 20s >&2
	fi
	stop_containerd
	[ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null && wait "$REG_PID" 2>/dev/null
	# Containers whose daemon died cannot be removed through CRI; the OCI
	# runtime's state under our runroot still knows them.
	for root in "$TMP"/run/runtime/* "$CTD"/runc/*; do
		[ -d "$root" ] || continue
		for id in $(runc --root "$root" list -q 2>/dev/null); do
			runc --root "$root" delete -f "$id" >/dev/null 2>&1
		done
	done
	# Namespace pins and rootfs mounts left under the temp dir, deepest
	# first; lazy so a busy mount cannot keep the temp dir alive.
	awk -v t="$TMP" '$5 == t || index($5, t "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || log "could not unmount $m"; done
	ip link del "$BRIDGE" 2>/dev/null
	ip link del "$CTD_BRIDGE" 2>/dev/null
	# Leftover processes (a conmon or a shim whose daemon died) go back to
	# the root cgroup so that ours can be removed.
	if [ "$CONTAINERD" = 1 ] && [ -z "$CTD_RUN_BEFORE" ]; then
		rmdir /run/containerd/s /run/containerd 2>/dev/null
	fi
	for cg in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do
		[ "$CONTAINERD" = 1 ] && [ -d "$cg" ] || continue
		grep -qxF "$cg" <<<"$CTD_K8SIO_BEFORE" || rmdir "$cg" 2>/dev/null || log "could not remove cgroup $cg"
	done
	for cg in "$CGROUP" "$CTD_CGROUP"; do
		[ -d "$cg" ] || continue
		while read -r p; do echo "$p" >"$(dirname "$cg")/cgroup.procs" 2>/dev/null; done <"$cg/cgroup.procs"
		rmdir "$cg" 2>/dev/null || log "could not remove cgroup $cg"
	done
	if [ -s "$PINRT_LOG" ]; then
		cp "$PINRT_LOG" "$OUT/pinrt.log" 2>/dev/null
	fi
	if [ -s "$CTD/containerd.log" ]; then
		cp "$CTD/containerd.log" "$OUT/containerd.log" 2>/dev/null
	fi
	rm -rf "$TMP" || log "could not remove $TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The daemon's root (images, layers, bundles) is a fresh ext4 with a
# journal, in a file on the same disk, as on a node. The hosts this runs
# on often have a journal-less ext4 root, whose inode allocator skips, and
# rescans for every new inode, each inode freed in the last 60 s (360 s
# while its inode table block is dirty): a pull of 20 000 files minutes
# after the removal of as many took 14 s instead of 1.8 s, whoever pulled.
# BENCH_ROOT_FS=host keeps the root on the temp dir's filesystem.
# containerd's root is a sibling of pinrt's on the same filesystem.
case ${BENCH_ROOT_FS:-ext4} in
ext4)
	truncate -s "${BENCH_ROOT_FS_SIZE:-32G}" "$TMP/root.img" &&
		mkfs.ext4 -q -F "$TMP/root.img" &&
		mount -o loop "$TMP/root.img" "$TMP/fs" ||
		die "cannot make an ext4 root in $TMP/root.img (BENCH_ROOT_FS=host runs without)"
	;;
host) ;;
*) die "BENCH_ROOT_FS: ext4 or host, not ${BENCH_ROOT_FS}" ;;
esac
mkdir -p "$TMP/fs/pinrt" "$TMP/fs/containerd"

pinrt_alive() {
	local pid
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}

# The CNI network: our own bridge and subnet, IPAM state inside the temp
# dir, no ipMasq and no portmap so the host's firewall is never touched.
# loopback is not listed: pinrt brings lo up itself.
write_conflist "$TMP/cni/net.d/10-pbench.conflist" pbench "$BRIDGE" "$SUBNET" "$TMP/cni/ipam"

# The command that (re)starts pinrt, shared by the first start and the
# restore scenario's restart. setsid and /dev/null stdin detach it from the
# caller, so `sh -c` in pinrt-bench returns at once.
cat >"$TMP/start-pinrt.sh" <<EOF
#!/bin/sh
echo \$\$ >"$CGROUP/cgroup.procs" || exit 1
setsid "$PINRT" --config "$TMP/pinrt.toml" --config-dir "$TMP/conf.d" \\
	--root "$TMP/fs/pinrt" --runroot "$TMP/run" --listen "$SOCK" \\
	--cni-config-dir "$TMP/cni/net.d" --cni-plugin-dir /opt/cni/bin \\
	--log-level "\${PINRT_LOG_LEVEL:-$LOG_LEVEL}" >>"$PINRT_LOG" 2>&1 </dev/null &
echo \$! >"$PIDFILE"
EOF
# restart: SIGKILL (no graceful shutdown: the point is that a crash loses
# nothing), wait until the process is gone, start again.
cat >"$TMP/restart-pinrt.sh" <<EOF
#!/bin/sh
pid=\$(cat "$PIDFILE")
kill -KILL "\$pid"
i=0
while [ -e /proc/\$pid ] && ! grep -q '^State:.*Z' /proc/\$pid/status 2>/dev/null && [ \$i -lt 500 ]; do
	sleep 0.01; i=\$((i+1))
done
exec sh "$TMP/start-pinrt.sh"
EOF

start_pinrt() {
	rm -f "$SOCK"
	sh "$TMP/start-pinrt.sh"
	wait_socket pinrt "$SOCK" pinrt_alive "$PINRT_LOG"
}

log "temp dir $TMP, results in $OUT"
start_pinrt || exit 1

"$BIN/pinrt-bench" registry --listen 127.0.0.1:0 --addr-file "$TMP/registry.addr" >"$TMP/registry.log" 2>&1 &
REG_PID=$!
for _ in $(seq 100); do
	[ -s "$TMP/registry.addr" ] && break
	kill -0 "$REG_PID" 2>/dev/null || break
	sleep 0.1
done
[ -s "$TMP/registry.addr" ] || { cat "$TMP/registry.log" >&2; die "test registry did not start"; }
IMAGE=$(cat "$TMP/registry.addr")/bench/busybox:latest
log "test image $IMAGE"
if [ "$CONTAINERD" = 1 ]; then
	start_containerd "$(cat "$TMP/registry.addr")/bench/pause:latest" || die "containerd does not start"
	log "containerd $(containerd --version | awk '{print $3}') on $CTD_SOCK"
fi

SUMMARY=()
FAILED=0

# run_bench NAME ARGS...: one scenario; its table goes to stdout and
# $OUT/NAME.txt, its JSON to $OUT/NAME.json. Failures are recorded and the
# next scenario still runs on a clean runtime.
run_bench() {
	local name=$1 rc last
	shift
	if [ -n "$SCENARIOS" ] && ! [[ " $SCENARIOS " == *" $name "* ]]; then
		return
	fi
	if ! pinrt_alive; then
		log "pinrt is not running (crashed?); restarting it before $name"
		SUMMARY+=("$(printf '%-22s %s' "$name" "pinrt had died before this scenario; restarted")")
		FAILED=$((FAILED + 1))
		start_pinrt || { SUMMARY+=("$(printf '%-22s %s' "$name" "SKIPPED: pinrt does not start")"); return; }
	fi
	echo
	echo "### $name"
	"$BIN/pinrt-bench" "$@" --endpoint "unix://$SOCK" --timeout "$TIMEOUT" --log-dir "$TMP/logs" \
		--cgroup "$CGROUP" --daemon-log "$PINRT_LOG" --pid-file "$PIDFILE" --out "$OUT/$name.json" | tee "$OUT/$name.txt"
	rc=${PIPESTATUS[0]}
	last=$(tail -n 1 "$OUT/$name.txt")
	case $last in RESULT:*) ;; *) last="RESULT: tool failed (exit $rc)" ;; esac
	# The headline numbers: lifecycle pods/s, RunPodSandbox p50, pod to
	# Running p50, CPU per pod (daemon and all it started).
	key=$(awk '
		/^(sandbox|pod) end to end / { k = k " pods/s=" $NF }
		/^RunPodSandbox / { k = k " RunPodSandbox-p50=" $4 }
		/^pod to Running / { k = k " pod-to-Running-p50=" $6 }
		/^cpu_ms_per_pod = / { k = k " cpu/pod=" $3 "ms" }
		/^ExecSync / { k = k " ExecSync-p50=" $4 }
		/^Exec\(stream\) / { k = k " Exec(stream)-p50=" $4 }
		/^portforward_mb_per_s = / { k = k " port-forward=" $3 "MB/s" }
		/^idle_cpu_ms_per_min = / { k = k " idle-cpu=" $3 "ms/min" }
		/^ContainerStatus +[0-9]/ { k = k " ContainerStatus-p50=" $4 }
		/^ListContainers +[0-9]/ { k = k " ListContainers-p50=" $4 }
		/^ListContainers floor / { k = k " (floor " $5 ")" }
		/^status_procs_started = / { k = k " status-procs=" $3 }
		/^procs_per_pod = / { k = k " procs/pod=" $3 }
		/^PullImage +[0-9]/ { k = k " PullImage-p50=" $4 }
		/^download / { k = k " download-p50=" $6 }
		/^pull_over_download = / { k = k " pull/download=" $3 }
		END { print k }' "$OUT/$name.txt")
	SUMMARY+=("$(printf '%-22s %s%s' "$name" "$last" "$key")")
	[ "$rc" = 0 ] || FAILED=$((FAILED + 1))
	# A failed scenario may leave pods behind; don't let them skew the next.
	if pinrt_alive; then
		"$BIN/pinrt-bench" cleanup --endpoint "unix://$SOCK" --all --timeout 20s >/dev/null 2>"$TMP/cleanup.err" ||
			{ log "cleanup after $name had errors:"; head -n 5 "$TMP/cleanup.err" >&2; }
	fi
}

for v in netns userns; do
	run_bench "sandbox-$v-p1" sandbox --variant "$v" -n "$N" -p 1
	run_bench "sandbox-$v-p$PAR" sandbox --variant "$v" -n "$N" -p "$PAR"
done
run_bench "pod-p1" pod -n "$N" -p 1 --image "$IMAGE"
run_bench "pod-p$PAR" pod -n "$N" -p "$PAR" --image "$IMAGE"
# ContainerStatus (plain and verbose) and ListContainers with
# BENCH_STATUS_N pods running, one call at a time; status_procs_started
# counts the processes the runtime started meanwhile (want 0).
run_bench "status" status -n "$STATUS_N" --containers "${BENCH_STATUS_CONTAINERS:-1}" -p "$PAR" --image "$IMAGE" --stats-rounds "${BENCH_STATUS_ROUNDS:-5}"
# ExecSync and streaming Exec (client-go SPDY) of "echo hi" in one pod;
# --streams, because the tool's default is a tenth of -n.
run_bench "exec" exec -n "$EXEC_N" --streams "$EXEC_STREAMS" --image "$IMAGE"
# Reading 64 MiB three times through PortForward (client-go SPDY), MB/s.
run_bench "portforward" portforward --image "$IMAGE" --forward-mb 64 --streams 3
# density also measures the runtime's CPU while its pods idle (ms/min) and
# times ListContainerStats/ListPodSandboxStats with its pods up.
run_bench "density" density -n "$DENSITY_N" -p "$PAR" --image "$IMAGE" --stats-rounds 20 --idle "$IDLE"
restore_args=()
[ "${BENCH_RESTORE_CONTAINERS:-}" = 1 ] && restore_args=(--with-containers --image "$IMAGE")
run_bench "restore" restore -n "$RESTORE_N" -p "$PAR" --restart-cmd "sh $TMP/restart-pinrt.sh" "${restore_args[@]}"

# Pulls of issue 22's image (3 gzip layers: 300 MB of binary data, 20 000
# small files, 74 MB of executables) from a local registry limited to
# BENCH_PULL_MBPS, against the download of its blobs alone.
run_bench "pull" pull -n "$PULL_N" --limit-mbps "$PULL_MBPS" --scale "$PULL_SCALE" --pull-settle "$PULL_SETTLE"

# The image pull path on its own, in process: a cold pull of a 10-layer,
# 200 MB image (MB/s, download and unpack seconds).
if [ -z "$SCENARIOS" ] || [[ " $SCENARIOS " == *" image-cold-pull "* ]]; then
echo
echo "### image-cold-pull"
(cd "$REPO" && "${GO:-go}" test -run '^$' -bench BenchmarkColdPull ./image/) 2>&1 | grep -v 'level=' | tee "$OUT/image-cold-pull.txt"
if [ "${PIPESTATUS[0]}" = 0 ]; then
	SUMMARY+=("$(printf '%-22s %s' image-cold-pull "$(grep -m1 '^BenchmarkColdPull' "$OUT/image-cold-pull.txt")")")
else
	SUMMARY+=("$(printf '%-22s %s' image-cold-pull "RESULT: go test failed")")
	FAILED=$((FAILED + 1))
fi
fi

# run_compare NAME ARGS...: one scenario on containerd (A) and pinrt (B)
# alternately, BENCH_COMPARE_ROUNDS rounds; its tables and the ratios
# pinrt/containerd go to stdout and $OUT/NAME.txt, the headline ratios to
# the summary.
run_compare() {
	local name=$1 rc last key
	shift
	[ "$CONTAINERD" = 1 ] || return
	if [ -n "$SCENARIOS" ] && ! [[ " $SCENARIOS " == *" $name "* ]]; then
		return
	fi
	if ! pinrt_alive || ! ctd_alive; then
		SUMMARY+=("$(printf '%-22s %s' "$name" "SKIPPED: pinrt or containerd is not running")")
		FAILED=$((FAILED + 1))
		return
	fi
	echo
	echo "### $name (A: containerd, B: pinrt, B/A: pinrt/containerd)"
	"$BIN/pinrt-bench" "$@" --endpoint "unix://$CTD_SOCK" --cgroup "$CTD_CGROUP" --pid-file "$CTD_PIDFILE" \
		--compare "unix://$SOCK" --cgroup-b "$CGROUP" --pid-file-b "$PIDFILE" --rounds "$ROUNDS" \
		--timeout "$TIMEOUT" --log-dir "$TMP/logs" | tee "$OUT/$name.txt"
	rc=${PIPESTATUS[0]}
	# From the comparison table: "OPERATION p50 ms A B B/A" (operation
	# names have spaces) and "metric A B B/A".
	key=$(awk '
		/^== compare / { on = 1; next }
		!on { next }
		NF >= 5 && $(NF-3) == "ms" && ($(NF-4) == "p50" || $(NF-4) == "p99") {
			op = $1
			for (i = 2; i <= NF - 5; i++) op = op "_" $i
			if (op ~ /^(pod_end_to_end|sandbox_end_to_end|RunPodSandbox|CreateContainer|StartContainer|StopContainer|RemoveContainer|StopPodSandbox|ContainerStatus|ListContainers|ListPodSandbox|ListContainerStats|PullImage|ContainerStatus_floor|ListContainers_floor|ListContainerStats_floor|ExecSync|Exec\(stream\))$/)
				k = k " " op "-" $(NF-4) "=" $NF
		}
		NF == 4 && $1 ~ /^(cpu_ms_per_pod|runtime_pss_kib|daemon_rss_kib|teardown_wall_ms|portforward_mb_per_s)$/ { k = k " " $1 "=" $NF }
		END { print k }' "$OUT/$name.txt")
	last="RESULT: ok"
	[ "$rc" = 0 ] || last="RESULT: errors (exit $rc)"
	SUMMARY+=("$(printf '%-22s %s (pinrt/containerd)%s' "$name" "$last" "$key")")
	[ "$rc" = 0 ] || FAILED=$((FAILED + 1))
	local ep
	for ep in "$CTD_SOCK" "$SOCK"; do
		"$BIN/pinrt-bench" cleanup --endpoint "unix://$ep" --all --timeout 20s >/dev/null 2>"$TMP/cleanup.err" ||
			{ log "cleanup after $name had errors:"; head -n 5 "$TMP/cleanup.err" >&2; }
	done
}

# containerd against pinrt, the same scenarios alternated. pinrt runs at
# the info log level for them, as containerd at its default (at debug,
# pinrt writes a line per request: a cost of the phase timings above, not
# of a node). The sandbox image is pulled once first, as a node has it.
if [ "$CONTAINERD" = 1 ] && { [ -z "$SCENARIOS" ] || [[ $SCENARIOS == *compare-* ]]; }; then
	if [ "$LOG_LEVEL" = debug ] || [ "$LOG_LEVEL" = trace ]; then
		stop_pinrt
		PINRT_LOG_LEVEL=info start_pinrt || die "pinrt does not restart"
	fi
	"$BIN/pinrt-bench" sandbox -n 1 --endpoint "unix://$CTD_SOCK" --timeout 5m >"$TMP/ctd-warmup.txt" 2>&1 ||
		{ cat "$TMP/ctd-warmup.txt" >&2; log "containerd cannot run a pod"; FAILED=$((FAILED + 1)); }
fi
run_compare compare-sandbox sandbox --variant netns -n "$N" -p 1
run_compare compare-pod pod -n "$N" -p 1 --image "$IMAGE"
# The same pods stopped as kubelet stops them: SIGTERM, a 30 s grace
# period, a container that exits on it.
run_compare compare-pod-graceful pod -n "$N" -p 1 --image "$IMAGE" --graceful
# kubelet's default node: 110 pods, here with two containers each,
# statuses and lists read one call at a time, memory of the daemon and
# its monitors, then everything removed (teardown_wall_ms).
run_compare compare-node status -n "$NODE_PODS" --containers "$NODE_CONTAINERS" -p "$PAR" --image "$IMAGE" --stats-rounds 20
# ExecSync and streaming Exec in one pod, as kubelet's probes and
# kubectl exec make them.
run_compare compare-exec exec -n "$EXEC_N" --streams "$EXEC_STREAMS" --image "$IMAGE"
# kubectl port-forward's path: 64 MiB read three times through one
# forward, over SPDY.
run_compare compare-portforward portforward --image "$IMAGE" --forward-mb 64 --streams 3
run_compare compare-pull pull -n "$PULL_N" --limit-mbps "$PULL_MBPS" --scale "$PULL_SCALE" --pull-settle "$PULL_SETTLE"

echo
echo "### summary (JSON and tables in $OUT)"
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" -gt 0 ]; then
	if [ "${BENCH_ALLOW_ERRORS:-}" = 1 ]; then
		echo "BENCH: $FAILED scenario(s) had errors (allowed by BENCH_ALLOW_ERRORS=1)"
		exit 0
	fi
	echo "BENCH: $FAILED scenario(s) had errors"
	exit 1
fi
echo "BENCH: ok"
