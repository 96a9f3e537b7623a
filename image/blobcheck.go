package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// blobChecks are the sizes and digests the manifest gives for the blobs
// one pull downloads. progressTransport checks every blob response
// against them on the wire, below go-containerregistry's own checks:
// those fail with plain errors ("Content-Length header … does not match
// expected size", "error verifying size", an unexported checksum error)
// that a caller cannot tell from any other failure, while a blob that
// is not what the manifest says is data loss, and must say so.
type blobChecks struct {
	mu    sync.Mutex
	blobs map[string]v1.Descriptor // by digest
}

// expect registers d; a blob listed twice keeps its first descriptor.
// Digests of an algorithm we cannot hash are left to go-containerregistry.
func (b *blobChecks) expect(d v1.Descriptor) {
	if _, err := v1.Hasher(d.Digest.Algorithm); err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.blobs == nil {
		b.blobs = map[string]v1.Descriptor{}
	}
	if _, ok := b.blobs[d.Digest.String()]; !ok {
		b.blobs[d.Digest.String()] = d
	}
}

// has says whether the blob digest is checked on the wire.
func (b *blobChecks) has(digest string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.blobs[digest]
	return ok
}

// wireChecked is a layer whose download blobChecks verifies: its size
// and digest are checked as it arrives, and go-containerregistry checks
// them again. Unpacking it need not hash the compressed stream a third
// time, on the goroutine that inflates it.
type wireChecked struct{ v1.Layer }

// forRequest finds the descriptor of the blob req fetches. Registries
// often redirect blob GETs to a CDN, so it is the first request of the
// redirect chain that names the blob.
func (b *blobChecks) forRequest(req *http.Request) (v1.Descriptor, bool) {
	if b == nil || req.Method != http.MethodGet {
		return v1.Descriptor{}, false
	}
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	i := strings.LastIndex(req.URL.Path, "/blobs/")
	if i < 0 {
		return v1.Descriptor{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.blobs[req.URL.Path[i+len("/blobs/"):]]
	return d, ok
}

// check returns resp's body, checked against the descriptor if resp is a
// blob the manifest lists, or a blobMismatchError (and closes the body)
// if its Content-Length already disagrees.
func (b *blobChecks) check(req *http.Request, resp *http.Response) (io.ReadCloser, error) {
	d, ok := b.forRequest(req)
	if !ok || resp.StatusCode != http.StatusOK {
		return resp.Body, nil
	}
	if resp.ContentLength >= 0 && resp.ContentLength != d.Size {
		resp.Body.Close()
		return nil, &blobMismatchError{digest: d.Digest.String(),
			msg: fmt.Sprintf("registry sends %d bytes, the manifest says %d", resp.ContentLength, d.Size)}
	}
	h, err := v1.Hasher(d.Digest.Algorithm)
	if err != nil {
		return resp.Body, nil // expect refused it already
	}
	return &checkedBody{rc: resp.Body, want: d, h: h}, nil
}

// blobMismatchError is a blob whose size or digest is not the manifest's.
type blobMismatchError struct{ digest, msg string }

func (e *blobMismatchError) Error() string {
	return "blob " + e.digest + ": " + e.msg + ": " + errdefs.ErrDataLoss.Error()
}

func (e *blobMismatchError) Unwrap() error { return errdefs.ErrDataLoss }

func isBlobMismatch(err error) bool {
	var m *blobMismatchError
	return errors.As(err, &m)
}

// checkedBody counts and hashes a blob as it arrives. The digest is
// checked on the read that reaches the expected size, not at EOF:
// go-containerregistry reads no further than that size and would report
// a mismatch itself first. A body that ends early is a mismatch too, but
// only at a clean EOF: a read error (connection reset, the body cut short
// of its Content-Length) passes through as the network failure it is.
type checkedBody struct {
	rc      io.ReadCloser
	want    v1.Descriptor
	h       hash.Hash
	n       int64
	checked bool
}

func (b *checkedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n += int64(n)
	b.h.Write(p[:n])
	switch {
	case b.n > b.want.Size:
		return n, b.mismatch(fmt.Sprintf("registry sends more than the manifest's %d bytes", b.want.Size))
	case b.n == b.want.Size && !b.checked:
		b.checked = true
		if got := b.want.Digest.Algorithm + ":" + hex.EncodeToString(b.h.Sum(nil)); got != b.want.Digest.String() {
			return n, b.mismatch(fmt.Sprintf("registry sends content of digest %s", got))
		}
	case b.n < b.want.Size && errors.Is(err, io.EOF):
		return n, b.mismatch(fmt.Sprintf("registry sends %d bytes, the manifest says %d", b.n, b.want.Size))
	}
	return n, err
}

func (b *checkedBody) mismatch(msg string) error {
	return &blobMismatchError{digest: b.want.Digest.String(), msg: msg}
}

func (b *checkedBody) Close() error { return b.rc.Close() }
