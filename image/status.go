package image

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ConfigFile returns the whole image config of the image ref resolves
// to, as pulled: platform, history and rootfs besides the runtime
// config that Get returns. It is read from the config blob, which the
// store keeps for as long as the image.
func (s *Store) ConfigFile(ref string) (*v1.ConfigFile, error) {
	s.mu.RLock()
	r, err := s.resolveLocked(ref)
	if err != nil {
		s.mu.RUnlock()
		return nil, err
	}
	id, p := r.ID, s.blobPath(r.ID)
	s.mu.RUnlock()
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config blob of image %s: %w", id, errdefs.ErrDataLoss)
	}
	if err != nil {
		return nil, fmt.Errorf("config blob of image %s: %w", id, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("config blob of image %s: %w: %w", id, err, errdefs.ErrDataLoss)
	}
	return cf, nil
}
