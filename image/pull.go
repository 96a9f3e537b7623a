package image

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// authenticator turns CRI credentials into a go-containerregistry
// authenticator; no credentials means anonymous.
func (a *Auth) authenticator() authn.Authenticator {
	if a == nil || *a == (Auth{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username:      a.Username,
		Password:      a.Password,
		Auth:          a.Auth,
		IdentityToken: a.IdentityToken,
		RegistryToken: a.RegistryToken,
	})
}

// endpoint is one place to pull a reference from: a mirror or the origin.
type endpoint struct {
	ref  name.Reference
	opts []remote.Option
}

// endpoints lists the mirrors of r's registry in order, then the
// registry itself unless SkipOrigin.
func (s *Store) endpoints(ctx context.Context, r name.Reference, auth *Auth) ([]endpoint, error) {
	cfg := s.opts.Registries[registryHost(r)]
	var eps []endpoint
	for _, m := range cfg.Mirrors {
		host, _, _ := strings.Cut(strings.Trim(m, "/"), "/")
		mcfg := s.opts.Registries[host]
		mref, err := mirrorRef(r, m, nameOpts(mcfg)...)
		if err != nil {
			return nil, fmt.Errorf("mirror %q: %w: %w", m, err, errdefs.ErrInvalidArgument)
		}
		ep, err := s.endpoint(ctx, mref, mcfg, auth)
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	if !cfg.SkipOrigin {
		oref, err := name.ParseReference(r.String(), nameOpts(cfg)...)
		if err != nil {
			return nil, fmt.Errorf("image reference %q: %w: %w", r, err, errdefs.ErrInvalidArgument)
		}
		ep, err := s.endpoint(ctx, oref, cfg, auth)
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("registry %s: skip_origin set and no mirrors: %w", registryHost(r), errdefs.ErrFailedPrecondition)
	}
	return eps, nil
}

// nameOpts: go-containerregistry already uses plain HTTP for localhost
// and loopback names; Insecure extends that to any host.
func nameOpts(cfg RegistryConfig) []name.Option {
	if cfg.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

func (s *Store) endpoint(ctx context.Context, ref name.Reference, cfg RegistryConfig, auth *Auth) (endpoint, error) {
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	dialTimeout := 30 * time.Second
	if s.opts.PullTimeout > 0 && s.opts.PullTimeout < dialTimeout {
		dialTimeout = s.opts.PullTimeout
	}
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	if cfg.Insecure || cfg.CAFile != "" {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.Insecure} //nolint:gosec // opted in per registry
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return endpoint{}, fmt.Errorf("registry CA file: %w", err)
			}
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				return endpoint{}, fmt.Errorf("registry CA file %s has no certificates: %w", cfg.CAFile, errdefs.ErrInvalidArgument)
			}
			tr.TLSClientConfig.RootCAs = pool
		}
	}
	return endpoint{ref: ref, opts: []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(tr),
		remote.WithAuth(auth.authenticator()),
		remote.WithPlatform(s.platform),
		// The default backoff waits 1s and 3s; a mirror that is down
		// should hand over to the next one quickly.
		remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 2}),
	}}, nil
}

// classify maps registry and network failures to errdefs classes.
func classify(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusNotFound:
			return withClass(err, errdefs.ErrNotFound)
		case http.StatusUnauthorized:
			return withClass(err, errdefs.ErrUnauthenticated)
		case http.StatusForbidden:
			return withClass(err, errdefs.ErrPermissionDenied)
		}
		for _, d := range terr.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return withClass(err, errdefs.ErrNotFound)
			}
		}
		return withClass(err, errdefs.ErrUnavailable)
	}
	// A timeout is the registry not answering in time: unavailable. The
	// error still wraps context.DeadlineExceeded, which withClass keeps
	// from deciding the gRPC code.
	if errors.Is(err, context.DeadlineExceeded) {
		return withClass(fmt.Errorf("timed out: %w", err), errdefs.ErrUnavailable)
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, io.ErrUnexpectedEOF) {
		return withClass(fmt.Errorf("registry unreachable: %w", err), errdefs.ErrUnavailable)
	}
	return err
}

// Pull fetches ref (tag or digest; indexes resolve to the store's
// platform), unpacks its layers and records it. Concurrent pulls of the
// same reference share one download: the first caller's context governs
// it. The returned image keeps the name asked for, even when it came
// from a mirror.
func (s *Store) Pull(ctx context.Context, ref string, auth *Auth) (*Image, error) {
	r, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	img, err := s.flight.do(normalize(r), func() (*Image, error) { return s.pull(ctx, r, auth) })
	if err != nil {
		return nil, err
	}
	return img.clone(), nil
}

func (s *Store) pull(ctx context.Context, r name.Reference, auth *Auth) (*Image, error) {
	if s.opts.PullTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.PullTimeout)
		defer cancel()
	}
	start := time.Now()
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()

	eps, err := s.endpoints(ctx, r, auth)
	if err != nil {
		return nil, err
	}
	var (
		desc *remote.Descriptor
		ep   endpoint
		errs []error
	)
	for _, ep = range eps {
		desc, err = remote.Get(ep.ref, ep.opts...)
		if err == nil {
			break
		}
		log.G(ctx).WithError(err).WithField("endpoint", ep.ref.Context().RegistryStr()).Debug("image endpoint failed")
		errs = append(errs, fmt.Errorf("%s: %w", ep.ref.Context().RegistryStr(), classify(err)))
		if ctx.Err() != nil {
			break
		}
	}
	if desc == nil {
		err := errors.Join(errs...)
		// Not found only if every endpoint said so; otherwise the image may
		// exist behind an endpoint we couldn't reach.
		for _, e := range errs {
			if !errdefs.IsNotFound(e) {
				return nil, fmt.Errorf("pull %s: %w", normalize(r), withClass(err, errdefs.ErrUnavailable))
			}
		}
		return nil, fmt.Errorf("pull %s: %w", normalize(r), withClass(err, errdefs.ErrNotFound))
	}
	rec, err := s.fetch(ctx, desc)
	if err != nil {
		return nil, fmt.Errorf("pull %s from %s: %w", normalize(r), ep.ref.Context().RegistryStr(), classify(err))
	}
	rec.RepoDigests = []string{repoName(r) + "@" + desc.Digest.String()}
	if _, ok := r.(name.Tag); ok {
		rec.RepoTags = []string{normalize(r)}
	}
	img, err := s.commit(rec)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", normalize(r), err)
	}
	log.G(ctx).WithField("image", normalize(r)).WithField("id", img.ID).WithField("took", time.Since(start)).Info("pulled image")
	return img, nil
}

// withClass makes class the class of err. errdefs.Resolve, and with it
// the gRPC code, takes the first class found walking the wrap chain in
// order, so appending class is not enough when err already wraps another
// one (context.DeadlineExceeded inside a timeout, or NotFound from a
// mirror joined with an unreachable origin): the class goes first in the
// chain, while the message keeps err's text first.
func withClass(err, class error) error {
	if errors.Is(errdefs.Resolve(err), class) {
		return err
	}
	return &classError{err: err, class: class}
}

type classError struct{ err, class error }

func (e *classError) Error() string   { return e.err.Error() + ": " + e.class.Error() }
func (e *classError) Unwrap() []error { return []error{e.class, e.err} }

// fetch stores the manifest, config and layers of desc.
func (s *Store) fetch(ctx context.Context, desc *remote.Descriptor) (*record, error) {
	img, err := desc.Image()
	if err != nil {
		return nil, err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	if err := s.putBlob(mdigest.String(), rawManifest); err != nil {
		return nil, err
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	if err := s.putBlob(manifest.Config.Digest.String(), rawConfig); err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	if len(cfg.RootFS.DiffIDs) != len(manifest.Layers) {
		return nil, fmt.Errorf("image has %d layers but %d diffIDs: %w", len(manifest.Layers), len(cfg.RootFS.DiffIDs), errdefs.ErrDataLoss)
	}
	rec := &record{
		ID:             manifest.Config.Digest.String(),
		ManifestDigest: mdigest.String(),
		Size:           uint64(manifest.Config.Size),
		Config:         cfg.Config,
	}
	chain := ""
	for i, ld := range manifest.Layers {
		diffID := cfg.RootFS.DiffIDs[i].String()
		chain = chainID(chain, diffID)
		lr := layerRecord{Digest: ld.Digest.String(), DiffID: diffID, ChainID: chain, Size: ld.Size, MediaType: string(ld.MediaType)}
		layer, err := img.LayerByDigest(ld.Digest)
		if err != nil {
			return nil, err
		}
		if err := s.ensureLayer(ctx, layer, lr); err != nil {
			return nil, err
		}
		rec.Layers = append(rec.Layers, lr)
		rec.Size += uint64(ld.Size)
	}
	return rec, nil
}

// chainID is the OCI chain ID: the first diffID, then
// sha256(parent + " " + diffID).
func chainID(parent, diffID string) string {
	if parent == "" {
		return diffID
	}
	h := sha256.Sum256([]byte(parent + " " + diffID))
	return "sha256:" + hex.EncodeToString(h[:])
}

// putBlob writes a small, already fetched blob after checking its digest.
func (s *Store) putBlob(digest string, data []byte) error {
	h := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(h[:]); got != digest {
		return fmt.Errorf("blob digest mismatch: got %s, want %s: %w", got, digest, errdefs.ErrDataLoss)
	}
	unlock := s.locks.lock("blob:" + digest)
	defer unlock()
	if _, err := os.Stat(s.blobPath(digest)); err == nil {
		return nil
	}
	return atomicfile.WriteFile(s.blobPath(digest), data, 0o600)
}

// ensureLayer makes layers/<chain> exist. The compressed stream is
// written to the blob store and unpacked in one pass; both land in their
// final place only after both digests checked out.
func (s *Store) ensureLayer(ctx context.Context, layer v1.Layer, lr layerRecord) (retErr error) {
	unlock := s.locks.lock("layer:" + lr.ChainID)
	defer unlock()
	final := s.layerPath(lr.ChainID)
	if _, err := os.Stat(final); err == nil {
		return nil
	}
	unlockBlob := s.locks.lock("blob:" + lr.Digest)
	defer unlockBlob()

	tmpDir, err := os.MkdirTemp(s.path("tmp"), "layer-")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmpDir)
		}
	}()
	// MkdirTemp makes 0700; the layer root gets the tar's "./" metadata
	// if it has one, otherwise it must still be readable by any user.
	if err := os.Chmod(tmpDir, 0o755); err != nil {
		return err
	}

	var (
		src     io.Reader
		blobTmp *os.File
	)
	if f, err := os.Open(s.blobPath(lr.Digest)); err == nil {
		defer f.Close()
		src = f
	} else {
		rc, err := layer.Compressed()
		if err != nil {
			return err
		}
		defer rc.Close()
		blobTmp, err = os.CreateTemp(s.path("tmp"), "blob-")
		if err != nil {
			return err
		}
		defer func() {
			blobTmp.Close()
			if retErr != nil {
				os.Remove(blobTmp.Name())
			}
		}()
		src = io.TeeReader(&ctxReader{ctx: ctx, r: rc}, blobTmp)
	}
	if _, err := UnpackLayer(src, tmpDir, lr.Digest, lr.DiffID); err != nil {
		return err
	}
	// The unpacked files must be durable before the rename publishes the
	// layer, or a crash could leave a trusted but empty layer.
	if err := syncFS(tmpDir); err != nil {
		return err
	}
	if blobTmp != nil {
		if err := blobTmp.Sync(); err != nil {
			return err
		}
		if err := os.Rename(blobTmp.Name(), s.blobPath(lr.Digest)); err != nil {
			return err
		}
		if err := atomicfile.SyncDir(filepath.Dir(s.blobPath(lr.Digest))); err != nil {
			return err
		}
	}
	if err := os.Rename(tmpDir, final); err != nil {
		return err
	}
	return atomicfile.SyncDir(s.path("layers"))
}

func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// ctxReader stops a layer download when the pull is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// commit records rec, merging it with an existing record of the same ID
// and moving its tags away from any other image.
func (s *Store) commit(rec *record) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := map[string]*record{}
	save := func(r *record) {
		if _, ok := prev[r.ID]; !ok {
			c := *r
			prev[r.ID] = &c
		}
	}
	for _, other := range s.images {
		if other.ID == rec.ID {
			continue
		}
		if slices.ContainsFunc(other.RepoTags, func(t string) bool { return slices.Contains(rec.RepoTags, t) }) {
			save(other)
			other.RepoTags = slices.DeleteFunc(slices.Clone(other.RepoTags), func(t string) bool { return slices.Contains(rec.RepoTags, t) })
		}
	}
	existing, had := s.images[rec.ID]
	if had {
		save(existing)
		merged := *existing
		merged.RepoTags = union(existing.RepoTags, rec.RepoTags)
		merged.RepoDigests = union(existing.RepoDigests, rec.RepoDigests)
		s.images[rec.ID] = &merged
	} else {
		s.images[rec.ID] = rec
	}
	if err := s.saveLocked(); err != nil {
		for id, r := range prev {
			s.images[id] = r
		}
		if !had {
			delete(s.images, rec.ID)
		}
		return nil, err
	}
	return s.images[rec.ID].image(), nil
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}
