package oci

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// cdiSpecYAML defines example.com/test=null, /dev/null exposed as
// /dev/cdi-null with an env var and a read-only bind of share, and
// example.com/test=other with only an env var. Written the way device
// plugins write them (YAML, as the NVIDIA toolkit does).
func cdiSpecYAML(share string) string {
	return `cdiVersion: "0.6.0"
kind: "example.com/test"
containerEdits:
  env: ["CDI_VENDOR=example"]
devices:
- name: "null"
  containerEdits:
    env: ["CDI_DEV=null"]
    deviceNodes:
    - path: /dev/cdi-null
      hostPath: /dev/null
    mounts:
    - hostPath: ` + share + `
      containerPath: /cdi-share
      options: ["ro", "bind"]
- name: other
  containerEdits:
    env: ["CDI_DEV=other"]
`
}

func cdiDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCDIDeviceNames(t *testing.T) {
	tests := []struct {
		name    string
		field   []string
		ann     map[string]string
		want    []string
		wantErr error
	}{
		{name: "none"},
		{
			name:  "field then annotations, without duplicates",
			field: []string{"example.com/test=null"},
			ann: map[string]string{
				"cdi.k8s.io/plugin_b": "example.com/test=other,example.com/test=null",
				"unrelated":           "x",
			},
			want: []string{"example.com/test=null", "example.com/test=other"},
		},
		{name: "unqualified field name", field: []string{"null"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "bad annotation value", ann: map[string]string{"cdi.k8s.io/p": "not-a-device"}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CDIDeviceNames(tt.field, tt.ann)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("names = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCDIResolve(t *testing.T) {
	share := t.TempDir()
	good := cdiDir(t, map[string]string{"test.yaml": cdiSpecYAML(share)})
	broken := cdiDir(t, map[string]string{"broken.json": `{"cdiVersion": "0.6.0", "kind": "example.com/broken", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}`})
	r, err := NewCDIRegistry([]string{good, broken})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Resolve([]string{"example.com/test=null", "example.com/test=other"}); err != nil {
		t.Fatalf("known devices: %v (a broken unrelated spec must not matter)", err)
	}
	err = r.Resolve([]string{"example.com/test=null", "example.com/test=gpu9"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), `"example.com/test=gpu9"`) || strings.Contains(err.Error(), `"example.com/test=null"`) {
		t.Errorf("unknown device: %v, want FailedPrecondition naming only it", err)
	}
	err = r.Resolve([]string{"example.com/broken=x"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), filepath.Join(broken, "broken.json")) {
		t.Errorf("device of a malformed spec: %v, want FailedPrecondition naming the file", err)
	}
	if _, err := NewCDIRegistry([]string{"etc/cdi"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("relative spec dir: %v", err)
	}
}

// A spec file edited or added after the registry was made is seen by the
// next Resolve: device plugins write specs while pinrt runs.
func TestCDIResolveSeesEditedSpec(t *testing.T) {
	dir := t.TempDir()
	r, err := NewCDIRegistry([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Resolve([]string{"example.com/test=other"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("before the spec exists: %v", err)
	}
	f := filepath.Join(dir, "test.yaml")
	if err := os.WriteFile(f, []byte(cdiSpecYAML(t.TempDir())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Resolve([]string{"example.com/test=other"}); err != nil {
		t.Fatalf("after writing the spec: %v", err)
	}
	renamed := strings.Replace(cdiSpecYAML(t.TempDir()), "name: other", "name: renamed", 1)
	if err := os.WriteFile(f, []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Resolve([]string{"example.com/test=other"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a device removed from the spec still resolves: %v", err)
	}
	if err := r.Resolve([]string{"example.com/test=renamed"}); err != nil {
		t.Errorf("renamed device: %v", err)
	}
}

func TestWithCDIDevices(t *testing.T) {
	share := t.TempDir()
	r, err := NewCDIRegistry([]string{cdiDir(t, map[string]string{"test.yaml": cdiSpecYAML(share)})})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"example.com/test=null"}
	if err := r.Resolve(names); err != nil {
		t.Fatal(err)
	}
	podMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 65536}}
	idmap := &Features{IDMapMounts: true}

	t.Run("host user namespace: a device node", func(t *testing.T) {
		s, err := gen(t, WithEnv(nil, []string{"A=1"}), WithDevices(nil, false, nil), WithCDIDevices(r, names, nil))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range []string{"A=1", "CDI_VENDOR=example", "CDI_DEV=null"} {
			if !slices.Contains(s.Process.Env, e) {
				t.Errorf("env %q missing from %q", e, s.Process.Env)
			}
		}
		i := slices.IndexFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/cdi-null" })
		if i < 0 || s.Linux.Devices[i].Type != "c" || s.Linux.Devices[i].Major != 1 || s.Linux.Devices[i].Minor != 3 {
			t.Fatalf("devices = %+v, want /dev/cdi-null c 1:3", s.Linux.Devices)
		}
		if !slices.ContainsFunc(s.Linux.Resources.Devices, func(d specs.LinuxDeviceCgroup) bool {
			return d.Allow && d.Type == "c" && d.Major != nil && *d.Major == 1 && d.Minor != nil && *d.Minor == 3 && d.Access == "rwm"
		}) {
			t.Errorf("no cgroup rule allows c 1:3: %+v", s.Linux.Resources.Devices)
		}
		m := mountAt(s, "/cdi-share")
		if m == nil || m.Source != share || !slices.Contains(m.Options, "ro") || len(m.UIDMappings) != 0 {
			t.Errorf("/cdi-share mount = %+v, want a plain ro bind of %s", m, share)
		}
	})

	t.Run("pod user namespace: a bind mount and an idmapped mount", func(t *testing.T) {
		s, err := gen(t, WithNamespaces(Namespaces{User: "/run/x/user"}, false), WithDevices(nil, false, nil),
			WithCDIDevices(r, names, &PodUserNS{UIDMappings: podMap, GIDMappings: podMap, Features: idmap}))
		if err != nil {
			t.Fatal(err)
		}
		// runc would bind /dev/cdi-null of the host, which is not /dev/null.
		if slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/cdi-null" }) {
			t.Errorf("/dev/cdi-null left in linux.devices: %+v", s.Linux.Devices)
		}
		d := mountAt(s, "/dev/cdi-null")
		if d == nil || d.Source != "/dev/null" || d.Type != "bind" || slices.Contains(d.Options, "nodev") {
			t.Errorf("/dev/cdi-null mount = %+v, want a bind of /dev/null without nodev", d)
		}
		m := mountAt(s, "/cdi-share")
		if m == nil || !slices.Equal(m.UIDMappings, podMap) || !slices.Equal(m.GIDMappings, podMap) {
			t.Errorf("/cdi-share mount = %+v, want the pod's mappings", m)
		}
		if _, err := gen(t, WithCDIDevices(r, names, &PodUserNS{UIDMappings: podMap, GIDMappings: podMap, Features: &Features{}})); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("without idmap support: %v, want FailedPrecondition", err)
		}
	})

	t.Run("no registry", func(t *testing.T) {
		if _, err := gen(t, WithCDIDevices(nil, names, nil)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("err = %v", err)
		}
		if _, err := gen(t, WithCDIDevices(nil, nil, nil)); err != nil {
			t.Errorf("no devices, no registry: %v", err)
		}
	})

	t.Run("host path gone", func(t *testing.T) {
		spec := strings.Replace(cdiSpecYAML(share), "hostPath: /dev/null", "hostPath: /dev/pinrt-no-such-device", 1)
		r, err := NewCDIRegistry([]string{cdiDir(t, map[string]string{"gone.yaml": spec})})
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Resolve(names)
		_, err = gen(t, WithCDIDevices(r, names, nil))
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "gone.yaml") || !strings.Contains(err.Error(), names[0]) {
			t.Errorf("err = %v, want FailedPrecondition naming the device and gone.yaml", err)
		}
	})
}

func mountAt(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}
