package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Serve serves the images of the layouts at dirs from an in-memory
// registry on addr (host:port), each under <addr>/<its full name>. Once
// every image is pushed it writes ready (when not empty); it serves until
// ctx ends. Two layouts may hold one name only for one image.
func Serve(ctx context.Context, addr string, dirs []string, ready string, logw io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: time.Minute,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	host := ln.Addr().String()
	pushed := map[string]string{} // name to the digest pushed under it
	for _, dir := range dirs {
		if err := push(ctx, host, dir, pushed); err != nil {
			return err
		}
	}
	fmt.Fprintf(logw, "standin: serving %d images on %s\n", len(pushed), host)
	if ready != "" {
		if err := os.WriteFile(ready, []byte(host+"\n"), 0o644); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// push pushes every image of the layout at dir to the registry at host.
func push(ctx context.Context, host, dir string, pushed map[string]string) error {
	p, err := layout.FromPath(dir)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		n := d.Annotations[RefNameAnnotation]
		if n == "" {
			return fmt.Errorf("image %s in %s has no %s", d.Digest, dir, RefNameAnnotation)
		}
		if prev, ok := pushed[n]; ok && prev != d.Digest.String() {
			return fmt.Errorf("%s is %s in %s but %s in an earlier layout", n, d.Digest, dir, prev)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		ref, err := name.ParseReference(host+"/"+n, name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		pushed[n] = d.Digest.String()
	}
	return nil
}

// Multicall runs the program pinrt-standin stands in for when it is
// called by that program's name (as in the images), and reports whether
// it was: "nnp" prints its effective UID as Kubernetes' nonewprivs test
// image does; "pause" waits for SIGINT or SIGTERM as the pause image does.
func Multicall(argv0 string, stdout io.Writer) (bool, int) {
	switch argv0 {
	case "nnp":
		fmt.Fprintf(stdout, "Effective uid: %d\n", os.Geteuid())
		return true, 0
	case "pause":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		return true, 0
	}
	return false, 0
}
