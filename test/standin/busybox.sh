#!/bin/bash
# busybox.sh: build BusyBox 1.37.0 as the official busybox:1.37.0 image
# has it (upstream's defconfig: an ash that passes every environment
# variable through, as Kubernetes' ConfigMap and Secret environment specs
# need; "can't create" errors, as the read-only root specs expect), static,
# from Debian's copy of the upstream tarball, checked against a pinned
# SHA-256. Debian's own busybox builds patch ash to drop variables whose
# names are not shell identifiers (data-1), so they cannot stand in for
# it. Cached by version; prints the binary's path.
#
#   busybox.sh [CACHE]   CACHE defaults to $PINRT_VM_CACHE or /var/cache/pinrt-vm
set -euo pipefail
version=1.37.0
sha256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
url=http://deb.debian.org/debian/pool/main/b/busybox/busybox_$version.orig.tar.bz2
cache=${1:-${PINRT_VM_CACHE:-/var/cache/pinrt-vm}}
dir=$cache/busybox-$version-$(echo "$sha256 defconfig static no-tc" | sha256sum | cut -c1-8)
out=$dir/busybox
if [ ! -x "$out" ]; then
	mkdir -p "$dir"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	echo "busybox.sh: building BusyBox $version into $dir" >&2
	curl -fsS --retry 3 -m 120 -o "$work/src.tar.bz2" "$url"
	echo "$sha256  $work/src.tar.bz2" | sha256sum -c --quiet -
	tar -xjf "$work/src.tar.bz2" -C "$work"
	cd "$work/busybox-$version"
	make -s defconfig >/dev/null
	# Static, so the image needs no libraries; tc does not build against
	# the kernel headers of Debian 12, and no spec runs it.
	sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config
	make -s -j"$(nproc)" busybox >/dev/null 2>"$work/make.log" || { cat "$work/make.log" >&2; exit 1; }
	install -m 0755 busybox "$out.tmp"
	mv "$out.tmp" "$out"
fi
echo "$out"
