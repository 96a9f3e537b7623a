// Package imagetest is a hand-written, in-memory fake of the image
// store's ImageService side (Pull, Get, List, Remove, FsUsage) for unit
// tests of its consumers. Set the *Err fields to inject failures.
package imagetest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/pinrt/pinrt/image"
)

// Fake serves images from Images, keyed by the reference Pull is given.
type Fake struct {
	mu sync.Mutex
	// Registry maps a pull reference to the image a pull returns.
	Registry map[string]image.Image
	// Pulled holds what was pulled, by ID.
	Pulled map[string]image.Image

	PullErr, RemoveErr, FsUsageErr error
	Bytes, Inodes                  uint64
	// PullAuths records the auth of every Pull call, PullNamespaces
	// the namespace it was for.
	PullAuths      []*image.Auth
	PullNamespaces []string
	// Configs are the whole image configs by image ID; an image without
	// one gets a linux config holding its runtime Config.
	Configs   map[string]*v1.ConfigFile
	ConfigErr error
	// TopLayers are the files of each image's top layer, by image ID.
	TopLayers map[string]map[string]string
}

// TopLayerFiles calls fn with TopLayers[ID] of the image ref names, in
// lexical order.
func (f *Fake) TopLayerFiles(ref string, fn func(name string, r io.Reader) error) error {
	img, err := f.Get(ref)
	if err != nil {
		return err
	}
	f.mu.Lock()
	files := maps.Clone(f.TopLayers[img.ID])
	f.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := fn(name, strings.NewReader(files[name])); err != nil {
			return err
		}
	}
	return nil
}

// Pull "downloads" Registry[ref].
func (f *Fake) Pull(_ context.Context, ref string, auth *image.Auth, opts ...image.PullOption) (*image.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.PullAuths = append(f.PullAuths, auth)
	f.PullNamespaces = append(f.PullNamespaces, image.PullOptions(opts...).Namespace)
	if f.PullErr != nil {
		return nil, f.PullErr
	}
	img, ok := f.Registry[ref]
	if !ok {
		return nil, fmt.Errorf("pull %s: %w", ref, errdefs.ErrNotFound)
	}
	if f.Pulled == nil {
		f.Pulled = map[string]image.Image{}
	}
	if prev, ok := f.Pulled[img.ID]; ok {
		for _, t := range img.RepoTags {
			if !slices.Contains(prev.RepoTags, t) {
				prev.RepoTags = append(prev.RepoTags, t)
			}
		}
		img = prev
	}
	f.Pulled[img.ID] = img
	return &img, nil
}

// Get matches ID, ID prefix, tag or digest exactly.
func (f *Fake) Get(ref string) (*image.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.getLocked(ref)
}

func (f *Fake) getLocked(ref string) (*image.Image, error) {
	for _, img := range f.Pulled {
		if img.ID == ref || strings.HasPrefix(img.ID, "sha256:"+ref) || slices.Contains(img.RepoTags, ref) || slices.Contains(img.RepoDigests, ref) {
			return &img, nil
		}
	}
	return nil, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

// List returns the pulled images sorted by ID.
func (f *Fake) List() []image.Image {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []image.Image
	for _, img := range f.Pulled {
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Remove drops the image ref resolves to.
func (f *Fake) Remove(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.RemoveErr != nil {
		return f.RemoveErr
	}
	img, err := f.getLocked(ref)
	if err != nil {
		return err
	}
	delete(f.Pulled, img.ID)
	return nil
}

// FsUsage returns Bytes and Inodes.
func (f *Fake) FsUsage() (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Bytes, f.Inodes, f.FsUsageErr
}

// ConfigFile returns Configs[ID] of the image ref names.
func (f *Fake) ConfigFile(ref string) (*v1.ConfigFile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ConfigErr != nil {
		return nil, f.ConfigErr
	}
	img, err := f.getLocked(ref)
	if err != nil {
		return nil, err
	}
	if cf, ok := f.Configs[img.ID]; ok {
		return cf.DeepCopy(), nil
	}
	return &v1.ConfigFile{OS: "linux", Config: img.Config, RootFS: v1.RootFS{Type: "layers"}}, nil
}
