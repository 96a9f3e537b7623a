package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci"
)

const cdiTestSpec = `cdiVersion: "0.6.0"
kind: "example.com/test"
devices:
- name: env
  containerEdits:
    env: ["CDI_ENV=1"]
- name: env2
  containerEdits:
    env: ["CDI_ENV2=1"]
`

func newCDIFixture(t *testing.T) (*ctrFixture, string) {
	t.Helper()
	f := newCtrFixture(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(cdiTestSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := oci.NewCDIRegistry([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.deps.CDI = reg
	return f, dir
}

func TestCreateContainerCDI(t *testing.T) {
	f, _ := newCDIFixture(t)
	pod, _ := f.pod(t, false)
	cfg := unitCtr("c")
	cfg.CDIDevices = []*runtimeapi.CDIDevice{{Name: "example.com/test=env"}}
	cfg.Annotations = map[string]string{"cdi.k8s.io/plugin": "example.com/test=env2"}
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	env := f.rt.Specs[resp.ContainerId].Process.Env
	if !slices.Contains(env, "CDI_ENV=1") || !slices.Contains(env, "CDI_ENV2=1") {
		t.Errorf("env = %q, want the edits of the field's and the annotation's device", env)
	}
}

func TestCreateContainerCDIErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *runtimeapi.ContainerConfig)
		noDI bool
		want error
		msg  string
	}{
		{"unknown device", func(c *runtimeapi.ContainerConfig) {
			c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "example.com/test=gpu0"}}
		}, false, errdefs.ErrFailedPrecondition, `CDI device "example.com/test=gpu0" not found`},
		{"unknown annotated device", func(c *runtimeapi.ContainerConfig) {
			c.Annotations = map[string]string{"cdi.k8s.io/p": "example.com/test=gpu1"}
		}, false, errdefs.ErrFailedPrecondition, `"example.com/test=gpu1"`},
		{"unqualified name", func(c *runtimeapi.ContainerConfig) {
			c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "gpu0"}}
		}, false, errdefs.ErrInvalidArgument, `CDI device "gpu0"`},
		{"no registry", func(c *runtimeapi.ContainerConfig) {
			c.CDIDevices = []*runtimeapi.CDIDevice{{Name: "example.com/test=env"}}
		}, true, errdefs.ErrFailedPrecondition, "CDI is not configured"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newCDIFixture(t)
			if tc.noDI {
				f.srv.deps.CDI = nil
			}
			pod, _ := f.pod(t, false)
			cfg := unitCtr("c")
			tc.edit(cfg)
			_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			f.nothingLeft(t)
			// The name was not kept.
			if _, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")}); err != nil {
				t.Fatalf("the same name without the device: %v", err)
			}
		})
	}
}
