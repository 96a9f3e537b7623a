package oci

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	nriapi "github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func nriBaseSpec(t *testing.T) *specs.Spec {
	t.Helper()
	s, err := gen(t,
		WithNamespaces(Namespaces{User: "/run/x/ns/user/p", Net: "/run/x/ns/net/p", PIDMode: PIDContainer}, false),
		WithEnv(nil, []string{"KEEP=1", "DROP=1"}),
		WithDevices(nil, false, nil),
		WithAnnotations(map[string]string{"io.kubernetes.cri.sandbox-id": "p"}),
	)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A plugin's memory limit takes the swap limit along (NRI's generator
// sets both), so a memory limit raised above the swap limit pinrt gave
// (DefaultSwap) does not leave swap below it, which runc cannot set, and
// a lowered one does not let the container swap.
func TestNRIMemoryLimitKeepsSwapOff(t *testing.T) {
	for _, newLimit := range []int64{128 << 20, 32 << 20} {
		s := nriBaseSpec(t)
		s.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(64 << 20), Swap: i64(64 << 20)}}
		adj := &nriapi.ContainerAdjustment{}
		adj.SetLinuxMemoryLimit(newLimit)
		if err := ApplyNRIAdjustment(s, adj, nil, nil); err != nil {
			t.Fatal(err)
		}
		if m := s.Linux.Resources.Memory; *m.Limit != newLimit || m.Swap == nil || *m.Swap != newLimit {
			t.Errorf("memory limit %d, swap %s, want both %d", *m.Limit, ptrString(m.Swap), newLimit)
		}
	}
}

func TestDefaultSwap(t *testing.T) {
	on, off := &HostInfo{SwapController: true}, &HostInfo{}
	for _, tc := range []struct {
		name string
		m    *specs.LinuxMemory
		host *HostInfo
		want *int64
	}{
		{"limit alone", &specs.LinuxMemory{Limit: i64(64 << 20)}, on, i64(64 << 20)},
		{"swap not accounted", &specs.LinuxMemory{Limit: i64(64 << 20)}, off, nil},
		{"swap given", &specs.LinuxMemory{Limit: i64(64 << 20), Swap: i64(-1)}, on, i64(-1)},
		{"unlimited", &specs.LinuxMemory{Limit: i64(-1)}, on, nil},
		{"no limit", &specs.LinuxMemory{}, on, nil},
	} {
		DefaultSwap(tc.m, tc.host)
		if got := tc.m.Swap; (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: swap %s, want %s", tc.name, ptrString(got), ptrString(tc.want))
		}
	}
	DefaultSwap(nil, on) // no memory limits: nothing to do
}

func TestApplyNRIAdjustment(t *testing.T) {
	s := nriBaseSpec(t)
	adj := &nriapi.ContainerAdjustment{}
	adj.AddEnv("NRI", "1")
	adj.RemoveEnv("DROP")
	adj.AddAnnotation("nri.example/a", "b")
	adj.AddMount(&nriapi.Mount{Destination: "/nri", Source: "/tmp", Type: "bind", Options: []string{"rbind", "ro"}})
	adj.AddRlimit("RLIMIT_NOFILE", 4242, 4242)
	oom := 345
	adj.SetLinuxOomScoreAdj(&oom)
	adj.SetLinuxMemoryLimit(64 << 20)
	adj.SetLinuxCgroupsPath("/nri/moved")
	adj.AddDevice(&nriapi.LinuxDevice{Path: "/dev/nri-null", Type: "c", Major: 1, Minor: 3})
	adj.AddHooks(&nriapi.Hooks{CreateRuntime: []*nriapi.Hook{{Path: "/bin/true"}}})
	if err := ApplyNRIAdjustment(s, adj, nil, nil); err != nil {
		t.Fatal(err)
	}
	env := s.Process.Env
	if !slices.Contains(env, "NRI=1") || !slices.Contains(env, "KEEP=1") || slices.Contains(env, "DROP=1") {
		t.Errorf("env = %q", env)
	}
	if s.Annotations["nri.example/a"] != "b" || s.Annotations["io.kubernetes.cri.sandbox-id"] != "p" {
		t.Errorf("annotations = %v", s.Annotations)
	}
	if m := mountAt(s, "/nri"); m == nil || m.Source != "/tmp" {
		t.Errorf("mount /nri = %+v", m)
	}
	if len(s.Process.Rlimits) != 1 || s.Process.Rlimits[0] != (specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: 4242, Soft: 4242}) {
		t.Errorf("rlimits = %+v", s.Process.Rlimits)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != 345 {
		t.Errorf("oom score = %v", s.Process.OOMScoreAdj)
	}
	if l := s.Linux.Resources.Memory; l == nil || l.Limit == nil || *l.Limit != 64<<20 {
		t.Errorf("memory = %+v", l)
	}
	if s.Linux.CgroupsPath != "/nri/moved" {
		t.Errorf("cgroups path = %q", s.Linux.CgroupsPath)
	}
	if !slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/nri-null" && d.Major == 1 && d.Minor == 3 }) {
		t.Errorf("devices = %+v", s.Linux.Devices)
	}
	if s.Hooks == nil || len(s.Hooks.CreateRuntime) != 1 || s.Hooks.CreateRuntime[0].Path != "/bin/true" {
		t.Errorf("hooks = %+v", s.Hooks)
	}
}

func TestApplyNRIAdjustmentRefusesNamespaces(t *testing.T) {
	for _, tc := range []struct {
		name string
		ns   func(a *nriapi.ContainerAdjustment)
	}{
		{"move the network namespace", func(a *nriapi.ContainerAdjustment) {
			a.AddOrReplaceNamespace(&nriapi.LinuxNamespace{Type: "network", Path: "/proc/1/ns/net"})
		}},
		{"leave the user namespace", func(a *nriapi.ContainerAdjustment) {
			a.RemoveNamespace(&nriapi.LinuxNamespace{Type: "user"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := nriBaseSpec(t)
			want := slices.Clone(s.Linux.Namespaces)
			adj := &nriapi.ContainerAdjustment{}
			adj.AddEnv("NRI", "1")
			tc.ns(adj)
			err := ApplyNRIAdjustment(s, adj, nil, nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "namespaces") {
				t.Fatalf("err = %v, want InvalidArgument about namespaces", err)
			}
			if !slices.Equal(s.Linux.Namespaces, want) {
				t.Errorf("namespaces changed: %+v", s.Linux.Namespaces)
			}
		})
	}
}

func TestApplyNRIAdjustmentCDI(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "t.yaml"), []byte(cdiSpecYAML(t.TempDir())), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := NewCDIRegistry([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	adj := &nriapi.ContainerAdjustment{}
	adj.AddCDIDevice(&nriapi.CDIDevice{Name: "example.com/test=other"})
	s := nriBaseSpec(t)
	if err := ApplyNRIAdjustment(s, adj, r, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "CDI_DEV=other") {
		t.Errorf("env = %q, want the CDI device's", s.Process.Env)
	}
	bad := &nriapi.ContainerAdjustment{}
	bad.AddCDIDevice(&nriapi.CDIDevice{Name: "example.com/test=nope"})
	if err := ApplyNRIAdjustment(nriBaseSpec(t), bad, r, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "example.com/test=nope") {
		t.Errorf("unknown CDI device from a plugin: %v", err)
	}
	if err := ApplyNRIAdjustment(nriBaseSpec(t), adj, nil, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CDI device without a registry: %v", err)
	}
}

func TestApplyNRIAdjustmentRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		adj  func(a *nriapi.ContainerAdjustment)
		msg  string
	}{
		{"unknown rlimit", func(a *nriapi.ContainerAdjustment) { a.AddRlimit("RLIMIT_BOGUS", 1, 1) }, `unknown rlimit "RLIMIT_BOGUS"`},
		{"soft above hard", func(a *nriapi.ContainerAdjustment) { a.AddRlimit("RLIMIT_NOFILE", 10, 20) }, "soft limit 20 above hard limit 10"},
		{"relative mount", func(a *nriapi.ContainerAdjustment) {
			a.AddMount(&nriapi.Mount{Destination: "rel", Source: "/tmp", Type: "bind"})
		}, `mount destination "rel"`},
		{"device type", func(a *nriapi.ContainerAdjustment) {
			a.AddDevice(&nriapi.LinuxDevice{Path: "/dev/x", Type: "z"})
		}, `unknown type "z"`},
		{"relative hook", func(a *nriapi.ContainerAdjustment) {
			a.AddHooks(&nriapi.Hooks{Poststart: []*nriapi.Hook{{Path: "true"}}})
		}, `hook path "true"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adj := &nriapi.ContainerAdjustment{}
			tc.adj(adj)
			err := ApplyNRIAdjustment(nriBaseSpec(t), adj, nil, nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want InvalidArgument with %q", err, tc.msg)
			}
		})
	}
}

// In a pod with a user namespace runc binds each device node from the
// host file at its container path and mounts binds unmapped: what a
// plugin adds is rewritten as CDI's edits are.
func TestApplyNRIAdjustmentUserNS(t *testing.T) {
	share := t.TempDir()
	r, err := NewCDIRegistry([]string{cdiDir(t, map[string]string{"test.yaml": cdiSpecYAML(share)})})
	if err != nil {
		t.Fatal(err)
	}
	podMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 65536}}
	u := &PodUserNS{UIDMappings: podMap, GIDMappings: podMap, Features: &Features{IDMapMounts: true}}
	adj := &nriapi.ContainerAdjustment{}
	adj.AddDevice(&nriapi.LinuxDevice{Path: "/dev/nri-null", Type: "c", Major: 1, Minor: 3})
	adj.AddDevice(&nriapi.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 3})
	adj.AddMount(&nriapi.Mount{Destination: "/nri", Source: share, Type: "bind", Options: []string{"rbind", "ro"}})
	adj.AddMount(&nriapi.Mount{Destination: "/nri-tmp", Type: "tmpfs", Source: "tmpfs"})
	adj.AddCDIDevice(&nriapi.CDIDevice{Name: "example.com/test=null"})

	s := nriBaseSpec(t)
	if err := ApplyNRIAdjustment(s, adj, r, u); err != nil {
		t.Fatal(err)
	}
	hasDev := func(p string) bool {
		return slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == p })
	}
	// /dev/nri-null is no host file: it becomes a bind of the host's
	// node of c 1:3. /dev/null is one, and runc binds it itself.
	if hasDev("/dev/nri-null") || !hasDev("/dev/null") {
		t.Errorf("devices = %+v, want /dev/null only", s.Linux.Devices)
	}
	if m := mountAt(s, "/dev/nri-null"); m == nil || m.Source != "/dev/null" || m.Type != "bind" {
		t.Errorf("/dev/nri-null mount = %+v, want a bind of /dev/null", m)
	}
	if m := mountAt(s, "/dev/null"); m != nil {
		t.Errorf("/dev/null got a mount %+v", m)
	}
	for _, dst := range []string{"/nri", "/cdi-share"} {
		if m := mountAt(s, dst); m == nil || !slices.Equal(m.UIDMappings, podMap) || !slices.Equal(m.GIDMappings, podMap) {
			t.Errorf("%s mount = %+v, want the pod's mappings", dst, m)
		}
	}
	if m := mountAt(s, "/nri-tmp"); m == nil || len(m.UIDMappings) != 0 {
		t.Errorf("/nri-tmp mount = %+v, want an unmapped tmpfs", m)
	}
	if m := mountAt(s, "/dev/cdi-null"); m == nil || m.Source != "/dev/null" || hasDev("/dev/cdi-null") {
		t.Errorf("/dev/cdi-null mount = %+v (devices %+v), want a bind of /dev/null", m, s.Linux.Devices)
	}

	// In the host's user namespace all stays as the plugin said.
	s = nriBaseSpec(t)
	if err := ApplyNRIAdjustment(s, adj, r, nil); err != nil {
		t.Fatal(err)
	}
	if !hasDev("/dev/nri-null") || mountAt(s, "/dev/nri-null") != nil || len(mountAt(s, "/nri").UIDMappings) != 0 {
		t.Errorf("host userns: devices %+v, mounts %+v", s.Linux.Devices, s.Mounts)
	}
}

func TestApplyNRIAdjustmentUserNSRefused(t *testing.T) {
	podMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 65536}}
	t.Run("device with no host node", func(t *testing.T) {
		adj := &nriapi.ContainerAdjustment{}
		adj.AddDevice(&nriapi.LinuxDevice{Path: "/dev/nri-none", Type: "c", Major: 4000, Minor: 4000})
		u := &PodUserNS{UIDMappings: podMap, GIDMappings: podMap, Features: &Features{IDMapMounts: true}}
		err := ApplyNRIAdjustment(nriBaseSpec(t), adj, nil, u)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/dev/nri-none") {
			t.Errorf("err = %v, want FailedPrecondition naming /dev/nri-none", err)
		}
	})
	t.Run("bind mount without idmapped mounts", func(t *testing.T) {
		adj := &nriapi.ContainerAdjustment{}
		adj.AddMount(&nriapi.Mount{Destination: "/nri", Source: "/tmp", Type: "bind", Options: []string{"rbind"}})
		u := &PodUserNS{UIDMappings: podMap, GIDMappings: podMap, Features: &Features{}}
		err := ApplyNRIAdjustment(nriBaseSpec(t), adj, nil, u)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/nri") {
			t.Errorf("err = %v, want FailedPrecondition naming /nri", err)
		}
	})
}
