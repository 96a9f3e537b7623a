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
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/pinrt/pinrt/conf"
)

// The images critest v1.37.0 pulls on linux/amd64 (cri-tools
// pkg/validate and pkg/framework), but the pinned digest.
var critestImages = []string{
	"registry.k8s.io/e2e-test-images/busybox:1.29-2",
	"registry.k8s.io/e2e-test-images/nginx:1.14-2",
	"registry.k8s.io/e2e-test-images/httpd:2.4.39-4",
	"registry.k8s.io/e2e-test-images/nonewprivs:1.3",
	"registry.k8s.io/pause:3.9",
	"k8s.gcr.io/pause:3.9",
	"gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-1:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-2:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-3:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-latest:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-tag:test",
	"gcr.io/k8s-staging-cri-tools/test-image-tag:all",
	"gcr.io/k8s-staging-cri-tools/test-image-tags:1",
	"gcr.io/k8s-staging-cri-tools/test-image-tags:2",
	"gcr.io/k8s-staging-cri-tools/test-image-tags:3",
	"gcr.io/k8s-staging-cri-tools/test-image-user-uid:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-user-username:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-user-uid-group:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-user-username-group:latest",
	"gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest",
}

func TestCatalogHasEveryCritestImage(t *testing.T) {
	checkSet(t, Critest, critestImages)
}

// checkSet checks a set's catalog: every name valid and listed once,
// every image of want present, every entry with its About and Build.
func checkSet(t *testing.T, set Set, want []string) {
	t.Helper()
	have := map[string]int{}
	for _, n := range set.Names() {
		have[n]++
		if _, err := name.ParseReference(n, name.StrictValidation); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	for n, c := range have {
		if c > 1 {
			t.Errorf("%s is in the %s set %d times", n, set.Name, c)
		}
	}
	for _, n := range want {
		if have[n] == 0 {
			t.Errorf("the %s set lacks %s", set.Name, n)
		}
	}
	for _, e := range set.Catalog() {
		if e.About == "" || e.Build == nil {
			t.Errorf("%v: entry without About or Build", e.Names)
		}
	}
}

// MirrorsTOML must be configuration pinrt loads, sending every host of
// the sets to the stand-in registry only.
func TestMirrorsTOMLLoadsInPinrt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sets  []Set
		hosts []string
	}{
		{"critest", []Set{Critest}, []string{"gcr.io", "k8s.gcr.io", "registry.k8s.io"}},
		{"node-e2e", []Set{NodeE2E}, []string{"registry.k8s.io"}},
		{"both", []Set{NodeE2E, Critest}, []string{"gcr.io", "k8s.gcr.io", "registry.k8s.io"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "pinrt.toml")
			if err := os.WriteFile(file, []byte(MirrorsTOML("127.0.0.1:5000", tc.sets...)), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := conf.Load(file, filepath.Join(dir, "pinrt.d"), true)
			if err != nil {
				t.Fatal(err)
			}
			hosts := Hosts(tc.sets...)
			if strings.Join(hosts, " ") != strings.Join(tc.hosts, " ") {
				t.Errorf("Hosts() = %v, want %v", hosts, tc.hosts)
			}
			if len(cfg.Image.Registries) != len(tc.hosts) {
				t.Errorf("%d [image.registries] entries, want %d", len(cfg.Image.Registries), len(tc.hosts))
			}
			for _, h := range tc.hosts {
				r, ok := cfg.Image.Registries[h]
				if !ok {
					t.Errorf("no [image.registries.%q]", h)
					continue
				}
				if !r.SkipOrigin || len(r.Mirrors) != 1 || r.Mirrors[0] != "127.0.0.1:5000/"+h {
					t.Errorf("%s: mirrors %v skip_origin %v, want [127.0.0.1:5000/%s] and true", h, r.Mirrors, r.SkipOrigin, h)
				}
			}
		})
	}
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make deps-apt): %v", tool, err)
		}
	}
}

// layer packs with GNU tar: no "./" prefix, root-owned, fixed times,
// hard links kept as links, modes with the sticky and setuid bits.
func TestLayerIsGNUTar(t *testing.T) {
	needTools(t, "tar", "gzip")
	b := &Builder{work: t.TempDir()}
	tr, err := b.newTree("t")
	if err != nil {
		t.Fatal(err)
	}
	tr.file("/bin/busybox", 0o755, "#!/bin/true\n")
	tr.dir("/tmp", 0o777|os.ModeSticky)
	tr.file("/usr/local/bin/nnp", 0o755|os.ModeSetuid, "x")
	tr.symlink("/var/log/nginx/access.log", "/dev/stdout")
	if tr.err == nil {
		tr.err = os.Link(tr.path("/bin/busybox"), tr.path("/bin/ls"))
	}
	l, err := tr.layer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	r := tar.NewReader(rc)
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "./") || strings.HasPrefix(h.Name, "/") {
			t.Errorf("entry %q: want a relative name without ./", h.Name)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(created) {
			t.Errorf("%s: uid %d gid %d mtime %v, want 0 0 %v", h.Name, h.Uid, h.Gid, h.ModTime, created)
		}
		got[strings.TrimSuffix(h.Name, "/")] = h
	}
	check := func(n string, typ byte, mode int64, link string) {
		t.Helper()
		h := got[n]
		if h == nil {
			names := make([]string, 0, len(got))
			for k := range got {
				names = append(names, k)
			}
			sort.Strings(names)
			t.Errorf("no %s in the layer (%v)", n, names)
			return
		}
		if h.Typeflag != typ || h.Mode&0o7777 != mode || h.Linkname != link {
			t.Errorf("%s: type %c mode %o link %q, want %c %o %q", n, h.Typeflag, h.Mode&0o7777, h.Linkname, typ, mode, link)
		}
	}
	check("tmp", tar.TypeDir, 0o1777, "")
	check("usr/local/bin/nnp", tar.TypeReg, 0o4755, "")
	check("var/log/nginx/access.log", tar.TypeSymlink, 0o777, "/dev/stdout")
	// The first of the two names is the file, the other a link to it.
	bl, ls := got["bin/busybox"], got["bin/ls"]
	if bl == nil || ls == nil || (bl.Typeflag != tar.TypeLink && ls.Typeflag != tar.TypeLink) {
		t.Errorf("bin/busybox and bin/ls: want one a hard link to the other, got %+v %+v", bl, ls)
	}
	// gzip, as registries' images: the blob starts with gzip's magic.
	c, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	magic := make([]byte, 2)
	if _, err := io.ReadFull(c, magic); err != nil || !bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		t.Errorf("compressed layer starts with %x (%v), want gzip's 1f8b", magic, err)
	}
}

// Serve pushes every image of a layout under <addr>/<name> and answers
// pulls of it; ready appears only once it does.
func TestServe(t *testing.T) {
	needTools(t, "tar", "gzip")
	dir := t.TempDir()
	b := &Builder{work: t.TempDir()}
	tr, err := b.newTree("s")
	if err != nil {
		t.Fatal(err)
	}
	tr.file("/hello", 0o644, "hello\n")
	l, err := tr.layer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	img, err := image(Config{Cmd: []string{"sh"}, User: "1002"}, l)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"registry.k8s.io/e2e-test-images/busybox:1.29-2", "k8s.gcr.io/pause:3.9"}
	for _, n := range names {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: n})); err != nil {
			t.Fatal(err)
		}
	}
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "127.0.0.1:0", []string{dir}, ready, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	var addr string
	for deadline := time.Now().Add(30 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if data, err := os.ReadFile(ready); err == nil {
			addr = strings.TrimSpace(string(data))
		}
	}
	if addr == "" {
		t.Fatal("no ready file after 30s")
	}
	want, _ := img.Digest()
	for _, n := range names {
		ref, err := name.ParseReference(addr+"/"+n, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: digest %s, want %s", ref, d, want)
		}
		cf, err := got.ConfigFile()
		if err != nil || cf.Config.User != "1002" {
			t.Errorf("%s: config user %q (%v), want 1002", ref, cf.Config.User, err)
		}
	}
	// A name it was not given is unknown, not served from elsewhere.
	ref, _ := name.ParseReference(addr+"/registry.k8s.io/e2e-test-images/nginx:1.14-2", name.Insecure)
	if _, err := remote.Image(ref); err == nil {
		t.Errorf("pull %s: no error for an image it does not hold", ref)
	}
}

func TestServeRejectsUnnamedImages(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(empty.Image); err != nil {
		t.Fatal(err)
	}
	err = Serve(context.Background(), "127.0.0.1:0", []string{dir}, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), RefNameAnnotation) {
		t.Errorf("Serve of an unnamed image: %v, want an error naming %s", err, RefNameAnnotation)
	}
}

func TestMulticall(t *testing.T) {
	var out bytes.Buffer
	ok, code := Multicall("nnp", &out)
	if !ok || code != 0 || out.String() != "Effective uid: "+strconv.Itoa(os.Geteuid())+"\n" {
		t.Errorf("nnp: ok %v code %d output %q", ok, code, out.String())
	}
	out.Reset()
	if ok, _ := Multicall("pinrt-standin", &out); ok || out.Len() != 0 {
		t.Errorf("pinrt-standin: handled %v, output %q; want neither", ok, out.String())
	}
}

// Serve serves several layouts at once (critest's and node-e2e's sets
// behind one mirror); one name must not stand for two images.
func TestServeLayouts(t *testing.T) {
	needTools(t, "tar", "gzip")
	b := &Builder{work: t.TempDir()}
	img := func(file string) v1.Image {
		tr, err := b.newTree("s")
		if err != nil {
			t.Fatal(err)
		}
		tr.file(file, 0o644, file+"\n")
		l, err := tr.layer(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		i, err := image(Config{Cmd: []string{"sh"}}, l)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	one, two := img("/one"), img("/two")
	write := func(images map[string]v1.Image) string {
		dir := t.TempDir()
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		for n, i := range images {
			if err := p.AppendImage(i, layout.WithAnnotations(map[string]string{RefNameAnnotation: n})); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	const (
		a = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
		c = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	)
	critest := write(map[string]v1.Image{a: one})
	nodeE2E := write(map[string]v1.Image{c: two, a: one}) // a again, the same image
	clash := write(map[string]v1.Image{a: two})

	t.Run("two layouts", func(t *testing.T) {
		ready := filepath.Join(t.TempDir(), "ready")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, "127.0.0.1:0", []string{critest, nodeE2E}, ready, io.Discard) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}()
		var addr string
		for deadline := time.Now().Add(30 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if data, err := os.ReadFile(ready); err == nil {
				addr = strings.TrimSpace(string(data))
			}
		}
		if addr == "" {
			t.Fatal("no ready file after 30s")
		}
		for n, want := range map[string]v1.Image{a: one, c: two} {
			ref, err := name.ParseReference(addr+"/"+n, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			got, err := remote.Image(ref)
			if err != nil {
				t.Fatalf("pull %s: %v", ref, err)
			}
			gd, _ := got.Digest()
			wd, _ := want.Digest()
			if gd != wd {
				t.Errorf("%s: digest %s, want %s", ref, gd, wd)
			}
		}
	})
	t.Run("one name, two images", func(t *testing.T) {
		err := Serve(context.Background(), "127.0.0.1:0", []string{critest, clash}, "", io.Discard)
		if err == nil || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), "earlier layout") {
			t.Errorf("Serve of two images under %s: %v, want an error naming it", a, err)
		}
	})
}
