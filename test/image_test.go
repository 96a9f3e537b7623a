package test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// The image e2e tests pull from an in-process registry on loopback, so
// they need no network; the daemon is real and runs as root.

func imgPull(t testing.TB, d *Daemon, ref string) string {
	t.Helper()
	resp, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("PullImage(%s): %v", ref, err)
	}
	return resp.ImageRef
}

func imgStatus(t testing.TB, d *Daemon, ref string, verbose bool) *runtimeapi.ImageStatusResponse {
	t.Helper()
	resp, err := d.Image.ImageStatus(Ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Verbose: verbose})
	if err != nil {
		t.Fatalf("ImageStatus(%s): %v", ref, err)
	}
	return resp
}

func imgRemove(t testing.TB, d *Daemon, ref string) {
	t.Helper()
	if _, err := d.Image.RemoveImage(Ctx(t), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("RemoveImage(%s): %v", ref, err)
	}
}

// imgList returns the listed images by ID.
func imgList(t testing.TB, d *Daemon, filter string) map[string]*runtimeapi.Image {
	t.Helper()
	req := &runtimeapi.ListImagesRequest{}
	if filter != "" {
		req.Filter = &runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: filter}}
	}
	resp, err := d.Image.ListImages(Ctx(t), req)
	if err != nil {
		t.Fatalf("ListImages(%q): %v", filter, err)
	}
	out := map[string]*runtimeapi.Image{}
	for _, img := range resp.Images {
		if _, dup := out[img.Id]; dup {
			t.Errorf("ListImages lists %s twice", img.Id)
		}
		out[img.Id] = img
	}
	return out
}

func imgFsInfo(t testing.TB, d *Daemon) *runtimeapi.FilesystemUsage {
	t.Helper()
	resp, err := d.Image.ImageFsInfo(Ctx(t), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatalf("ImageFsInfo: %v", err)
	}
	if len(resp.ImageFilesystems) != 1 {
		t.Fatalf("ImageFilesystems = %v, want one", resp.ImageFilesystems)
	}
	return resp.ImageFilesystems[0]
}

func TestImagePullByTagAndDigest(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{Cmd: []string{"sh"}, Layers: [][]testimage.File{{{Path: "etc/hello", Content: []byte("hi\n")}}}})
	id := testimage.ID(t, img)
	digestRef := reg.Push(t, "pulltest:1", img)
	tagRef := reg.Ref("pulltest:1")
	d := StartDaemon(t, Options{})

	if got := imgPull(t, d, tagRef); got != id {
		t.Fatalf("PullImage(tag) = %q, want the config digest %q", got, id)
	}
	st := imgStatus(t, d, tagRef, false).Image
	if st == nil {
		t.Fatalf("ImageStatus(%s) = nil after pulling it", tagRef)
	}
	if st.Id != id || !slices.Equal(st.RepoTags, []string{tagRef}) || !slices.Equal(st.RepoDigests, []string{digestRef}) {
		t.Errorf("after tag pull: id %s tags %v digests %v, want %s [%s] [%s]", st.Id, st.RepoTags, st.RepoDigests, id, tagRef, digestRef)
	}
	if st.Size == 0 || st.Pinned || st.GetSpec().GetImage() != id {
		t.Errorf("size %d pinned %v spec %v, want a size, unpinned, spec = ID", st.Size, st.Pinned, st.Spec)
	}

	if got := imgPull(t, d, digestRef); got != id {
		t.Fatalf("PullImage(digest) = %q, want %q", got, id)
	}
	// Every way of naming the image reports the same record.
	for _, ref := range []string{tagRef, digestRef, id, strings.TrimPrefix(id, "sha256:")[:12]} {
		st := imgStatus(t, d, ref, false).Image
		if st.GetId() != id || !slices.Equal(st.RepoTags, []string{tagRef}) || !slices.Equal(st.RepoDigests, []string{digestRef}) {
			t.Errorf("ImageStatus(%s) = %v, want id %s, tags [%s], digests [%s]", ref, st, id, tagRef, digestRef)
		}
	}
	all := imgList(t, d, "")
	if len(all) != 1 || all[id] == nil {
		t.Errorf("ListImages = %v, want only %s", all, id)
	}
	for _, filter := range []string{tagRef, digestRef, id} {
		if got := imgList(t, d, filter); len(got) != 1 || got[id] == nil {
			t.Errorf("ListImages(filter %s) = %v, want only %s", filter, got, id)
		}
	}
	if got := imgList(t, d, reg.Ref("other:1")); len(got) != 0 {
		t.Errorf("ListImages(filter other) = %v, want none", got)
	}
	if st := imgStatus(t, d, reg.Ref("pulltest:2"), false); st.Image != nil || st.Info != nil {
		t.Errorf("ImageStatus(unknown) = %v, want an empty response", st)
	}
}

func TestImageStatusUser(t *testing.T) {
	reg := testimage.StartRegistry(t)
	d := StartDaemon(t, Options{})
	tests := []struct {
		name     string
		user     string
		wantUID  *runtimeapi.Int64Value
		wantName string
	}{
		{"numeric", "1002", &runtimeapi.Int64Value{Value: 1002}, ""},
		{"numeric with group", "1002:1002", &runtimeapi.Int64Value{Value: 1002}, ""},
		{"root", "0", &runtimeapi.Int64Value{Value: 0}, ""},
		{"name", "www-data", nil, "www-data"},
		{"unset", "", nil, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img := testimage.Build(t, testimage.Spec{User: tc.user, Cmd: []string{"sh"}})
			ref := reg.Ref(fmt.Sprintf("user:%d", i))
			reg.Push(t, fmt.Sprintf("user:%d", i), img)
			imgPull(t, d, ref)
			resp := imgStatus(t, d, ref, true)
			st := resp.Image
			if st.GetUid().GetValue() != tc.wantUID.GetValue() || (st.Uid == nil) != (tc.wantUID == nil) || st.Username != tc.wantName {
				t.Errorf("USER %q: uid %v username %q, want uid %v username %q", tc.user, st.Uid, st.Username, tc.wantUID, tc.wantName)
			}
			var info struct {
				ID       string    `json:"id"`
				ChainIDs []string  `json:"chainIDs"`
				Config   v1.Config `json:"config"`
			}
			if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
				t.Fatalf("verbose info %q: %v", resp.Info, err)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if info.ID != st.Id || info.Config.User != tc.user || len(info.ChainIDs) != len(layers) || !slices.Equal(info.Config.Cmd, []string{"sh"}) {
				t.Errorf("verbose info = %+v, want id %s, USER %q, Cmd [sh] and %d chain IDs", info, st.Id, tc.user, len(layers))
			}
		})
	}
}

func TestImagePullThroughMirror(t *testing.T) {
	mirror := testimage.StartRegistry(t)
	img := testimage.Busybox(t)
	id := testimage.ID(t, img)
	mirror.Push(t, "mirrored/bb:1", img)
	// The origin is a port nothing listens on: the pull can only succeed
	// through the mirror.
	const origin = "127.0.0.1:1"
	d := StartDaemon(t, Options{Config: fmt.Sprintf("[image.registries.%q]\nmirrors = [%q]\n", origin, mirror.Addr)})

	ref := origin + "/mirrored/bb:1"
	if got := imgPull(t, d, ref); got != id {
		t.Fatalf("PullImage(%s) = %q, want %q", ref, got, id)
	}
	st := imgStatus(t, d, ref, false).Image
	if st == nil || !slices.Equal(st.RepoTags, []string{ref}) {
		t.Fatalf("ImageStatus(%s) = %v, want RepoTags [%s]: the name asked for, not the mirror's", ref, st, ref)
	}
	for _, dg := range st.RepoDigests {
		if !strings.HasPrefix(dg, origin+"/mirrored/bb@sha256:") {
			t.Errorf("RepoDigest %q names the mirror, want the original registry", dg)
		}
	}
	if n := mirror.Requests("GET /v2/mirrored/bb/manifests/1"); n != 1 {
		t.Errorf("mirror served the manifest %d times, want 1 (log %v)", n, mirror.Log())
	}
	if got := imgStatus(t, d, mirror.Ref("mirrored/bb:1"), false).Image; got != nil {
		t.Errorf("the mirror's own name resolves to %v, want no image", got)
	}
}

func TestImageRemove(t *testing.T) {
	reg := testimage.StartRegistry(t)
	multi := testimage.Build(t, testimage.Spec{Cmd: []string{"sh"}, Labels: map[string]string{"which": "multi"}})
	single := testimage.Build(t, testimage.Spec{Cmd: []string{"sh"}, Labels: map[string]string{"which": "single"}})
	multiID, singleID := testimage.ID(t, multi), testimage.ID(t, single)
	reg.Push(t, "multi:a", multi)
	reg.Push(t, "multi:b", multi)
	singleDigest := reg.Push(t, "single:1", single)
	d := StartDaemon(t, Options{})
	empty := imgFsInfo(t, d)

	for _, ref := range []string{reg.Ref("multi:a"), reg.Ref("multi:b"), reg.Ref("single:1")} {
		imgPull(t, d, ref)
	}
	st := imgStatus(t, d, reg.Ref("multi:b"), false).Image
	if st.GetId() != multiID || !slices.Equal(st.RepoTags, []string{reg.Ref("multi:a"), reg.Ref("multi:b")}) {
		t.Fatalf("ImageStatus(multi:b) = %v, want %s with both tags", st, multiID)
	}

	// Removing by one tag removes the image and with it every tag.
	imgRemove(t, d, reg.Ref("multi:a"))
	for _, ref := range []string{reg.Ref("multi:a"), reg.Ref("multi:b"), multiID} {
		if got := imgStatus(t, d, ref, false).Image; got != nil {
			t.Errorf("ImageStatus(%s) after removing multi:a = %v, want nil", ref, got)
		}
	}
	if got := imgList(t, d, ""); len(got) != 1 || got[singleID] == nil {
		t.Errorf("ListImages = %v, want only %s", got, singleID)
	}
	// By digest, then again: removal is idempotent.
	imgRemove(t, d, singleDigest)
	imgRemove(t, d, singleDigest)
	imgRemove(t, d, singleID)
	if got := imgList(t, d, ""); len(got) != 0 {
		t.Errorf("ListImages after removing everything = %v, want none", got)
	}
	// The blobs and layers went with the images; only index.json, which
	// the first pull created, is new since the empty store.
	for _, dir := range []string{"blobs/sha256", "layers"} {
		if ents, err := os.ReadDir(filepath.Join(d.Root, "images", dir)); err != nil || len(ents) != 0 {
			t.Errorf("images/%s after removing all images: %d entries (%v), want none", dir, len(ents), err)
		}
	}
	if after := imgFsInfo(t, d); after.InodesUsed.Value != empty.InodesUsed.Value+1 {
		t.Errorf("inodes used after removing all images = %d, want %d (the empty store's + index.json)", after.InodesUsed.Value, empty.InodesUsed.Value+1)
	}
	if _, err := d.Image.RemoveImage(Ctx(t), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("RemoveImage(empty) = %v, want InvalidArgument", err)
	}
}

func TestImageFsInfoGrows(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Busybox(t)
	reg.Push(t, "bb:1", img)
	d := StartDaemon(t, Options{})

	before := imgFsInfo(t, d)
	if mp := before.GetFsId().GetMountpoint(); mp != d.Root+"/images" {
		t.Errorf("mountpoint = %q, want the store root %s/images", mp, d.Root)
	}
	if now := time.Now().UnixNano(); before.Timestamp > now || before.Timestamp < now-int64(time.Minute) {
		t.Errorf("timestamp %d is not now (%d)", before.Timestamp, now)
	}
	imgPull(t, d, reg.Ref("bb:1"))
	after := imgFsInfo(t, d)

	// The store holds the compressed layer and the unpacked busybox: at
	// least the image's size more bytes, and an inode per applet link.
	size := imgStatus(t, d, reg.Ref("bb:1"), false).Image.Size
	if grew := after.UsedBytes.Value - before.UsedBytes.Value; after.UsedBytes.Value <= before.UsedBytes.Value || grew < size {
		t.Errorf("used bytes %d -> %d, want growth of at least the image size %d", before.UsedBytes.Value, after.UsedBytes.Value, size)
	}
	if grew := after.InodesUsed.Value - before.InodesUsed.Value; after.InodesUsed.Value <= before.InodesUsed.Value || grew < uint64(len(testimage.Applets)) {
		t.Errorf("inodes %d -> %d, want growth of at least %d (the applet links)", before.InodesUsed.Value, after.InodesUsed.Value, len(testimage.Applets))
	}
	t.Logf("busybox image: %d bytes compressed; store grew %d bytes, %d inodes",
		size, after.UsedBytes.Value-before.UsedBytes.Value, after.InodesUsed.Value-before.InodesUsed.Value)
}

// TestImageConcurrentPulls sends the same pull 8 times at once over CRI:
// the store must download each blob once and every caller get the ID.
func TestImageConcurrentPulls(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{Cmd: []string{"sh"}, Layers: [][]testimage.File{
		{{Path: "data/a", Content: []byte(strings.Repeat("a", 1<<20))}},
		{{Path: "data/b", Content: []byte(strings.Repeat("b", 1<<20))}},
	}})
	id := testimage.ID(t, img)
	reg.Push(t, "conc:1", img)
	d := StartDaemon(t, Options{})

	const n = 8
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		refs  = make([]string, n)
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: reg.Ref("conc:1")}})
			errs[i] = err
			if err == nil {
				refs[i] = resp.ImageRef
			}
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || refs[i] != id {
			t.Errorf("pull %d = %q, %v; want %s", i, refs[i], errs[i], id)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	blobs := []string{cfg.String()}
	for _, l := range layers {
		dg, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, dg.String())
	}
	for _, b := range blobs {
		if got := reg.Requests("GET /v2/conc/blobs/" + b); got != 1 {
			t.Errorf("blob %s fetched %d times by %d concurrent pulls, want 1", b, got, n)
		}
	}
	if t.Failed() {
		t.Logf("registry log:\n%s", strings.Join(reg.Log(), "\n"))
	}
	if got := imgList(t, d, ""); len(got) != 1 || got[id] == nil {
		t.Errorf("ListImages = %v, want only %s", got, id)
	}
}

// blackhole accepts TCP connections on loopback and never answers, the
// worst kind of unreachable registry.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

func TestImagePullFailures(t *testing.T) {
	reg := testimage.StartRegistry(t)
	reg.Push(t, "present:1", testimage.Busybox(t))
	// 127.0.0.1:2 is a dead origin whose mirror answers 404: the image
	// may still exist at the origin, so that is Unavailable, not NotFound.
	d := StartDaemon(t, Options{Config: fmt.Sprintf("[image]\npull_timeout = \"3s\"\n[image.registries.\"127.0.0.1:2\"]\nmirrors = [%q]\n", reg.Addr)})
	hole := blackhole(t)

	tests := []struct {
		name    string
		ref     string
		want    codes.Code
		wantMsg string
	}{
		{"connection refused", "127.0.0.1:1/nothing:1", codes.Unavailable, "registry unreachable"},
		{"registry never answers", hole + "/nothing:1", codes.Unavailable, "timed out"},
		{"mirror 404, origin down", "127.0.0.1:2/absent:1", codes.Unavailable, "127.0.0.1:2: registry unreachable"},
		{"unknown tag", reg.Ref("present:2"), codes.NotFound, "pull " + reg.Ref("present:2")},
		{"unknown repository", reg.Ref("absent:1"), codes.NotFound, "pull " + reg.Ref("absent:1")},
		{"empty reference", "", codes.InvalidArgument, "image reference is empty"},
		{"malformed reference", "UPPER/Case::x", codes.InvalidArgument, "UPPER/Case::x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: tc.ref}})
			took := time.Since(start)
			if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
				t.Errorf("PullImage(%s) = %v, want %v containing %q", tc.ref, err, tc.want, tc.wantMsg)
			}
			// pull_timeout is 3s; allow for retries' bookkeeping but not
			// for the 30s dial timeout or the client's own deadline.
			if took > 15*time.Second {
				t.Errorf("PullImage(%s) took %v, want it bounded by pull_timeout (3s)", tc.ref, took)
			}
			t.Logf("%s: %v after %v", tc.name, status.Convert(err).Message(), took.Round(time.Millisecond))
		})
	}
	if got := imgList(t, d, ""); len(got) != 0 {
		t.Errorf("ListImages after failed pulls = %v, want none", got)
	}
}

// BenchmarkImagePullRemove measures a cold pull of the busybox image over
// CRI from a loopback registry (download, verify, unpack, fsync, record)
// followed by its removal, which garbage-collects blobs and layers.
func BenchmarkImagePullRemove(b *testing.B) {
	reg := testimage.StartRegistry(b)
	reg.Push(b, "bench:1", testimage.Busybox(b))
	d := StartDaemon(b, Options{})
	ref := reg.Ref("bench:1")
	for b.Loop() {
		imgPull(b, d, ref)
		imgRemove(b, d, ref)
	}
}

// BenchmarkImagePullPresent measures kubelet's common case: a re-pull of
// an image the store has, which still resolves the tag at the registry.
func BenchmarkImagePullPresent(b *testing.B) {
	reg := testimage.StartRegistry(b)
	reg.Push(b, "bench:1", testimage.Busybox(b))
	d := StartDaemon(b, Options{})
	ref := reg.Ref("bench:1")
	imgPull(b, d, ref)
	for b.Loop() {
		imgPull(b, d, ref)
	}
}
