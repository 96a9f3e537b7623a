// Package testimage builds small OCI images for tests and serves them
// from an in-process registry, so no test needs the network.
//
// A typical end-to-end test does:
//
//	reg := testimage.StartRegistry(t)
//	ref := reg.Push(t, "busybox:1", testimage.Busybox(t))
//	// pull ref ("127.0.0.1:<port>/busybox@sha256:...") through the runtime
//
// Images are built from Debian's static /bin/busybox (package
// busybox-static), applet symlinks, an /etc/passwd and /etc/group with
// root, www-data (33), user1002 (1002) and nobody, and optionally static Go
// programs compiled on the fly. Image builds are deterministic: the same
// Spec gives the same image ID.
//
// Spec.Shape makes the layers the way the outside world does (GNU tar,
// the gzip and zstd binaries, uncompressed, Docker media types), and
// PushIndexAs and Intercept give multi-arch indexes, manifest lists and a
// registry that misbehaves on purpose: see shapes.go.
package testimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is where busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// Applets get a symlink to busybox in /bin.
var Applets = []string{
	"sh", "ls", "cat", "sleep", "id", "echo", "mount", "umount", "true", "false",
	"env", "ps", "grep", "head", "tail", "touch", "mkdir", "rm", "rmdir", "chmod",
	"chown", "stat", "wc", "date", "hostname", "ln", "cp", "mv", "test", "printf",
	"uname", "whoami", "kill", "nc", "wget", "readlink", "df", "du", "find", "sed",
	"awk", "tee", "dd", "top", "pwd", "ip", "ping", "nslookup", "cut", "seq", "yes",
	"sync", "nproc", "ulimit", "free", "xargs", "basename", "dirname", "which",
}

// Passwd and Group are the /etc files of every Busybox-based image.
const (
	Passwd = "root:x:0:0:root:/root:/bin/sh\n" +
		"www-data:x:33:33:www-data:/var/www:/bin/sh\n" +
		"user1002:x:1002:1002:user1002:/home/user1002:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	Group = "root:x:0:\n" +
		"www-data:x:33:\n" +
		"group1002:x:1002:\n" +
		"nogroup:x:65534:\n"
)

// File is one entry of a layer. Mode holds the permission bits including
// setuid/setgid/sticky (os.ModeSetuid etc. or the raw 04000 bits both
// work); Type is a tar type flag (default regular file, or directory when
// Path ends in "/").
type File struct {
	Path     string
	Content  []byte
	Mode     int64 // e.g. 0o4755; 0 means 0644 for files, 0755 for dirs
	UID, GID int
	Type     byte   // tar.TypeReg, TypeDir, TypeSymlink, TypeLink, TypeChar, TypeFifo...
	Linkname string // symlink or hard link target
	Xattrs   map[string]string
}

// Spec describes an image. Layers are stacked in order on top of the
// base layer (busybox, /etc files and programs) unless NoBusybox.
type Spec struct {
	// NoBusybox leaves out the busybox base layer.
	NoBusybox bool
	// Programs maps an image path to the source of a Go main package;
	// each is built with CGO_ENABLED=0 and added with mode 0755.
	Programs map[string]string
	// Layers are extra layers, bottom to top.
	Layers [][]File

	Entrypoint []string
	Cmd        []string
	Env        []string // default PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	User       string
	StopSignal string
	WorkingDir string
	Labels     map[string]string
	// Volumes are the image's VOLUMEs (its config's Volumes).
	Volumes []string
	// Architecture defaults to amd64.
	Architecture string
	// Shape is how every layer (the base too) is written and what
	// manifest describes the image; the zero Shape is Go's tar and gzip
	// under an OCI manifest.
	Shape Shape
}

// DefaultPath is the PATH of images built without Env.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Build builds the image described by spec.
func Build(t testing.TB, spec Spec) v1.Image {
	t.Helper()
	layer := func(files []File) v1.Layer {
		if spec.Shape == (Shape{}) {
			return Layer(t, files)
		}
		return ShapedLayer(t, files, spec.Shape)
	}
	var layers []v1.Layer
	if !spec.NoBusybox {
		layers = append(layers, layer(BaseFiles(t)))
	}
	if len(spec.Programs) > 0 {
		var files []File
		for _, p := range sortedKeys(spec.Programs) {
			files = append(files, File{Path: p, Content: GoProgram(t, spec.Programs[p]), Mode: 0o755})
		}
		layers = append(layers, layer(files))
	}
	for _, l := range spec.Layers {
		layers = append(layers, layer(l))
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatalf("testimage: append layers: %v", err)
	}
	if spec.Shape.Docker {
		img = mutate.MediaType(img, types.DockerManifestSchema2)
		img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	} else {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("testimage: config: %v", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = spec.Architecture
	if cf.Architecture == "" {
		cf.Architecture = "amd64"
	}
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	if cf.Config.Env == nil {
		cf.Config.Env = []string{DefaultPath}
	}
	cf.Config.User = spec.User
	cf.Config.StopSignal = spec.StopSignal
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.Labels = spec.Labels
	if len(spec.Volumes) > 0 {
		cf.Config.Volumes = map[string]struct{}{}
		for _, v := range spec.Volumes {
			cf.Config.Volumes[v] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatalf("testimage: set config: %v", err)
	}
	return img
}

// Busybox is the plain busybox image with Cmd ["sh"].
func Busybox(t testing.TB) v1.Image {
	t.Helper()
	return Build(t, Spec{Cmd: []string{"sh"}})
}

// BaseFiles are busybox, its applet links and the /etc files.
func BaseFiles(t testing.TB) []File {
	t.Helper()
	bb, err := os.ReadFile(BusyboxPath)
	if err != nil {
		t.Fatalf("testimage: %v: busybox-static is needed for every test image (make deps installs it)", err)
	}
	files := []File{
		{Path: "bin/", Mode: 0o755}, {Path: "etc/", Mode: 0o755}, {Path: "tmp/", Mode: 0o1777},
		{Path: "root/", Mode: 0o700}, {Path: "proc/", Mode: 0o555}, {Path: "sys/", Mode: 0o555},
		{Path: "dev/", Mode: 0o755}, {Path: "var/", Mode: 0o755}, {Path: "var/www/", Mode: 0o755, UID: 33, GID: 33},
		{Path: "home/", Mode: 0o755}, {Path: "home/user1002/", Mode: 0o750, UID: 1002, GID: 1002},
		{Path: "usr/", Mode: 0o755}, {Path: "usr/bin/", Mode: 0o755}, {Path: "sbin/", Mode: 0o755},
		{Path: "bin/busybox", Content: bb, Mode: 0o755},
		{Path: "etc/passwd", Content: []byte(Passwd), Mode: 0o644},
		{Path: "etc/group", Content: []byte(Group), Mode: 0o644},
		{Path: "etc/hostname", Content: []byte("testimage\n"), Mode: 0o644},
	}
	for _, a := range Applets {
		files = append(files, File{Path: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	return files
}

// Layer turns files into a gzip layer (OCI media type).
func Layer(t testing.TB, files []File) v1.Layer {
	t.Helper()
	data := TarBytes(t, files)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatalf("testimage: layer: %v", err)
	}
	return l
}

// TopLayer is the digest of img's last layer, the one a pull fetches
// last: tests slow or break its download.
func TopLayer(t testing.TB, img v1.Image) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		t.Fatalf("testimage: layers: %v (%d)", err, len(layers))
	}
	top, err := layers[len(layers)-1].Digest()
	if err != nil {
		t.Fatalf("testimage: top layer: %v", err)
	}
	return top.String()
}

// TarBytes writes files as an uncompressed tar stream.
func TarBytes(t testing.TB, files []File) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{
			Name: f.Path, Uid: f.UID, Gid: f.GID, Mode: f.Mode, ModTime: epoch,
			Typeflag: f.Type, Linkname: f.Linkname, Format: tar.FormatPAX,
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
			if strings.HasSuffix(f.Path, "/") {
				hdr.Typeflag = tar.TypeDir
			}
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
			if hdr.Typeflag == tar.TypeSymlink {
				hdr.Mode = 0o777
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(f.Content))
		}
		for k, v := range f.Xattrs {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("testimage: tar header %s: %v", f.Path, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Content); err != nil {
				t.Fatalf("testimage: tar %s: %v", f.Path, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("testimage: tar: %v", err)
	}
	return buf.Bytes()
}

var (
	progMu    sync.Mutex
	progCache = map[string][]byte{}
)

// GoProgram compiles a Go main package from source into a static binary.
// Results are cached per process by source hash.
func GoProgram(t testing.TB, source string) []byte {
	t.Helper()
	sum := sha256.Sum256([]byte(source))
	key := hex.EncodeToString(sum[:])
	progMu.Lock()
	defer progMu.Unlock()
	if b, ok := progCache[key]; ok {
		return b
	}
	dir, err := os.MkdirTemp("", "testimage-prog-")
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	defer os.RemoveAll(dir)
	files := map[string]string{
		"main.go": source,
		"go.mod":  "module prog\n\ngo 1.22\n",
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatalf("testimage: %v", err)
		}
	}
	goBin := filepath.Join(runtimeGOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", "prog", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testimage: go build: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "prog"))
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	progCache[key] = b
	return b
}

func runtimeGOROOT() string {
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		return strings.TrimSpace(string(out))
	}
	return "/usr/local/go"
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Registry is an in-process OCI registry on 127.0.0.1 that counts the
// requests it serves.
type Registry struct {
	// Addr is "127.0.0.1:<port>", the registry part of image names.
	Addr string

	srv   *httptest.Server
	mu    sync.Mutex
	reqs  []string     // "METHOD /path"
	reg   http.Handler // the registry itself
	front http.Handler // what serves requests; reg unless Intercept
}

// StartRegistry starts a registry; it is closed on t.Cleanup.
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{}
	r.reg = registry.New(registry.Logger(discardLogger()))
	r.front = r.reg
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
		front := r.front
		r.mu.Unlock()
		front.ServeHTTP(w, req)
	}))
	r.Addr = strings.TrimPrefix(r.srv.URL, "http://")
	t.Cleanup(r.Close)
	return r
}

// Intercept serves the requests that follow with wrap(registry): a
// handler in front of the registry that damages a blob, throttles it or
// demands credentials. nil restores the plain registry. Push goes
// through the front too, so push first. Requests still count in Log.
func (r *Registry) Intercept(wrap func(registry http.Handler) http.Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.front = r.reg
	if wrap != nil {
		r.front = wrap(r.reg)
	}
}

// Close stops the registry (for tests of an unreachable registry too).
func (r *Registry) Close() { r.srv.Close() }

// Requests counts the requests whose "METHOD /path" contains sub, e.g.
// Requests("GET /v2/busybox/blobs/sha256:ab...").
func (r *Registry) Requests(sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.reqs {
		if strings.Contains(q, sub) {
			n++
		}
	}
	return n
}

// Log returns every request served so far.
func (r *Registry) Log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reqs...)
}

// ResetRequests forgets the counted requests (e.g. those of Push).
func (r *Registry) ResetRequests() {
	r.mu.Lock()
	r.reqs = nil
	r.mu.Unlock()
}

// Ref prefixes a "repo:tag" with the registry address.
func (r *Registry) Ref(repoTag string) string { return r.Addr + "/" + repoTag }

// Push uploads img as "repo:tag" (relative to the registry) and returns
// its digest reference "127.0.0.1:<port>/repo@sha256:...". The push's
// own requests are not counted.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("testimage: push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	r.ResetRequests()
	return ref.Context().Name() + "@" + d.String()
}

// PlatformImage is one entry of a multi-arch index.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// PushIndex uploads a multi-arch OCI index as "repo:tag" and returns its
// digest reference.
func (r *Registry) PushIndex(t testing.TB, repoTag string, imgs ...PlatformImage) string {
	t.Helper()
	return r.PushIndexAs(t, repoTag, types.OCIImageIndex, imgs...)
}

// PushIndexAs is PushIndex with the index media type: types.OCIImageIndex
// or types.DockerManifestList (whose entries should be Docker images).
// The entries keep their order, so a test can list foreign platforms
// before the one the runtime must pick.
func (r *Registry) PushIndexAs(t testing.TB, repoTag string, mt types.MediaType, imgs ...PlatformImage) string {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, mt)
	for _, pi := range imgs {
		p := pi.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        pi.Image,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("testimage: push index %s: %v", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	r.ResetRequests()
	return ref.Context().Name() + "@" + d.String()
}

// ID returns the image ID (config digest) of img.
func ID(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatalf("testimage: %v", err)
	}
	return d.String()
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// TarFiles reads a tar stream and returns its regular files' contents
// by entry name.
func TarFiles(t testing.TB, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("reading a tar stream: %v", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = b
	}
}

// TarFileAt is TarFiles of the tar archive at path.
func TarFileAt(t testing.TB, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return TarFiles(t, f)
}
