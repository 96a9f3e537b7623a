package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ImageRepo is where the test registry serves its image.
const ImageRepo = "bench/busybox:latest"

// PauseRepo is the same image whose command sleeps for ever: the sandbox
// image of a runtime that runs a pause container (containerd's
// sandbox_image), which pinrt does not need.
const PauseRepo = "bench/pause:latest"

// busyboxApplets are the commands the scenarios and a shell need; each
// becomes a symlink to busybox, which dispatches on argv[0].
var busyboxApplets = []string{"sh", "sleep", "true", "ls", "cat", "echo"}

// BusyboxLayer returns an uncompressed tar of a minimal root filesystem:
// the static busybox binary at /bin/busybox, applet symlinks, and the
// directories and /etc files a runtime expects to find.
func BusyboxLayer(busybox []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// A fixed time keeps the layer digest reproducible across runs.
	mtime := time.Unix(0, 0)
	dirs := []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/", "root/"}
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	files := []struct {
		name string
		mode int64
		data []byte
	}{
		{"bin/busybox", 0o755, busybox},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: mtime}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	for _, a := range busyboxApplets {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BusyboxImage builds a single-layer OCI image for this machine's platform
// from the static busybox at path.
func BusyboxImage(path string) (v1.Image, error) {
	bb, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read busybox (install busybox-static): %w", err)
	}
	tarBytes, err := BusyboxLayer(bb)
	if err != nil {
		return nil, fmt.Errorf("build layer: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("build layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Cmd = []string{"sh"}
	return mutate.ConfigFile(img, cf)
}

// Registry is an in-process OCI registry serving the busybox test image.
type Registry struct {
	Addr  string // host:port
	Image string // full reference of the pushed image
	srv   *http.Server
	done  chan error
}

// StartRegistry listens on listen (e.g. "127.0.0.1:0"), serves an in-memory
// registry and pushes the busybox image built from busyboxPath to it.
// Loopback registries are spoken to over plain HTTP by go-containerregistry
// and by the runtimes' usual defaults, so no TLS is set up.
func StartRegistry(ctx context.Context, listen, busyboxPath string) (*Registry, error) {
	img, err := BusyboxImage(busyboxPath)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", listen, err)
	}
	r, err := serveImage(ctx, ln, registry.New(registry.Logger(discardLogger())), img, ImageRepo)
	if err != nil {
		return nil, err
	}
	pause, err := pauseImage(img)
	if err == nil {
		err = r.push(ctx, PauseRepo, pause)
	}
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// pauseImage is img with a command that sleeps until it is killed, as a
// sandbox's pause process does (StopPodSandbox kills it).
func pauseImage(img v1.Image) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	c := cf.Config
	c.Cmd = []string{"sleep", "2147483647"}
	return mutate.Config(img, c)
}

// serveImage serves h on ln and pushes img to it as repo.
func serveImage(ctx context.Context, ln net.Listener, h http.Handler, img v1.Image, repo string) (*Registry, error) {
	r := &Registry{
		Addr: ln.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	r.Image = r.Addr + "/" + repo
	if err := r.push(ctx, repo, img); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// push pushes img to the registry as repo.
func (r *Registry) push(ctx context.Context, repo string, img v1.Image) error {
	ref, err := name.ParseReference(r.Addr+"/"+repo, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

// Wait blocks until the server stops.
func (r *Registry) Wait() error {
	err := <-r.done
	r.done <- err
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the server.
func (r *Registry) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.srv.Shutdown(ctx)
}

func discardLogger() *stdlog.Logger { return stdlog.New(io.Discard, "", 0) }
