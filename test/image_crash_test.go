package test

import (
	"context"
	"crypto/rand"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// TestImageStoreKilled SIGKILLs the daemon in the middle of pulls and
// removals. After every restart the image is either listed and whole on
// disk, or not listed and nothing of it is on disk: no layer, no blob and
// nothing staged, once the restarted daemon has settled. A crash must not
// leave hundreds of megabytes that no image owns and that ImageFsInfo
// counts for ever.
func TestImageStoreKilled(t *testing.T) {
	reg := testimage.StartRegistry(t)
	payload := make([]byte, 4<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	img := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{
		{{Path: "small", Content: []byte("published before the crash")}},
		{{Path: "payload", Content: payload}},
	}})
	ref := reg.Push(t, "crash/payload:1", img)
	top := testimage.TopLayer(t, img)
	d := StartDaemon(t, Options{Network: true})
	spec := &runtimeapi.ImageSpec{Image: ref}
	pull := func(ctx context.Context) error {
		_, err := d.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec})
		return err
	}
	remove := func(ctx context.Context) error {
		_, err := d.Image.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: spec})
		return err
	}

	// What the store holds with the image and without it.
	none := storeEntries(t, d)
	if err := pull(Ctx(t)); err != nil {
		t.Fatal(err)
	}
	whole := storeEntries(t, d)
	if len(whole) <= len(none) {
		t.Fatalf("the store after a pull holds %v, before it %v", whole, none)
	}
	if err := remove(Ctx(t)); err != nil {
		t.Fatal(err)
	}
	settled(t, d, none, false)

	t.Run("held", func(t *testing.T) {
		// The top layer's download hangs: the layers below it are
		// published, the image is not recorded, and the daemon dies.
		arrived, release := make(chan struct{}, 1), make(chan struct{})
		hold := throttled(1, 0, 0, release)
		reg.Intercept(onBlob(top, func(w http.ResponseWriter, r *http.Request, hdr http.Header, body []byte) {
			select {
			case arrived <- struct{}{}:
			default:
			}
			hold(w, r, hdr, body)
		}))
		defer reg.Intercept(nil)
		defer close(release)
		errc := make(chan error, 1)
		go func() { errc <- pull(context.Background()) }()
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			t.Fatal("the top layer was never asked for")
		}
		waitUntil(t, "a layer published under the held pull", func() bool {
			return slices.ContainsFunc(storeEntries(t, d), func(e string) bool { return strings.HasPrefix(e, "layers/") })
		})
		if err := d.Restart(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err == nil {
			t.Fatal("the pull the daemon died in succeeded")
		}
		settled(t, d, none, false)
	})

	t.Run("random", func(t *testing.T) {
		// The top layer at about 8 MB/s: a pull lasts half a second, and
		// the kills land anywhere in it.
		reg.Intercept(onBlob(top, throttled(64, 8*time.Millisecond, -1, nil)))
		defer reg.Intercept(nil)
		listed := false
		for i := range int(envInt("CRASH_ITERATIONS", 12)) {
			op, opName := pull, "pull"
			window := 700 * time.Millisecond
			if listed {
				op, opName, window = remove, "remove", 40*time.Millisecond
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- op(ctx) }()
			wait := randDuration(window)
			time.Sleep(wait)
			if err := d.Restart(); err != nil {
				cancel()
				t.Fatalf("iteration %d: restart after a kill %v into a %s: %v", i, wait, opName, err)
			}
			err := <-done
			cancel()
			listed = len(imgList(t, d, ref)) == 1
			t.Logf("iteration %d: killed %v into a %s (%v); image listed: %v", i, wait, opName, err, listed)
			if listed {
				settled(t, d, whole, true)
			} else {
				settled(t, d, none, false)
			}
		}
	})

	// After all of it, the image pulls and runs with the right content.
	reg.Intercept(nil)
	if err := pull(Ctx(t)); err != nil {
		t.Fatal(err)
	}
	settled(t, d, whole, true)
	checkPayload(t, d, ref, payload)
}

// settled waits until the image store holds exactly want, and checks
// that ListImages lists the image exactly when listed. The restarted
// daemon may collect what a crash left after its socket opens.
func settled(t *testing.T, d *Daemon, want []string, listed bool) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got = storeEntries(t, d); slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(got, want) {
		extra, missing := entriesDiff(want, got)
		t.Fatalf("the image store (image listed: %v) has %d entries no image owns: %v; and lacks %v", listed, len(extra), extra, missing)
	}
	if n := len(imgList(t, d, "")); (n == 1) != listed {
		t.Fatalf("%d images listed, want the image listed: %v", n, listed)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func randDuration(max time.Duration) time.Duration {
	n, err := rand.Int(rand.Reader, big.NewInt(int64(max)))
	if err != nil {
		panic(err)
	}
	return time.Duration(n.Int64())
}
