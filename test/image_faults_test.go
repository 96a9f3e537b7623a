package test

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// blobFault is a registry front that damages the GETs of one blob: the
// first `times` of them (all of them while times < 0) send half of the
// blob and then cut the connection (reset) or end the body early
// (truncate, the length still announced in full).
type blobFault struct {
	digest string
	mode   string // "reset" or "truncate"
	times  atomic.Int64
	hits   atomic.Int64
}

func (f *blobFault) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+f.digest) {
			next.ServeHTTP(w, r)
			return
		}
		if n := f.times.Load(); n == 0 {
			next.ServeHTTP(w, r)
			return
		} else if n > 0 {
			f.times.Add(-1)
		}
		f.hits.Add(1)
		rec := &bufferedResponse{header: http.Header{}}
		next.ServeHTTP(rec, r)
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body[:len(rec.body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if f.mode == "reset" {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
		}
		// truncate: returning with the body short of Content-Length makes
		// the server close the connection after what was written.
	})
}

// bufferedResponse records what the registry answered.
type bufferedResponse struct {
	header http.Header
	code   int
	body   []byte
}

func (b *bufferedResponse) Header() http.Header { return b.header }
func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	b.body = append(b.body, p...)
	return len(p), nil
}

// TestImagePullRegistryDies: a registry that resets the connection or
// truncates a blob mid-transfer, every time or only the first time. A
// pull fails cleanly (Unavailable or DataLoss, nothing of it left in the
// store) or succeeds within its retries with the right content; pulls of
// the same image running at once share the outcome and never record a
// damaged image; once the registry behaves, the pull succeeds.
func TestImagePullRegistryDies(t *testing.T) {
	reg := testimage.StartRegistry(t)
	payload := make([]byte, 4<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	img := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "payload", Content: payload}}}})
	ref := reg.Push(t, "faults/payload:1", img)
	digest := testimage.TopLayer(t, img)
	d := StartDaemon(t, Options{Network: true, Config: "[image]\npull_timeout = \"20s\"\n"})
	pull := func() error {
		_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		return err
	}
	for _, mode := range []string{"reset", "truncate"} {
		t.Run(mode, func(t *testing.T) {
			clean := rootFiles(t, d.Root)
			f := &blobFault{digest: digest, mode: mode}
			reg.Intercept(f.wrap)
			defer reg.Intercept(nil)

			// Every attempt damaged: the pull fails, and leaves nothing.
			f.times.Store(-1)
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = pull() }()
			}
			wg.Wait()
			for i, err := range errs {
				if err == nil {
					t.Fatalf("pull %d through a registry that always fails %s: no error", i, mode)
				}
				t.Logf("pull %d: %v", i, err)
			}
			if f.hits.Load() == 0 {
				t.Fatal("the fault was never hit")
			}
			if got := imgList(t, d, ""); len(got) != 0 {
				t.Errorf("images after failed pulls: %v", got)
			}
			if diff := fileDiff(clean, rootFiles(t, d.Root)); len(diff) > 0 {
				t.Errorf("the failed pulls left:\n%s", strings.Join(diff, "\n"))
			}

			// One damaged answer: the pulls succeed or fail, but what is
			// recorded is the image, whole.
			f.times.Store(1)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = pull() }()
			}
			wg.Wait()
			for i, err := range errs {
				t.Logf("pull %d after one fault: %v", i, err)
			}
			// The registry behaves: the pull succeeds, the content is right.
			if err := pull(); err != nil {
				t.Fatalf("pull through a healthy registry: %v", err)
			}
			checkPayload(t, d, ref, payload)
			if _, err := d.Image.RemoveImage(Ctx(t), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestImagePullRegistryRestarts: a registry that goes down after it
// served the manifest (every blob request's connection dies, as with a
// killed server) and comes back: the pull in between fails with nothing
// left, the next one succeeds with the right content.
func TestImagePullRegistryRestarts(t *testing.T) {
	reg := testimage.StartRegistry(t)
	payload := make([]byte, 1<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	ref := reg.Push(t, "faults/restart:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "payload", Content: payload}}}}))
	d := StartDaemon(t, Options{Network: true, Config: "[image]\npull_timeout = \"20s\"\n"})
	var down atomic.Bool
	down.Store(true)
	reg.Intercept(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if down.Load() && strings.Contains(r.URL.Path, "/blobs/") {
				if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = conn.Close()
				}
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	defer reg.Intercept(nil)
	clean := rootFiles(t, d.Root)
	spec := &runtimeapi.ImageSpec{Image: ref}
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: spec}); err == nil {
		t.Fatal("pull from a registry that died after the manifest: no error")
	}
	if got := imgList(t, d, ""); len(got) != 0 {
		t.Errorf("images after the failed pull: %v", got)
	}
	if diff := fileDiff(clean, rootFiles(t, d.Root)); len(diff) > 0 {
		t.Errorf("the failed pull left:\n%s", strings.Join(diff, "\n"))
	}
	down.Store(false)
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: spec}); err != nil {
		t.Fatalf("pull once the registry is back: %v", err)
	}
	checkPayload(t, d, ref, payload)
}

// checkPayload runs the image and compares the payload's digest inside.
func checkPayload(t *testing.T, d *Daemon, ref string, payload []byte) {
	t.Helper()
	pod := d.RunPod(t, PodConfig("payload-"+randHex(3)))
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: ref},
		Command: []string{"sleep", "1000"},
	}
	c, err := d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: PodConfig("payload")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatal(err)
	}
	resp, err := d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: c.ContainerId, Cmd: []string{"busybox", "sha256sum", "/payload"}, Timeout: 30})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%x", sha256.Sum256(payload))
	if f := strings.Fields(string(resp.Stdout)); len(f) == 0 || f[0] != want {
		t.Errorf("sha256 of the payload in the container = %q, want %s", resp.Stdout, want)
	}
	if _, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
}
