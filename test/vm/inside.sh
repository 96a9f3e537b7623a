#!/bin/bash
# inside.sh runs in the guest, from pinrt-vm-test.service, with the host's
# share on /mnt/share. It runs the e2e test binary once per cgroup driver
# and leaves each run's output, exit code and duration in /mnt/share/out.
set -u
share=/mnt/share
out=$share/out
cut -d' ' -f1 /proc/uptime >"$out/booted"
# shellcheck source=/dev/null
. "$share/env"

install -m 0755 "$share/bin/runc" /usr/local/bin/runc
mkdir -p /opt/cni
ln -sfn "$share/cni" /opt/cni/bin
{
	echo "kernel $(uname -r); $(systemctl --version | head -1)"
	echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
} >"$out/guest-info"

# If systemd stops this unit under the tests (the VM then powers off with
# no result), leave the journal for run.sh to show.
trap 'journalctl -b --no-pager -n 300 >"$out/journal-on-term.log" 2>&1; sync; exit 143' TERM

cd /tmp
for d in $DRIVERS; do
	start=$(cut -d' ' -f1 /proc/uptime)
	PINRT_E2E_BINARY=$share/bin/pinrt PINRT_E2E_CGROUP_DRIVER=$d \
		"$share/bin/pinrt-e2e.test" -test.v -test.count="${COUNT:-1}" -test.timeout=40m \
		-test.run "$TESTS" -test.skip "$SKIP" >"$out/$d.log" 2>&1
	echo $? >"$out/$d.rc.tmp"
	end=$(cut -d' ' -f1 /proc/uptime)
	awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", b - a }' >"$out/$d.time"
	cat "$out/guest-info" >>"$out/$d.log"
	mv "$out/$d.rc.tmp" "$out/$d.rc"
done
sync
