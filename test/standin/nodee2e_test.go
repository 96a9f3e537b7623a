package standin

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The images the [NodeConformance] and SIG Node specs of Kubernetes
// v1.37.2's test/e2e/common and test/e2e/node and its e2e framework pull
// (see NodeE2ECatalog).
var nodeE2EImages = []string{
	"registry.k8s.io/e2e-test-images/agnhost:2.66.1",
	"registry.k8s.io/e2e-test-images/agnhost:2.55",
	"registry.k8s.io/e2e-test-images/kitten:1.8",
	"registry.k8s.io/e2e-test-images/nautilus:1.8",
	"registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
	"registry.k8s.io/pause:3.10.2",
	"registry.k8s.io/e2e-test-images/nonroot:1.5",
	"registry.k8s.io/e2e-test-images/nonewprivs:1.4",
	"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
	"registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
	"registry.k8s.io/e2e-test-images/ipc-utils:1.4",
}

func TestNodeE2ECatalog(t *testing.T) {
	checkSet(t, NodeE2E, nodeE2EImages)
	seen := map[string]bool{}
	for _, p := range NodeE2EPackages {
		if seen[p] {
			t.Errorf("package %s listed twice", p)
		}
		seen[p] = true
	}
	for _, p := range Packages {
		if !seen[p] {
			t.Errorf("package %s of the critest set missing from the node-e2e set, whose busybox layer is the same", p)
		}
	}
	if s, err := LookupSet("node-e2e"); err != nil || s.Name != NodeE2E.Name || !s.Agnhost {
		t.Errorf("LookupSet(node-e2e) = %+v, %v", s, err)
	}
	if _, err := LookupSet("nope"); err == nil {
		t.Error("LookupSet(nope): no error")
	}
}

// The embedded TLS pair is agnhost's own, and the pictures and data.json
// the kitten and nautilus images', when the module is at hand.
func TestEmbeddedFilesAreTheModules(t *testing.T) {
	dir := filepath.Join(goModCache(t), "k8s.io", "kubernetes@v1.37.2", "test", "images", "agnhost", "porter")
	for _, f := range []struct{ file, embedded string }{
		{"localhost.crt", agnhostCert},
		{"localhost.key", agnhostKey},
		{"../../kitten/html/kitten.jpg", kittenJPG},
		{"../../kitten/html/data.json", kittenJSON},
		{"../../nautilus/html/nautilus.jpg", nautilusJPG},
		{"../../nautilus/html/data.json", nautilusJSON},
	} {
		data, err := os.ReadFile(filepath.Join(dir, f.file))
		if errors.Is(err, os.ErrNotExist) {
			t.Skipf("k8s.io/kubernetes@v1.37.2 not in the module cache: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != f.embedded {
			t.Errorf("agnhost/%s differs from the module's %s", f.file, filepath.Join(dir, f.file))
		}
	}
}

// The key of the critest set is the one from before there were sets (a
// warm cache stays warm); another set's key names the set and the
// agnhost binary.
func TestKey(t *testing.T) {
	dir := t.TempDir()
	write := func(n, content string) string {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	self := write("self", "SELF")
	agn1 := write("agnhost1", "AGNHOST 1")
	agn2 := write("agnhost2", "AGNHOST 2")
	debs := map[string]string{"libc6": "/d/libc6_2.36_amd64.deb", "busybox": "/d/busybox_1.35_amd64.deb"}
	key := func(b *Builder) string {
		t.Helper()
		k, err := b.Key(debs)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	// sha256("debs busybox_1.35_amd64.deb libc6_2.36_amd64.deb\nSELF")[:16]
	const before = "932db5a5273a7000"
	if got := key(&Builder{Self: self}); got != before {
		t.Errorf("critest key %s, want %s as before sets", got, before)
	}
	if got := key(&Builder{Set: Critest, Self: self}); got != before {
		t.Errorf("critest key (named) %s, want %s", got, before)
	}
	e1 := key(&Builder{Set: NodeE2E, Self: self, Agnhost: agn1, Busybox: agn1})
	e2 := key(&Builder{Set: NodeE2E, Self: self, Agnhost: agn2, Busybox: agn1})
	if e3 := key(&Builder{Set: NodeE2E, Self: self, Agnhost: agn1, Busybox: agn2}); e3 == e1 {
		t.Errorf("node-e2e key %s does not change with the busybox binary", e3)
	}
	if e1 == before || e1 == e2 {
		t.Errorf("node-e2e keys %s (agnhost 1) and %s (agnhost 2), critest %s: want three different keys", e1, e2, before)
	}
	if _, err := (&Builder{Set: NodeE2E, Self: self}).Key(debs); err == nil || !strings.Contains(err.Error(), "agnhost") {
		t.Errorf("node-e2e key without agnhost: %v, want an error naming it", err)
	}
}

// A node-e2e build stops before downloading anything when its agnhost is
// missing or not the static executable agnhost's image holds.
func TestCachedChecksAgnhost(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agnhost.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, agnhost, want string }{
		{"none", "", "needs the agnhost binary (-agnhost)"},
		{"script", script, "not a static ELF executable"},
		{"absent", filepath.Join(dir, "nope"), "no such file"},
	}
	if dyn, err := exec.LookPath("true"); err == nil {
		if n, ok, _ := readELF(dyn); ok && n.interp != "" {
			cases = append(cases, struct{ name, agnhost, want string }{"linked dynamically", dyn, "not a static ELF executable"})
		}
	}
	static := staticBinary(t) // stands in for busybox: the check is agnhost's
	cases = append(cases, struct{ name, agnhost, want string }{"no busybox", static, "needs BusyBox 1.37"})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			debs := filepath.Join(t.TempDir(), "debs")
			b := &Builder{Set: NodeE2E, Debs: debs, Self: script, Agnhost: tc.agnhost, Busybox: static, Log: io.Discard}
			if tc.name == "no busybox" {
				b.Busybox = ""
			}
			_, err := b.Cached(context.Background(), t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Cached: %v, want an error with %q", err, tc.want)
			}
			if _, serr := os.Stat(debs); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("Cached made %s (%v) before failing", debs, serr)
			}
		})
	}
}

func goModCache(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("GOMODCACHE"); d != "" {
		return d
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skip(err)
		}
		gopath = filepath.Join(home, "go")
	}
	return filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")
}

// staticBinary builds pinrt-standin without cgo, as the VM suites do: the
// images' /pause and nnp, and agnhost's stand-in when no real one is
// given.
func staticBinary(t *testing.T) string {
	t.Helper()
	// go test puts its own GOROOT/bin first in the test's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build pinrt-standin with: %v", err)
	}
	out := filepath.Join(t.TempDir(), "pinrt-standin")
	cmd := exec.Command(goTool, "build", "-trimpath", "-buildvcs=false", "-o", out, "./cmd/pinrt-standin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot build pinrt-standin (%s): %v: %s", goTool, err, msg)
	}
	return out
}

// nodeE2ELayout builds the node-e2e set into a layout. The .debs are
// kept in $PINRT_STANDIN_DEBS, or the user's cache directory, across runs;
// the first run downloads them with apt-get. PINRT_STANDIN_AGNHOST names
// the real agnhost binary; without it pinrt-standin stands in for it.
func nodeE2ELayout(t *testing.T) (layout.Path, bool) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the node-e2e images; not with -short")
	}
	needTools(t, "apt-get", "dpkg-deb", "tar", "gzip", "cp")
	debs := os.Getenv("PINRT_STANDIN_DEBS")
	if debs == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			t.Skipf("no cache directory for the .debs and no PINRT_STANDIN_DEBS: %v", err)
		}
		debs = filepath.Join(cache, "pinrt-standin", "debs")
	}
	self := staticBinary(t)
	agnhost, real := os.Getenv("PINRT_STANDIN_AGNHOST"), true
	if agnhost == "" {
		agnhost, real = self, false
		t.Log("PINRT_STANDIN_AGNHOST unset: pinrt-standin stands in for the agnhost binary")
	}
	busybox := os.Getenv("PINRT_STANDIN_BUSYBOX")
	if busybox == "" {
		// busybox.sh builds it once into the suites' cache.
		out, err := exec.Command("bash", "busybox.sh").Output()
		if err != nil {
			t.Skipf("no BusyBox 1.37 (PINRT_STANDIN_BUSYBOX unset, busybox.sh: %v)", err)
		}
		busybox = strings.TrimSpace(string(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b := &Builder{Set: NodeE2E, Debs: debs, Self: self, Agnhost: agnhost, Busybox: busybox, Log: io.Discard}
	files, err := b.Fetch(ctx)
	if err != nil {
		t.Fatalf("fetching the .debs into %s (set PINRT_STANDIN_DEBS to a directory holding them to run offline): %v", debs, err)
	}
	dir := t.TempDir()
	if err := b.Build(ctx, files, dir); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p, real
}

// imageByName finds the image stored under name in the layout.
func imageByName(t *testing.T, p layout.Path, n string) v1.Image {
	t.Helper()
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Annotations[RefNameAnnotation] == n {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no %s in the layout", n)
	return nil
}

// entry is one path of an image's file system: the uppermost layer's.
type entry struct {
	hdr  *tar.Header
	data []byte // of a regular file up to 64 KiB
}

// files is an image's file system as its layers stack up (ours have no
// whiteouts).
func files(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	fsys := map[string]entry{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		r := tar.NewReader(rc)
		for {
			h, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			e := entry{hdr: h}
			if h.Typeflag == tar.TypeReg && h.Size <= 64<<10 {
				if e.data, err = io.ReadAll(r); err != nil {
					t.Fatal(err)
				}
			}
			fsys["/"+strings.TrimSuffix(h.Name, "/")] = e
		}
		rc.Close()
	}
	return fsys
}

// unpack extracts the image's layers in order with GNU tar (as root,
// which keeps owners, modes and the setuid bit) into a new directory.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("tar", "-x", "-f", "-", "-C", root)
		cmd.Stdin = rc
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("tar -x: %v: %s", err, out)
		}
		rc.Close()
	}
	return root
}

// runIn runs argv (argv[0] a path in the image) chrooted into root, in a
// UTS namespace of its own, with exactly env; it returns the output.
func runIn(t *testing.T, root string, env []string, argv ...string) string {
	t.Helper()
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: env, Dir: "/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Cloneflags: syscall.CLONE_NEWUTS}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%v: %v: %s", argv, err, out.String())
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("%v: still running after a minute: %s", argv, out.String())
	}
	return out.String()
}

// TestNodeE2EImages checks, on the built node-e2e set, what the specs
// rely on: each image's config, the files agnhost's Dockerfile adds, and
// (as root, chrooted into the unpacked image) that the programs run and
// that sh passes every variable of the environment on.
func TestNodeE2EImages(t *testing.T) {
	p, realAgnhost := nodeE2ELayout(t)
	path := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	agnPorts := []string{"5000/tcp", "80/tcp", "8080/tcp", "8081/tcp", "9376/tcp"}

	t.Run("config", func(t *testing.T) {
		for _, tc := range []struct {
			name       string
			entrypoint []string
			cmd        []string
			user       string
			ports      []string
			stop       string
		}{
			{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", []string{"/agnhost"}, []string{"pause"}, "", agnPorts, ""},
			{"registry.k8s.io/e2e-test-images/agnhost:2.55", []string{"/agnhost"}, []string{"pause"}, "", agnPorts, ""},
			{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", nil, []string{"sh"}, "", nil, ""},
			{"registry.k8s.io/pause:3.10.2", []string{"/pause"}, nil, "65535:65535", nil, ""},
			{"registry.k8s.io/e2e-test-images/nonroot:1.5", nil, []string{"/bin/sh"}, "1234", nil, ""},
			{"registry.k8s.io/e2e-test-images/nonewprivs:1.4", nil, []string{"nnp"}, "", nil, ""},
			{"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1", nil, []string{"bash"}, "", nil, ""},
			{"registry.k8s.io/e2e-test-images/nginx:1.27.0-2", []string{"/docker-entrypoint.sh"}, []string{"nginx", "-g", "daemon off;"}, "", []string{"80/tcp"}, "SIGQUIT"},
			{"registry.k8s.io/e2e-test-images/nginx:1.28.0-2", []string{"/docker-entrypoint.sh"}, []string{"nginx", "-g", "daemon off;"}, "", []string{"80/tcp"}, "SIGQUIT"},
			{"registry.k8s.io/e2e-test-images/ipc-utils:1.4", nil, []string{"/bin/sh"}, "", nil, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cf, err := imageByName(t, p, tc.name).ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				c := cf.Config
				var ports []string
				for port := range c.ExposedPorts {
					ports = append(ports, port)
				}
				slices.Sort(ports)
				if !slices.Equal(c.Entrypoint, tc.entrypoint) || !slices.Equal(c.Cmd, tc.cmd) || c.User != tc.user ||
					!slices.Equal(ports, tc.ports) || c.StopSignal != tc.stop || !slices.Contains(c.Env, path[0]) {
					t.Errorf("entrypoint %q cmd %q user %q ports %v stop %q env %q; want %q %q %q %v %q and %s",
						c.Entrypoint, c.Cmd, c.User, ports, c.StopSignal, c.Env, tc.entrypoint, tc.cmd, tc.user, tc.ports, tc.stop, path[0])
				}
			})
		}
		// As in the registry, each agnhost name is an image of its own.
		a, _ := imageByName(t, p, "registry.k8s.io/e2e-test-images/agnhost:2.66.1").ConfigName()
		b, _ := imageByName(t, p, "registry.k8s.io/e2e-test-images/agnhost:2.55").ConfigName()
		if a == b {
			t.Errorf("agnhost 2.66.1 and 2.55 are one image, %s", a)
		}
	})

	t.Run("files", func(t *testing.T) {
		type want struct {
			path    string
			typ     byte
			mode    int64  // permission bits, when not 0
			link    string // symlink target
			content string // a line the file holds
		}
		for _, tc := range []struct {
			name  string
			files []want
		}{
			{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", []want{
				{path: "/agnhost", typ: tar.TypeReg, mode: 0o755},
				{path: "/agnhost-2", typ: tar.TypeSymlink, link: "agnhost"},
				{path: "/localhost.crt", typ: tar.TypeReg, content: "-----BEGIN CERTIFICATE-----"},
				{path: "/localhost.key", typ: tar.TypeReg, content: "PRIVATE KEY-----"},
				{path: "/uploads", typ: tar.TypeDir},
				{path: "/etc/passwd", typ: tar.TypeReg, content: "\nuser-defined-in-image:x:1000:1000:"},
				{path: "/etc/group", typ: tar.TypeReg, content: "\ngroup-defined-in-image:x:50000:user-defined-in-image\n"},
				{path: "/etc/nsswitch.conf", typ: tar.TypeReg, content: "\nhosts:          files dns\n"},
				{path: "/bin/sh", typ: tar.TypeSymlink, link: "busybox"},
				{path: "/bin/bash", typ: tar.TypeReg, mode: 0o755},
				{path: "/usr/bin/curl", typ: tar.TypeReg},
				{path: "/usr/bin/nc", typ: tar.TypeSymlink, link: "../../bin/nc.openbsd"},
				{path: "/bin/ss", typ: tar.TypeReg},
				{path: "/usr/bin/socat", typ: tar.TypeReg},
				{path: "/usr/bin/ipcs", typ: tar.TypeReg},
			}},
			{"registry.k8s.io/e2e-test-images/busybox:1.37.0-2", []want{
				// BusyBox 1.37's ash, not Debian's (which drops data-1),
				// and every applet in /bin.
				{path: "/bin/busybox", typ: tar.TypeReg, mode: 0o755},
				{path: "/bin/sh", typ: tar.TypeSymlink, link: "busybox"},
				{path: "/bin/sysctl", typ: tar.TypeSymlink, link: "busybox"},
				{path: "/etc/nsswitch.conf", typ: tar.TypeReg, content: "\nhosts:          files dns\n"},
			}},
			{"registry.k8s.io/e2e-test-images/nonewprivs:1.4", []want{
				{path: "/usr/local/bin/nnp", typ: tar.TypeReg, mode: 0o4755},
			}},
			{"registry.k8s.io/pause:3.10.2", []want{
				{path: "/pause", typ: tar.TypeReg, mode: 0o755},
			}},
			{"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1", []want{
				{path: "/bin/sh", typ: tar.TypeSymlink, link: "dash"},
				{path: "/bin/hostname", typ: tar.TypeReg},
				{path: "/bin/bash", typ: tar.TypeReg},
				{path: "/etc/nsswitch.conf", typ: tar.TypeReg, content: "\nhosts:          files dns\n"},
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				fsys := files(t, imageByName(t, p, tc.name))
				for _, w := range tc.files {
					e, ok := fsys[w.path]
					if !ok {
						t.Errorf("no %s", w.path)
						continue
					}
					h := e.hdr
					if h.Typeflag != w.typ || (w.mode != 0 && h.Mode&0o7777 != w.mode) || h.Linkname != w.link {
						t.Errorf("%s: type %c mode %o link %q, want %c %o %q", w.path, h.Typeflag, h.Mode&0o7777, h.Linkname, w.typ, w.mode, w.link)
					}
					if w.content != "" && !strings.Contains(string(e.data), w.content) {
						t.Errorf("%s holds %q, want a part %q", w.path, e.data, w.content)
					}
				}
			})
		}
	})

	t.Run("run", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chroot into the unpacked images needs root")
		}
		env := append([]string{"data-1=value-1", "data_2=value-2"}, path...)
		bb := unpack(t, imageByName(t, p, "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"))
		agn := unpack(t, imageByName(t, p, "registry.k8s.io/e2e-test-images/agnhost:2.66.1"))
		// The ConfigMap and Secret "consumable via the environment" specs.
		for _, root := range []string{bb, agn} {
			out := runIn(t, root, env, "/bin/sh", "-c", "env")
			for _, v := range []string{"data-1=value-1", "data_2=value-2"} {
				if !strings.Contains(out, v+"\n") {
					t.Errorf("%s: sh -c env printed %q, want %s in it", filepath.Base(root), out, v)
				}
			}
		}
		// The read-only root spec expects ash's wording of a failed
		// redirection, not bash's.
		if out := runIn(t, bb, env, "/bin/sh", "-c", "echo x >/nonexistent/file 2>&1; true"); !strings.Contains(out, "can't create /nonexistent/file") {
			t.Errorf("busybox: a failed redirection printed %q, want ash's \"can't create /nonexistent/file\"", out)
		}
		// The busybox applets still run, by name, through sh's PATH.
		if out := runIn(t, bb, env, "/bin/sh", "-c", "echo a-b | cut -d- -f2; id -u"); out != "b\n0\n" {
			t.Errorf("busybox: cut and id printed %q, want \"b\\n0\\n\"", out)
		}
		// Through sh's PATH, as the specs' exec hooks and probes run them.
		for _, tc := range []struct{ cmd, want string }{
			{"curl --version", "curl 7."},
			{"nc -h", "OpenBSD netcat"},
			{"ss -V", "ss utility, iproute2"},
			{"ip -V", "ip utility, iproute2"},
			{"socat -V", "socat version"},
			{"ipcs -V", "ipcs from util-linux"},
		} {
			if out := runIn(t, agn, env, "/bin/sh", "-c", tc.cmd); !strings.Contains(out, tc.want) {
				t.Errorf("agnhost: %s printed %q, want %q in it", tc.cmd, out, tc.want)
			}
		}
		// The readiness spec's script: bash, with a SIGTERM trap.
		if out := runIn(t, agn, env, "/bin/bash", "-c", `trap 'echo term; exit 0' SIGTERM; kill -TERM $$; sleep 5`); out != "term\n" {
			t.Errorf("agnhost: bash trap printed %q, want \"term\\n\"", out)
		}
		if out := runIn(t, agn, env, "/bin/sh", "-c", "id -G user-defined-in-image"); out != "1000 50000\n" {
			t.Errorf("agnhost: id -G user-defined-in-image printed %q, want \"1000 50000\\n\"", out)
		}
		if realAgnhost {
			// The Containers specs: the image's entrypoint and its link.
			if out := runIn(t, agn, env, "/agnhost-2", "entrypoint-tester", "override", "arguments"); out != "[/agnhost-2 entrypoint-tester override arguments]\n" {
				t.Errorf("agnhost: /agnhost-2 entrypoint-tester printed %q", out)
			}
		}
		nnp := unpack(t, imageByName(t, p, "registry.k8s.io/e2e-test-images/nonewprivs:1.4"))
		if out := runIn(t, nnp, env, "/usr/local/bin/nnp"); out != "Effective uid: 0\n" {
			t.Errorf("nonewprivs: nnp printed %q, want \"Effective uid: 0\\n\"", out)
		}
		// Override hostname of Pod: glibc's hostname -f answers from the
		// /etc/hosts kubelet writes, through nsswitch.conf.
		dns := unpack(t, imageByName(t, p, "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"))
		if err := os.WriteFile(filepath.Join(dns, "etc/hosts"), []byte("127.0.0.1 localhost\n10.1.2.3 override-host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := runIn(t, dns, env, "/bin/sh", "-c", `hostname override-host && echo $(hostname)';'$(hostname -f)';'`); out != "override-host;override-host;\n" {
			t.Errorf("glibc-dns-testing: printed %q, want \"override-host;override-host;\\n\"", out)
		}
	})
}
