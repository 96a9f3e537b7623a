package k8snode

import (
	"archive/tar"
	"fmt"
	"os"
	"testing"

	"github.com/pinrt/pinrt/test/testimage"
)

// images is where the pods' images come from. The pods name them as a
// user would (docker.io/library/...); pinrt reaches a registry inside the
// node through its [image.registries] mirror settings with skip_origin.
type images interface {
	// start serves the images and returns pinrt's config that pulls
	// them: [image.registries.*] tables.
	start(t *testing.T) string
	busybox() string
	// nginx is the nginx image, "" when this source has none.
	nginx() string
}

// testimageSource serves a busybox image built by test/testimage from
// an in-process registry. It has no nginx: the web container is busybox
// httpd then.
type testimageSource struct{}

func (testimageSource) busybox() string { return "docker.io/library/busybox:1.36" }
func (testimageSource) nginx() string   { return "" }

func (testimageSource) start(t *testing.T) string {
	reg := testimage.StartRegistry(t)
	var links []testimage.File
	for _, a := range []string{"tar", "httpd", "sha256sum"} {
		links = append(links, testimage.File{Path: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	reg.Push(t, "library/busybox:1.36", testimage.Build(t, testimage.Spec{
		Cmd:    []string{"sh"},
		Layers: [][]testimage.File{links},
	}))
	return mirrorConf("docker.io", reg.Addr)
}

// standinSource is the stand-in images of test/standin (busybox and
// nginx from Debian's packages, under the names of the Kubernetes e2e
// images), served by the suite in the guest (pinrt-standin serve); conf
// is the file holding `pinrt-standin mirrors` for that registry.
type standinSource struct{ conf string }

func (standinSource) busybox() string { return "registry.k8s.io/e2e-test-images/busybox:1.29-2" }
func (standinSource) nginx() string   { return "registry.k8s.io/e2e-test-images/nginx:1.14-2" }

func (s standinSource) start(t *testing.T) string {
	b, err := os.ReadFile(s.conf)
	if err != nil {
		t.Fatalf("stand-in registry's mirrors: %v", err)
	}
	return string(b)
}

// mirrorConf is pinrt's config pulling host's images from mirror only.
func mirrorConf(host, mirror string) string {
	return fmt.Sprintf("[image.registries.%q]\nmirrors = [%q]\nskip_origin = true\n", host, mirror)
}
