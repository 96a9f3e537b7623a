package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Bounds for waits that only a hang exceeds: the tests share two cores
// with other test runs, so they assert what happens, not how fast.
const hangBound = 20 * time.Second

func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangBound):
		t.Fatalf("%s: still waiting after %v", what, hangBound)
		panic("unreachable")
	}
}

// releaseOnCleanup lets g's held downloads go when the test ends, however
// it ends, so no handler outlives it.
func releaseOnCleanup(t *testing.T, g *gate) (release func()) {
	var once sync.Once
	release = func() { once.Do(func() { close(g.release) }) }
	t.Cleanup(release)
	return release
}

// isGiveUp reports whether err is Remove giving up at its deadline.
func isGiveUp(err error) bool {
	return errors.Is(errdefs.Resolve(err), errdefs.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded)
}

func goRemove(ctx context.Context, s *Store, ref string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- s.Remove(ctx, ref) }()
	return ch
}

// Kubelet's image GC (RemoveImage) while one pull is stuck on a slow
// layer must hold up neither itself nor the pulls that come after it.
// With a read-write lock held shared by every pull, the Remove waited
// for the stuck pull, and a new pull queued behind the waiting Remove.
func TestRemoveDoesNotWaitForPulls(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	slow := fileLayer(t, "slow", []byte("held by the registry"))
	gone := fileLayer(t, "gone", []byte("removed meanwhile"))
	third := fileLayer(t, "third", []byte("pulled meanwhile"))
	reg.push(t, "slow:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, slow))
	reg.push(t, "gone:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, gone))
	reg.push(t, "third:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, third))
	g := newGate(digestOf(t, slow))
	reg.pulls(g.wrap)
	release := releaseOnCleanup(t, g)
	s := newTestStore(t, Options{})
	ctx := context.Background()
	goneImg, err := s.Pull(ctx, reg.ref("gone:1"), nil)
	if err != nil {
		t.Fatal(err)
	}

	held := goPull(ctx, s, reg.ref("slow:1"), nil)
	waitFor(t, g.arrived, "the slow layer's download")
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	removed := goRemove(rctx, s, reg.ref("gone:1"))
	// Give a Remove that waits for the held pull time to start waiting,
	// so that the pull below would queue behind it.
	time.Sleep(100 * time.Millisecond)
	if r := recvWithin(t, goPull(ctx, s, reg.ref("third:1"), nil), "a new pull while another is held and a Remove runs"); r.err != nil {
		t.Fatalf("new pull: %v", r.err)
	}
	// With a short context Remove may finish or give up, but never hang,
	// and a give-up is classified for the gRPC interceptor.
	if err := recvWithin(t, removed, "Remove with a 1s context"); err != nil && !isGiveUp(err) {
		t.Fatalf("Remove = %v, want success or Unavailable wrapping the deadline", err)
	}
	release()
	if r := recvWithin(t, held, "the held pull once released"); r.err != nil {
		t.Fatalf("held pull: %v", r.err)
	}
	if err := s.Remove(ctx, reg.ref("gone:1")); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.layerPath(goneImg.ChainIDs[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer of the removed image: %v, want it gone", err)
	}
	for _, ref := range []string{"slow:1", "third:1"} {
		img, err := s.Get(reg.ref(ref))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(s.layerPath(img.ChainIDs[0])); err != nil {
			t.Errorf("layer of %s: %v", ref, err)
		}
	}
}

// Remove gives up when its context ends while another collection holds
// the store, having removed nothing, with an error the interceptor maps
// to Unavailable, so that kubelet retries.
func TestRemoveGivesUpWithItsContext(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	reg.push(t, "r:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "r", []byte("r"))))
	reg.pulls(nil)
	s := newTestStore(t, Options{})
	img, err := s.Pull(context.Background(), reg.ref("r:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.gcLock <- struct{}{} // another collection, stuck
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = recvWithin(t, goRemove(ctx, s, img.ID), "Remove with a 50ms context")
	if !isGiveUp(err) || !strings.Contains(err.Error(), "garbage collection") {
		t.Fatalf("Remove = %v, want Unavailable naming the garbage collection it waited for", err)
	}
	if _, err := s.Get(img.ID); err != nil {
		t.Fatalf("image gone after a Remove that gave up: %v", err)
	}
	s.unlockGC()
	if err := s.Remove(context.Background(), img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.layerPath(img.ChainIDs[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("layer after Remove: %v, want it gone", err)
	}
}

// A Remove while a pull runs deletes neither the layers the pull found
// present (shared with the image removed) nor those it has published
// but not yet recorded in the index, though no image references them.
func TestRemoveKeepsWhatPullsUse(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	base := fileLayer(t, "base", []byte("shared base"))
	onlyZ := fileLayer(t, "z", []byte("only in z"))
	mid, top := fileLayer(t, "mid", []byte("published mid-pull")), fileLayer(t, "top", []byte("held"))
	reg.push(t, "z:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, base, onlyZ))
	reg.push(t, "p:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, base, mid, top))
	g := newGate(digestOf(t, top))
	reg.pulls(g.wrap)
	release := releaseOnCleanup(t, g)
	s := newTestStore(t, Options{})
	ctx := context.Background()
	z, err := s.Pull(ctx, reg.ref("z:1"), nil)
	if err != nil {
		t.Fatal(err)
	}

	p := goPull(ctx, s, reg.ref("p:1"), nil)
	waitFor(t, g.arrived, "the top layer's download")
	baseChain := chainID("", base.diffID.String())
	midChain := chainID(baseChain, mid.diffID.String())
	for deadline := time.Now().Add(hangBound); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(s.layerPath(midChain)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull never published its middle layer")
		}
	}
	if err := recvWithin(t, goRemove(ctx, s, z.ID), "Remove while a pull is held"); err != nil {
		t.Fatal(err)
	}
	for what, path := range map[string]string{
		"shared base layer":      s.layerPath(baseChain),
		"shared base blob":       s.blobPath(digestOf(t, base)),
		"published middle layer": s.layerPath(midChain),
		"published middle blob":  s.blobPath(digestOf(t, mid)),
	} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s, which the running pull uses, deleted by Remove: %v", what, err)
		}
	}
	for _, path := range []string{s.layerPath(z.ChainIDs[1]), s.blobPath(digestOf(t, onlyZ)), s.blobPath(z.ID)} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s of the removed image: %v, want it gone", path, err)
		}
	}

	release()
	r := recvWithin(t, p, "the held pull once released")
	if r.err != nil {
		t.Fatal(r.err)
	}
	for i, name := range []string{"base", "mid", "top"} {
		want := map[string]string{"base": "shared base", "mid": "published mid-pull", "top": "held"}[name]
		if got, err := os.ReadFile(filepath.Join(s.layerPath(r.img.ChainIDs[i]), name)); err != nil || string(got) != want {
			t.Errorf("%s in layer %d = %q, %v; want %q", name, i, got, err, want)
		}
	}
	// Once the pull is recorded, the next collection keeps it whole.
	if n, err := s.collect(ctx, nil); err != nil || n != (gcCount{}) {
		t.Fatalf("collection after the pull: deleted %+v, %v", n, err)
	}
	for _, c := range r.img.ChainIDs {
		if _, err := os.Stat(s.layerPath(c)); err != nil {
			t.Errorf("layer %s of the pulled image after a collection: %v", c, err)
		}
	}
}

// Images that share a layer share its download, its blob and its
// unpacked directory, and removing one leaves the other whole, as well
// as the rootfs of a container still running the removed one.
func TestPullSharesLayersBetweenImages(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	base := fileLayer(t, "base", []byte("shared base"))
	la, lb := fileLayer(t, "a", []byte("only in A")), fileLayer(t, "b", []byte("only in B"))
	reg.push(t, "a:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, base, la))
	reg.push(t, "b:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, base, lb))
	var (
		mu   sync.Mutex
		gets = map[string]int{} // blob digest -> GETs, during B's pull
		onB  atomic.Bool
	)
	reg.pulls(func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i := strings.LastIndex(r.URL.Path, "/blobs/"); i >= 0 && r.Method == http.MethodGet && onB.Load() {
				mu.Lock()
				gets[r.URL.Path[i+len("/blobs/"):]]++
				mu.Unlock()
			}
			inner.ServeHTTP(w, r)
		})
	})
	s := newTestStore(t, Options{})
	ctx := context.Background()
	a, err := s.Pull(ctx, reg.ref("a:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	onB.Store(true)
	b, err := s.Pull(ctx, reg.ref("b:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if n := gets[digestOf(t, base)]; n != 0 {
		t.Errorf("B's pull fetched the shared base layer %d times, want 0", n)
	}
	if n := gets[digestOf(t, lb)]; n != 1 {
		t.Errorf("B's pull fetched its own layer %d times, want 1", n)
	}
	mu.Unlock()
	if a.ChainIDs[0] != b.ChainIDs[0] {
		t.Fatalf("base chain IDs %s and %s differ", a.ChainIDs[0], b.ChainIDs[0])
	}

	mount := func(id, imageID string) string {
		t.Helper()
		dir := t.TempDir()
		t.Cleanup(func() { s.UnmountRootfs(ctx, id, "", dir) })
		rootfs, err := s.MountRootfs(ctx, MountRequest{ContainerID: id, ImageID: imageID, Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return rootfs
	}
	checkFiles := func(what, dir string, want map[string]string) {
		t.Helper()
		for name, content := range want {
			if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != content {
				t.Errorf("%s: %s = %q, %v; want %q", what, name, got, err, content)
			}
		}
	}
	rootfsA := mount("ca", a.ID)
	if err := s.Remove(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	checkFiles("rootfs of a container of removed A", rootfsA, map[string]string{"base": "shared base", "a": "only in A"})
	checkFiles("B's base layer", s.layerPath(b.ChainIDs[0]), map[string]string{"base": "shared base"})
	checkFiles("B's own layer", s.layerPath(b.ChainIDs[1]), map[string]string{"b": "only in B"})
	for _, d := range []string{digestOf(t, base), digestOf(t, lb), b.ID} {
		if _, err := os.Stat(s.blobPath(d)); err != nil {
			t.Errorf("B's blob %s after removing A: %v", d, err)
		}
	}
	checkFiles("rootfs of B mounted after removing A", mount("cb", b.ID), map[string]string{"base": "shared base", "b": "only in B"})
	if _, err := os.Stat(filepath.Join(rootfsA, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("B's file in A's rootfs: %v", err)
	}
}

// A blob unpacked again from the store, on another parent, is checked
// against its compressed digest even where the download was checked on
// the wire, and its damage is DataLoss, not the registry's failure.
func TestPullChecksAStoredBlob(t *testing.T) {
	requireRoot(t)
	var emptyGzip bytes.Buffer
	zw := gzip.NewWriter(&emptyGzip)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		appended []byte
		want     string
	}{
		// A second, empty gzip member: the inflate and the diffID are
		// as before, the compressed digest is not.
		"an empty gzip member appended": {emptyGzip.Bytes(), "compressed digest"},
		// A byte that starts no gzip member: the inflate fails at the
		// end of the file.
		"a stray byte appended": {[]byte{0}, "unexpected EOF"},
	} {
		t.Run(name, func(t *testing.T) {
			reg := startTestRegistry(t)
			shared := fileLayer(t, "shared", []byte("on two parents"))
			reg.push(t, "a:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "a", []byte("base of A")), shared))
			reg.push(t, "b:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, fileLayer(t, "b", []byte("base of B")), shared))
			s := newTestStore(t, Options{})
			ctx := context.Background()
			if _, err := s.Pull(ctx, reg.ref("a:1"), nil); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(s.blobPath(digestOf(t, shared)), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(tc.appended); err != nil {
				t.Fatal(err)
			}
			f.Close()
			_, err = s.Pull(ctx, reg.ref("b:1"), nil)
			if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "unreachable") {
				t.Fatalf("pull unpacking the damaged stored blob: %v, want DataLoss naming %q", err, tc.want)
			}
		})
	}
}

// A Remove of the image a rootfs or image volume is being mounted from,
// run after the mount resolved the image and before the overlay is
// mounted, keeps the layers the mount uses. The mount resolved the image
// before it took mountMu, under which gc reads what is mounted, so gc
// found nothing mounted and trashed the layers: the mount failed on
// missing lower dirs or, a moment later, left the container an empty
// rootfs.
func TestRemoveRacingMount(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name  string
		mount func(ctx context.Context, s *Store, imageID, dir string) (string, error)
	}{
		{"rootfs", func(ctx context.Context, s *Store, imageID, dir string) (string, error) {
			return s.MountRootfs(ctx, MountRequest{ContainerID: "c", ImageID: imageID, Dir: dir})
		}},
		{"image volume", func(ctx context.Context, s *Store, imageID, dir string) (string, error) {
			return s.MountImageVolume(ctx, VolumeRequest{ContainerID: "c", ImageID: imageID, Dir: dir})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t, Options{})
			img := pullTestImage(t, s)
			ctx := context.Background()
			dir := t.TempDir()
			t.Cleanup(func() { s.UnmountRootfs(ctx, "c", "", dir) })
			var removeErr error
			removed := make(chan struct{})
			s.resolved = func() {
				go func() {
					removeErr = s.Remove(ctx, img.ID)
					close(removed)
				}()
				// A Remove that does not wait for this mount is done well
				// within the second; one that waits only slows the test.
				select {
				case <-removed:
				case <-time.After(time.Second):
				}
			}
			root, err := tc.mount(ctx, s, img.ID, dir)
			if err != nil {
				t.Fatalf("mount with a Remove of its image after the image was resolved: %v", err)
			}
			recvWithin(t, removed, "Remove of the image being mounted")
			if removeErr != nil {
				t.Fatalf("Remove: %v", removeErr)
			}
			if got, err := os.ReadFile(filepath.Join(root, "srv/data")); err != nil || string(got) != "d" {
				t.Errorf("srv/data of the mounted image after its Remove = %q, %v; want \"d\"", got, err)
			}
			for _, c := range img.ChainIDs {
				if _, err := os.Stat(s.layerPath(c)); err != nil {
					t.Errorf("layer %s under the mount: %v", c, err)
				}
			}
		})
	}
}

// An image removed while a container runs from it, and pulled again,
// has its layer blobs in the store again. Remove keeps the layers under
// the rootfs but not their blobs, which no mount names; the pull found
// the layers present and fetched nothing, and recorded blobs that were
// not on disk: an ImageStatus size of bytes the store does not hold, and
// no blob to unpack a lost layer from again.
func TestPullAgainAfterRemoveInUse(t *testing.T) {
	requireRoot(t)
	reg := startTestRegistry(t)
	base, top := fileLayer(t, "base", []byte("base")), fileLayer(t, "top", []byte("top"))
	reg.push(t, "inuse:1", imageOf(t, types.OCIManifestSchema1, types.OCIConfigJSON, base, top))
	s := newTestStore(t, Options{})
	ctx := context.Background()
	img, err := s.Pull(ctx, reg.ref("inuse:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Cleanup(func() { s.UnmountRootfs(ctx, "c", "", dir) })
	rootfs, err := s.MountRootfs(ctx, MountRequest{ContainerID: "c", ImageID: img.ID, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(ctx, reg.ref("inuse:1"), nil); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*rawLayer{base, top} {
		if _, err := os.Stat(s.blobPath(digestOf(t, l))); err != nil {
			t.Errorf("blob of a layer of the image pulled again: %v", err)
		}
	}
	for _, c := range img.ChainIDs {
		if _, err := os.Stat(s.layerPath(c)); err != nil {
			t.Errorf("layer %s: %v", c, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(rootfs, "top")); err != nil || string(got) != "top" {
		t.Errorf("top in the running container's rootfs = %q, %v", got, err)
	}
	// Staging the blob again leaves nothing behind.
	if ents, err := os.ReadDir(s.path("tmp")); err != nil || len(ents) != 0 {
		t.Errorf("tmp/ after the pull: %v, %v", ents, err)
	}
}
