package imagetest

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/pinrt/pinrt/image"
)

// imageService is the consumer-side view the server declares; the fake
// and the real store must both satisfy it.
type imageService interface {
	Pull(ctx context.Context, ref string, auth *image.Auth, opts ...image.PullOption) (*image.Image, error)
	Get(ref string) (*image.Image, error)
	List() []image.Image
	Remove(ctx context.Context, ref string) error
	FsUsage() (bytes, inodes uint64, err error)
	ConfigFile(ref string) (*v1.ConfigFile, error)
}

var (
	_ imageService = (*Fake)(nil)
	_ imageService = (*image.Store)(nil)
)

func TestFake(t *testing.T) {
	f := &Fake{Registry: map[string]image.Image{"a:1": {ID: "sha256:abcd", RepoTags: []string{"a:1"}}}}
	if _, err := f.Pull(context.Background(), "a:1", nil); err != nil {
		t.Fatal(err)
	}
	if img, err := f.Get("abcd"); err != nil || img.ID != "sha256:abcd" {
		t.Fatalf("Get = %v, %v", img, err)
	}
	if err := f.Remove(context.Background(), "a:1"); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(context.Background(), "a:1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	f.PullErr = errdefs.ErrUnavailable
	if _, err := f.Pull(context.Background(), "a:1", nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("injected error: %v", err)
	}
}
