package image

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/pinrt/pinrt/test/testimage"
)

func newTestStore(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Root == "" {
		opts.Root = filepath.Join(t.TempDir(), "images")
	}
	s, err := NewStore(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPullByTagAndDigest(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{
		Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "true"}, User: "www-data:www-data",
		WorkingDir: "/var/www", StopSignal: "SIGINT", Env: []string{"A=1"},
		Layers: [][]testimage.File{{{Path: "etc/motd", Content: []byte("hi")}}},
	})
	digestRef := reg.Push(t, "app:v1", img)
	id := testimage.ID(t, img)
	s := newTestStore(t, Options{PullTimeout: 30 * time.Second})
	ctx := context.Background()

	got, err := s.Pull(ctx, reg.Ref("app:v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != id {
		t.Fatalf("ID %s, want %s", got.ID, id)
	}
	wantTags := []string{reg.Ref("app:v1")}
	wantDigests := []string{digestRef}
	if !slices.Equal(got.RepoTags, wantTags) || !slices.Equal(got.RepoDigests, wantDigests) {
		t.Fatalf("tags %v digests %v; want %v %v", got.RepoTags, got.RepoDigests, wantTags, wantDigests)
	}
	if got.Config.User != "www-data:www-data" || got.Config.WorkingDir != "/var/www" || got.Config.StopSignal != "SIGINT" ||
		!slices.Equal(got.Config.Entrypoint, []string{"/bin/sh"}) || !slices.Equal(got.Config.Env, []string{"A=1"}) {
		t.Fatalf("config %+v", got.Config)
	}
	if uid, user := got.UIDOrUser(); uid != nil || user != "www-data" {
		t.Fatalf("UIDOrUser = %v, %q", uid, user)
	}
	wantSize := uint64(0)
	m, _ := img.Manifest()
	wantSize += uint64(m.Config.Size)
	for _, l := range m.Layers {
		wantSize += uint64(l.Size)
	}
	if got.Size != wantSize || len(got.ChainIDs) != 2 {
		t.Fatalf("size %d chainIDs %v; want %d, 2 layers", got.Size, got.ChainIDs, wantSize)
	}
	motd, err := os.ReadFile(filepath.Join(s.layerPath(got.ChainIDs[1]), "etc/motd"))
	if err != nil || string(motd) != "hi" {
		t.Fatalf("layer content %q, %v", motd, err)
	}

	// By digest: same image, and a digest pull adds no tag.
	byDigest, err := s.Pull(ctx, digestRef, nil)
	if err != nil {
		t.Fatal(err)
	}
	if byDigest.ID != id || !slices.Equal(byDigest.RepoTags, wantTags) {
		t.Fatalf("digest pull: %s %v", byDigest.ID, byDigest.RepoTags)
	}
	for _, ref := range []string{id, strings.TrimPrefix(id, "sha256:"), id[:12], strings.TrimPrefix(id, "sha256:")[:6], reg.Ref("app:v1"), digestRef} {
		if g, err := s.Get(ref); err != nil || g.ID != id {
			t.Errorf("Get(%q) = %v, %v", ref, g, err)
		}
	}
	if _, err := s.Get(reg.Ref("app:v2")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get unknown tag: %v", err)
	}

	// The index survives a restart.
	s2 := newTestStore(t, Options{Root: s.Root()})
	if l := s2.List(); len(l) != 1 || l[0].ID != id || !slices.Equal(l[0].RepoTags, wantTags) {
		t.Fatalf("reloaded List = %+v", l)
	}
}

func TestPullThroughMirrorKeepsName(t *testing.T) {
	requireRoot(t)
	regB := testimage.StartRegistry(t)
	img := testimage.Busybox(t)
	regB.Push(t, "mirror/lib/busybox:1", img)
	// Registry A is down: a port nothing listens on.
	downA := closedAddr(t)
	s := newTestStore(t, Options{
		PullTimeout: 20 * time.Second,
		Registries: map[string]RegistryConfig{
			downA: {Mirrors: []string{regB.Addr + "/mirror"}},
		},
	})
	got, err := s.Pull(context.Background(), downA+"/lib/busybox:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{downA + "/lib/busybox:1"}; !slices.Equal(got.RepoTags, want) {
		t.Fatalf("RepoTags %v, want %v", got.RepoTags, want)
	}
	if !strings.HasPrefix(got.RepoDigests[0], downA+"/lib/busybox@sha256:") {
		t.Fatalf("RepoDigests %v", got.RepoDigests)
	}
	if n := regB.Requests("/v2/mirror/lib/busybox/manifests/1"); n == 0 {
		t.Fatalf("mirror not asked: %v", regB.Log())
	}

	// With skip_origin and a dead mirror the pull fails as unavailable.
	s2 := newTestStore(t, Options{
		PullTimeout: 20 * time.Second,
		Registries:  map[string]RegistryConfig{regB.Addr: {Mirrors: []string{downA}, SkipOrigin: true}},
	})
	if _, err := s2.Pull(context.Background(), regB.Ref("mirror/lib/busybox:1"), nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("skip_origin pull: %v, want ErrUnavailable", err)
	}
}

// closedAddr returns a loopback address with no listener.
func closedAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRemove(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	base := testimage.Busybox(t)
	other := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "x", Content: []byte("x")}}}})
	reg.Push(t, "a:1", base)
	reg.Push(t, "a:2", base)
	reg.Push(t, "b:1", other)
	s := newTestStore(t, Options{})
	ctx := context.Background()
	for _, r := range []string{"a:1", "a:2", "b:1"} {
		if _, err := s.Pull(ctx, reg.Ref(r), nil); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.Get(reg.Ref("a:1"))
	b, _ := s.Get(reg.Ref("b:1"))
	if !slices.Equal(a.RepoTags, []string{reg.Ref("a:1"), reg.Ref("a:2")}) || len(s.List()) != 2 {
		t.Fatalf("a tags %v, %d images", a.RepoTags, len(s.List()))
	}
	// The busybox layer is shared: removing a (by its second tag, which
	// removes both tags) keeps it for b.
	if err := s.Remove(context.Background(), reg.Ref("a:2")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"a:1", "a:2"} {
		if _, err := s.Get(reg.Ref(r)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Get %s after remove: %v", r, err)
		}
	}
	if _, err := os.Stat(s.layerPath(b.ChainIDs[0])); err != nil {
		t.Fatalf("shared layer removed: %v", err)
	}
	if _, err := os.Stat(s.blobPath(a.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("config blob of removed image: %v", err)
	}
	if err := s.Remove(context.Background(), reg.Ref("a:1")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if err := s.Remove(context.Background(), b.ID); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"layers", "blobs/sha256"} {
		if ents, _ := os.ReadDir(s.path(d)); len(ents) != 0 {
			t.Fatalf("%s not empty after removing everything: %v", d, ents)
		}
	}
}

func TestConcurrentPullsFetchOnce(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "big", Content: make([]byte, 4<<20)}}}})
	reg.Push(t, "c:1", img)
	s := newTestStore(t, Options{})
	usedBefore, inodesBefore, err := s.FsUsage()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Pull(context.Background(), reg.Ref("c:1"), nil) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	m, _ := img.Manifest()
	for _, l := range m.Layers {
		if n := reg.Requests("GET /v2/c/blobs/" + l.Digest.String()); n != 1 {
			t.Errorf("layer %s fetched %d times, want 1", l.Digest, n)
		}
	}
	used, inodes, err := s.FsUsage()
	if err != nil {
		t.Fatal(err)
	}
	// The 4 MiB file lives in the layer and its compressed blob is small
	// (zeros), so usage grows by at least 4 MiB and by 70+ inodes.
	if used < usedBefore+4<<20 || inodes < inodesBefore+70 {
		t.Fatalf("FsUsage %d bytes %d inodes, before %d %d", used, inodes, usedBefore, inodesBefore)
	}
}

func TestPullUnreachable(t *testing.T) {
	requireRoot(t)
	// A listener that accepts and never answers: only the timeout ends it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	tests := []struct {
		name, ref string
	}{
		{"closed port", "127.0.0.1:1/x:1"},
		{"silent registry", l.Addr().String() + "/x:1"},
	}
	s := newTestStore(t, Options{PullTimeout: 2 * time.Second})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := s.Pull(context.Background(), tt.ref, nil)
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("took %v, timeout is 2s", took)
			}
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("got %v, want ErrUnavailable", err)
			}
			if host, _, _ := strings.Cut(tt.ref, "/"); !strings.Contains(err.Error(), host) {
				t.Fatalf("error %q doesn't name the registry", err)
			}
			t.Log(err)
		})
	}
}

func TestPullNotFound(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	s := newTestStore(t, Options{})
	if _, err := s.Pull(context.Background(), reg.Ref("nope:1"), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("got %v, want ErrNotFound", err)
	}
	if _, err := s.Pull(context.Background(), "Bad//Ref", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("got %v, want ErrInvalidArgument", err)
	}
}

func TestPullMultiArch(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	amd := testimage.Build(t, testimage.Spec{Architecture: "amd64", Labels: map[string]string{"arch": "amd64"}})
	arm := testimage.Build(t, testimage.Spec{Architecture: "arm64", Labels: map[string]string{"arch": "arm64"}})
	idxRef := reg.PushIndex(t, "multi:1",
		testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: "arm64"}, Image: arm},
		testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Image: amd},
	)
	s := newTestStore(t, Options{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}})
	got, err := s.Pull(context.Background(), reg.Ref("multi:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != testimage.ID(t, amd) || got.Config.Labels["arch"] != "amd64" {
		t.Fatalf("resolved %s (%v), want amd64 image %s", got.ID, got.Config.Labels, testimage.ID(t, amd))
	}
	// The repo digest is the index's: that's what the user can pull by.
	if !slices.Equal(got.RepoDigests, []string{idxRef}) {
		t.Fatalf("RepoDigests %v, want %v", got.RepoDigests, idxRef)
	}
}

func TestUIDOrUser(t *testing.T) {
	tests := []struct {
		user     string
		uid      int64
		hasUID   bool
		username string
	}{
		{"", 0, false, ""},
		{"1002", 1002, true, ""},
		{"1002:1002", 1002, true, ""},
		{"0", 0, true, ""},
		{"www-data", 0, false, "www-data"},
		{"www-data:grp", 0, false, "www-data"},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			img := &Image{Config: v1.Config{User: tt.user}}
			uid, name := img.UIDOrUser()
			if (uid != nil) != tt.hasUID || (uid != nil && *uid != tt.uid) || name != tt.username {
				t.Fatalf("UIDOrUser(%q) = %v, %q", tt.user, uid, name)
			}
		})
	}
}

func TestNormalizeRef(t *testing.T) {
	tests := map[string]string{
		"busybox":                       "docker.io/library/busybox:latest",
		"busybox:1.36":                  "docker.io/library/busybox:1.36",
		"docker.io/library/busybox":     "docker.io/library/busybox:latest",
		"index.docker.io/foo/bar:x":     "docker.io/foo/bar:x",
		"127.0.0.1:5000/a/b":            "127.0.0.1:5000/a/b:latest",
		"quay.io/x/y@sha256:" + hex64(): "quay.io/x/y@sha256:" + hex64(),
	}
	for in, want := range tests {
		if got, err := NormalizeRef(in); err != nil || got != want {
			t.Errorf("NormalizeRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func hex64() string { return strings.Repeat("ab", 32) }

// The temp files of atomic writes a crash cut short (index.json's, a
// blob's) go at start; a collection leaves a temp file alone, since it
// is a pull's write in progress whose rename would fail.
func TestStoreTempFiles(t *testing.T) {
	s := newTestStore(t, Options{})
	stale := []string{
		filepath.Join(s.Root(), ".index.json.tmp123"),
		s.path("blobs", "sha256", "."+hex64()+".tmp456"),
	}
	for _, p := range stale {
		if err := os.WriteFile(p, []byte("cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s = newTestStore(t, Options{Root: s.Root()})
	for _, p := range stale {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a restart: %v, want it gone", p, err)
		}
	}
	inFlight := s.path("blobs", "sha256", "."+hex64()+".tmp789")
	if err := os.WriteFile(inFlight, []byte("being written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Collect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("a blob write in progress, after a collection: %v", err)
	}
}

// The registries configuration is keyed by host as an operator writes
// it: Docker Hub under any of its names, a host in any case, as the auth
// file's keys are matched. Under "index.docker.io" the mirrors used to be
// ignored without a word, and every pull went to Docker Hub.
func TestRegistryConfigKeys(t *testing.T) {
	tests := []struct {
		name, key, ref string
		want           []string // the endpoints, scheme first
	}{
		{"docker.io", "docker.io", "busybox", []string{"http://mirror.example:5000/library/busybox:latest"}},
		{"index.docker.io", "index.docker.io", "busybox", []string{"http://mirror.example:5000/library/busybox:latest"}},
		{"registry-1.docker.io", "registry-1.docker.io", "docker.io/library/busybox:1", []string{"http://mirror.example:5000/library/busybox:1"}},
		{"upper case", "Registry.Example.COM", "registry.example.com/app:1", []string{"http://mirror.example:5000/app:1"}},
		{"other host", "quay.io", "busybox", []string{"https://index.docker.io/library/busybox:latest"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestStore(t, Options{Registries: map[string]RegistryConfig{
				tt.key: {Mirrors: []string{"mirror.example:5000"}, SkipOrigin: tt.key != "quay.io"},
				// The mirror's own entry, in another case, makes it plain HTTP.
				"MIRROR.example:5000": {Insecure: true},
			}})
			r, err := parseRef(tt.ref)
			if err != nil {
				t.Fatal(err)
			}
			eps, err := s.endpoints(context.Background(), r, nil, nil, newPullProgress(), &blobChecks{})
			if err != nil {
				t.Fatal(err)
			}
			defer closeIdle(eps)
			var got []string
			for _, ep := range eps {
				got = append(got, ep.ref.Context().Scheme()+"://"+ep.ref.Name())
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("endpoints %v, want %v", got, tt.want)
			}
		})
	}
}

// Mirrors written as URLs, as containerd's configuration has them
// ("https://mirror.gcr.io"), name the same endpoints as host[:port][/prefix];
// "http://" is plain HTTP. Such a mirror used to fail every pull of its
// registry with InvalidArgument, before any endpoint was tried.
func TestMirrorURLs(t *testing.T) {
	s := newTestStore(t, Options{Registries: map[string]RegistryConfig{
		"docker.io": {Mirrors: []string{"https://mirror.example:5000/prefix/", "http://plain.example", "bare.example"}},
	}})
	r, err := parseRef("busybox:1")
	if err != nil {
		t.Fatal(err)
	}
	eps, err := s.endpoints(context.Background(), r, nil, nil, newPullProgress(), &blobChecks{})
	if err != nil {
		t.Fatalf("endpoints: %v", err)
	}
	defer closeIdle(eps)
	var got []string
	for _, ep := range eps {
		got = append(got, ep.ref.Context().Scheme()+"://"+ep.ref.Name())
	}
	want := []string{
		"https://mirror.example:5000/prefix/library/busybox:1",
		"http://plain.example/library/busybox:1",
		"https://bare.example/library/busybox:1",
		"https://index.docker.io/library/busybox:1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("endpoints %v, want %v", got, want)
	}
}
