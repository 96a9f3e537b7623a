package oci

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// padDir returns base extended with directories to exactly n bytes (base
// must be shorter); no component is longer than NAME_MAX.
func padDir(t *testing.T, base string, n int) string {
	t.Helper()
	p := base
	for len(p) < n {
		if n-len(p) == 1 {
			p += "p" // no room for a separator and a name
			break
		}
		p = filepath.Join(p, strings.Repeat("p", min(n-len(p)-1, 100)))
	}
	if len(p) != n {
		t.Fatalf("cannot make %q a path of %d bytes", base, n)
	}
	return p
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRuntimeAttachAnyPathLength attaches to a `cat` under state dirs and
// bundles of the lengths that broke attach when conmon was given
// --socket-dir-path <state dir>/attach: a <state dir>/attach/<id> link of
// exactly 107 bytes, which conmon cuts by one byte so attach found no
// socket, and paths far longer than sun_path's 108 bytes.
func TestRuntimeAttachAnyPathLength(t *testing.T) {
	e := newTestEnv(t)
	// Under /tmp itself: t.TempDir alone is longer than the 35 bytes the
	// first case needs.
	base, err := os.MkdirTemp("/tmp", "pa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	id := strings.Repeat("a", 52) + randID(t) // 64 bytes, as a CRI ID
	tests := []struct {
		name                string
		stateLen, bundleLen int
	}{
		{"link of exactly 107 bytes", 107 - len(id) - len("/attach/"), 0},
		{"paths over 108 bytes", 150, 200},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			caseDir := filepath.Join(base, strings.Repeat("c", i+1))
			rt, err := NewRuntime(e.h, padDir(t, caseDir, tc.stateLen))
			if err != nil {
				t.Fatal(err)
			}
			bundle := filepath.Join(caseDir, "b")
			if tc.bundleLen > 0 {
				bundle = padDir(t, bundle, tc.bundleLen)
			}
			e.createCat(t, rt, id, bundle)
			var out syncBuffer
			inR, inW := io.Pipe()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var attachErr error
			ended := make(chan struct{})
			go func() {
				attachErr = rt.Attach(ctx, id, AttachOptions{Stdin: inR, Stdout: &out, Stderr: io.Discard})
				// Writes to an attach that ended must fail, not block.
				inR.CloseWithError(io.ErrClosedPipe)
				close(ended)
			}()
			waitFor(t, func() bool {
				select {
				case <-ended:
					t.Fatalf("attach ended before the echo came back: %v", attachErr)
				default:
				}
				_, _ = io.WriteString(inW, "ping\n")
				return strings.Contains(out.String(), "ping")
			})
			// The end of the client's stdin is a detach.
			inW.Close()
			<-ended
			if attachErr != nil {
				t.Fatalf("attach: %v", attachErr)
			}
		})
	}
}

// createCat creates and starts `cat` with stdin as id under rt, deleted
// (with its conmon) when the test ends.
func (e *testEnv) createCat(t *testing.T, rt *Runtime, id, bundle string) {
	t.Helper()
	ctx := context.Background()
	spec, err := BuildContainerSpec(ctx, &ContainerSpec{
		ID: id, Rootfs: e.rootfs, Command: []string{"cat"}, Stdin: true,
		Namespaces:   Namespaces{PIDMode: PIDContainer},
		Seccomp:      SecurityProfile{Type: ProfileRuntimeDefault},
		CgroupParent: e.cgroup,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Delete(cctx, id, true); err != nil {
			t.Errorf("cleanup delete %s: %v", id, err)
		}
		killConmon(bundle)
	})
	if _, err := rt.Create(ctx, CreateOptions{ID: id, Bundle: bundle, Spec: spec, Stdin: true, ExitDir: bundle}); err != nil {
		b, _ := os.ReadFile(filepath.Join(bundle, "runtime.log"))
		t.Fatalf("create: %v\nruntime.log: %s", err, b)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("start: %v", err)
	}
}
