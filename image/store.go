package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

const indexVersion = 1

// record is what index.json keeps per image.
type record struct {
	ID             string        `json:"id"`
	RepoTags       []string      `json:"repoTags,omitempty"`
	RepoDigests    []string      `json:"repoDigests,omitempty"`
	ManifestDigest string        `json:"manifestDigest"`
	Size           uint64        `json:"size"`
	Config         v1.Config     `json:"config"`
	Layers         []layerRecord `json:"layers"`
	// Annotations are the manifest's.
	Annotations map[string]string `json:"annotations,omitempty"`
}

type layerRecord struct {
	Digest    string `json:"digest"`
	DiffID    string `json:"diffID"`
	ChainID   string `json:"chainID"`
	Size      int64  `json:"size"`
	MediaType string `json:"mediaType,omitempty"`
}

type indexFile struct {
	Version int       `json:"version"`
	Images  []*record `json:"images"`
}

func (r *record) image() *Image {
	img := &Image{ID: r.ID, RepoTags: r.RepoTags, RepoDigests: r.RepoDigests, Size: r.Size, Config: r.Config, Annotations: r.Annotations}
	for _, l := range r.Layers {
		img.ChainIDs = append(img.ChainIDs, l.ChainID)
	}
	return img.clone()
}

// Store is the image store and rootfs mounter. It is safe for concurrent
// use.
type Store struct {
	root     string
	opts     Options
	platform v1.Platform

	// gcLock is held by a garbage collection while it decides what is
	// unused and moves it out of layers/ and blobs/, and by a pull while
	// it pins or unpins what it relies on (pinned). So an item is either
	// pinned before a collection looks at it, or gone before the pull
	// that pins it checks whether it is present; and a pull's layers stay
	// pinned until its record is in the index. Pulls used to hold a
	// read lock for their whole length instead: a Remove waiting for a
	// slow pull then held up every new pull behind it. Nothing waits
	// for a pull under gcLock, and the slow deletion itself runs after
	// it is released. A channel, so that Remove can give up waiting.
	gcLock chan struct{}
	// pinned counts, per layer and blob, the pulls that rely on it:
	// found it present, or are publishing it, and have not yet recorded
	// their image. Guarded by gcLock.
	pinned pinCounts
	// orphans are what failed pulls published, to be removed if no
	// image uses them once no pull has them pinned (sweepOrphans).
	orphans storeItems

	mu     sync.RWMutex
	images map[string]*record // by ID

	flight flightGroup
	locks  keyedMutex
	// logEvery is how often a running pull logs its progress.
	logEvery time.Duration

	mountMu sync.Mutex
	// mounted maps container ID to the chain IDs under its rootfs, so
	// Remove keeps layers that are still someone's lower dir.
	mounted map[string]mountedRootfs
	// resolved, when set, runs in MountRootfs and MountImageVolume right
	// after they resolve the image: tests place a Remove there.
	resolved func()
}

// NewStore creates the store directories under opts.Root and loads
// index.json. Staging leftovers of an interrupted run are removed.
func NewStore(opts Options) (*Store, error) {
	if opts.Root == "" || !filepath.IsAbs(opts.Root) {
		return nil, fmt.Errorf("image store root %q must be an absolute path: %w", opts.Root, errdefs.ErrInvalidArgument)
	}
	s := &Store{
		root:     filepath.Clean(opts.Root),
		opts:     opts,
		images:   map[string]*record{},
		mounted:  map[string]mountedRootfs{},
		logEvery: progressLogInterval,
		gcLock:   make(chan struct{}, 1),
		pinned:   pinCounts{layers: map[string]int{}, blobs: map[string]int{}},
	}
	s.opts.Registries = CanonicalRegistries(opts.Registries)
	if opts.Platform != nil {
		s.platform = *opts.Platform
	} else {
		s.platform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	if err := os.RemoveAll(s.path("tmp")); err != nil {
		return nil, fmt.Errorf("clean image staging dir: %w", err)
	}
	for _, d := range []string{"blobs/sha256", "layers", "tmp", "idmapped"} {
		if err := os.MkdirAll(s.path(d), 0o700); err != nil {
			return nil, fmt.Errorf("create image store: %w", err)
		}
	}
	// Nothing writes yet: what a crash left of an atomic write goes.
	atomicfile.RemoveTemps(s.root)
	atomicfile.RemoveTemps(s.path("blobs", "sha256"))
	if err := markTopDir(s.path("tmp")); err != nil {
		log.L.WithError(err).Warn("could not mark the image staging dir as a top directory (chattr +T); pulls right after removals may be slower on ext4 without a journal")
	}
	// Layers are lower dirs of containers that run as any user; the
	// directory itself must be traversable.
	if err := os.Chmod(s.path("layers"), 0o711); err != nil {
		return nil, fmt.Errorf("create image store: %w", err)
	}
	data, err := os.ReadFile(s.path("index.json"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read image index: %w", err)
	default:
		var idx indexFile
		if err := json.Unmarshal(data, &idx); err != nil {
			return nil, fmt.Errorf("parse %s: %w: %w", s.path("index.json"), err, errdefs.ErrDataLoss)
		}
		if idx.Version != indexVersion {
			return nil, fmt.Errorf("image index version %d, want %d: %w", idx.Version, indexVersion, errdefs.ErrNotImplemented)
		}
		for _, r := range idx.Images {
			s.images[r.ID] = r
		}
	}
	return s, nil
}

// Root returns the store directory.
func (s *Store) Root() string { return s.root }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.root}, elem...)...)
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) layerPath(chainID string) string {
	return s.path("layers", strings.TrimPrefix(chainID, "sha256:"))
}

// saveLocked writes index.json atomically. Callers hold s.mu.
func (s *Store) saveLocked() error {
	idx := indexFile{Version: indexVersion}
	for _, r := range s.images {
		idx.Images = append(idx.Images, r)
	}
	sort.Slice(idx.Images, func(i, j int) bool { return idx.Images[i].ID < idx.Images[j].ID })
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path("index.json"), data, 0o600)
}

// Get finds an image by full or short (>= 4 hex chars, unambiguous) ID,
// by tag or digest reference, or by a name that normalises to a tag
// ("busybox" is docker.io/library/busybox:latest).
func (s *Store) Get(ref string) (*Image, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, err := s.resolveLocked(ref)
	if err != nil {
		return nil, err
	}
	return r.image(), nil
}

func (s *Store) resolveLocked(ref string) (*record, error) {
	if m := fullIDRe.FindStringSubmatch(ref); m != nil {
		if r, ok := s.images["sha256:"+m[1]]; ok {
			return r, nil
		}
	}
	if pr, err := parseRef(ref); err == nil {
		n := normalize(pr)
		for _, r := range s.images {
			if slices.Contains(r.RepoTags, n) || slices.Contains(r.RepoDigests, n) {
				return r, nil
			}
		}
	}
	if m := shortIDRe.FindStringSubmatch(ref); m != nil {
		var found *record
		for id, r := range s.images {
			if strings.HasPrefix(id, "sha256:"+m[1]) {
				if found != nil {
					return nil, fmt.Errorf("image %q: ambiguous ID prefix: %w", ref, errdefs.ErrNotFound)
				}
				found = r
			}
		}
		if found != nil {
			return found, nil
		}
	}
	return nil, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

// List returns all images, sorted by ID.
func (s *Store) List() []Image {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Image, 0, len(s.images))
	for _, r := range s.images {
		out = append(out, *r.image())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Remove deletes the image ref resolves to, with all its tags, and the
// blobs and layers no other image uses. Layers that are the lower dir of
// a mounted rootfs stay until a later Remove finds them unused, and so
// do those a running pull has pinned. Remove never waits for a pull; it
// waits only for another collection to finish moving things away, and
// gives up with ErrUnavailable, having removed nothing, when ctx ends
// first.
func (s *Store) Remove(ctx context.Context, ref string) error {
	if err := s.lockGC(ctx); err != nil {
		return withClass(fmt.Errorf("remove image %q: waiting for another image garbage collection: %w", ref, err), errdefs.ErrUnavailable)
	}
	trash, err := s.removeLocked(ref)
	s.unlockGC()
	return firstErr(err, removeTrash(trash))
}

// removeLocked drops ref's record and collects the whole store. Callers
// hold gcLock and delete the returned trash after releasing it.
func (s *Store) removeLocked(ref string) (trash string, err error) {
	s.mu.Lock()
	r, err := s.resolveLocked(ref)
	if err != nil {
		s.mu.Unlock()
		return "", err
	}
	delete(s.images, r.ID)
	if err := s.saveLocked(); err != nil {
		s.images[r.ID] = r
		s.mu.Unlock()
		return "", fmt.Errorf("remove image %s: %w", r.ID, err)
	}
	s.mu.Unlock()
	s.orphans.take() // the whole store is collected now
	trash, _, err = s.gc(nil)
	return trash, err
}

// lockGC takes gcLock, or fails with ctx's cause if ctx ends first.
func (s *Store) lockGC(ctx context.Context) error {
	select {
	case s.gcLock <- struct{}{}:
		return nil
	default:
	}
	select {
	case s.gcLock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (s *Store) unlockGC() { <-s.gcLock }

// pinCounts counts pins per layer and blob, named as in storeItems.
type pinCounts struct{ layers, blobs map[string]int }

// pinSet is what one pull has pinned.
type pinSet struct{ layers, blobs []string }

// pin pins rec's layers and blobs (config, manifest, layer blobs) for a
// pull, before the pull looks for any of them in the store; unpin lets
// them go once the pull has recorded its image or failed. A garbage
// collection running meanwhile is the only thing pin waits for.
func (s *Store) pin(ctx context.Context, ps *pinSet, rec *record) error {
	if err := s.lockGC(ctx); err != nil {
		return err
	}
	defer s.unlockGC()
	add := func(m map[string]int, list *[]string, id string) {
		id = strings.TrimPrefix(id, "sha256:")
		m[id]++
		*list = append(*list, id)
	}
	add(s.pinned.blobs, &ps.blobs, rec.ID)
	add(s.pinned.blobs, &ps.blobs, rec.ManifestDigest)
	for _, l := range rec.Layers {
		add(s.pinned.blobs, &ps.blobs, l.Digest)
		add(s.pinned.layers, &ps.layers, l.ChainID)
	}
	return nil
}

func (s *Store) unpin(ps *pinSet) {
	if len(ps.layers) == 0 && len(ps.blobs) == 0 {
		return
	}
	_ = s.lockGC(context.Background())
	defer s.unlockGC()
	drop := func(m map[string]int, ids []string) {
		for _, id := range ids {
			if m[id]--; m[id] <= 0 {
				delete(m, id)
			}
		}
	}
	drop(s.pinned.layers, ps.layers)
	drop(s.pinned.blobs, ps.blobs)
	*ps = pinSet{}
}

// storeItems names layers (by chain ID) and blobs (by digest) as their
// entries in layers/ and blobs/sha256/ are named. It is safe for
// concurrent use.
type storeItems struct {
	mu            sync.Mutex
	layers, blobs map[string]bool
}

func (it *storeItems) addLayer(chainID string) { it.add(&it.layers, chainID) }
func (it *storeItems) addBlob(digest string)   { it.add(&it.blobs, digest) }

func (it *storeItems) add(m *map[string]bool, id string) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if *m == nil {
		*m = map[string]bool{}
	}
	(*m)[strings.TrimPrefix(id, "sha256:")] = true
}

// moveFrom moves every item of other into it.
func (it *storeItems) moveFrom(other *storeItems) {
	layers, blobs := other.take()
	for l := range layers {
		it.add(&it.layers, l)
	}
	for b := range blobs {
		it.add(&it.blobs, b)
	}
}

// take empties it and returns what it held.
func (it *storeItems) take() (layers, blobs map[string]bool) {
	it.mu.Lock()
	defer it.mu.Unlock()
	layers, blobs = it.layers, it.blobs
	it.layers, it.blobs = nil, nil
	return layers, blobs
}

func (it *storeItems) empty() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	return len(it.layers) == 0 && len(it.blobs) == 0
}

// sweepOrphans removes what failed pulls published and no image uses.
// Orphans a running pull has pinned (it found them present and may
// record an image on them) stay orphans: every pull calls this when it is
// done and has unpinned, after recording its own orphans, so the last of
// the pulls that pinned one decides. Remove collects the whole store
// anyway.
func (s *Store) sweepOrphans(ctx context.Context) {
	if s.orphans.empty() {
		return
	}
	layers, blobs := s.orphans.take()
	// Not ctx: a failed pull's is often cancelled, and the wait is
	// bounded by another collection's renames, as nothing under gcLock
	// waits for a pull.
	if _, err := s.collect(context.Background(), &gcCandidates{layers: layers, blobs: blobs}); err != nil {
		log.G(ctx).WithError(err).Warn("removing what a failed image pull left")
	}
}

// Collect deletes every blob and layer of the store that no image
// references, no mounted overlay uses and no running pull has pinned.
// A daemon killed in the middle of a pull leaves the layers it had
// published, and one killed in the middle of a RemoveImage the image's
// layers; the daemon calls Collect once at start, after the containers
// are restored, so that nothing is left of either.
// It logs what it deleted.
func (s *Store) Collect(ctx context.Context) error {
	n, err := s.collect(ctx, nil)
	if n.layers+n.blobs > 0 {
		log.G(ctx).WithField("layers", n.layers).WithField("blobs", n.blobs).Info("image store: deleted what no image uses (left by an interrupted pull or removal)")
	}
	return err
}

// collect runs gc under gcLock, then deletes what it moved away. With no
// candidates it collects the whole store, orphans included.
func (s *Store) collect(ctx context.Context, cand *gcCandidates) (gcCount, error) {
	if err := s.lockGC(ctx); err != nil {
		return gcCount{}, err
	}
	if cand == nil {
		s.orphans.take()
	}
	trash, n, err := s.gc(cand)
	s.unlockGC()
	return n, firstErr(err, removeTrash(trash))
}

// gcCount is what a gc deleted.
type gcCount struct{ layers, blobs int }

// gcCandidates limits gc to these layers and blobs, named as in
// storeItems.
type gcCandidates struct{ layers, blobs map[string]bool }

// gc deletes blobs and layers no image references, no mounted rootfs
// uses and no pull has pinned: among cand if set, else in the whole
// store. Unused items that are pinned become orphans, for the pull that
// pinned them to sweep if it fails. Layers are only renamed into trash,
// a directory under tmp/ that the caller removes (removeTrash) after
// releasing gcLock, which callers hold: deleting a large layer is slow
// and pulls pin under that lock.
func (s *Store) gc(cand *gcCandidates) (trash string, n gcCount, _ error) {
	blobs, layers, err := s.inUse()
	if err != nil {
		return "", n, err
	}
	var errs []error
	var layerNames, blobNames []string
	if cand != nil {
		layerNames, blobNames = slices.Collect(maps.Keys(cand.layers)), slices.Collect(maps.Keys(cand.blobs))
	} else {
		if layerNames, err = dirNames(s.path("layers")); err != nil {
			return "", n, err
		}
		if blobNames, err = dirNames(s.path("blobs", "sha256")); err != nil {
			return "", n, err
		}
	}
	for _, name := range layerNames {
		if layers[name] {
			continue
		}
		if s.pinned.layers[name] > 0 {
			s.orphans.addLayer(name)
			continue
		}
		// Rename first so the layer vanishes atomically; a crash before
		// the slow RemoveAll leaves garbage in tmp/, which NewStore clears.
		if trash == "" {
			var err error
			if trash, err = os.MkdirTemp(s.path("tmp"), "gc-"); err != nil {
				return "", n, err
			}
		}
		switch err := os.Rename(s.path("layers", name), filepath.Join(trash, name)); {
		case err == nil:
			n.layers++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	for _, name := range blobNames {
		// A temp file is a pull's write in progress (NewStore removed
		// those a crash left).
		if blobs[name] || atomicfile.IsTemp(name) {
			continue
		}
		if s.pinned.blobs[name] > 0 {
			s.orphans.addBlob(name)
			continue
		}
		switch err := os.Remove(s.path("blobs", "sha256", name)); {
		case err == nil:
			n.blobs++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return trash, n, fmt.Errorf("image garbage collection: %w", err)
	}
	return trash, n, nil
}

// inUse are the blobs and layers gc keeps: those of recorded images, and
// the layers of mounted rootfs, by the store's bookkeeping and by the
// kernel's mount table.
func (s *Store) inUse() (blobs, layers map[string]bool, _ error) {
	blobs, layers = map[string]bool{}, map[string]bool{}
	s.mu.RLock()
	for _, r := range s.images {
		blobs[strings.TrimPrefix(r.ManifestDigest, "sha256:")] = true
		blobs[strings.TrimPrefix(r.ID, "sha256:")] = true
		for _, l := range r.Layers {
			blobs[strings.TrimPrefix(l.Digest, "sha256:")] = true
			layers[strings.TrimPrefix(l.ChainID, "sha256:")] = true
		}
	}
	s.mu.RUnlock()
	s.mountMu.Lock()
	for _, m := range s.mounted {
		for _, c := range m.chainIDs {
			layers[strings.TrimPrefix(c, "sha256:")] = true
		}
	}
	// Read under mountMu, so no rootfs is being mounted meanwhile. Mounts
	// resolve their image under mountMu too (taking s.mu inside it, so
	// s.mu is released above): one that found an image whose record was
	// gone when read above is listed here.
	mounted, mountErr := s.mountedLayers()
	s.mountMu.Unlock()
	if mountErr != nil {
		return nil, nil, fmt.Errorf("image garbage collection: %w", mountErr)
	}
	maps.Copy(layers, mounted)
	return blobs, layers, nil
}

// firstErr returns the first non-nil error. Trash left by a failed
// removal is under tmp/, which NewStore clears, so a gc error says more.
// Unlike errors.Join it keeps a lone error unwrapped.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// removeTrash deletes what gc moved away.
func removeTrash(trash string) error {
	if trash == "" {
		return nil
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("image garbage collection: %w", err)
	}
	return nil
}

func dirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

// FsUsage returns the bytes (allocated blocks) and inodes used under the
// store, counting each hard-linked inode once.
func (s *Store) FsUsage() (bytes, inodes uint64, err error) {
	return diskUsage(s.root, map[string]bool{s.path("idmapped"): true})
}

// diskUsage walks dir without crossing into skip (mounted trees).
func diskUsage(dir string, skip map[string]bool) (bytes, inodes uint64, err error) {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if skip[p] {
			return filepath.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		k := ino{st.Dev, st.Ino}
		if seen[k] {
			return nil
		}
		seen[k] = true
		inodes++
		bytes += uint64(st.Blocks) * 512
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return bytes, inodes, nil
}

// Usage returns the bytes and inodes of a container's writable layer
// (Dir/upper of its MountRequest).
func (s *Store) Usage(dir string) (bytes, inodes uint64, err error) {
	return diskUsage(filepath.Join(dir, "upper"), nil)
}

// flightGroup runs one call per key at a time and shares its result
// with the callers that arrive meanwhile. The call runs on a context
// detached from every caller: it keeps the first caller's values (logger
// fields) but not its cancellation, so the first kubelet to give up does
// not fail the pull for the others. It is cancelled only when every
// waiter has gone.
type flightGroup struct {
	mu    sync.Mutex
	calls map[string]*flightCall
}

type flightCall struct {
	done    chan struct{}
	img     *Image
	err     error
	waiters int
	cancel  context.CancelCauseFunc
}

// errNoWaiters is the cause a shared pull is cancelled with when all its
// callers have given up.
var errNoWaiters = fmt.Errorf("every caller of the pull went away: %w", context.Canceled)

func (g *flightGroup) do(ctx context.Context, key string, fn func(context.Context) (*Image, error)) (*Image, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("image pull: %w", err)
	}
	g.mu.Lock()
	if g.calls == nil {
		g.calls = map[string]*flightCall{}
	}
	c, ok := g.calls[key]
	if ok {
		c.waiters++
	} else {
		cctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
		c = &flightCall{done: make(chan struct{}), waiters: 1, cancel: cancel}
		g.calls[key] = c
		go func() {
			defer cancel(nil)
			c.img, c.err = fn(cctx)
			g.mu.Lock()
			if g.calls[key] == c {
				delete(g.calls, key)
			}
			g.mu.Unlock()
			close(c.done)
		}()
	}
	g.mu.Unlock()

	select {
	case <-c.done:
		return c.img, c.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	c.waiters--
	if c.waiters == 0 {
		// Nobody wants the result any more: stop the download, and let
		// the next caller start afresh instead of joining a dying call.
		c.cancel(errNoWaiters)
		if g.calls[key] == c {
			delete(g.calls, key)
		}
	}
	g.mu.Unlock()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
		return nil, fmt.Errorf("waiting for image pull: %w (%w)", ctx.Err(), cause)
	}
	return nil, fmt.Errorf("waiting for image pull: %w", ctx.Err())
}

// keyedMutex is a mutex per key (blob digest, chain ID), dropped when
// nobody holds or waits for it.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

// keyedLock is held while its channel holds a token; a channel rather
// than a sync.Mutex so that a waiter can give up with its context.
type keyedLock struct {
	ch   chan struct{}
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	unlock, _ = k.lockCtx(context.Background(), key)
	return unlock
}

// lockCtx waits for key's lock or for ctx to end, whichever comes first.
// A pull waiting for a layer another pull is staging must still stop
// when its own callers have gone.
func (k *keyedMutex) lockCtx(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l, ok := k.locks[key]
	if !ok {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, context.Cause(ctx)
	}
	return func() {
		<-l.ch
		release()
	}, nil
}
