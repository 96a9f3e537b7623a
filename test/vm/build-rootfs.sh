#!/bin/bash
# build-rootfs.sh OUTDIR: builds the test VM's disk image, kernel and initrd
# into OUTDIR (rootfs.img, vmlinuz, initrd.img). run.sh calls it only when
# the cache entry for the hash of this file is missing, so edits here
# rebuild the image and nothing else does.
#
# The guest is Debian bookworm with the kernel from bookworm-backports: the
# e2e tests need idmapped tmpfs and overlay mounts, which arrived in 6.3,
# and bookworm itself ships 6.1.
set -euo pipefail

out=${1:?usage: build-rootfs.sh OUTDIR}
# The same mirror the host's apt uses (the only one this network reaches).
mirror=${PINRT_VM_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
pkgs=systemd,systemd-sysv,dbus,udev,kmod,conmon,iptables,iproute2,busybox-static,libseccomp2,tar,gzip,zstd,ca-certificates,procps

work=$(mktemp -d /var/tmp/pinrt-vm-build.XXXXXX)
root=$work/root
cleanup() {
	for m in dev/pts dev proc sys; do umount -l "$root/$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

echo "vm: debootstrap $suite from $mirror"
debootstrap --variant=minbase --include="$pkgs" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -50 "$work/debootstrap.log"; exit 1; }

cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror $suite main
deb $mirror $suite-backports main
SRC
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
echo "vm: installing the backports kernel"
chroot "$root" /bin/sh -ec '
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends -t bookworm-backports linux-image-amd64 initramfs-tools >/dev/null
	apt-get clean
	rm -rf /var/lib/apt/lists/*
'
for m in dev/pts dev proc sys; do umount -l "$root/$m"; done

# The guest: root on /dev/vda, the host's share on /mnt/share, no network,
# and one oneshot unit that runs the share's inner script and powers off.
echo pinrt-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 pinrt-vm\n' >"$root/etc/hosts"
cat >"$root/etc/fstab" <<'FSTAB'
/dev/vda / ext4 rw,errors=remount-ro 0 1
share /mnt/share 9p trans=virtio,version=9p2000.L,msize=1048576,nofail 0 0
FSTAB
mkdir -p "$root/mnt/share"
printf '9p\n9pnet_virtio\n' >"$root/etc/modules-load.d/9p.conf"
cat >"$root/etc/systemd/system/pinrt-vm-test.service" <<'UNIT'
[Unit]
Description=pinrt VM test run
Requires=mnt-share.mount dbus.service
After=mnt-share.mount dbus.service multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/bash /mnt/share/inside.sh
ExecStopPost=/bin/systemctl --no-block poweroff
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/pinrt-vm-test.service "$root/etc/systemd/system/multi-user.target.wants/pinrt-vm-test.service"
# Nothing in the guest needs these, and under TCG every unit costs boot time.
for u in systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
	ln -sf /dev/null "$root/etc/systemd/system/$u"
done
chroot "$root" passwd -d root >/dev/null

cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
rm -f "$root"/boot/initrd.img-* # the image needs no copy of it
truncate -s 6G "$work/rootfs.img"
mkfs.ext4 -q -F -L pinrt-vm -d "$root" "$work/rootfs.img"

mkdir -p "$out"
mv "$work/vmlinuz" "$work/initrd.img" "$work/rootfs.img" "$out/"
echo "vm: image ready in $out"
