// Package standin builds stand-ins for the public images a test suite
// pulls, under their real names, and serves them from a registry on
// loopback, so a node with no network at all can run the suite exactly as
// an air-gapped node would: pinrt reaches the registry through its own
// [image.registries] mirror settings with skip_origin, never through a
// rewritten image name.
//
// The images come in sets, one per suite (Sets):
//
//   - critest (the default): every image the CRI conformance suite
//     (critest) pulls (Catalog); test/k8snode's own specs use its
//     Busybox and WebServer too.
//   - node-e2e: every image Kubernetes' [NodeConformance] e2e specs of
//     test/e2e/common pull (NodeE2ECatalog): agnhost, busybox, pause,
//     nonroot, nonewprivs, glibc-dns-testing, and nginx and ipc-utils for
//     the e2e framework's pre-pull list. Its agnhost images hold the real
//     agnhost binary, built from the Kubernetes module and given to build
//     with -agnhost.
//
// The images are made from Debian packages (busybox, bash-static, curl,
// nginx and the libraries they load, ipcs from util-linux, pgrep from
// procps, ...), fetched with `apt-get download` into a cache directory;
// each layer is a staged directory tree packed with GNU tar and
// compressed with gzip, the tools registries' images are made with.
// Every ELF file of an image must find its loader and libraries in that
// image, or the build fails. Each catalog entry says what it stands in
// for and how it differs from the original.
//
// The command test/standin/cmd/pinrt-standin drives it:
//
//	go build -o bin/pinrt-standin ./test/standin/cmd/pinrt-standin
//	dir=$(bin/pinrt-standin build -cache /var/cache/pinrt-vm/standin)
//	bin/pinrt-standin serve -addr 127.0.0.1:5000 -ready /tmp/reg.ready "$dir" &
//	bin/pinrt-standin mirrors -addr 127.0.0.1:5000 >/etc/pinrt/pinrt.d/50-standin.toml
//
// and for the node-e2e set (agnhost built from the Kubernetes module):
//
//	dir=$(bin/pinrt-standin build -cache DIR -set node-e2e -agnhost /path/to/agnhost)
//	bin/pinrt-standin serve -addr 127.0.0.1:5000 "$dir" &
//	bin/pinrt-standin mirrors -addr 127.0.0.1:5000 -set node-e2e
//
// build prints the directory of the built images, an OCI image layout,
// and reuses it while the .deb files and the pinrt-standin binary (so the
// recipes in this package), and the agnhost binary for node-e2e, are
// unchanged: the cache key is a hash of them.
// build needs apt-get (Debian's sources reachable) only on a cold cache.
// serve loads one or more layouts into an in-memory registry, writes the
// -ready file once every image is pushed, and serves until killed; a
// layout can be copied to another machine (the VM) and served there.
// mirrors prints the TOML that points every registry host of the sets at
// the served registry, with skip_origin = true.
//
// In the registry an image "registry.k8s.io/e2e-test-images/nginx:1.14-2"
// is stored as "<addr>/registry.k8s.io/e2e-test-images/nginx:1.14-2": one
// path prefix per origin host, which is what the mirror entries name.
// Another suite reuses the images by these names (Set.Names, or the
// catalog entries); the Kubernetes node suite wants WebServer (nginx
// answering HTTP on port 80 with its access log on /dev/stdout) and
// Busybox.
package standin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image names other suites may rely on.
const (
	// Busybox is critest's default image: busybox with every applet.
	Busybox = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
	// WebServer is nginx serving HTTP on port 80, access log on
	// /dev/stdout and error log on /dev/stderr, as the official image.
	WebServer = "registry.k8s.io/e2e-test-images/nginx:1.14-2"
)

// RefNameAnnotation holds an image's full name in the layout's index.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// created is every image's creation time, so builds are deterministic.
var created = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// A Set is the group of stand-ins one suite pulls, built into one layout.
type Set struct {
	// Name selects the set: pinrt-standin build -set NAME.
	Name string
	// Packages are the Debian packages its images are made of.
	Packages []string
	// Catalog lists its images.
	Catalog func() []Entry
	// Agnhost says its images hold Builder.Agnhost.
	Agnhost bool
}

// Critest is the default set: the images of Catalog.
var Critest = Set{Name: "critest", Packages: Packages, Catalog: Catalog}

// NodeE2E is the set of NodeE2ECatalog.
var NodeE2E = Set{Name: "node-e2e", Packages: NodeE2EPackages, Catalog: NodeE2ECatalog, Agnhost: true}

// Sets lists every set, the default first.
func Sets() []Set { return []Set{Critest, NodeE2E} }

// LookupSet returns the set called name.
func LookupSet(name string) (Set, error) {
	var names []string
	for _, s := range Sets() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Set{}, fmt.Errorf("no image set %q (have %s)", name, strings.Join(names, ", "))
}

// Names lists every image name of the set.
func (s Set) Names() []string {
	var names []string
	for _, e := range s.Catalog() {
		names = append(names, e.Names...)
	}
	return names
}

// Hosts are the registry hosts the images of the sets come from; mirrors
// point each at the stand-in registry.
func Hosts(sets ...Set) []string {
	seen := map[string]bool{}
	var hosts []string
	for _, s := range sets {
		for _, n := range s.Names() {
			h, _, _ := strings.Cut(n, "/")
			if !seen[h] {
				seen[h] = true
				hosts = append(hosts, h)
			}
		}
	}
	sort.Strings(hosts)
	return hosts
}

// MirrorsTOML is pinrt configuration sending every host of the sets'
// images to the registry at addr (host:port) and nowhere else.
func MirrorsTOML(addr string, sets ...Set) string {
	var b strings.Builder
	b.WriteString("# Stand-in images (test/standin): every registry the images come from is\n# mirrored to " + addr + ", never reached itself.\n")
	for _, h := range Hosts(sets...) {
		fmt.Fprintf(&b, "[image.registries.%q]\n  mirrors = [%q]\n  skip_origin = true\n", h, addr+"/"+h)
	}
	return b.String()
}

// Builder makes the images of a set.
type Builder struct {
	// Set is the set to build; the zero Set is Critest.
	Set Set
	// Debs is the directory holding the .deb files (apt-get download
	// fills it when one is missing).
	Debs string
	// Self is a static binary copied into images as /usr/local/bin/nnp
	// and /pause: pinrt-standin itself, which behaves as those programs
	// when called by those names (see Multicall).
	Self string
	// Agnhost is Kubernetes' agnhost binary (test/images/agnhost of the
	// release under test, built with CGO_ENABLED=0 as its image does),
	// which a set with Agnhost copies into its images as /agnhost.
	Agnhost string
	// Busybox is BusyBox 1.37.0 as the official image has it, static
	// (test/standin/busybox.sh builds it), which the node-e2e set puts
	// over Debian's busybox as its shell and applets.
	Busybox string
	// Log receives progress lines.
	Log io.Writer

	work   string
	layers map[string]v1.Layer // shared layers by name, built once
	// roots maps each layer to the tree it was packed from, which
	// checkLinked inspects; needs caches what the trees' ELF files need.
	roots map[v1.Layer]string
	needs map[string][]elfNeeds
}

// set is the set being built.
func (b *Builder) set() Set {
	if b.Set.Name == "" {
		return Critest
	}
	return b.Set
}

// Packages are the Debian packages of the critest set's images.
var Packages = []string{
	// Debian's dynamically linked busybox, not busybox-static: the static
	// build's shell runs applets without exec (FEATURE_SH_STANDALONE), so
	// a masked /bin/ls would still run, unlike in the official image.
	// glibc, and ipcs and pgrep with their libraries: busybox lacks them.
	"busybox", "libc6", "util-linux", "procps", "libproc2-0",
	"libsystemd0", "libcap2", "libgcrypt20", "liblzma5", "libzstd1", "liblz4-1", "libgpg-error0",
	// nginx.
	"nginx", "nginx-common", "libcrypt1", "libpcre2-8-0", "libssl3", "zlib1g",
}

// Fetch makes sure Debs holds a .deb of every package, downloading the
// missing ones, and returns their paths by package name.
func (b *Builder) Fetch(ctx context.Context) (map[string]string, error) {
	if err := os.MkdirAll(b.Debs, 0o755); err != nil {
		return nil, err
	}
	find := func() (map[string]string, []string) {
		have := map[string]string{}
		var missing []string
		for _, p := range b.set().Packages {
			m, _ := filepath.Glob(filepath.Join(b.Debs, p+"_*.deb"))
			if len(m) == 0 {
				missing = append(missing, p)
				continue
			}
			sort.Strings(m)
			have[p] = m[len(m)-1]
		}
		return have, missing
	}
	have, missing := find()
	if len(missing) == 0 {
		return have, nil
	}
	fmt.Fprintf(b.Log, "standin: downloading %s\n", strings.Join(missing, " "))
	download := func() error {
		cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, missing...)...)
		cmd.Dir = b.Debs
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get download: %w: %s", err, out)
		}
		return nil
	}
	if err := download(); err != nil {
		// A fresh machine has no package lists yet.
		fmt.Fprintf(b.Log, "standin: %v; running apt-get update\n", err)
		if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("apt-get update: %w: %s", err, out)
		}
		if err := download(); err != nil {
			return nil, err
		}
	}
	have, missing = find()
	if len(missing) > 0 {
		return nil, fmt.Errorf("no .deb for %s in %s after apt-get download", strings.Join(missing, " "), b.Debs)
	}
	return have, nil
}

// Key is a hash of the inputs: the .deb files by name, the Self
// binary's content (the recipes are compiled into it) and, for a set
// other than critest, the set's name and the Agnhost binary's content.
// The critest key is computed as it was before there were sets, so a
// warm critest cache stays warm.
func (b *Builder) Key(debs map[string]string) (string, error) {
	set := b.set()
	h := sha256.New()
	names := make([]string, 0, len(debs))
	for _, p := range debs {
		names = append(names, filepath.Base(p))
	}
	sort.Strings(names)
	fmt.Fprintf(h, "debs %s\n", strings.Join(names, " "))
	if err := hashFile(h, b.Self); err != nil {
		return "", err
	}
	if set.Name != Critest.Name {
		fmt.Fprintf(h, "\nset %s\n", set.Name)
	}
	if set.Agnhost {
		if b.Agnhost == "" {
			return "", fmt.Errorf("set %s needs the agnhost binary (-agnhost)", set.Name)
		}
		fmt.Fprintf(h, "agnhost\n")
		if err := hashFile(h, b.Agnhost); err != nil {
			return "", err
		}
		fmt.Fprintf(h, "busybox\n")
		if err := hashFile(h, b.Busybox); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func hashFile(h io.Writer, name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}

// Build writes every image of the set into a new OCI layout at dir.
func (b *Builder) Build(ctx context.Context, debs map[string]string, dir string) error {
	work, err := os.MkdirTemp("", "standin-build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b.work = work
	b.layers, b.roots, b.needs = nil, nil, nil
	defer func() { b.layers, b.roots, b.needs = nil, nil, nil }()
	for p, deb := range debs {
		x := filepath.Join(work, "deb", p)
		if err := os.MkdirAll(x, 0o755); err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, x).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %w: %s", deb, err, out)
		}
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	for _, e := range b.set().Catalog() {
		img, err := e.Build(ctx, b)
		if err != nil {
			return fmt.Errorf("%s: %w", e.Names[0], err)
		}
		for _, n := range e.Names {
			if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: n})); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		}
		id, _ := img.ConfigName()
		fmt.Fprintf(b.Log, "standin: built %s (%s)\n", strings.Join(e.Names, ", "), id)
	}
	return nil
}

// Cached builds the images into cache/images-<key> (critest) or
// cache/images-<set>-<key> unless that exists, fetching the .debs into
// cache/debs, and returns the directory.
func (b *Builder) Cached(ctx context.Context, cache string) (string, error) {
	if b.Debs == "" {
		b.Debs = filepath.Join(cache, "debs")
	}
	if b.set().Agnhost {
		if err := b.checkAgnhost(); err != nil {
			return "", err // before a download that would be in vain
		}
	}
	debs, err := b.Fetch(ctx)
	if err != nil {
		return "", err
	}
	key, err := b.Key(debs)
	if err != nil {
		return "", err
	}
	name := "images-" + key
	if set := b.set(); set.Name != Critest.Name {
		name = "images-" + set.Name + "-" + key
	}
	dir := filepath.Join(cache, name)
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		return dir, nil
	}
	// Build beside and rename, so a concurrent or interrupted build never
	// leaves a half layout under the final name.
	tmp, err := os.MkdirTemp(cache, "."+name+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := b.Build(ctx, debs, tmp); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "index.json")); serr == nil {
			return dir, nil // another build won
		}
		return "", err
	}
	return dir, nil
}

// Config is the part of an image's config a catalog entry sets.
type Config struct {
	Entrypoint   []string
	Cmd          []string
	User         string
	WorkingDir   string
	Env          []string
	ExposedPorts []string
	StopSignal   string
	Labels       map[string]string
}

// image assembles layers and config into an image.
func image(cfg Config, layers ...v1.Layer) (v1.Image, error) {
	ports := map[string]struct{}{}
	for _, p := range cfg.ExposedPorts {
		ports[p] = struct{}{}
	}
	env := cfg.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Entrypoint: cfg.Entrypoint,
			Cmd:        cfg.Cmd,
			User:       cfg.User,
			WorkingDir: cfg.WorkingDir,
			Env:        env,
			StopSignal: cfg.StopSignal,
			Labels:     cfg.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	if len(ports) > 0 {
		cf.Config.ExposedPorts = ports
	}
	img, err := mutate.ConfigFile(empty.Image, cf)
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   l,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "pinrt-standin"},
		})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// image is the free function image after checking that every ELF file of
// the layers finds its loader and libraries in them.
func (b *Builder) image(cfg Config, layers ...v1.Layer) (v1.Image, error) {
	roots := make([]string, 0, len(layers))
	for _, l := range layers {
		r, ok := b.roots[l]
		if !ok {
			return nil, errors.New("a layer not packed by this builder")
		}
		roots = append(roots, r)
	}
	if err := b.checkLinked(roots); err != nil {
		return nil, err
	}
	return image(cfg, layers...)
}

// shared returns the layer called name, made by mk on first use: layers
// several images hold are packed once, so the images share their blobs.
func (b *Builder) shared(name string, mk func() (v1.Layer, error)) (v1.Layer, error) {
	if l := b.layers[name]; l != nil {
		return l, nil
	}
	l, err := mk()
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", name, err)
	}
	if b.layers == nil {
		b.layers = map[string]v1.Layer{}
	}
	b.layers[name] = l
	return l, nil
}

// layer packs the tree under dir with GNU tar (sorted, root-owned, fixed
// mtimes) and gzip, the way image build tools do, without a "./" prefix.
func layer(ctx context.Context, dir string) (v1.Layer, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	args := []string{"--create", "--file=-", "--format=gnu", "--sort=name", "--numeric-owner",
		"--owner=0", "--group=0", "--mtime=@" + fmt.Sprint(created.Unix()), "-C", dir}
	for _, e := range ents {
		args = append(args, e.Name())
	}
	tarCmd := exec.CommandContext(ctx, "tar", args...)
	gz := exec.CommandContext(ctx, "gzip", "-n", "-c")
	pipe, err := tarCmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	gz.Stdin = pipe
	var tarErr strings.Builder
	tarCmd.Stderr = &tarErr
	if err := tarCmd.Start(); err != nil {
		return nil, fmt.Errorf("GNU tar: %w", err)
	}
	blob, gzErr := gz.Output()
	if err := tarCmd.Wait(); err != nil {
		return nil, fmt.Errorf("tar %s: %w: %s", dir, err, tarErr.String())
	}
	if gzErr != nil {
		return nil, fmt.Errorf("gzip: %w", gzErr)
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(string(blob))), nil
	})
}

// tree is a directory being staged for one layer.
type tree struct {
	b    *Builder
	root string
	err  error
}

func (b *Builder) newTree(name string) (*tree, error) {
	d, err := os.MkdirTemp(b.work, "layer-"+name+"-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(d, 0o755); err != nil {
		return nil, err
	}
	return &tree{b: b, root: d}, nil
}

func (t *tree) path(p string) string { return filepath.Join(t.root, strings.TrimPrefix(p, "/")) }

func (t *tree) dir(p string, mode os.FileMode) {
	if t.err != nil {
		return
	}
	if t.err = os.MkdirAll(t.path(p), 0o755); t.err == nil {
		t.err = os.Chmod(t.path(p), mode)
	}
}

func (t *tree) file(p string, mode os.FileMode, content string) {
	t.dir(filepath.Dir(p), 0o755)
	if t.err != nil {
		return
	}
	if t.err = os.WriteFile(t.path(p), []byte(content), mode); t.err == nil {
		t.err = os.Chmod(t.path(p), mode) // past the umask, with setuid bits
	}
}

func (t *tree) symlink(p, target string) {
	t.dir(filepath.Dir(p), 0o755)
	if t.err != nil {
		return
	}
	_ = os.Remove(t.path(p))
	t.err = os.Symlink(target, t.path(p))
}

// copyFile copies a host file (a binary) into the tree.
func (t *tree) copyFile(p string, mode os.FileMode, src string) {
	if t.err != nil {
		return
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.err = err
		return
	}
	t.file(p, mode, string(data))
}

// unpack copies an extracted package into the tree: all of it, or only
// the given paths; documentation is left out.
func (b *Builder) unpack(t *tree, pkg string, only ...string) {
	if t.err != nil {
		return
	}
	src := filepath.Join(b.work, "deb", pkg)
	if _, err := os.Stat(src); err != nil {
		t.err = fmt.Errorf("package %s not extracted: %w", pkg, err)
		return
	}
	if len(only) == 0 {
		only = []string{"."}
	}
	for _, o := range only {
		// cp -a keeps modes and symlinks; --parents keeps the path.
		cmd := exec.Command("cp", "-a", "--parents", o, t.root)
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			t.err = fmt.Errorf("copy %s from %s: %w: %s", o, pkg, err, out)
			return
		}
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/lintian", "usr/share/locale", "usr/share/info", "usr/share/bug"} {
		_ = os.RemoveAll(t.path(d))
	}
}

func (t *tree) layer(ctx context.Context) (v1.Layer, error) {
	if t.err != nil {
		return nil, t.err
	}
	l, err := layer(ctx, t.root)
	if err != nil {
		return nil, err
	}
	if t.b.roots == nil {
		t.b.roots = map[v1.Layer]string{}
	}
	t.b.roots[l] = t.root
	return l, nil
}

// errNoApplets is returned when busybox lists no applets.
var errNoApplets = errors.New("busybox --list-full printed no applets")
