#!/bin/sh
# criu.sh installs CRIU, which runc drives for CheckpointContainer, at
# /usr/local/sbin/criu, unless that version is there already.
#
# Debian 12's criu (3.17) cannot run on the kernels pinrt meets (6.x: it
# fails to parse the vDSO), and 4.1 fails to dump any TCP socket on
# kernels from 6.16 (it asks SO_PASSCRED of inet sockets, which they no
# longer answer). 4.2.1 works on both; it is built here from Debian's own
# source tarball (the one its package is built from, pinned by digest),
# with Debian 12's libraries.
set -eu
version=4.2.1
sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
url=http://deb.debian.org/debian/pool/main/c/criu/criu_$version.orig.tar.xz
dest=/usr/local/sbin/criu

if "$dest" --version 2>/dev/null | grep -qx "Version: $version"; then
	exit 0
fi
echo "installing CRIU $version"
need=""
for p in build-essential pkgconf libbsd-dev libcap-dev libnet1-dev libnl-3-dev libnftables-dev libgnutls28-dev \
	libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev xz-utils curl iptables; do
	dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
	apt-get update -qq
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsS --retry 3 -o "$work/criu.tar.xz" "$url"
echo "$sha256  $work/criu.tar.xz" | sha256sum -c --quiet
mkdir "$work/src"
tar -xJf "$work/criu.tar.xz" -C "$work/src" --strip-components=1
make -C "$work/src" -j"$(nproc)" criu >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
install -D -m 0755 "$work/src/criu/criu" "$dest"
"$dest" --version
