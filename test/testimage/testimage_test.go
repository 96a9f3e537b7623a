package testimage

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestBuildPushPull(t *testing.T) {
	reg := StartRegistry(t)
	img := Build(t, Spec{
		Cmd:      []string{"/hello"},
		User:     "1002",
		Programs: map[string]string{"hello": "package main\nfunc main() { println(\"hi\") }\n"},
	})
	again := Build(t, Spec{
		Cmd:      []string{"/hello"},
		User:     "1002",
		Programs: map[string]string{"hello": "package main\nfunc main() { println(\"hi\") }\n"},
	})
	if ID(t, img) != ID(t, again) {
		t.Fatalf("builds differ: %s %s", ID(t, img), ID(t, again))
	}
	ref := reg.Push(t, "hello:1", img)
	if !strings.HasPrefix(ref, reg.Addr+"/hello@sha256:") {
		t.Fatalf("digest ref %q", ref)
	}
	r, _ := name.ParseReference(reg.Ref("hello:1"))
	got, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "1002" || !slices.Equal(cf.Config.Cmd, []string{"/hello"}) || cf.Architecture != "amd64" {
		t.Fatalf("config %+v", cf.Config)
	}
	layers, _ := got.Layers()
	if len(layers) != 2 {
		t.Fatalf("%d layers, want busybox + programs", len(layers))
	}
	if n := reg.Requests("GET /v2/hello/manifests/1"); n != 1 {
		t.Fatalf("manifest requests %d, want 1: %v", n, reg.Log())
	}
}
