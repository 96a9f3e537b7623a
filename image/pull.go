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
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// empty reports credentials that authenticate nothing: none, or only a
// server address.
func (a *Auth) empty() bool {
	return a == nil || *a == (Auth{ServerAddress: a.ServerAddress})
}

// forHost is a's credentials for one registry host, or nil: they go to
// every endpoint of a pull, its mirrors too, unless they name their
// server; then, as containerd reads CRI's credentials, to that server
// only ("https://index.docker.io/v1/" is Docker Hub).
func (a *Auth) forHost(host string) *Auth {
	if a.empty() || (a.ServerAddress != "" && authHost(a.ServerAddress) != authHost(host)) {
		return nil
	}
	return a
}

// authenticator turns CRI credentials into a go-containerregistry
// authenticator; no credentials means anonymous.
func (a *Auth) authenticator() authn.Authenticator {
	if a.empty() {
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
	// tr is the endpoint's own transport, whose idle connections the
	// pull closes when it ends: no later pull reuses them.
	tr *http.Transport
}

// closeIdle closes the connections eps' transports keep for reuse.
// Without it each pull left one to each registry it reached, with two
// goroutines, until the transport's idle timeout.
func closeIdle(eps []endpoint) {
	for _, ep := range eps {
		ep.tr.CloseIdleConnections()
	}
}

// endpoints lists the mirrors of r's registry in order, then the
// registry itself unless SkipOrigin. auth is the caller's credentials;
// an endpoint they are not for gets the auth file's entry for its host.
func (s *Store) endpoints(ctx context.Context, r name.Reference, auth *Auth, files authFileCreds, prog *pullProgress, blobs *blobChecks) ([]endpoint, error) {
	credsFor := func(ref name.Reference) *Auth {
		if a := auth.forHost(registryHost(ref)); a != nil {
			return a
		}
		return files.lookup(registryHost(ref))
	}
	cfg := s.registryConfig(registryHost(r))
	var eps []endpoint
	for _, m := range cfg.Mirrors {
		host, _, _ := SplitMirror(m)
		mcfg := s.registryConfig(host)
		mref, err := mirrorRef(r, m, nameOpts(mcfg)...)
		if err != nil {
			return nil, fmt.Errorf("mirror %q: %w: %w", m, err, errdefs.ErrInvalidArgument)
		}
		ep, err := s.endpoint(ctx, mref, mcfg, credsFor(mref), prog, blobs)
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
		ep, err := s.endpoint(ctx, oref, cfg, credsFor(oref), prog, blobs)
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

// registryConfig is the configuration of a registry host, which the
// operator may have written under any name of it: NewStore keyed them
// all by authHost (CanonicalRegistries), as the auth file's are.
func (s *Store) registryConfig(host string) RegistryConfig {
	return s.opts.Registries[authHost(host)]
}

// CanonicalRegistries keys regs by host as pulls name it (authHost):
// "index.docker.io" or "registry-1.docker.io" configure Docker Hub, which
// pulls call docker.io, and "Quay.io" is quay.io. Of two keys naming one
// host the one already in that form wins, else the first in sorted
// order. The signature helper is configured from the same keys.
func CanonicalRegistries(regs map[string]RegistryConfig) map[string]RegistryConfig {
	out := make(map[string]RegistryConfig, len(regs))
	for _, k := range slices.Sorted(maps.Keys(regs)) {
		h := authHost(k)
		if _, dup := out[h]; dup && k != h {
			continue
		}
		out[h] = regs[k]
	}
	return out
}

// nameOpts: go-containerregistry already uses plain HTTP for localhost
// and loopback names; Insecure extends that to any host.
func nameOpts(cfg RegistryConfig) []name.Option {
	if cfg.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

func (s *Store) progressTimeout() time.Duration {
	if s.opts.PullProgressTimeout > 0 {
		return s.opts.PullProgressTimeout
	}
	return DefaultPullProgressTimeout
}

func (s *Store) endpoint(ctx context.Context, ref name.Reference, cfg RegistryConfig, auth *Auth, prog *pullProgress, blobs *blobChecks) (endpoint, error) {
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	// Connecting and waiting for response headers are bounded by the
	// stall timeout per request, not by the watchdog, so that a mirror
	// that drops packets or accepts and never answers fails this one
	// endpoint and the next one is tried. Once headers arrived, the
	// watchdog on the bodies takes over.
	stall := s.progressTimeout()
	dialTimeout := min(30*time.Second, stall)
	if s.opts.PullTimeout > 0 {
		dialTimeout = min(dialTimeout, s.opts.PullTimeout)
	}
	tr.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = stall
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
	return endpoint{ref: ref, tr: tr, opts: []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(&progressTransport{base: tr, p: prog, blobs: blobs, timeout: stall}),
		remote.WithAuth(auth.authenticator()),
		remote.WithPlatform(s.platform),
		// The default backoff waits 1s and 3s; a mirror that is down
		// should hand over to the next one quickly.
		remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 2}),
	}}, nil
}

// diskFull says whether err is the store's filesystem (or quota) out of
// room.
func diskFull(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// classify maps registry and network failures to errdefs classes.
func classify(err error) error {
	// Before the network checks: net/http wraps what the transport
	// returns in a *url.Error, which is a net.Error.
	if isBlobMismatch(err) {
		return withClass(err, errdefs.ErrDataLoss)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusNotFound:
			return withClass(err, errdefs.ErrNotFound)
		case http.StatusUnauthorized:
			return withClass(err, errdefs.ErrUnauthenticated)
		case http.StatusForbidden:
			return withClass(err, errdefs.ErrPermissionDenied)
		case http.StatusTooManyRequests:
			// A rate limit (Docker Hub's pulls per six hours) that the
			// retries did not outlast.
			return withClass(err, errdefs.ErrResourceExhausted)
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
// platform), unpacks its layers and records it. The returned image keeps
// the name asked for, even when it came from a mirror.
//
// Concurrent pulls of the same reference with the same credentials share
// one download, which runs detached from the callers: each caller stops
// waiting when its own ctx ends (the error wraps ctx.Err()), and the
// download stops when all of them have.
func (s *Store) Pull(ctx context.Context, ref string, auth *Auth, opts ...PullOption) (*Image, error) {
	r, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	req := PullOptions(opts...)
	img, err := s.flight.do(ctx, flightKey(r, auth, req), func(ctx context.Context) (*Image, error) {
		img, _, err := s.pull(ctx, r, auth, req)
		return img, err
	})
	if err != nil {
		return nil, err
	}
	return img.clone(), nil
}

// flightKey says which pulls share a download: the same image with the
// same credentials, for the same namespace (whose signature policy may
// differ from another's).
func flightKey(r name.Reference, auth *Auth, req PullRequest) string {
	return normalize(r) + " " + credKey(auth) + " " + req.Namespace
}

// pullStats describe one finished pull, for the log and the benchmark.
type pullStats struct {
	// Bytes is what the registry sent, manifests included.
	Bytes int64
	Took  time.Duration
	// NetWait is the time blocked reading from the registry and Unpack
	// the rest of staging and publishing the layers, both summed over
	// the concurrent layers, so together they can exceed Took.
	NetWait, Unpack time.Duration
}

// pull runs one pull, bounded by the stall watchdog and, if configured,
// PullTimeout. When either ends it, the error says which setting fired.
func (s *Store) pull(ctx context.Context, r name.Reference, auth *Auth, req PullRequest) (*Image, pullStats, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if s.opts.PullTimeout > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeoutCause(ctx, s.opts.PullTimeout,
			fmt.Errorf("pull timed out after %s (image.pull_timeout): %w", s.opts.PullTimeout, errdefs.ErrUnavailable))
		defer cancelT()
	}
	prog := newPullProgress()
	stop := prog.watch(ctx, cancel, s.progressTimeout(), s.logEvery, normalize(r))
	start := time.Now()
	img, f, ep, err := s.pullOnce(ctx, r, auth, req, prog)
	stop()
	if err != nil {
		// Whatever failed after a cancellation failed because of it; the
		// cause says why (stall, pull_timeout, every caller gone) better
		// than "context canceled" from deep inside an HTTP read.
		if ctx.Err() != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
				err = fmt.Errorf("%w (%w)", cause, err)
			}
		}
		return nil, pullStats{}, err
	}
	st := pullStats{Bytes: prog.bytes.Load(), Took: time.Since(start), NetWait: time.Duration(prog.netWait.Load())}
	st.Unpack = max(0, time.Duration(f.stageTime.Load())-st.NetWait)
	log.G(ctx).WithFields(log.Fields{
		"image": normalize(r), "id": img.ID, "endpoint": ep, "size": f.rec.Size, "received": st.Bytes,
		"took": st.Took.Round(time.Millisecond).String(), "mb_per_s": mbPerSec(st.Bytes, st.Took),
		"download": st.NetWait.Round(time.Millisecond).String(), "unpack": st.Unpack.Round(time.Millisecond).String(),
	}).Info("pulled image")
	return img, st, nil
}

// pullOnce runs pullShared and, if it fails, takes back the layers and
// blobs it published: a failed pull leaves the store as it found it.
// Those another running pull has pinned (it found them present and may
// record an image using them) stay until that pull is done, which
// sweepOrphans sees to.
func (s *Store) pullOnce(ctx context.Context, r name.Reference, auth *Auth, req PullRequest, prog *pullProgress) (*Image, *fetched, string, error) {
	added := &storeItems{}
	img, f, ep, err := s.pullShared(ctx, r, auth, req, prog, added)
	if err != nil {
		s.orphans.moveFrom(added)
	}
	s.sweepOrphans(ctx)
	return img, f, ep, err
}

// pullShared pulls, recording in added what it publishes. What fetch
// pins stays pinned until the image is recorded (or the pull failed), so
// that no garbage collection deletes it in between.
func (s *Store) pullShared(ctx context.Context, r name.Reference, auth *Auth, req PullRequest, prog *pullProgress, added *storeItems) (*Image, *fetched, string, error) {
	// The policy is checked before anything is fetched; what is fetched
	// is then the manifest it accepted, by digest. r keeps naming the
	// image for its record.
	fetchRef, err := s.verify(ctx, r, auth.forHost(registryHost(r)), req)
	if err != nil {
		return nil, nil, "", err
	}
	pins := &pinSet{}
	defer s.unpin(pins)

	var files authFileCreds
	if auth.empty() || auth.ServerAddress != "" {
		var err error
		if files, err = loadAuthFile(s.opts.AuthFile); err != nil {
			return nil, nil, "", fmt.Errorf("pull %s: %w", normalize(r), err)
		}
	}
	blobs := &blobChecks{}
	eps, err := s.endpoints(ctx, fetchRef, auth, files, prog, blobs)
	if err != nil {
		return nil, nil, "", err
	}
	defer closeIdle(eps)
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
		return nil, nil, "", fmt.Errorf("pull %s: %w", normalize(r), endpointsFailed(errs))
	}
	epName := ep.ref.Context().RegistryStr()
	f, err := s.fetch(ctx, desc, blobs, added, pins, normalize(r), epName)
	if err != nil {
		if diskFull(err) {
			// The registry is fine: this node is full.
			return nil, nil, "", withClass(fmt.Errorf("pull %s: no room for the image in %s: %w", normalize(r), s.root, err), errdefs.ErrResourceExhausted)
		}
		return nil, nil, "", fmt.Errorf("pull %s from %s: %w", normalize(r), epName, classify(err))
	}
	rec := f.rec
	rec.RepoDigests = []string{repoName(r) + "@" + desc.Digest.String()}
	if _, ok := r.(name.Tag); ok {
		rec.RepoTags = []string{normalize(r)}
	}
	img, err := s.commit(rec)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pull %s: %w", normalize(r), err)
	}
	return img, f, epName, nil
}

// verify runs the Verifier, if any, and returns the reference to fetch:
// r itself when no policy applies, else r's repository at the accepted
// digest.
func (s *Store) verify(ctx context.Context, r name.Reference, auth *Auth, req PullRequest) (name.Reference, error) {
	if s.opts.Verifier == nil {
		return r, nil
	}
	d, err := s.opts.Verifier.Verify(ctx, normalize(r), auth, req.Namespace)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", normalize(r), err)
	}
	if d == "" {
		return r, nil
	}
	return r.Context().Digest(d), nil
}

// endpointsFailed joins the errors of every endpoint tried. The class is
// theirs when they all agree (every endpoint said not found, or refused
// the credentials); otherwise the image may exist behind an endpoint we
// couldn't reach, or accept us there, and the pull is Unavailable.
func endpointsFailed(errs []error) error {
	err := errors.Join(errs...)
	class := errdefs.Resolve(errs[0])
	for _, e := range errs[1:] {
		if !errors.Is(errdefs.Resolve(e), class) {
			return withClass(err, errdefs.ErrUnavailable)
		}
	}
	if errors.Is(class, errdefs.ErrUnknown) {
		return withClass(err, errdefs.ErrUnavailable)
	}
	return withClass(err, class)
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

// fetched is the result of fetch.
type fetched struct {
	rec *record
	// stageTime is the time spent staging and publishing layers, summed
	// over concurrent layers, without the time waiting for a download
	// slot or a parent layer.
	stageTime atomic.Int64
}

// noPlatform classifies err, desc.Image's failure, as NotFound when desc
// is an index without an image for the store's platform, naming the
// platforms it has (containerd's "no match for platform in manifest").
// Any other failure is returned as it is.
func (s *Store) noPlatform(desc *remote.Descriptor, err error) error {
	if !desc.MediaType.IsIndex() {
		return err
	}
	idx, ierr := desc.ImageIndex()
	if ierr != nil {
		return err
	}
	im, ierr := idx.IndexManifest()
	if ierr != nil {
		return err
	}
	var have []string
	for _, m := range im.Manifests {
		p := v1.Platform{OS: "linux", Architecture: "amd64"} // the registry library's default
		if m.Platform != nil {
			p = *m.Platform
		}
		if p.Satisfies(s.platform) {
			return err
		}
		have = append(have, p.String())
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	return fmt.Errorf("image index has no image for platform %s (it has: %s): %w",
		s.platform.String(), strings.Join(have, ", "), errdefs.ErrNotFound)
}

// fetch stores the layers, config and manifest of desc, recording in
// added the ones it publishes. It pins them all in pins (see
// Store.gcLock) before looking for any of them in the store. Layers
// download and unpack concurrently, up to MaxConcurrentDownloads at
// once; each is published once the layers below it are (see
// ensureLayer). The manifest and config are
// stored last. The manifest's descriptors go to blobs before any blob is
// fetched, for the transport to check them.
func (s *Store) fetch(ctx context.Context, desc *remote.Descriptor, blobs *blobChecks, added *storeItems, pins *pinSet, imgName, epName string) (*fetched, error) {
	img, err := desc.Image()
	if err != nil {
		return nil, s.noPlatform(desc, err)
	}
	mdigest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	manifest, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	blobs.expect(manifest.Config)
	for _, l := range manifest.Layers {
		blobs.expect(l)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	if len(cfg.RootFS.DiffIDs) != len(manifest.Layers) {
		return nil, fmt.Errorf("image has %d layers but %d diffIDs: %w", len(manifest.Layers), len(cfg.RootFS.DiffIDs), errdefs.ErrDataLoss)
	}
	f := &fetched{rec: &record{
		ID:             manifest.Config.Digest.String(),
		ManifestDigest: mdigest.String(),
		Size:           uint64(manifest.Config.Size),
		Config:         cfg.Config,
		Annotations:    manifest.Annotations,
	}}
	layers, layerBytes, err := recordLayers(img, manifest, cfg, f.rec)
	if err != nil {
		return nil, err
	}
	for i, lr := range f.rec.Layers {
		if blobs.has(lr.Digest) {
			layers[i] = wireChecked{layers[i]}
		}
	}
	if err := s.pin(ctx, pins, f.rec); err != nil {
		return nil, err
	}
	log.G(ctx).WithFields(log.Fields{"image": imgName, "endpoint": epName, "layers": len(manifest.Layers), "size": layerBytes}).
		Info("pulling image")

	if err := s.fetchLayers(ctx, layers, f, added); err != nil {
		return nil, err
	}
	if err := s.putBlob(f.rec.ID, rawConfig, added); err != nil {
		return nil, err
	}
	if err := s.putBlob(mdigest.String(), rawManifest, added); err != nil {
		return nil, err
	}
	return f, nil
}

// recordLayers appends manifest's layers to rec, with their diffIDs
// from cfg and their chain IDs, adds their size to rec's, and returns
// them as img's layers and their compressed size in bytes.
func recordLayers(img v1.Image, manifest *v1.Manifest, cfg *v1.ConfigFile, rec *record) ([]v1.Layer, int64, error) {
	var (
		layerBytes int64
		layers     []v1.Layer
	)
	chain := ""
	for i, ld := range manifest.Layers {
		diffID := cfg.RootFS.DiffIDs[i].String()
		chain = chainID(chain, diffID)
		rec.Layers = append(rec.Layers, layerRecord{Digest: ld.Digest.String(), DiffID: diffID, ChainID: chain, Size: ld.Size, MediaType: string(ld.MediaType)})
		layerBytes += ld.Size
		layer, err := img.LayerByDigest(ld.Digest)
		if err != nil {
			return nil, 0, err
		}
		layers = append(layers, layer)
	}
	rec.Size += uint64(layerBytes)
	return layers, layerBytes, nil
}

// fetchLayers ensures each of f.rec's layers (layers, in the same
// order) is in the store: up to MaxConcurrentDownloads download at
// once, and each is published once its parent is (see ensureLayer).
func (s *Store) fetchLayers(ctx context.Context, layers []v1.Layer, f *fetched, added *storeItems) error {
	n := s.opts.MaxConcurrentDownloads
	if n <= 0 {
		n = DefaultMaxConcurrentDownloads
	}
	sem := make(chan struct{}, n)
	present := make([]chan struct{}, len(f.rec.Layers))
	g, gctx := errgroup.WithContext(ctx)
	for i, lr := range f.rec.Layers {
		present[i] = make(chan struct{})
		var parent <-chan struct{}
		if i > 0 {
			parent = present[i-1]
		}
		g.Go(func() error {
			if err := s.ensureLayer(gctx, layers[i], lr, parent, sem, &f.stageTime, added); err != nil {
				return err
			}
			close(present[i])
			return nil
		})
	}
	return g.Wait()
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

// putBlob writes a small, already fetched blob after checking its digest
// and records it in added if it was not there yet.
func (s *Store) putBlob(digest string, data []byte, added *storeItems) error {
	h := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(h[:]); got != digest {
		return fmt.Errorf("blob digest mismatch: got %s, want %s: %w", got, digest, errdefs.ErrDataLoss)
	}
	unlock := s.locks.lock("blob:" + digest)
	defer unlock()
	if _, err := os.Stat(s.blobPath(digest)); err == nil {
		return nil
	}
	if err := atomicfile.WriteFile(s.blobPath(digest), data, 0o600); err != nil {
		return err
	}
	added.addBlob(digest)
	return nil
}

// ensureLayer makes layers/<chain> exist.
//
// Layers are independent directories, so each one is downloaded and
// unpacked into tmp/ as soon as a download slot (sem) is free, without
// waiting for the layers below it. But the name layers/<chain> claims that
// the whole chain below is valid, and a later pull trusts it without
// looking further down. So the staged layer is only published (renamed
// into place) after its parent is present: publishing goes bottom-up,
// and a crash at any instant leaves only complete chains under layers/.
// The layer's chain lock is held throughout, so two pulls never stage the
// same chain twice; the download slot is given back before waiting for
// the parent, so a slow lower layer never holds up the downloads above.
// The time spent staging and publishing, not waiting, is added to work;
// what it publishes is recorded in added.
//
// A layer present without its blob is staged all the same, for the
// blob alone, checked against both digests and published: the record
// about to name the blob needs it on disk (stageLayer says why). Remove
// leaves a layer so when a mounted rootfs uses it, since mounts name
// layers, not blobs; pulling the image again while its container runs
// finds it so.
func (s *Store) ensureLayer(ctx context.Context, layer v1.Layer, lr layerRecord, parent <-chan struct{}, sem chan struct{}, work *atomic.Int64, added *storeItems) error {
	unlock, err := s.locks.lockCtx(ctx, "layer:"+lr.ChainID)
	if err != nil {
		return err
	}
	defer unlock()
	blobOnly := false
	if _, err := os.Stat(s.layerPath(lr.ChainID)); err == nil {
		if _, err := os.Stat(s.blobPath(lr.Digest)); err == nil {
			return nil
		}
		blobOnly = true
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	start := time.Now()
	st, err := s.stageLayer(ctx, layer, lr)
	work.Add(int64(time.Since(start)))
	<-sem
	if err != nil {
		return err
	}
	published := false
	defer func() {
		if !published {
			st.discard()
		}
	}()
	if blobOnly {
		return s.publishBlob(st, lr, added)
	}
	if parent != nil {
		select {
		case <-parent:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	start = time.Now()
	defer func() { work.Add(int64(time.Since(start))) }()
	if err := s.publishLayer(st, lr, added); err != nil {
		return err
	}
	published = true
	return nil
}

// stagedLayer is a layer unpacked and verified in tmp/, not yet visible.
type stagedLayer struct {
	dir  string // tmp/layer-*: the unpacked layer
	blob string // tmp/blob-*: its compressed blob; "" if already stored
}

// discard removes what staging left; everything is under tmp/, which
// NewStore also clears after a crash.
func (st *stagedLayer) discard() {
	os.RemoveAll(st.dir)
	if st.blob != "" {
		os.Remove(st.blob)
	}
}

// stageLayer writes the compressed stream to tmp/ and unpacks it in one
// pass, checking both digests, and makes both durable. A blob already in
// the store (another image shares it) is unpacked from there instead.
//
// Why the compressed blob is kept after unpacking (issue 22; the same
// text is in docs/design.md):
//   - It is the only copy that can be checked against its digests again.
//     A layer directory that is missing while its blob is stored (an
//     operator's rm, a chain dropped and needed again) is unpacked again
//     from the blob, with both digests checked and no network: on an
//     air-gapped node whose mirror is down that is the difference between
//     starting a pod and not.
//   - Layer sharing is by chain ID, but the same blob can sit on a
//     different parent in another image; that image unpacks it from the
//     stored blob without downloading it again (gc_linux_test.go).
//   - kubelet's image GC weighs images by the size ImageStatus reports,
//     which is the compressed size, and ImageFsInfo reports the bytes the
//     store uses: keeping the blob keeps both honest; dropping it would
//     make ImageStatus report bytes that are not on disk.
//   - CRI never pushes, and verbose ImageStatus needs only the manifest
//     and config, which are kept in any case; those two alone would not
//     justify it.
//   - Crash consistency does not need it (the layer is published by a
//     rename after one syncfs), and it costs a write of the compressed
//     size while the pull runs. It is written in the same pass as the
//     unpack (tee), never read back, and made durable by the same syncfs
//     as the layer, so it adds no read and no extra flush: the price is
//     disk space (the compressed size: for gzip typically a third to two
//     thirds of the unpacked size), which image GC reclaims with the
//     image.
//
// containerd keeps the blob too (its content store; discard_unpacked_layers
// is opt-in); CRI-O does not (containers/storage keeps tar-split metadata
// to rebuild a layer's tar, at the cost of not having the original bytes).
func (s *Store) stageLayer(ctx context.Context, layer v1.Layer, lr layerRecord) (_ *stagedLayer, retErr error) {
	tmpDir, err := os.MkdirTemp(s.path("tmp"), "layer-")
	if err != nil {
		return nil, err
	}
	st := &stagedLayer{dir: tmpDir}
	defer func() {
		if retErr != nil {
			st.discard()
		}
	}()
	// MkdirTemp makes 0700; the layer root gets the tar's "./" metadata
	// if it has one, otherwise it must still be readable by any user.
	if err := os.Chmod(tmpDir, 0o755); err != nil {
		return nil, err
	}
	var (
		src     io.Reader
		blobTmp *os.File
		// A stored blob's compressed digest is checked as it is
		// unpacked, and so is a download's that is not checked on the
		// wire.
		checkCompressed = true
	)
	if f, err := os.Open(s.blobPath(lr.Digest)); err == nil {
		defer f.Close()
		src = &ctxReader{ctx: ctx, r: f}
	} else {
		rc, err := layer.Compressed()
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", lr.Digest, err)
		}
		defer rc.Close()
		blobTmp, err = os.CreateTemp(s.path("tmp"), "blob-")
		if err != nil {
			return nil, err
		}
		st.blob = blobTmp.Name()
		defer blobTmp.Close()
		ra := newReadAhead(io.TeeReader(&ctxReader{ctx: ctx, r: rc}, blobTmp), readAheadChunk, readAheadDepth)
		// Runs before the deferred closes above: no write to the blob
		// file after this returns.
		defer func() {
			ra.stop()
			rc.Close()
			ra.wait()
		}()
		src = ra
		_, onWire := layer.(wireChecked)
		checkCompressed = !onWire
	}
	if _, err := unpackLayer(src, tmpDir, lr.Digest, lr.DiffID, checkCompressed); err != nil {
		if blobTmp == nil && errdefs.IsDataLoss(err) {
			// The stored blob is damaged. Its truncation is no network
			// failure: the message stays, the unexpected EOF that
			// classify would take for one does not.
			return nil, fmt.Errorf("stored blob: %s: %w", err.Error(), errdefs.ErrDataLoss)
		}
		return nil, err
	}
	// The unpacked files must be durable before the rename publishes the
	// layer, or a crash could leave a trusted but empty layer. One syncfs
	// and no fsync per file: the blob is in tmp/ too, on the same
	// filesystem, so this makes it durable as well.
	if err := syncFS(tmpDir); err != nil {
		return nil, err
	}
	return st, nil
}

// publishLayer moves a staged layer (and its blob) into place and
// records in added what it moved.
func (s *Store) publishLayer(st *stagedLayer, lr layerRecord, added *storeItems) error {
	if err := s.publishBlob(st, lr, added); err != nil {
		return err
	}
	if err := os.Rename(st.dir, s.layerPath(lr.ChainID)); err != nil {
		return err
	}
	added.addLayer(lr.ChainID)
	return atomicfile.SyncDir(s.path("layers"))
}

// publishBlob moves a staged layer's blob, if it downloaded one, into
// place and records it in added.
func (s *Store) publishBlob(st *stagedLayer, lr layerRecord, added *storeItems) error {
	if st.blob == "" {
		return nil
	}
	if err := os.Rename(st.blob, s.blobPath(lr.Digest)); err != nil {
		return err
	}
	st.blob = ""
	added.addBlob(lr.Digest)
	return atomicfile.SyncDir(filepath.Dir(s.blobPath(lr.Digest)))
}

func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// A layer's download is read up to readAheadDepth chunks of
// readAheadChunk bytes (2 MiB) ahead of its unpack (readahead.go).
const (
	readAheadChunk = 128 << 10
	readAheadDepth = 16
)

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
