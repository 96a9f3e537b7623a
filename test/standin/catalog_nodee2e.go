package standin

import (
	"context"
	_ "embed"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// NodeE2EPackages are the Debian packages of the node-e2e set's images:
// the critest set's, plus bash-static (every name in the environment
// passes through its sh), dash and hostname (glibc-dns-testing), and
// agnhost's tools (curl, nc, ip and ss, socat) with the libraries they
// load. Build checks that every ELF file finds its libraries.
var NodeE2EPackages = union(Packages,
	[]string{"bash-static", "dash", "hostname", "curl", "netcat-openbsd", "iproute2", "socat"},
	agnhostLibs)

// union is the lists' strings, each once, in order.
func union(lists ...[]string) []string {
	var out []string
	for _, s := range slices.Concat(lists...) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// agnhostLibs are the libraries of agnhost's tools.
var agnhostLibs = []string{
	// curl.
	"libcurl4", "libbrotli1", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0",
	"libcom-err2", "libkeyutils1", "libidn2-0", "libunistring2", "libldap-2.5-0", "libsasl2-2",
	"libnghttp2-14", "libpsl5", "librtmp1", "libgnutls30", "libhogweed6", "libnettle8", "libgmp10",
	"libp11-kit0", "libffi8", "libtasn1-6", "libssh2-1", "libssl3", "zlib1g",
	// nc, ip, ss, socat.
	"libbsd0", "libmd0", "libbpf1", "libelf1", "libmnl0", "libselinux1", "libpcre2-8-0", "libtirpc3",
	"libwrap0", "libnsl2",
}

// The agnhost image's TLS pair, test/images/agnhost/porter/localhost.crt
// and .key of Kubernetes v1.37.2: probes and lifecycle hooks with scheme
// HTTPS run agnhost netexec --tls-cert-file /localhost.crt.
var (
	//go:embed agnhost/localhost.crt
	agnhostCert string
	//go:embed agnhost/localhost.key
	agnhostKey string
)

// The kitten and nautilus images' files, test/images/{kitten,nautilus}/
// html/ of Kubernetes v1.37.2: a picture and data.json naming it.
var (
	//go:embed kitten/kitten.jpg
	kittenJPG string
	//go:embed kitten/data.json
	kittenJSON string
	//go:embed nautilus/nautilus.jpg
	nautilusJPG string
	//go:embed nautilus/data.json
	nautilusJSON string
)

// alpineOSRelease is the /etc/os-release of Alpine 3.21, agnhost's
// base, which the image volume spec reads in the kitten image.
const alpineOSRelease = `NAME="Alpine Linux"
ID=alpine
VERSION_ID=3.21.3
PRETTY_NAME="Alpine Linux v3.21"
HOME_URL="https://alpinelinux.org/"
BUG_REPORT_URL="https://gitlab.alpinelinux.org/alpine/aports/-/issues"
`

// nsswitchConf is Debian's /etc/nsswitch.conf without the db and nis
// services, which the images lack. The official glibc busybox image
// copies Debian's in; without one glibc asks DNS before /etc/hosts.
const nsswitchConf = `passwd:         files
group:          files
shadow:         files
gshadow:        files

hosts:          files dns
networks:       files

protocols:      files
services:       files
ethers:         files
rpc:            files
`

// nginxEntrypoint is the official nginx image's /docker-entrypoint.sh
// cut to what it does with an empty /docker-entrypoint.d: log that and
// run the command.
const nginxEntrypoint = `#!/bin/sh
set -e
if [ "$1" = "nginx" ] || [ "$1" = "nginx-debug" ]; then
    if [ -z "${NGINX_ENTRYPOINT_QUIET_LOGS:-}" ]; then
        echo "$0: No files found in /docker-entrypoint.d/, skipping configuration"
    fi
fi
exec "$@"
`

// NodeE2ECatalog lists the images Kubernetes v1.37.2's [NodeConformance],
// SIG Node and SIG CLI specs of test/e2e/common (node, storage, network),
// test/e2e/node and test/e2e/kubectl pull on Linux/amd64
// when [Slow], [Serial], [Disruptive], [Flaky] and [Feature:*] specs are
// left out, under the names of test/utils/image/manifest.go, and the
// images of the e2e framework's pre-pull list (test/e2e/common/util.go
// PrePulledImages) but volume/nfs, an NFS server no such spec uses.
//
// Where the specs pull them: agnhost:2.66.1 (containers, probes,
// lifecycle hooks, networking, downward API, projected volumes, ...),
// busybox:1.37.0-2 (the framework's default image: ConfigMap, Secret,
// expansion, security context, init containers, ...), pause:3.10.2
// (imageutils.GetPauseImageName: pods, init containers, lifecycle hooks,
// PodOSRejection), nonroot:1.5 and nonewprivs:1.4 (security context),
// glibc-dns-testing:2.1.1 (Override hostname of Pod), kitten:1.8 (the
// image volume spec, kubectl's Update Demo) and nautilus:1.8 (Update
// Demo). agnhost:2.55,
// nginx:1.27.0-2 and ipc-utils:1.4 are pre-pull images; nginx:1.28.0-2
// (NginxNew) is nginx's next version, built beside it.
//
// Kept whole: it is a table, one entry per image, read best in one place
// (as Catalog).
func NodeE2ECatalog() []Entry {
	agnhost := func(version string) Entry {
		return Entry{
			Names: []string{e2e + "agnhost:" + version},
			About: "Kubernetes test/images/agnhost " + version + ": the real agnhost binary (-agnhost, built from the Kubernetes module; the same binary under every agnhost name) as /agnhost with /agnhost-2 linking to it, /localhost.crt and /localhost.key from its porter/, an empty /uploads, user-defined-in-image (1000) in group-defined-in-image (50000), ENTRYPOINT /agnhost, CMD pause, EXPOSE 80 8080 8081 9376 5000. " +
				"Alpine's musl and busybox 1.37 are glibc and Debian's busybox 1.35 (as the busybox stand-in), /bin/sh is BusyBox 1.37's ash (test/standin/busybox.sh) and /bin/bash is Debian's bash-static; curl, nc (netcat-openbsd), ip and ss (iproute2), socat and ipcs are Debian's; iperf, dig and the coredns binary are left out (no spec of the set runs them), and so is /var/registry (fakeregistryserver's images, for [Serial] specs); /home/user-defined-in-image is owned by root",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				// The label is the one difference between the agnhost
				// names, so that each is an image of its own as in the
				// real registry.
				return b.agnhostImage(ctx, "pause", map[string]string{"org.opencontainers.image.version": version})
			},
		}
	}
	// kitten and nautilus: the image volume spec and kubectl's Update
	// Demo (which serves the picture).
	picture := func(name, jpg, json string) Entry {
		return Entry{
			Names: []string{e2e + name + ":1.8"},
			About: "Kubernetes test/images/" + name + " 1.8 (agnhost 2.66.1 with " + name + ".jpg and data.json in /, CMD test-webserver): the agnhost 2.66.1 stand-in with those two files, embedded from the release, and Alpine 3.21's /etc/os-release, which the image volume spec reads through its volume",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				top := func(ctx context.Context) (v1.Layer, error) {
					return b.shared(name, func() (v1.Layer, error) {
						t, err := b.newTree(name)
						if err != nil {
							return nil, err
						}
						t.file("/"+name+".jpg", 0o644, jpg)
						t.file("/data.json", 0o644, json)
						t.file("/etc/os-release", 0o644, alpineOSRelease)
						return t.layer(ctx)
					})
				}
				return b.agnhostImage(ctx, "test-webserver", nil, top)
			},
		}
	}
	nginx := func(tag, version, official string) Entry {
		return Entry{
			Names: []string{e2e + "nginx:" + tag},
			About: "Kubernetes test/images/nginx (the official nginx:" + official + "-alpine): the critest nginx stand-in (Debian's nginx 1.22 on the busybox layer, user nginx 101, logs on /dev/stdout and /dev/stderr, port 80) with the official image's ENTRYPOINT /docker-entrypoint.sh (which here only logs, as the official one with no configuration scripts) and STOPSIGNAL SIGQUIT",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.nginx, b.nginxEntrypoint)
				if err != nil {
					return nil, err
				}
				return b.image(Config{
					Entrypoint:   []string{"/docker-entrypoint.sh"},
					Cmd:          []string{"nginx", "-g", "daemon off;"},
					Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "NGINX_VERSION=" + version},
					ExposedPorts: []string{"80/tcp"},
					StopSignal:   "SIGQUIT",
				}, layers...)
			},
		}
	}
	return []Entry{
		agnhost("2.66.1"),
		agnhost("2.55"),
		picture("kitten", kittenJPG, kittenJSON),
		picture("nautilus", nautilusJPG, nautilusJSON),
		{
			Names: []string{e2e + "busybox:1.37.0-2"},
			About: "Kubernetes test/images/busybox (the official glibc busybox:1.37.0 unchanged): the critest busybox stand-in (Debian's busybox 1.35 applets, hard links, with ipcs and pgrep) plus Debian's /etc/nsswitch.conf as the official image has, and BusyBox 1.37.0 built with upstream's defconfig (test/standin/busybox.sh) over it with every applet in /bin: Debian's ash drops variables whose names are not shell identifiers (data-1) from the environment it passes on, which the ConfigMap and Secret environment specs read with `sh -c env`, and bash, which keeps them, words its errors otherwise than ash (the read-only root spec expects ash's wording, can't create); CMD sh",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.e2eShell)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"sh"}}, layers...)
			},
		},
		{
			Names: []string{"registry.k8s.io/pause:3.10.2"},
			About: "the pause image: a static /pause that waits for SIGTERM or SIGINT (pinrt-standin itself, called as pause; unlike the real one it neither reaps children nor logs the signal), ENTRYPOINT /pause, user 65535",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				return b.pause(ctx)
			},
		},
		{
			Names: []string{e2e + "nonroot:1.5"},
			About: "Kubernetes test/images/nonroot: USER 1234 on the busybox:1.37.0-2 stand-in (the real one is debian-base with USER 1234); the specs run id -u in it",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.e2eShell)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"/bin/sh"}, User: "1234"}, layers...)
			},
		},
		{
			Names: []string{e2e + "nonewprivs:1.4"},
			About: "Kubernetes test/images/nonewprivs 1.4: a setuid-root /usr/local/bin/nnp printing \"Effective uid: N\" (pinrt-standin itself, called as nnp), CMD nnp, on the busybox:1.37.0-2 stand-in instead of Alpine",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.e2eShell, b.nnp)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"nnp"}}, layers...)
			},
		},
		{
			Names: []string{e2e + "glibc-dns-testing:2.1.1"},
			About: "Kubernetes test/images/glibc-dns-testing (Debian bookworm-slim with dnsutils): glibc with Debian's nsswitch.conf, hostname (glibc's resolver answers hostname -f from /etc/hosts), dash as /bin/sh and bash (bash-static) on the busybox layer, whose applets stand in for coreutils; CMD bash. dig, nslookup of dnsutils and the coredns binary are left out: the set's specs run only sh and hostname in it",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.glibcDNS)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"bash"}}, layers...)
			},
		},
		nginx("1.27.0-2", "1.27.0", "1.27"),
		nginx("1.28.0-2", "1.28.0", "1.28"),
		{
			Names: []string{e2e + "ipc-utils:1.4"},
			About: "Kubernetes test/images/ipc-utils (Alpine with util-linux): ipcs, ipcmk and ipcrm of Debian's util-linux on the busybox:1.37.0-2 stand-in",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				layers, err := b.layersOf(ctx, b.base, b.e2eShell, b.ipcUtils)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"/bin/sh"}}, layers...)
			},
		},
	}
}

// layersOf makes the layers in order, stopping at the first error.
func (b *Builder) layersOf(ctx context.Context, mks ...func(context.Context) (v1.Layer, error)) ([]v1.Layer, error) {
	layers := make([]v1.Layer, 0, len(mks))
	for _, mk := range mks {
		l, err := mk(ctx)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	return layers, nil
}

// debFile is a file of an extracted package.
func (b *Builder) debFile(pkg, p string) string {
	return filepath.Join(b.work, "deb", pkg, p)
}

// e2eShell is the layer over the busybox layer that the e2e images other
// than nginx and glibc-dns-testing share: BusyBox 1.37.0 as the official
// image has it (Builder.Busybox, test/standin/busybox.sh) with every
// applet in /bin, where the official image has them and specs name them
// (/bin/sysctl); and nsswitch.conf. Debian's busybox stays below it for
// the applets upstream's defconfig lacks.
func (b *Builder) e2eShell(ctx context.Context) (v1.Layer, error) {
	return b.shared("e2e-sh", func() (v1.Layer, error) {
		if err := checkStatic("busybox", b.Busybox); err != nil {
			return nil, err
		}
		t, err := b.newTree("e2e-sh")
		if err != nil {
			return nil, err
		}
		t.copyFile("/bin/busybox", 0o755, b.Busybox)
		t.file("/etc/nsswitch.conf", 0o644, nsswitchConf)
		out, err := exec.CommandContext(ctx, b.Busybox, "--list").Output()
		if err != nil {
			return nil, fmt.Errorf("busybox --list: %w", err)
		}
		for _, name := range strings.Fields(string(out)) {
			if name != "busybox" {
				t.symlink("/bin/"+name, "busybox")
			}
		}
		return t.layer(ctx)
	})
}

// agnhostTools is the layer of the programs agnhost's Dockerfile adds to
// Alpine (apk add bind-tools curl netcat-openbsd iproute2 iperf bash
// util-linux-misc socat), as far as the specs run them, from Debian.
func (b *Builder) agnhostTools(ctx context.Context) (v1.Layer, error) {
	return b.shared("agnhost-tools", func() (v1.Layer, error) {
		t, err := b.newTree("agnhost-tools")
		if err != nil {
			return nil, err
		}
		for _, p := range agnhostLibs {
			b.unpack(t, p)
		}
		b.unpack(t, "curl", "usr/bin/curl")
		// Alpine's nc is netcat-openbsd's, at busybox's nc applet's path.
		b.unpack(t, "netcat-openbsd", "bin/nc.openbsd")
		t.symlink("/usr/bin/nc", "../../bin/nc.openbsd")
		b.unpack(t, "iproute2", "bin/ip", "bin/ss", "sbin/ip", "etc/iproute2")
		b.unpack(t, "socat", "usr/bin/socat")
		b.unpack(t, "util-linux", "usr/bin/ipcmk", "usr/bin/ipcrm")
		t.copyFile("/bin/bash", 0o755, b.debFile("bash-static", "bin/bash-static"))
		return t.layer(ctx)
	})
}

// agnhost is the layer of agnhost's Dockerfile's own files.
func (b *Builder) agnhost(ctx context.Context) (v1.Layer, error) {
	return b.shared("agnhost", func() (v1.Layer, error) {
		if err := b.checkAgnhost(); err != nil {
			return nil, err
		}
		t, err := b.newTree("agnhost")
		if err != nil {
			return nil, err
		}
		t.copyFile("/agnhost", 0o755, b.Agnhost)
		t.symlink("/agnhost-2", "agnhost")
		t.file("/localhost.crt", 0o644, agnhostCert)
		t.file("/localhost.key", 0o644, agnhostKey)
		t.dir("/uploads", 0o755)
		// adduser -u 1000 -D user-defined-in-image; addgroup -g 50000
		// group-defined-in-image; addgroup user-defined-in-image
		// group-defined-in-image.
		t.file("/etc/passwd", 0o644, passwd+"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
		t.file("/etc/group", 0o644, group+"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")
		t.dir("/home/user-defined-in-image", 0o755)
		return t.layer(ctx)
	})
}

// agnhostImage is an image of the agnhost stand-in's layers and more on
// top: ENTRYPOINT /agnhost with cmd, agnhost's ports, labels.
func (b *Builder) agnhostImage(ctx context.Context, cmd string, labels map[string]string, more ...func(context.Context) (v1.Layer, error)) (v1.Image, error) {
	layers, err := b.layersOf(ctx, append([]func(context.Context) (v1.Layer, error){b.base, b.e2eShell, b.agnhostTools, b.agnhost}, more...)...)
	if err != nil {
		return nil, err
	}
	return b.image(Config{
		Entrypoint:   []string{"/agnhost"},
		Cmd:          []string{cmd},
		ExposedPorts: []string{"80/tcp", "8080/tcp", "8081/tcp", "9376/tcp", "5000/tcp"},
		Labels:       labels,
	}, layers...)
}

// checkAgnhost makes sure Agnhost is a static executable. A dynamically
// linked agnhost would pass checkLinked on glibc, but its image is built
// with CGO_ENABLED=0 for musl; a script or an empty file would not run.
func (b *Builder) checkAgnhost() error {
	if b.Agnhost == "" {
		return fmt.Errorf("set %s needs the agnhost binary (-agnhost)", b.set().Name)
	}
	if b.Busybox == "" {
		return fmt.Errorf("set %s needs BusyBox 1.37 (-busybox; test/standin/busybox.sh builds it)", b.set().Name)
	}
	if err := checkStatic("busybox", b.Busybox); err != nil {
		return err
	}
	return checkStatic("agnhost (build it with CGO_ENABLED=0)", b.Agnhost)
}

// checkStatic fails unless path is a static ELF executable.
func checkStatic(what, path string) error {
	n, ok, err := readELF(path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !ok || n.interp != "" {
		return fmt.Errorf("%s: %s is not a static ELF executable", what, path)
	}
	return nil
}

// glibcDNS is the layer making the busybox layer glibc-dns-testing.
func (b *Builder) glibcDNS(ctx context.Context) (v1.Layer, error) {
	return b.shared("glibc-dns-testing", func() (v1.Layer, error) {
		t, err := b.newTree("glibc-dns")
		if err != nil {
			return nil, err
		}
		// dash's bin/sh link to dash replaces busybox's sh.
		b.unpack(t, "dash", "bin/dash", "bin/sh")
		b.unpack(t, "hostname", "bin")
		t.copyFile("/bin/bash", 0o755, b.debFile("bash-static", "bin/bash-static"))
		t.file("/etc/nsswitch.conf", 0o644, nsswitchConf)
		return t.layer(ctx)
	})
}

// nginxEntrypoint is the layer of the nginx image's entrypoint.
func (b *Builder) nginxEntrypoint(ctx context.Context) (v1.Layer, error) {
	return b.shared("nginx-entrypoint", func() (v1.Layer, error) {
		t, err := b.newTree("nginx-entrypoint")
		if err != nil {
			return nil, err
		}
		t.file("/docker-entrypoint.sh", 0o755, nginxEntrypoint)
		t.dir("/docker-entrypoint.d", 0o755)
		return t.layer(ctx)
	})
}

// ipcUtils is the layer of ipc-utils' util-linux programs but ipcs, which
// the busybox layer has.
func (b *Builder) ipcUtils(ctx context.Context) (v1.Layer, error) {
	return b.shared("ipc-utils", func() (v1.Layer, error) {
		t, err := b.newTree("ipc-utils")
		if err != nil {
			return nil, err
		}
		b.unpack(t, "util-linux", "usr/bin/ipcmk", "usr/bin/ipcrm")
		return t.layer(ctx)
	})
}
