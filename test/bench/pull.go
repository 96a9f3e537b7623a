package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ScenarioPull times pulls of a generated image from a local registry.
const ScenarioPull = "pull"

// Operation names of the pull scenario.
const (
	OpPull     = "PullImage"
	OpDownload = "download (blobs only)"
)

// PullImageRepo is the pull scenario's image in its registry.
const PullImageRepo = "bench/pull:latest"

// pullLayers describes the pull scenario's image, as issue 22 measured
// it: 300 MB of binary data, 20 000 small files, 74 MB of executables,
// each a gzip layer made by GNU tar and gzip. Sizes scale with the
// generator's scale (tests use a small one).
var pullLayers = []struct {
	name string
	gen  func(dir string, scale float64) error
}{
	{"data", genBinaryData},
	{"small", genSmallFiles},
	{"exec", genExecutables},
}

// pullImageVersion changes whenever the generated content would.
const pullImageVersion = "v1"

// GeneratePullImage writes the pull scenario's layers, gzipped tars, to
// dir (kept there: the next run reuses them) and returns their paths.
// The content is deterministic: a fixed seed, names sorted, mtimes 0,
// owner root, gzip without a name or time stamp.
func GeneratePullImage(ctx context.Context, dir string, scale float64) ([]string, error) {
	stamp := filepath.Join(dir, fmt.Sprintf("stamp-%s-%g", pullImageVersion, scale))
	var paths []string
	for _, l := range pullLayers {
		paths = append(paths, filepath.Join(dir, l.name+".tar.gz"))
	}
	if _, err := os.Stat(stamp); err == nil {
		return paths, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for i, l := range pullLayers {
		src := filepath.Join(dir, "src-"+l.name)
		if err := os.Mkdir(src, 0o755); err != nil {
			return nil, err
		}
		if err := l.gen(src, scale); err != nil {
			return nil, fmt.Errorf("generate layer %s: %w", l.name, err)
		}
		sh := fmt.Sprintf("set -o pipefail; tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -C %q -cf - . | gzip -n -6 > %q",
			src, paths[i])
		if out, err := exec.CommandContext(ctx, "bash", "-c", sh).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("tar and gzip layer %s: %w: %s", l.name, err, out)
		}
		if err := os.RemoveAll(src); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(stamp, nil, 0o644); err != nil {
		return nil, err
	}
	return paths, nil
}

// fill writes n deterministic bytes from rng to w: blocks of random
// bytes, each followed by a run of a repeated byte, so gzip finds about
// what it finds in real binary data (a ratio near 0.75).
func fill(w io.Writer, rng *rand.Rand, n int64) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var block [4096]byte
	for n > 0 {
		k := int(min(n, int64(len(block))))
		random := k * 3 / 4
		for i := 0; i < random; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < random; j++ {
				block[i+j] = byte(v >> (8 * j))
			}
		}
		for i := random; i < k; i++ {
			block[i] = byte(k)
		}
		if _, err := bw.Write(block[:k]); err != nil {
			return err
		}
		n -= int64(k)
	}
	return bw.Flush()
}

func writeFile(path string, mode os.FileMode, write func(io.Writer) error) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(path, mode) // past the umask
}

// genBinaryData: 300 MB in 30 files of 10 MB.
func genBinaryData(dir string, scale float64) error {
	rng := rand.New(rand.NewPCG(22, 1))
	size := int64(10e6 * scale)
	for i := range 30 {
		p := filepath.Join(dir, fmt.Sprintf("blob-%02d.bin", i))
		if err := writeFile(p, 0o644, func(w io.Writer) error { return fill(w, rng, size) }); err != nil {
			return err
		}
	}
	return nil
}

var words = strings.Fields(`the quick brown fox jumps over lazy dog pod container image layer
runtime kubelet node cgroup namespace mount volume network config status exit code signal
func return error nil struct import package const var type interface map slice string int`)

// genSmallFiles: 20 000 text files of 100 B to 8 KiB in 200 directories.
func genSmallFiles(dir string, scale float64) error {
	rng := rand.New(rand.NewPCG(22, 2))
	n := int(20000 * scale)
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i%200))
		if i < 200 {
			if err := os.Mkdir(sub, 0o755); err != nil {
				return err
			}
		}
		size := 100 + rng.IntN(8092)
		p := filepath.Join(sub, fmt.Sprintf("f%05d.txt", i))
		if err := writeFile(p, 0o644, func(w io.Writer) error {
			var b strings.Builder
			for b.Len() < size {
				b.WriteString(words[rng.IntN(len(words))])
				if rng.IntN(12) == 0 {
					b.WriteByte('\n')
				} else {
					b.WriteByte(' ')
				}
			}
			_, err := io.WriteString(w, b.String()[:size])
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// genExecutables: 74 MB in 37 files of 2 MB, mode 0755, with the byte
// distribution of machine code: mostly small values and repeats.
func genExecutables(dir string, scale float64) error {
	rng := rand.New(rand.NewPCG(22, 3))
	size := int(2e6 * scale)
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	for i := range 37 {
		p := filepath.Join(dir, "bin", fmt.Sprintf("tool-%02d", i))
		if err := writeFile(p, 0o755, func(w io.Writer) error {
			bw := bufio.NewWriterSize(w, 1<<20)
			_, _ = bw.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
			for j := 8; j < size; j++ {
				var c byte
				switch r := rng.IntN(16); {
				case r < 6:
					c = 0
				case r < 12:
					c = byte(rng.IntN(16))
				default:
					c = byte(rng.Uint32())
				}
				_ = bw.WriteByte(c)
			}
			return bw.Flush()
		}); err != nil {
			return err
		}
	}
	return nil
}

// PullImage builds the image from the layers GeneratePullImage wrote.
func PullImage(layers []string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, p := range layers {
		l, err := tarball.LayerFromFile(p, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", p, err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Cmd = []string{"/bin/tool-00"}
	return mutate.ConfigFile(img, cf)
}

// limiter shares a byte rate among all the responses it paces, as one
// network link would.
type limiter struct {
	mu   sync.Mutex
	rate float64 // bytes per second
	next time.Time
}

func (l *limiter) wait(n int) {
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	until := l.next
	l.mu.Unlock()
	time.Sleep(time.Until(until))
}

type pacedWriter struct {
	http.ResponseWriter
	l *limiter
}

func (p pacedWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		k := min(len(b), 64<<10)
		p.l.wait(k)
		n, err := p.ResponseWriter.Write(b[:k])
		written += n
		if err != nil {
			return written, err
		}
		b = b[k:]
	}
	return written, nil
}

// StartPullRegistry serves img as PullImageRepo from an in-memory
// registry on listen. With mbps > 0, blob downloads share that many MB/s,
// like a node's network link; the scenario's download row then shows
// what the bytes alone take.
func StartPullRegistry(ctx context.Context, listen string, img v1.Image, mbps float64) (*Registry, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", listen, err)
	}
	h := registry.New(registry.Logger(discardLogger()))
	if mbps > 0 {
		inner, l := h, &limiter{rate: mbps * 1e6}
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				w = pacedWriter{ResponseWriter: w, l: l}
			}
			inner.ServeHTTP(w, r)
		})
	}
	return serveImage(ctx, ln, h, img, PullImageRepo)
}

// download fetches every layer blob of ref in parallel, as a pull
// would, and discards it: the time the bytes alone take.
func download(ctx context.Context, ref string) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	errs := make([]error, len(layers))
	var wg sync.WaitGroup
	for i, l := range layers {
		wg.Go(func() {
			rc, err := l.Compressed()
			if err != nil {
				errs[i] = err
				return
			}
			defer rc.Close()
			_, errs[i] = io.Copy(io.Discard, rc)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pull removes the image, pulls it and downloads its blobs on their own,
// cfg.N times. The pull's p50 over the download's p50 is
// pull_over_download.
func (r *runner) pull(ctx context.Context) time.Duration {
	r.rec.Declare(OpPull, OpDownload)
	r.pods = r.cfg.N // per-pod metrics are per pull
	spec := &runtimeapi.ImageSpec{Image: r.cfg.Image}
	var pulls, downloads []time.Duration
	remove := func() error {
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		_, err := r.c.Image.RemoveImage(rctx, &runtimeapi.RemoveImageRequest{Image: spec})
		return err
	}
	start := time.Now()
	for range r.cfg.N {
		if err := remove(); err != nil {
			r.rec.Fail(OpPull, fmt.Errorf("removing the image before the pull: %w", err))
			continue
		}
		if r.cfg.PullSettle > 0 {
			select {
			case <-time.After(r.cfg.PullSettle):
			case <-ctx.Done():
				return time.Since(start)
			}
		}
		if r.cfg.DropCaches {
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
				r.rec.Fail(OpPull, fmt.Errorf("dropping caches: %w", err))
			}
		}
		t := time.Now()
		err := r.rec.timed(OpPull, func() error {
			pctx, cancel := context.WithTimeout(ctx, max(r.cfg.RPCTimeout, 10*time.Minute))
			defer cancel()
			_, err := r.c.Image.PullImage(pctx, &runtimeapi.PullImageRequest{Image: spec})
			return err
		})
		if err == nil {
			pulls = append(pulls, time.Since(t))
		}
		t = time.Now()
		if err := r.rec.timed(OpDownload, func() error { return download(ctx, r.cfg.Image) }); err == nil {
			downloads = append(downloads, time.Since(t))
		}
	}
	wall := time.Since(start)
	_ = remove()
	if len(pulls) > 0 && len(downloads) > 0 {
		r.setMetric("pull_over_download", float64(median(pulls))/float64(median(downloads)))
	}
	return wall
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
