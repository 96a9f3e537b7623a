package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pinrt/pinrt/test/testimage"
)

// fakeVerifier answers Verify from digests, keyed by reference, and
// records what it was asked.
type fakeVerifier struct {
	mu      sync.Mutex
	digests map[string]string
	err     error
	asked   []string // "ref namespace"
}

func (f *fakeVerifier) Verify(_ context.Context, ref string, _ *Auth, namespace string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, ref+" "+namespace)
	if f.err != nil {
		return "", f.err
	}
	return f.digests[ref], nil
}

// files lists the regular files under root.
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The store fetches the digest the Verifier accepted, not whatever the
// tag names by then, and records the image under the tag asked for.
func TestPullFetchesTheVerifiedDigest(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	verified := reg.Push(t, "app:1", testimage.Build(t, testimage.Spec{NoBusybox: true, Layers: [][]testimage.File{{{Path: "v", Content: []byte("verified")}}}}))
	// The tag moves after the check.
	reg.Push(t, "app:1", testimage.Build(t, testimage.Spec{NoBusybox: true, Layers: [][]testimage.File{{{Path: "v", Content: []byte("swapped")}}}}))
	d := verified[strings.Index(verified, "@")+1:]
	v := &fakeVerifier{digests: map[string]string{reg.Ref("app:1"): d}}
	s := newTestStore(t, Options{Verifier: v})
	reg.ResetRequests()

	img, err := s.Pull(context.Background(), reg.Ref("app:1"), nil, ForNamespace("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(img.RepoTags, []string{reg.Ref("app:1")}) || !slices.Equal(img.RepoDigests, []string{reg.Addr + "/app@" + d}) {
		t.Fatalf("recorded %v %v, want the tag and the verified digest %s", img.RepoTags, img.RepoDigests, d)
	}
	if n := reg.Requests("/manifests/1"); n != 0 {
		t.Fatalf("the tag was fetched after verification: %v", reg.Log())
	}
	if !slices.Equal(v.asked, []string{reg.Ref("app:1") + " team-a"}) {
		t.Fatalf("verifier asked %v", v.asked)
	}

	// No policy for the pull (""): the tag is pulled as usual.
	v.digests = nil
	if _, err := s.Pull(context.Background(), reg.Ref("app:1"), nil); err != nil {
		t.Fatal(err)
	}
	if n := reg.Requests("/manifests/1"); n == 0 {
		t.Fatalf("tag not fetched without a policy: %v", reg.Log())
	}
}

// A refusal fetches nothing and leaves nothing.
func TestPullRejectedLeavesNothing(t *testing.T) {
	requireRoot(t)
	reg := testimage.StartRegistry(t)
	reg.Push(t, "app:1", testimage.Busybox(t))
	rejected := fmt.Errorf("not signed: %w", ErrSignatureRejected)
	v := &fakeVerifier{err: rejected}
	s := newTestStore(t, Options{Verifier: v})
	before := files(t, s.Root())
	reg.ResetRequests()

	_, err := s.Pull(context.Background(), reg.Ref("app:1"), nil)
	if !errors.Is(err, ErrSignatureRejected) || !strings.Contains(err.Error(), reg.Ref("app:1")) {
		t.Fatalf("Pull = %v, want the rejection naming the image", err)
	}
	if l := reg.Log(); len(l) != 0 {
		t.Fatalf("a rejected pull asked the registry: %v", l)
	}
	if after := files(t, s.Root()); !slices.Equal(before, after) || len(s.List()) != 0 {
		t.Fatalf("a rejected pull left %v (before %v), images %v", after, before, s.List())
	}
}
