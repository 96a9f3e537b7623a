package image

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sirupsen/logrus"

	"github.com/pinrt/pinrt/test/testimage"
)

// Every layer media type a registry serves in practice goes through
// fetch and ensureLayer: go-containerregistry must not reject one on the
// way, and the unpacker picks the decompressor by magic.
func TestPullLayerMediaTypes(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name                          string
		compression                   compression
		layerMT, manifestMT, configMT types.MediaType
	}{
		{"oci gzip", gzipped, types.OCILayer, types.OCIManifestSchema1, types.OCIConfigJSON},
		{"oci zstd", zstded, types.OCILayerZStd, types.OCIManifestSchema1, types.OCIConfigJSON},
		{"oci uncompressed", uncompressed, types.OCIUncompressedLayer, types.OCIManifestSchema1, types.OCIConfigJSON},
		{"docker gzip", gzipped, types.DockerLayer, types.DockerManifestSchema2, types.DockerConfigJSON},
		{"docker uncompressed", uncompressed, types.DockerUncompressedLayer, types.DockerManifestSchema2, types.DockerConfigJSON},
	}
	reg := startTestRegistry(t)
	imgs := map[string]v1.Image{}
	for i, tt := range tests {
		base := makeLayer(t, []testimage.File{{Path: "etc/", Mode: 0o755}, {Path: "etc/base", Content: []byte(tt.name)}}, tt.compression, tt.layerMT)
		top := makeLayer(t, []testimage.File{{Path: "etc/top", Content: []byte{byte(i)}}}, tt.compression, tt.layerMT)
		imgs[tt.name] = imageOf(t, tt.manifestMT, tt.configMT, base, top)
		reg.push(t, "mt"+string(rune('a'+i))+":1", imgs[tt.name])
	}
	reg.pulls(nil)
	s := newTestStore(t, Options{})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := s.Pull(context.Background(), reg.ref("mt"+string(rune('a'+i))+":1"), nil)
			if err != nil {
				t.Fatalf("Pull: %v", err)
			}
			if img.ID != testimage.ID(t, imgs[tt.name]) || len(img.ChainIDs) != 2 {
				t.Fatalf("pulled %s with %d layers, want %s with 2", img.ID, len(img.ChainIDs), testimage.ID(t, imgs[tt.name]))
			}
			if got, err := os.ReadFile(filepath.Join(s.layerPath(img.ChainIDs[0]), "etc/base")); err != nil || string(got) != tt.name {
				t.Errorf("etc/base in the bottom layer = %q, %v", got, err)
			}
			if got, err := os.ReadFile(filepath.Join(s.layerPath(img.ChainIDs[1]), "etc/top")); err != nil || len(got) != 1 || got[0] != byte(i) {
				t.Errorf("etc/top in the top layer = %v, %v", got, err)
			}
			s.mu.RLock()
			rec := s.images[img.ID]
			s.mu.RUnlock()
			if rec.Layers[0].MediaType != string(tt.layerMT) {
				t.Errorf("recorded media type %q, want %q", rec.Layers[0].MediaType, tt.layerMT)
			}
		})
	}
}

// A layer that fails must leave nothing behind: not its blob, not its
// directory, not the layers above it (their chain is incomplete) even
// though they downloaded fine, and nothing in tmp/.
func TestPullFailedLayerLeavesNothing(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	bottom := fileLayer(t, "bottom", []byte("bottom layer"))
	upper := []*rawLayer{fileLayer(t, "u1", []byte("upper 1")), fileLayer(t, "u2", []byte("upper 2"))}
	reg.push(t, "broken:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, bottom, upper[0], upper[1]))
	bottomDigest := digestOf(t, bottom)
	upperServed := make(chan struct{}, 2)
	reg.pulls(func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case blobGET(r, bottomDigest):
				// Corrupt the bottom layer only once both upper layers were
				// sent, so they are staged (or staging) when it fails.
				for range 2 {
					select {
					case <-upperServed:
					case <-time.After(5 * time.Second):
					}
				}
				data := append([]byte(nil), bottom.blob...)
				data[len(data)/2] ^= 0xff
				w.Write(data)
			case blobGET(r, digestOf(t, upper[0])), blobGET(r, digestOf(t, upper[1])):
				inner.ServeHTTP(w, r)
				upperServed <- struct{}{}
			default:
				inner.ServeHTTP(w, r)
			}
		})
	})
	s := newTestStore(t, Options{MaxConcurrentDownloads: 3})
	_, err := s.Pull(context.Background(), reg.ref("broken:1"), nil)
	if err == nil || !strings.Contains(err.Error(), bottomDigest) {
		t.Fatalf("Pull = %v, want an error naming layer %s", err, bottomDigest)
	}
	assertStoreEmpty(t, s)
}

// assertStoreEmpty fails t unless s holds no layer, blob, staged file or
// image, as after a failed first pull.
func assertStoreEmpty(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{"layers", "blobs/sha256", "tmp"} {
		if ents, _ := os.ReadDir(s.path(d)); len(ents) != 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s/ after a failed pull holds %v, want nothing", d, names)
		}
	}
	if n := len(s.List()); n != 0 {
		t.Errorf("%d images recorded after a failed pull", n)
	}
}

// A failed pull takes back the layers and blobs it published, but not
// those another running pull uses: pull A publishes bottom, mid and
// onlyA, pull B finds bottom and mid present, A fails on its damaged top
// layer, and B then records an image on bottom and mid. Only onlyA may
// go, and it goes at once: no other pull pinned it.
func TestPullFailedRollsBackWhatNoImageUses(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	bottom, mid := fileLayer(t, "bottom", []byte("bottom")), fileLayer(t, "mid", []byte("mid"))
	onlyA := fileLayer(t, "onlyA", []byte("only in A"))
	topA, topB := fileLayer(t, "top", []byte("top of A")), fileLayer(t, "top", []byte("top of B"))
	reg.push(t, "a:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, bottom, mid, onlyA, topA))
	reg.push(t, "b:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, bottom, mid, topB))
	bAtTop, aDone := make(chan struct{}), make(chan struct{})
	// A handler must not t.Fatal; a timed-out wait fails the test below.
	wait := func(ch <-chan struct{}) {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
	}
	reg.pulls(func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case blobGET(r, digestOf(t, topA)):
				wait(bAtTop)
				data := bytes.Clone(topA.blob)
				data[len(data)/2] ^= 0xff
				w.Write(data)
			case blobGET(r, digestOf(t, topB)):
				close(bAtTop)
				wait(aDone)
				inner.ServeHTTP(w, r)
			default:
				inner.ServeHTTP(w, r)
			}
		})
	})
	s := newTestStore(t, Options{})
	a := goPull(context.Background(), s, reg.ref("a:1"), nil)
	// B starts once A has published everything below its top layer.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ents, _ := os.ReadDir(s.path("layers")); len(ents) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pull A never published its three lower layers")
		}
	}
	b := goPull(context.Background(), s, reg.ref("b:1"), nil)
	resA := <-a
	if !errors.Is(resA.err, errdefs.ErrDataLoss) || !strings.Contains(resA.err.Error(), digestOf(t, topA)) {
		t.Errorf("pull A = %v, want DataLoss naming %s", resA.err, digestOf(t, topA))
	}
	for _, l := range []*rawLayer{bottom, mid} {
		if _, err := os.Stat(s.blobPath(digestOf(t, l))); err != nil {
			t.Errorf("blob %s, which pull B uses, went with failed pull A: %v", digestOf(t, l), err)
		}
	}
	if _, err := os.Stat(s.blobPath(digestOf(t, onlyA))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("A's onlyA blob, which no pull uses, is still there after A failed: %v", err)
	}
	close(aDone)
	resB := <-b
	if resB.err != nil {
		t.Fatalf("pull B: %v", resB.err)
	}

	var wantLayers []string
	for _, c := range resB.img.ChainIDs {
		wantLayers = append(wantLayers, strings.TrimPrefix(c, "sha256:"))
	}
	wantBlobs := []string{resB.img.ID}
	for _, l := range []*rawLayer{bottom, mid, topB} {
		wantBlobs = append(wantBlobs, digestOf(t, l))
	}
	for i, d := range wantBlobs {
		wantBlobs[i] = strings.TrimPrefix(d, "sha256:")
	}
	got := func(dir string) []string {
		names, err := dirNames(s.path(dir))
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	slices.Sort(wantLayers)
	if g := got("layers"); !slices.Equal(g, wantLayers) {
		t.Errorf("layers/ = %v, want B's %v", g, wantLayers)
	}
	// B's blobs are its layers, config and manifest.
	if g := got("blobs/sha256"); len(g) != len(wantBlobs)+1 || !isSubset(wantBlobs, g) {
		t.Errorf("blobs/sha256/ = %v, want B's layers and config %v and its manifest", g, wantBlobs)
	}
	if g := got("tmp"); len(g) != 0 {
		t.Errorf("tmp/ = %v, want nothing", g)
	}
}

func isSubset(sub, set []string) bool {
	for _, x := range sub {
		if !slices.Contains(set, x) {
			return false
		}
	}
	return true
}

// Layers download concurrently, never more than max_concurrent_downloads
// at once.
func TestPullParallelDownloads(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	var layers []v1.Layer
	digests := map[string]bool{}
	for i := range 7 {
		l := fileLayer(t, "f", []byte{byte(i)})
		layers = append(layers, l)
		digests[digestOf(t, l)] = true
	}
	reg.push(t, "par:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, layers...))
	var (
		mu       sync.Mutex
		cur, top int
		limit    atomic.Int64
	)
	reg.pulls(func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
			if r.Method != http.MethodGet || !digests[d] {
				inner.ServeHTTP(w, r)
				return
			}
			mu.Lock()
			cur++
			top = max(top, cur)
			mu.Unlock()
			// Hold each download for a while so that downloads overlap
			// as much as the puller lets them: a serial puller shows as
			// top == 1, a parallel one reaches the limit, and one that
			// ignores the limit exceeds it. Stop early once it has.
			for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				mu.Lock()
				over := int64(top) > limit.Load()
				mu.Unlock()
				if over {
					break
				}
			}
			inner.ServeHTTP(w, r)
			mu.Lock()
			cur--
			mu.Unlock()
		})
	})
	for _, n := range []int{2, 3} {
		t.Run("max "+string(rune('0'+n)), func(t *testing.T) {
			limit.Store(int64(n))
			mu.Lock()
			top = 0
			mu.Unlock()
			s := newTestStore(t, Options{MaxConcurrentDownloads: n})
			if _, err := s.Pull(context.Background(), reg.ref("par:1"), nil); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if top != n {
				t.Errorf("at most %d layer downloads ran at once, want exactly %d (max_concurrent_downloads)", top, n)
			}
		})
	}
}

// stallLayer serves the layer blob dgst through send, and everything
// else normally.
func stallLayer(dgst string, send func(w http.ResponseWriter, r *http.Request)) func(http.Handler) http.Handler {
	return func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if blobGET(r, dgst) {
				send(w, r)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
}

// The stall timeout fires only when nothing arrives: a slow pull that
// keeps moving runs as long as it needs.
func TestPullProgressTimeout(t *testing.T) {
	requireRoot(t)
	// Long enough that a loaded machine's pause between two chunks of
	// the moving pull is no stall.
	const stall = time.Second
	layer := fileLayer(t, "slow", []byte("a small layer sent slowly, forty chunks of it or more"))
	dgst := digestOf(t, layer)
	testDone := make(chan struct{})
	t.Cleanup(func() { close(testDone) })
	hang := func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-testDone:
		}
	}
	tests := []struct {
		name    string
		wrap    func(http.Handler) http.Handler
		wantErr bool
		minTook time.Duration
	}{{
		// 40 chunks or more, 100ms apart: 4s in all, more than three times
		// the stall timeout, but never 1s without a byte.
		name: "slow but moving",
		wrap: stallLayer(dgst, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(layer.blob)))
			w.WriteHeader(http.StatusOK)
			chunk := max(1, len(layer.blob)/40)
			for b := layer.blob; len(b) > 0; {
				n := min(chunk, len(b))
				w.Write(b[:n])
				w.(http.Flusher).Flush()
				b = b[n:]
				time.Sleep(100 * time.Millisecond)
			}
		}),
		minTook: 3 * stall,
	}, {
		name: "stops sending",
		wrap: stallLayer(dgst, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(layer.blob)))
			w.WriteHeader(http.StatusOK)
			w.Write(layer.blob[:len(layer.blob)/2])
			w.(http.Flusher).Flush()
			hang(r)
		}),
		wantErr: true,
	}, {
		name: "no response headers",
		wrap: func(inner http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.Contains(r.URL.Path, "/manifests/") {
					hang(r)
					return
				}
				inner.ServeHTTP(w, r)
			})
		},
		wantErr: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := startTestRegistry(t)
			reg.push(t, "slow:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, layer))
			reg.pulls(tt.wrap)
			s := newTestStore(t, Options{PullProgressTimeout: stall, PullTimeout: 30 * time.Second})
			start := time.Now()
			_, err := s.Pull(context.Background(), reg.ref("slow:1"), nil)
			took := time.Since(start)
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("Pull = %v after %v, want success", err, took)
				}
				if took < tt.minTook {
					t.Fatalf("pull took %v: the test did not make it slower than the stall timeout", took)
				}
				return
			}
			if !errors.Is(errdefs.Resolve(err), errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "image.pull_progress_timeout") {
				t.Fatalf("Pull = %v, want Unavailable naming image.pull_progress_timeout", err)
			}
			if took > 5*stall {
				t.Errorf("stalled pull failed after %v, the stall timeout is %v", took, stall)
			}
			if ents, _ := os.ReadDir(s.path("tmp")); len(ents) != 0 {
				t.Errorf("tmp/ holds %d entries after a stalled pull", len(ents))
			}
		})
	}
}

// gate holds every GET of one blob until released, and tells when one
// arrived.
type gate struct {
	dgst     string
	arrived  chan struct{}
	release  chan struct{}
	gone     chan struct{} // a held request's client went away
	manifest atomic.Int64  // manifest GETs
}

func newGate(dgst string) *gate {
	return &gate{dgst: dgst, arrived: make(chan struct{}, 10), release: make(chan struct{}), gone: make(chan struct{}, 10)}
}

func (g *gate) wrap(inner http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			g.manifest.Add(1)
		}
		if blobGET(r, g.dgst) {
			g.arrived <- struct{}{}
			select {
			case <-g.release:
			case <-r.Context().Done():
				g.gone <- struct{}{}
				return
			}
		}
		inner.ServeHTTP(w, r)
	})
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waiters returns how many callers wait on the pull of ref with auth.
func (s *Store) waiters(t *testing.T, ref string, auth *Auth) int {
	t.Helper()
	r, err := parseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	s.flight.mu.Lock()
	defer s.flight.mu.Unlock()
	if c, ok := s.flight.calls[flightKey(r, auth, PullRequest{})]; ok {
		return c.waiters
	}
	return 0
}

func waitWaiters(t *testing.T, s *Store, ref string, auth *Auth, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.waiters(t, ref, auth) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers wait for %s, want %d", s.waiters(t, ref, auth), ref, n)
		}
		time.Sleep(time.Millisecond)
	}
}

type pullResult struct {
	img *Image
	err error
}

func goPull(ctx context.Context, s *Store, ref string, auth *Auth) <-chan pullResult {
	ch := make(chan pullResult, 1)
	go func() {
		img, err := s.Pull(ctx, ref, auth)
		ch <- pullResult{img, err}
	}()
	return ch
}

func TestPullCoalescing(t *testing.T) {
	requireRoot(t)
	alice := &Auth{Username: "alice", Password: "a"}
	bob := &Auth{Username: "bob", Password: "b"}
	layer := fileLayer(t, "f", []byte("coalesced"))

	setup := func(t *testing.T) (*Store, *gate, string) {
		reg := startTestRegistry(t)
		reg.push(t, "co:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, layer))
		g := newGate(digestOf(t, layer))
		reg.pulls(g.wrap)
		return newTestStore(t, Options{}), g, reg.ref("co:1")
	}

	t.Run("same credentials share one download", func(t *testing.T) {
		s, g, ref := setup(t)
		a := goPull(context.Background(), s, ref, alice)
		waitFor(t, g.arrived, "the first download")
		b := goPull(context.Background(), s, ref, &Auth{Username: "alice", Password: "a"})
		waitWaiters(t, s, ref, alice, 2)
		close(g.release)
		for _, ch := range []<-chan pullResult{a, b} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
		if n := g.manifest.Load(); n != 1 {
			t.Errorf("%d manifest GETs, want 1 shared pull", n)
		}
	})

	t.Run("different credentials do not share", func(t *testing.T) {
		s, g, ref := setup(t)
		a := goPull(context.Background(), s, ref, alice)
		waitFor(t, g.arrived, "alice's download")
		b := goPull(context.Background(), s, ref, bob)
		// Bob's pull must ask the registry itself while alice's is still
		// held: a shared pull would never send a second manifest GET.
		// (The layer itself is then shared through the store: it is
		// content-addressed, and bob's manifest proved his access.)
		for deadline := time.Now().Add(5 * time.Second); g.manifest.Load() < 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("bob's pull never reached the registry: it joined alice's")
			}
		}
		close(g.release)
		for _, ch := range []<-chan pullResult{a, b} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
		if n := g.manifest.Load(); n != 2 {
			t.Errorf("%d manifest GETs, want 2 separate pulls", n)
		}
	})

	t.Run("the first caller giving up does not stop the others", func(t *testing.T) {
		s, g, ref := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		first := goPull(ctx, s, ref, nil)
		waitFor(t, g.arrived, "the download")
		second := goPull(context.Background(), s, ref, nil)
		waitWaiters(t, s, ref, nil, 2)
		cancel()
		select {
		case r := <-first:
			if !errors.Is(r.err, context.Canceled) || !errdefs.IsCanceled(errdefs.Resolve(r.err)) {
				t.Errorf("cancelled caller got %v, want context.Canceled", r.err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the cancelled caller still waits for the shared pull")
		}
		close(g.release)
		if r := <-second; r.err != nil {
			t.Fatalf("the remaining caller failed: %v", r.err)
		}
	})

	t.Run("a waiter's deadline is its own", func(t *testing.T) {
		s, g, ref := setup(t)
		first := goPull(context.Background(), s, ref, nil)
		waitFor(t, g.arrived, "the download")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := s.Pull(ctx, ref, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller past its deadline got %v, want context.DeadlineExceeded", err)
		}
		close(g.release)
		if r := <-first; r.err != nil {
			t.Fatal(r.err)
		}
	})

	t.Run("the download stops when every caller has gone", func(t *testing.T) {
		s, g, ref := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		only := goPull(ctx, s, ref, nil)
		waitFor(t, g.arrived, "the download")
		cancel()
		if r := <-only; !errors.Is(r.err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", r.err)
		}
		waitFor(t, g.gone, "the registry to see the download abandoned")
		if n := s.waiters(t, ref, nil); n != 0 {
			t.Errorf("a new caller would join a cancelled pull with %d waiters", n)
		}
	})
}

// basicAuth makes every /v2/ request need user:pass, as a private
// registry does.
func basicAuth(user, pass string) func(http.Handler) http.Handler {
	return func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
}

func TestPullAuthFile(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	reg.push(t, "private:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "secret", []byte("s"))))
	reg.pulls(basicAuth("puller", "s3cret"))
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name    string
		file    string // "" means no file at all
		auth    *Auth
		wantErr error
		wantMsg string
	}{
		{name: "auth field", file: `{"auths": {"` + reg.addr + `": {"auth": "` + b64("puller:s3cret") + `"}}}`},
		{name: "username and password", file: `{"auths": {"http://` + reg.addr + `/v2/": {"username": "puller", "password": "s3cret"}}, "credsStore": "ignored"}`},
		{name: "no file", wantErr: errdefs.ErrUnauthenticated},
		{name: "other host only", file: `{"auths": {"other.example": {"auth": "` + b64("puller:s3cret") + `"}}}`, wantErr: errdefs.ErrUnauthenticated},
		{name: "kubelet's credentials win", file: `{"auths": {"` + reg.addr + `": {"auth": "` + b64("puller:s3cret") + `"}}}`,
			auth: &Auth{Username: "puller", Password: "wrong"}, wantErr: errdefs.ErrUnauthenticated},
		{name: "credentials for their server", auth: &Auth{Username: "puller", Password: "s3cret", ServerAddress: "http://" + reg.addr + "/v2/"}},
		{name: "credentials for another server", auth: &Auth{Username: "puller", Password: "s3cret", ServerAddress: "other.example"},
			wantErr: errdefs.ErrUnauthenticated},
		{name: "the file's for this host, kubelet's for another", file: `{"auths": {"` + reg.addr + `": {"auth": "` + b64("puller:s3cret") + `"}}}`,
			auth: &Auth{Username: "puller", Password: "wrong", ServerAddress: "https://other.example"}},
		{name: "a server address alone is no credentials", auth: &Auth{ServerAddress: reg.addr}, wantErr: errdefs.ErrUnauthenticated},
		{name: "malformed json", file: `{"auths": `, wantErr: errdefs.ErrInvalidArgument, wantMsg: "auth.json"},
		{name: "auth not base64", file: `{"auths": {"` + reg.addr + `": {"auth": "%%%"}}}`, wantErr: errdefs.ErrInvalidArgument, wantMsg: "auth.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "auth.json")
			if tt.file != "" {
				if err := os.WriteFile(path, []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s := newTestStore(t, Options{AuthFile: path})
			img, err := s.Pull(context.Background(), reg.ref("private:1"), tt.auth)
			if tt.wantErr == nil {
				if err != nil || img == nil {
					t.Fatalf("Pull = %v, want success with the auth file's credentials", err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) || !errors.Is(errdefs.Resolve(err), tt.wantErr) {
				t.Fatalf("Pull = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not name %q", err, tt.wantMsg)
			}
		})
	}

	// The file is read per pull: an edit applies to the next pull.
	path := filepath.Join(t.TempDir(), "auth.json")
	s := newTestStore(t, Options{AuthFile: path})
	if _, err := s.Pull(context.Background(), reg.ref("private:1"), nil); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("pull without the file = %v, want Unauthenticated", err)
	}
	if err := os.WriteFile(path, []byte(`{"auths": {"`+reg.addr+`": {"auth": "`+b64("puller:s3cret")+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), reg.ref("private:1"), nil); err != nil {
		t.Fatalf("pull after writing the file = %v", err)
	}
}

// kubelet's credentials go to a registry's mirrors too, as containerd
// and CRI-O send them, unless they name their server: then a mirror that
// asks for credentials gets none, and the origin serves the pull.
func TestPullCredentialsToMirrors(t *testing.T) {
	requireRoot(t)
	origin, mirror := startTestRegistry(t), startTestRegistry(t)
	img := imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "m", []byte("m")))
	origin.push(t, "private:1", img)
	mirror.push(t, "private:1", img)
	origin.pulls(basicAuth("puller", "s3cret"))
	var sent atomic.Int32
	mirror.pulls(func(inner http.Handler) http.Handler {
		auth := basicAuth("puller", "s3cret")(inner)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "" {
				sent.Add(1)
			}
			auth.ServeHTTP(w, r)
		})
	})
	for _, tc := range []struct {
		name         string
		server       string
		toMirror     bool
		originPulled bool
	}{
		{"no server address", "", true, false},
		{"the origin's address", "https://" + origin.addr + "/v2/", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent.Store(0)
			s := newTestStore(t, Options{Registries: map[string]RegistryConfig{origin.addr: {Mirrors: []string{mirror.addr}}}})
			ctx, buf := jsonLog()
			if _, err := s.Pull(ctx, origin.ref("private:1"), &Auth{Username: "puller", Password: "s3cret", ServerAddress: tc.server}); err != nil {
				t.Fatalf("Pull = %v", err)
			}
			if got := sent.Load() > 0; got != tc.toMirror {
				t.Errorf("credentials sent to the mirror: %v, want %v", got, tc.toMirror)
			}
			from := ""
			for _, m := range parseJSONLog(t, buf) {
				if m["msg"] == "pulling image" {
					from, _ = m["endpoint"].(string)
				}
			}
			if want := map[bool]string{true: origin.addr, false: mirror.addr}[tc.originPulled]; from != want {
				t.Errorf("pulled from %q, want %q", from, want)
			}
		})
	}
}

// The pull's log lines carry durations as strings ("1.234s") and rates
// as numbers: integer nanoseconds in the JSON format are unreadable.
func TestPullLogLines(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	reg.push(t, "logged:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "a", []byte("a")), fileLayer(t, "b", []byte("b"))))
	reg.pulls(nil)
	ctx, buf := jsonLog()
	s := newTestStore(t, Options{})
	if _, err := s.Pull(ctx, reg.ref("logged:1"), nil); err != nil {
		t.Fatal(err)
	}
	lines := map[string]map[string]any{}
	for _, m := range parseJSONLog(t, buf) {
		lines[m["msg"].(string)] = m
	}
	start, end := lines["pulling image"], lines["pulled image"]
	if start == nil || end == nil {
		t.Fatalf("no start or end line in %s", buf.String())
	}
	if start["layers"] != float64(2) || start["endpoint"] != reg.addr || start["image"] != reg.ref("logged:1") {
		t.Errorf("start line %v, want 2 layers from %s", start, reg.addr)
	}
	if _, ok := start["size"].(float64); !ok {
		t.Errorf("start line size %v is not a number", start["size"])
	}
	for _, k := range []string{"took", "download", "unpack"} {
		v, ok := end[k].(string)
		if _, err := time.ParseDuration(v); !ok || err != nil {
			t.Errorf("end line %s = %#v, want a duration string", k, end[k])
		}
	}
	for _, k := range []string{"size", "mb_per_s"} {
		if _, ok := end[k].(float64); !ok {
			t.Errorf("end line %s = %#v, want a number", k, end[k])
		}
	}
}

// A mirror that accepts connections and never answers costs one
// pull_progress_timeout, then the next endpoint serves the pull.
func TestPullSilentMirrorFallsBack(t *testing.T) {
	requireRoot(t)
	origin := startTestRegistry(t)
	origin.push(t, "app:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "x", []byte("x"))))
	origin.pulls(nil)
	silent := startTestRegistry(t)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	silent.pulls(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-done:
			}
		})
	})
	const stall = time.Second
	s := newTestStore(t, Options{
		PullProgressTimeout: stall,
		PullTimeout:         30 * time.Second, // fail, not hang, if the mirror is never given up
		Registries:          map[string]RegistryConfig{origin.addr: {Mirrors: []string{silent.addr}}},
	})
	start := time.Now()
	if _, err := s.Pull(context.Background(), origin.ref("app:1"), nil); err != nil {
		t.Fatalf("Pull = %v, want the origin to serve it after the silent mirror", err)
	}
	if took := time.Since(start); took > 5*stall {
		t.Errorf("pull took %v with a %v stall timeout", took, stall)
	}
}

// jsonLog returns a context whose log.G logger writes JSON to the buffer.
func jsonLog() (context.Context, *bytes.Buffer) {
	buf := &bytes.Buffer{}
	logger := logrus.New()
	logger.SetOutput(buf)
	logger.SetFormatter(&logrus.JSONFormatter{})
	return log.WithLogger(context.Background(), logrus.NewEntry(logger)), buf
}

func parseJSONLog(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// A pull that runs for a while logs its progress periodically: bytes so
// far, elapsed time as a duration string, and the rate.
func TestPullProgressLines(t *testing.T) {
	requireRoot(t)
	layer := fileLayer(t, "slow", []byte("a small layer sent slowly"))
	reg := startTestRegistry(t)
	reg.push(t, "slow:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, layer))
	reg.pulls(stallLayer(digestOf(t, layer), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(layer.blob)))
		w.WriteHeader(http.StatusOK)
		chunk := len(layer.blob)/8 + 1
		for b := layer.blob; len(b) > 0; b = b[min(chunk, len(b)):] {
			w.Write(b[:min(chunk, len(b))])
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	}))
	s := newTestStore(t, Options{})
	s.logEvery = 200 * time.Millisecond
	ctx, buf := jsonLog()
	if _, err := s.Pull(ctx, reg.ref("slow:1"), nil); err != nil {
		t.Fatal(err)
	}
	var progress []map[string]any
	for _, m := range parseJSONLog(t, buf) {
		if m["msg"] == "image pull progress" {
			progress = append(progress, m)
		}
	}
	// ~800ms of pulling logged every 200ms.
	if len(progress) < 2 {
		t.Fatalf("%d progress lines, want at least 2:\n%s", len(progress), buf)
	}
	last := progress[len(progress)-1]
	if n, ok := last["bytes"].(float64); !ok || n <= 0 {
		t.Errorf("progress bytes = %#v, want a positive number", last["bytes"])
	}
	if _, ok := last["mb_per_s"].(float64); !ok {
		t.Errorf("progress mb_per_s = %#v, want a number", last["mb_per_s"])
	}
	if v, ok := last["elapsed"].(string); !ok {
		t.Errorf("progress elapsed = %#v, want a duration string", last["elapsed"])
	} else if _, err := time.ParseDuration(v); err != nil {
		t.Errorf("progress elapsed %q: %v", v, err)
	}
}

// An index with no image for the node's platform is NotFound, as in
// containerd ("no match for platform in manifest"), and names the
// platforms it has; kubelet reports it as ErrImagePull either way, but
// crictl and the gRPC code should say that the image is not there.
func TestPullIndexWithoutThePlatform(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	l := makeLayer(t, []testimage.File{{Path: "etc/", Mode: 0o755}, {Path: "etc/x", Content: []byte("x")}}, gzipped, types.OCILayer)
	img := imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, l)
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        img,
		Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}},
	})
	ref, err := name.ParseReference(reg.ref("foreign:1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	reg.pulls(nil)
	s := newTestStore(t, Options{})
	_, err = s.Pull(context.Background(), reg.ref("foreign:1"), nil)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "linux/s390x") {
		t.Fatalf("Pull of an index for s390x only = %v, want NotFound naming linux/s390x", err)
	}
	assertStoreEmpty(t, s)
}
