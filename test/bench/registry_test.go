package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestBusyboxLayer(t *testing.T) {
	b, err := BusyboxLayer([]byte("BB"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			got[h.Name] = "-> " + h.Linkname
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			if h.Name == "bin/busybox" {
				got[h.Name] = string(data)
			}
		}
	}
	for k, v := range map[string]string{"bin/busybox": "BB", "bin/sh": "-> busybox", "bin/sleep": "-> busybox", "bin/true": "-> busybox"} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// startFakeRegistry serves the images of a busybox that is not one.
func startFakeRegistry(t *testing.T) *Registry {
	t.Helper()
	bb := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(bb, []byte("not really busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	reg, err := StartRegistry(context.Background(), "127.0.0.1:0", bb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

// fetchConfig pulls ref and returns its config and number of layers.
func fetchConfig(t *testing.T, ref string) (*v1.ConfigFile, int) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return cf, len(layers)
}

func TestRegistryServesImage(t *testing.T) {
	reg := startFakeRegistry(t)
	cf, layers := fetchConfig(t, reg.Image)
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || layers != 1 || cf.Config.Env[0] != "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" {
		t.Fatalf("config %+v with %d layers", cf, layers)
	}
}

// TestRegistryServesPause: the pause image is the busybox image with a
// command that sleeps, for runtimes that run a pause container.
func TestRegistryServesPause(t *testing.T) {
	reg := startFakeRegistry(t)
	cf, layers := fetchConfig(t, reg.Addr+"/"+PauseRepo)
	if layers != 1 || len(cf.Config.Cmd) != 2 || cf.Config.Cmd[0] != "sleep" || len(cf.Config.Env) == 0 {
		t.Errorf("pause image: cmd %q, env %q, %d layers; want sleep, busybox's env and layer", cf.Config.Cmd, cf.Config.Env, layers)
	}
}
