package standin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Entry is one stand-in image and every name it is pushed under.
type Entry struct {
	Names []string
	// About says what the original is and how the stand-in differs.
	About string
	Build func(ctx context.Context, b *Builder) (v1.Image, error)
}

// The registry prefix of critest's own test images (cri-tools
// pkg/validate/consts.go) and of the Kubernetes e2e test images.
const (
	criTools = "gcr.io/k8s-staging-cri-tools/"
	e2e      = "registry.k8s.io/e2e-test-images/"
)

// passwd and group are busybox's (the official busybox image's) files.
const (
	passwd = "root:x:0:0:root:/root:/bin/sh\n" +
		"daemon:x:1:1:daemon:/usr/sbin:/bin/false\n" +
		"bin:x:2:2:bin:/bin:/bin/false\n" +
		"sys:x:3:3:sys:/dev:/bin/false\n" +
		"sync:x:4:100:sync:/bin:/bin/sync\n" +
		"mail:x:8:8:mail:/var/spool/mail:/bin/false\n" +
		"www-data:x:33:33:www-data:/var/www:/bin/false\n" +
		"operator:x:37:37:Operator:/var:/bin/false\n" +
		"nobody:x:65534:65534:nobody:/home:/bin/false\n"
	group = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nadm:x:4:\ntty:x:5:\ndisk:x:6:\n" +
		"lp:x:7:\nmail:x:8:\nkmem:x:9:\nwheel:x:10:root\ncdrom:x:11:\ndialout:x:18:\n" +
		"floppy:x:19:\nvideo:x:28:\naudio:x:29:\ntape:x:32:\nwww-data:x:33:\noperator:x:37:\n" +
		"utmp:x:43:\nplugdev:x:46:\nstaff:x:50:\nlock:x:54:\nnetdev:x:82:\nusers:x:100:\n" +
		"nogroup:x:65534:\n"
)

// Catalog lists every image critest v1.37.0 pulls on Linux/amd64. The
// one it names by a pinned digest (test-image-digest@sha256:9700f9…)
// cannot be rebuilt bit for bit; it is built under its tag only, and the
// spec pulling it is in test/critest/skip.txt.
//
// Kept whole: it is a table, one entry per image critest pulls, and reads
// best in one place, in the order critest's sources name them.
func Catalog() []Entry {
	var tests []Entry
	// image-test/Dockerfile: busybox plus an empty file named after the
	// image, so each name is a distinct image.
	for _, ti := range []struct{ name, file string }{
		{"test-image-1:latest", "/test-image-1"},
		{"test-image-2:latest", "/test-image-2"},
		{"test-image-3:latest", "/test-image-3"},
		{"test-image-latest:latest", "/test-image-latest"},
		{"test-image-digest:latest", "/test-image-digest"},
		{"test-image-tag:test", "/test"},
		{"test-image-tag:all", "/all"},
	} {
		tests = append(tests, Entry{
			Names: []string{criTools + ti.name},
			About: "cri-tools images/image-test: busybox with an empty " + ti.file,
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				return b.withFile(ctx, ti.file)
			},
		})
	}
	users := []Entry{}
	for _, u := range []struct{ name, user string }{
		{"test-image-user-uid", "1002"},
		{"test-image-user-username", "www-data"},
		{"test-image-user-uid-group", "1003:1004"},
		{"test-image-user-username-group", "www-data:1004"},
	} {
		users = append(users, Entry{
			Names: []string{criTools + u.name + ":latest"},
			About: "cri-tools images/image-user: busybox with USER " + u.user,
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"sh"}, User: u.user}, base)
			},
		})
	}
	list := []Entry{
		{
			Names: []string{Busybox},
			About: "busybox with every applet of Debian's busybox (hard links, as in the official image), plus ipcs (util-linux) and pgrep (procps), which that build lacks, with their libraries",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"sh"}}, base)
			},
		},
		{
			Names: []string{criTools + "test-image-tags:1", criTools + "test-image-tags:2", criTools + "test-image-tags:3"},
			About: "cri-tools images/image-test: one image under three tags",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				return b.withFile(ctx, "/same-image")
			},
		},
		{
			Names: []string{criTools + "test-image-predefined-group:latest"},
			About: "cri-tools images/image-predefined-group: user 1000 in group 50000 of the image's /etc/group",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				t, err := b.newTree("group")
				if err != nil {
					return nil, err
				}
				t.file("/etc/passwd", 0o644, passwd+"default-user:x:1000:1000::/home/default-user:/bin/sh\n")
				t.file("/etc/group", 0o644, group+"default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")
				t.dir("/home/default-user", 0o755)
				l, err := t.layer(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Cmd: []string{"sh"}, User: "1000"}, base, l)
			},
		},
		{
			Names: []string{WebServer},
			About: "nginx from Debian's package on the busybox layer, configured as the official image: user nginx (101), pid /var/run/nginx.pid, access log on /dev/stdout, error log on /dev/stderr, port 80",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				ng, err := b.nginx(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(nginxConfig, base, ng)
			},
		},
		{
			Names: []string{criTools + "hostnet-nginx-amd64:latest"},
			About: "cri-tools images/hostnet-nginx: the nginx stand-in listening on 12003 (its default.conf)",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				ng, err := b.nginx(ctx)
				if err != nil {
					return nil, err
				}
				t, err := b.newTree("hostnet")
				if err != nil {
					return nil, err
				}
				t.file("/etc/nginx/conf.d/default.conf", 0o644, strings.ReplaceAll(nginxDefaultConf, "listen       80;", "listen       12003;"))
				l, err := t.layer(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(nginxConfig, base, ng, l)
			},
		},
		{
			Names: []string{e2e + "httpd:2.4.39-4"},
			About: "Apache httpd stands in as busybox httpd: httpd-foreground serves /usr/local/apache2/htdocs on port 80 and says \"httpd\" on stderr at start, as Apache's start-up warning does",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				t, err := b.newTree("httpd")
				if err != nil {
					return nil, err
				}
				t.file("/usr/local/apache2/htdocs/index.html", 0o644, "<html><body><h1>It works!</h1></body></html>\n")
				t.file("/usr/local/bin/httpd-foreground", 0o755, "#!/bin/sh\n"+
					"echo \"httpd-foreground: httpd (busybox) serving /usr/local/apache2/htdocs on port 80\" >&2\n"+
					"exec httpd -f -v -p 80 -h /usr/local/apache2/htdocs\n")
				l, err := t.layer(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(Config{
					Cmd:          []string{"httpd-foreground"},
					WorkingDir:   "/usr/local/apache2",
					Env:          []string{"PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HTTPD_PREFIX=/usr/local/apache2"},
					ExposedPorts: []string{"80/tcp"},
				}, base, l)
			},
		},
		{
			Names: []string{e2e + "nonewprivs:1.3"},
			About: "Kubernetes test/images/nonewprivs: a setuid-root /usr/local/bin/nnp printing \"Effective uid: N\" (pinrt-standin itself, called as nnp)",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				base, err := b.base(ctx)
				if err != nil {
					return nil, err
				}
				l, err := b.nnp(ctx)
				if err != nil {
					return nil, err
				}
				return b.image(Config{Entrypoint: []string{"/usr/local/bin/nnp"}}, base, l)
			},
		},
		{
			// critest checks that both names give one image ID.
			Names: []string{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"},
			About: "the pause image: a static /pause that waits for SIGTERM or SIGINT (pinrt-standin itself, called as pause), user 65535",
			Build: func(ctx context.Context, b *Builder) (v1.Image, error) {
				return b.pause(ctx)
			},
		},
	}
	list = append(list, tests...)
	return append(list, users...)
}

// nginxConfig is the official nginx image's config.
var nginxConfig = Config{
	Cmd:          []string{"nginx", "-g", "daemon off;"},
	Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "NGINX_VERSION=1.14.2"},
	ExposedPorts: []string{"80/tcp"},
	StopSignal:   "SIGTERM",
}

const nginxConf = `user  nginx;
worker_processes  1;

error_log  /var/log/nginx/error.log warn;
pid        /var/run/nginx.pid;

events {
    worker_connections  1024;
}

http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;

    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';

    access_log  /var/log/nginx/access.log  main;

    sendfile        on;
    keepalive_timeout  65;

    include /etc/nginx/conf.d/*.conf;
}
`

const nginxDefaultConf = `server {
    listen       80;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
`

const nginxIndex = `<!DOCTYPE html>
<html>
<head>
<title>Welcome to nginx!</title>
</head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and
working. Further configuration is required.</p>
</body>
</html>
`

// nginx is the layer holding nginx, its libraries and configuration.
func (b *Builder) nginx(ctx context.Context) (v1.Layer, error) {
	return b.shared("nginx", func() (v1.Layer, error) { return b.nginxLayer(ctx) })
}

func (b *Builder) nginxLayer(ctx context.Context) (v1.Layer, error) {
	t, err := b.newTree("nginx")
	if err != nil {
		return nil, err
	}
	for _, p := range []string{"nginx", "libcrypt1", "libpcre2-8-0", "libssl3", "zlib1g"} {
		b.unpack(t, p)
	}
	b.unpack(t, "nginx-common", "etc/nginx", "usr/share/nginx")
	for _, d := range []string{"etc/nginx/sites-available", "etc/nginx/sites-enabled", "etc/nginx/snippets", "etc/nginx/modules-enabled"} {
		_ = os.RemoveAll(t.path(d))
	}
	t.file("/etc/nginx/nginx.conf", 0o644, nginxConf)
	t.file("/etc/nginx/conf.d/default.conf", 0o644, nginxDefaultConf)
	t.file("/usr/share/nginx/html/index.html", 0o644, nginxIndex)
	t.file("/usr/share/nginx/html/50x.html", 0o644, "<html><body><h1>An error occurred.</h1></body></html>\n")
	t.file("/etc/passwd", 0o644, passwd+"nginx:x:101:101:nginx user:/nonexistent:/bin/false\n")
	t.file("/etc/group", 0o644, group+"nginx:x:101:\n")
	// Debian's nginx keeps its temporary files here.
	t.dir("/var/lib/nginx", 0o755)
	t.dir("/var/cache/nginx", 0o755)
	// As the official image: logs go to the container's output.
	t.symlink("/var/log/nginx/access.log", "/dev/stdout")
	t.symlink("/var/log/nginx/error.log", "/dev/stderr")
	return t.layer(ctx)
}

// nnp is the layer holding Kubernetes' test/images/nonewprivs program.
func (b *Builder) nnp(ctx context.Context) (v1.Layer, error) {
	return b.shared("nnp", func() (v1.Layer, error) {
		t, err := b.newTree("nnp")
		if err != nil {
			return nil, err
		}
		t.copyFile("/usr/local/bin/nnp", 0o755|os.ModeSetuid, b.Self)
		return t.layer(ctx)
	})
}

// pause is the pause image: /pause alone, as user 65535.
func (b *Builder) pause(ctx context.Context) (v1.Image, error) {
	l, err := b.shared("pause", func() (v1.Layer, error) {
		t, err := b.newTree("pause")
		if err != nil {
			return nil, err
		}
		t.copyFile("/pause", 0o755, b.Self)
		return t.layer(ctx)
	})
	if err != nil {
		return nil, err
	}
	return b.image(Config{Entrypoint: []string{"/pause"}, User: "65535:65535", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}, l)
}

// withFile is the busybox image with an empty file at p.
func (b *Builder) withFile(ctx context.Context, p string) (v1.Image, error) {
	base, err := b.base(ctx)
	if err != nil {
		return nil, err
	}
	t, err := b.newTree("file")
	if err != nil {
		return nil, err
	}
	t.file(p, 0o644, "")
	l, err := t.layer(ctx)
	if err != nil {
		return nil, err
	}
	return b.image(Config{Cmd: []string{"sh"}}, base, l)
}

// base is the busybox layer every image but pause starts from.
func (b *Builder) base(ctx context.Context) (v1.Layer, error) {
	return b.shared("busybox", func() (v1.Layer, error) { return b.busybox(ctx) })
}

func (b *Builder) busybox(ctx context.Context) (v1.Layer, error) {
	t, err := b.newTree("busybox")
	if err != nil {
		return nil, err
	}
	b.unpack(t, "busybox", "bin/busybox")
	for _, p := range []string{"libc6", "libproc2-0", "libsystemd0", "libcap2", "libgcrypt20", "liblzma5", "libzstd1", "liblz4-1", "libgpg-error0"} {
		b.unpack(t, p)
	}
	b.unpack(t, "util-linux", "usr/bin/ipcs")
	b.unpack(t, "procps", "usr/bin/pgrep")
	if t.err != nil {
		return nil, t.err
	}
	out, err := exec.CommandContext(ctx, t.path("/bin/busybox"), "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	n := 0
	for _, a := range strings.Fields(string(out)) {
		if _, err := os.Lstat(t.path(a)); err == nil {
			continue // a package's own program wins
		}
		// Hard links, as in the official busybox image: masking one
		// applet (MaskedPaths) must not mask busybox itself.
		t.dir(filepath.Dir("/"+a), 0o755)
		if t.err == nil {
			t.err = os.Link(t.path("/bin/busybox"), t.path(a))
		}
		n++
	}
	if n == 0 {
		return nil, errNoApplets
	}
	t.file("/etc/passwd", 0o644, passwd)
	t.file("/etc/group", 0o644, group)
	t.file("/etc/shadow", 0o600, "root:*:10933:0:99999:7:::\n")
	for _, d := range []string{"/dev", "/proc", "/sys", "/home", "/var/www", "/var/spool/mail", "/usr/local/bin", "/usr/local/sbin", "/run"} {
		t.dir(d, 0o755)
	}
	t.dir("/root", 0o700)
	t.dir("/tmp", 0o777|os.ModeSticky)
	t.symlink("/var/run", "../run")
	return t.layer(ctx)
}
