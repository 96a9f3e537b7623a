package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// cutReader returns data, then err instead of io.EOF.
type cutReader struct {
	r   io.Reader
	err error
}

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		err = c.err
	}
	return n, err
}

func blobRequest(t *testing.T, digest string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://r.example/v2/lib/img/blobs/"+digest, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A blob whose size or digest is not the manifest's fails with DataLoss
// before go-containerregistry's plain errors can; a read error is the
// network's and passes through unclassified.
func TestBlobChecks(t *testing.T) {
	blob := bytes.Repeat([]byte("layer bytes "), 1000)
	sum := sha256.Sum256(blob)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	flipped := bytes.Clone(blob)
	flipped[len(flipped)/2] ^= 0x55
	reset := &url.Error{Op: "read", URL: "x", Err: unix.ECONNRESET}
	tests := []struct {
		name          string
		body          io.Reader
		contentLength int64
		wantErr       error // nil: the whole blob reads fine
		wantMsg       string
	}{
		{"intact", bytes.NewReader(blob), int64(len(blob)), nil, ""},
		{"intact chunked", bytes.NewReader(blob), -1, nil, ""},
		{"Content-Length disagrees", bytes.NewReader(blob[:10]), 10, errdefs.ErrDataLoss, "registry sends 10 bytes, the manifest says 12000"},
		{"truncated chunked", bytes.NewReader(blob[:100]), -1, errdefs.ErrDataLoss, "registry sends 100 bytes, the manifest says 12000"},
		{"corrupted", bytes.NewReader(flipped), int64(len(blob)), errdefs.ErrDataLoss, "registry sends content of digest sha256:"},
		{"too long chunked", bytes.NewReader(append(bytes.Clone(blob), 'x')), -1, errdefs.ErrDataLoss, "more than the manifest's 12000 bytes"},
		{"connection reset", &cutReader{r: bytes.NewReader(blob[:100]), err: reset}, int64(len(blob)), unix.ECONNRESET, ""},
		{"cut short of Content-Length", &cutReader{r: bytes.NewReader(blob[:100]), err: io.ErrUnexpectedEOF}, int64(len(blob)), io.ErrUnexpectedEOF, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b blobChecks
			b.expect(v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(digest, "sha256:")}, Size: int64(len(blob))})
			resp := &http.Response{StatusCode: http.StatusOK, ContentLength: tc.contentLength, Body: io.NopCloser(tc.body)}
			var err error
			body, err := b.check(blobRequest(t, digest), resp)
			if err == nil {
				_, err = io.ReadAll(body)
			}
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("reading the blob: %v, want no error", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("reading the blob: %v, want %v", err, tc.wantErr)
			case !errors.Is(tc.wantErr, errdefs.ErrDataLoss) && errors.Is(err, errdefs.ErrDataLoss):
				t.Fatalf("reading the blob: %v, must not be DataLoss", err)
			case !strings.Contains(errString(err), tc.wantMsg) || (tc.wantMsg != "" && !strings.Contains(err.Error(), digest)):
				t.Errorf("error %q, want it to name %s and say %q", err, digest, tc.wantMsg)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The CDN a registry redirects a blob GET to is checked as the blob; a
// blob the manifest does not list, or a HEAD, is left alone.
func TestBlobChecksForRequest(t *testing.T) {
	d := v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("a", 64)}, Size: 3}
	var b blobChecks
	b.expect(d)
	listed := blobRequest(t, d.Digest.String())
	cdn, err := http.NewRequest(http.MethodGet, "https://cdn.example/x/y?sig=z", nil)
	if err != nil {
		t.Fatal(err)
	}
	cdn.Response = &http.Response{StatusCode: http.StatusTemporaryRedirect, Request: listed}
	head := blobRequest(t, d.Digest.String())
	head.Method = http.MethodHead
	tests := []struct {
		name string
		req  *http.Request
		want bool
	}{
		{"listed blob", listed, true},
		{"redirected to a CDN", cdn, true},
		{"unlisted blob", blobRequest(t, "sha256:"+strings.Repeat("b", 64)), false},
		{"HEAD", head, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := b.forRequest(tc.req); ok != tc.want {
				t.Errorf("forRequest(%s %s) found = %v, want %v", tc.req.Method, tc.req.URL, ok, tc.want)
			}
		})
	}
}
