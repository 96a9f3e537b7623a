package image

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/pinrt/pinrt/test/testimage"
)

// Helpers for pull tests against go-containerregistry's in-process
// registry on 127.0.0.1, with a middleware hook so a test can slow down,
// stall, count or authenticate requests. testimage.StartRegistry has no
// such hook.

// testRegistry is a registry whose handler can be wrapped. Push goes
// around the wrapper, so tests only see the pulls' requests.
type testRegistry struct {
	addr    string
	inner   http.Handler
	wrap    http.Handler // nil: serve inner directly
	pulling atomic.Bool  // set after wrap, read before it
}

func startTestRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{inner: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.pulling.Load() && r.wrap != nil {
			r.wrap.ServeHTTP(w, req)
			return
		}
		r.inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.addr = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// pulls switches the registry from pushing (unwrapped) to serving
// through wrap. Call it after the last push.
func (r *testRegistry) pulls(wrap func(inner http.Handler) http.Handler) {
	if wrap != nil {
		r.wrap = wrap(r.inner)
	}
	r.pulling.Store(true)
}

func (r *testRegistry) ref(repoTag string) string { return r.addr + "/" + repoTag }

func (r *testRegistry) push(t testing.TB, repoTag string, img v1.Image) {
	t.Helper()
	ref, err := name.ParseReference(r.ref(repoTag))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// rawLayer is a layer given as its blob bytes, so a test controls the
// compression and media type exactly (go-containerregistry's own layer
// constructors pick gzip).
type rawLayer struct {
	blob   []byte
	diffID v1.Hash
	mt     types.MediaType
}

func (l *rawLayer) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(l.blob))
	return h, err
}
func (l *rawLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }
func (l *rawLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l *rawLayer) Uncompressed() (io.ReadCloser, error) { return nil, fmt.Errorf("not needed") }
func (l *rawLayer) Size() (int64, error)                 { return int64(len(l.blob)), nil }
func (l *rawLayer) MediaType() (types.MediaType, error)  { return l.mt, nil }

// compression of a test layer.
type compression int

const (
	gzipped compression = iota
	zstded
	uncompressed
)

// makeLayer tars files and compresses the tar.
func makeLayer(t testing.TB, files []testimage.File, c compression, mt types.MediaType) *rawLayer {
	t.Helper()
	raw := testimage.TarBytes(t, files)
	diffID, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	switch c {
	case gzipped:
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		if _, err := zw.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	case zstded:
		zw, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := zw.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	case uncompressed:
		buf.Write(raw)
	}
	return &rawLayer{blob: buf.Bytes(), diffID: diffID, mt: mt}
}

// imageOf stacks layers into an image with the given manifest and config
// media types.
func imageOf(t testing.TB, manifestMT, configMT types.MediaType, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.MediaType(img, manifestMT)
	img = mutate.ConfigMediaType(img, configMT)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// fileLayer is a gzip OCI layer holding one file.
func fileLayer(t testing.TB, path string, content []byte) *rawLayer {
	t.Helper()
	return makeLayer(t, []testimage.File{{Path: path, Content: content}}, gzipped, types.OCILayer)
}

// blobGET reports whether req fetches the blob dgst.
func blobGET(req *http.Request, dgst string) bool {
	return req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+dgst)
}

func digestOf(t testing.TB, l v1.Layer) string {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
