#!/bin/bash
# inside.sh runs in the guest, from pinrt-vm-test.service, with the host's
# share on /mnt/share. It runs each suite (suites/*.sh) once per cgroup driver
# and leaves each run's output, exit code and duration in /mnt/share/out.
set -u
share=/mnt/share
out=$share/out
# run.sh names this boot's settings on the kernel command line.
envfile=env
for a in $(cat /proc/cmdline); do
	case $a in pinrt.env=*) envfile=${a#pinrt.env=} ;; esac
done
# shellcheck source=/dev/null
. "$share/$envfile"
cut -d' ' -f1 /proc/uptime >"$out/booted.$TAG"

install -m 0755 "$share/bin/runc" /usr/local/bin/runc
mkdir -p /opt/cni
ln -sfn "$share/cni" /opt/cni/bin
{
	echo "kernel $(uname -r); $(systemctl --version | head -1)"
	echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
} >"$out/guest-info.$TAG"

# If systemd stops this unit under the tests (the VM then powers off with
# no result), leave the journal for run.sh to show.
trap 'journalctl -b --no-pager -n 300 >"$out/journal-on-term.$TAG.log" 2>&1; sync; exit 143' TERM

# Each suite runs once per driver; a driver is done (out/DRIVER.done) when
# all its suites have left an exit code.
for d in $DRIVERS; do
	for s in $SUITES; do
		start=$(cut -d' ' -f1 /proc/uptime)
		(cd /tmp && bash "$share/suites/$s.sh" run "$d" "$share") >"$out/$d.$s.log" 2>&1
		echo $? >"$out/$d.$s.rc"
		end=$(cut -d' ' -f1 /proc/uptime)
		awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", b - a }' >"$out/$d.$s.time"
	done
	touch "$out/$d.done"
done
sync
