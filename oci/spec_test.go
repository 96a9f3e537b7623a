package oci

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-tools/generate"
	"github.com/sirupsen/logrus"
)

func gen(t *testing.T, opts ...SpecOpt) (*specs.Spec, error) {
	t.Helper()
	return GenerateSpec(context.Background(), opts...)
}

func TestWithNamespaces(t *testing.T) {
	tests := []struct {
		name     string
		ns       Namespaces
		cgroupNS bool
		want     []specs.LinuxNamespace
		wantErr  error
	}{
		{
			name:     "userns pod joins everything by path",
			ns:       Namespaces{User: "/run/x/ns/user/p", Net: "/run/x/ns/net/p", IPC: "/run/x/ns/ipc/p", UTS: "/run/x/ns/uts/p", PIDMode: PIDContainer},
			cgroupNS: true,
			want: []specs.LinuxNamespace{
				{Type: specs.UserNamespace, Path: "/run/x/ns/user/p"},
				{Type: specs.NetworkNamespace, Path: "/run/x/ns/net/p"},
				{Type: specs.IPCNamespace, Path: "/run/x/ns/ipc/p"},
				{Type: specs.UTSNamespace, Path: "/run/x/ns/uts/p"},
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
		},
		{
			name: "pod pid, host net, no cgroupns",
			ns:   Namespaces{IPC: "/i", UTS: "/u", PIDMode: PIDPod, PID: "/proc/42/ns/pid"},
			want: []specs.LinuxNamespace{
				{Type: specs.IPCNamespace, Path: "/i"},
				{Type: specs.UTSNamespace, Path: "/u"},
				{Type: specs.PIDNamespace, Path: "/proc/42/ns/pid"},
				{Type: specs.MountNamespace},
			},
		},
		{
			name: "node pid",
			ns:   Namespaces{PIDMode: PIDNode},
			want: []specs.LinuxNamespace{{Type: specs.MountNamespace}},
		},
		{name: "relative path", ns: Namespaces{Net: "ns/net"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "pod pid without path", ns: Namespaces{PIDMode: PIDPod}, wantErr: errdefs.ErrInvalidArgument},
		{name: "bad mode", ns: Namespaces{PIDMode: "bogus"}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Mappings left over from a base spec must go: the userns is joined.
			pre := func(g *Generator) error {
				g.Config.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
				g.Config.Linux.GIDMappings = g.Config.Linux.UIDMappings
				return nil
			}
			s, err := gen(t, pre, WithNamespaces(tt.ns, tt.cgroupNS))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if !reflect.DeepEqual(s.Linux.Namespaces, tt.want) {
				t.Errorf("namespaces = %+v\nwant %+v", s.Linux.Namespaces, tt.want)
			}
			if s.Linux.UIDMappings != nil || s.Linux.GIDMappings != nil {
				t.Errorf("uid/gid mappings present: %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
			}
		})
	}
}

func TestWithProcessArgs(t *testing.T) {
	tests := []struct {
		name                           string
		command, args, entrypoint, cmd []string
		want                           []string
	}{
		{"image only", nil, nil, []string{"/ep"}, []string{"c1"}, []string{"/ep", "c1"}},
		{"command drops entrypoint and cmd", []string{"/bin/x"}, nil, []string{"/ep"}, []string{"c1"}, []string{"/bin/x"}},
		{"command and args", []string{"/bin/x"}, []string{"a"}, []string{"/ep"}, []string{"c1"}, []string{"/bin/x", "a"}},
		{"args replace cmd", nil, []string{"a", "b"}, []string{"/ep"}, []string{"c1"}, []string{"/ep", "a", "b"}},
		{"cmd only image", nil, nil, nil, []string{"/bin/sh"}, []string{"/bin/sh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithProcessArgs(tt.command, tt.args, tt.entrypoint, tt.cmd))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Process.Args, tt.want) {
				t.Errorf("args = %q, want %q", s.Process.Args, tt.want)
			}
		})
	}
	if _, err := gen(t, WithProcessArgs(nil, nil, nil, nil)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("empty command err = %v, want InvalidArgument", err)
	}
}

func TestWithEnv(t *testing.T) {
	tests := []struct {
		name       string
		image, env []string
		want       []string
	}{
		{"request overrides image by key", []string{"PATH=/img", "A=1", "B=2"}, []string{"B=x", "C=3"}, []string{"PATH=/img", "A=1", "B=x", "C=3"}},
		{"default PATH", []string{"A=1"}, nil, []string{defaultPath, "A=1"}},
		{"value with =", nil, []string{"PATH=/p", "K=a=b"}, []string{"PATH=/p", "K=a=b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithEnv(tt.image, tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Process.Env, tt.want) {
				t.Errorf("env = %q, want %q", s.Process.Env, tt.want)
			}
		})
	}
}

func writeRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:app:/home/app:/bin/sh\n",
		"etc/group":  "root:x:0:\napp:x:1001:\nwheel:x:10:app\naudio:x:63:app,other\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func i64v(v int64) *int64 { return &v }

func TestWithUser(t *testing.T) {
	root := writeRootfs(t)
	tests := []struct {
		name      string
		user      User
		imageUser string
		wantUID   uint32
		wantGID   uint32
		wantGids  []uint32
		wantHome  string
		wantErr   error
	}{
		{name: "default root", wantGids: []uint32{0}, wantHome: "HOME=/root"},
		{name: "image user by name", imageUser: "app", wantUID: 1000, wantGID: 1001, wantGids: []uint32{1001, 10, 63}, wantHome: "HOME=/home/app"},
		{name: "image uid:gid", imageUser: "1000:5", wantUID: 1000, wantGID: 5, wantGids: []uint32{5, 10, 63}, wantHome: "HOME=/home/app"},
		{name: "request uid wins over image", user: User{UID: i64v(0)}, imageUser: "app", wantGids: []uint32{0}, wantHome: "HOME=/root"},
		{name: "unknown numeric uid", user: User{UID: i64v(4242)}, wantUID: 4242, wantGids: []uint32{0}, wantHome: "HOME=/"},
		{name: "username + gid + supplemental", user: User{Username: "app", GID: i64v(7), SupplementalGroups: []int64{63, 99}}, wantUID: 1000, wantGID: 7, wantGids: []uint32{7, 10, 63, 99}, wantHome: "HOME=/home/app"},
		{name: "strict ignores image groups", user: User{Username: "app", GID: i64v(7), SupplementalGroups: []int64{99}, GroupsPolicy: GroupsStrict}, wantUID: 1000, wantGID: 7, wantGids: []uint32{7, 99}, wantHome: "HOME=/home/app"},
		{name: "strict image user", imageUser: "app", user: User{GroupsPolicy: GroupsStrict}, wantUID: 1000, wantGID: 1001, wantGids: []uint32{1001}, wantHome: "HOME=/home/app"},
		{name: "unknown name", user: User{Username: "nobody-here"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "negative uid", user: User{UID: i64v(-1)}, wantErr: errdefs.ErrInvalidArgument},
		{name: "uid (uid_t)-1", user: User{UID: i64v(1<<32 - 1)}, wantErr: errdefs.ErrInvalidArgument},
		{name: "gid past 32 bits", user: User{UID: i64v(0), GID: i64v(1 << 40)}, wantErr: errdefs.ErrInvalidArgument},
		// 2^32 once wrapped around to root's group.
		{name: "supplemental group 2^32", user: User{UID: i64v(0), SupplementalGroups: []int64{1 << 32}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "supplemental group 2^31", user: User{UID: i64v(0), SupplementalGroups: []int64{1 << 31}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "largest ids", user: User{UID: i64v(1<<31 - 1), GID: i64v(1<<31 - 1), SupplementalGroups: []int64{1<<31 - 1}}, wantUID: 1<<31 - 1, wantGID: 1<<31 - 1, wantGids: []uint32{1<<31 - 1}, wantHome: "HOME=/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithUser(root, tt.user, tt.imageUser))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			u := s.Process.User
			if u.UID != tt.wantUID || u.GID != tt.wantGID || !reflect.DeepEqual(u.AdditionalGids, tt.wantGids) {
				t.Errorf("user = %d:%d %v, want %d:%d %v", u.UID, u.GID, u.AdditionalGids, tt.wantUID, tt.wantGID, tt.wantGids)
			}
			if !slices.Contains(s.Process.Env, tt.wantHome) {
				t.Errorf("env %q lacks %q", s.Process.Env, tt.wantHome)
			}
		})
	}
}

func TestWithUserPasswdSymlinkStaysInRootfs(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"etc", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// An absolute symlink resolves inside the rootfs, never on the host.
	if err := os.WriteFile(filepath.Join(root, "data", "passwd"), []byte("alice:x:5:6::/a:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/data/passwd", filepath.Join(root, "etc", "passwd")); err != nil {
		t.Fatal(err)
	}
	s, err := gen(t, WithUser(root, User{Username: "alice"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if u := s.Process.User; u.UID != 5 || u.GID != 6 || !reflect.DeepEqual(u.AdditionalGids, []uint32{6}) {
		t.Errorf("user = %+v, want 5:6 and groups [6], none from the host", u)
	}
}

func TestWithCapabilities(t *testing.T) {
	tests := []struct {
		name       string
		privileged bool
		add, drop  []string
		bounding   []string
		want       []string
		wantErr    error
	}{
		{name: "defaults", want: DefaultCapabilities},
		{name: "add without prefix, drop with", add: []string{"net_admin"}, drop: []string{"CAP_KILL", "chown"},
			want: []string{"CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_NET_ADMIN"}},
		{name: "drop ALL add one", add: []string{"NET_BIND_SERVICE"}, drop: []string{"ALL"}, want: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "add ALL drop one", add: []string{"ALL"}, drop: []string{"SYS_ADMIN"}, bounding: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_SYS_ADMIN", "CAP_FOWNER"}, want: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}},
		{name: "add and drop same: dropped", add: []string{"SYS_TIME"}, drop: []string{"SYS_TIME", "ALL"}, want: nil},
		{name: "privileged gets the bounding set", privileged: true, drop: []string{"ALL"}, bounding: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE"}, want: []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE"}},
		{name: "privileged without CAP_SYS_RESOURCE", privileged: true, bounding: slices.DeleteFunc(slices.Clone(allCaps), func(c string) bool { return c == "CAP_SYS_RESOURCE" }),
			want: slices.DeleteFunc(slices.Clone(allCaps), func(c string) bool { return c == "CAP_SYS_RESOURCE" })},
		{name: "privileged with unknown bounding set gets all known", privileged: true, want: allCaps},
		{name: "add ALL without CAP_SYS_RESOURCE", add: []string{"ALL"}, bounding: []string{"CAP_CHOWN", "CAP_KILL"}, want: []string{"CAP_CHOWN", "CAP_KILL"}},
		{name: "defaults the daemon lacks are left out", drop: []string{"CHOWN"}, bounding: []string{"CAP_CHOWN", "CAP_KILL", "CAP_SETUID"}, want: []string{"CAP_SETUID", "CAP_KILL"}},
		{name: "named add beyond the bounding set", add: []string{"SYS_RESOURCE"}, bounding: []string{"CAP_CHOWN"}, wantErr: errdefs.ErrFailedPrecondition},
		{name: "unknown cap", add: []string{"CAP_FLY"}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithCapabilities(tt.privileged, tt.add, tt.drop, tt.bounding))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			c := s.Process.Capabilities
			if !slices.Equal(c.Bounding, tt.want) || !slices.Equal(c.Effective, tt.want) || !slices.Equal(c.Permitted, tt.want) {
				t.Errorf("caps = %v, want %v", c.Bounding, tt.want)
			}
			if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
				t.Errorf("inheritable/ambient = %v/%v, want none", c.Inheritable, c.Ambient)
			}
		})
	}
}

func TestParseCapBnd(t *testing.T) {
	tests := []struct {
		name, status string
		want         []string
		wantErr      error
	}{
		// This host's daemon: everything up to CAP_CHECKPOINT_RESTORE (40)
		// except CAP_SYS_RESOURCE (24).
		{"no sys_resource", "Name:\tpinrt\nCapBnd:\t000001fffeffffff\nCapAmb:\t0\n",
			slices.DeleteFunc(slices.Clone(allCaps), func(c string) bool { return c == "CAP_SYS_RESOURCE" }), nil},
		{"three", "CapBnd:\t0000000000000007\n", []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH"}, nil},
		{"none", "CapBnd:\t0000000000000000\n", []string{}, nil},
		{"bits beyond known names", "CapBnd:\tffffffffffffffff\n", allCaps, nil},
		{"missing", "Name:\tx\n", nil, errdefs.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCapBnd([]byte(tt.status))
			if !errors.Is(err, tt.wantErr) || !slices.Equal(got, tt.want) {
				t.Fatalf("= %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestWithSeccomp(t *testing.T) {
	dir := t.TempDir()
	local := filepath.Join(dir, "p.json")
	if err := os.WriteFile(local, []byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		privileged  bool
		p           SecurityProfile
		wantNil     bool
		wantDefault specs.LinuxSeccompAction
		wantSyscall string
		wantErr     error
	}{
		{name: "runtime default", p: SecurityProfile{Type: ProfileRuntimeDefault}, wantDefault: specs.ActErrno, wantSyscall: "clone3"},
		{name: "unconfined", p: SecurityProfile{Type: ProfileUnconfined}, wantNil: true},
		{name: "privileged ignores default", privileged: true, p: SecurityProfile{Type: ProfileRuntimeDefault}, wantNil: true},
		{name: "localhost", p: SecurityProfile{Type: ProfileLocalhost, Localhost: local}, wantDefault: specs.ActErrno, wantSyscall: "write"},
		{name: "localhost relative", p: SecurityProfile{Type: ProfileLocalhost, Localhost: "p.json"}, wantErr: errdefs.ErrInvalidArgument},
		{name: "localhost missing", p: SecurityProfile{Type: ProfileLocalhost, Localhost: filepath.Join(dir, "none.json")}, wantErr: errdefs.ErrNotFound},
		{name: "localhost invalid", p: SecurityProfile{Type: ProfileLocalhost, Localhost: bad}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithCapabilities(false, nil, nil, nil), WithSeccomp(tt.privileged, tt.p))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if tt.wantNil {
				if s.Linux.Seccomp != nil {
					t.Errorf("seccomp = %+v, want none", s.Linux.Seccomp)
				}
				return
			}
			if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != tt.wantDefault {
				t.Fatalf("seccomp = %+v, want default action %s", s.Linux.Seccomp, tt.wantDefault)
			}
			found := false
			for _, sc := range s.Linux.Seccomp.Syscalls {
				found = found || slices.Contains(sc.Names, tt.wantSyscall)
			}
			if !found {
				t.Errorf("profile has no rule for %s", tt.wantSyscall)
			}
		})
	}
}

func TestWithAppArmorAndSELinux(t *testing.T) {
	if _, err := gen(t, WithAppArmor(SecurityProfile{Type: ProfileLocalhost, Localhost: "k8s-x"}, false)); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), `apparmor profile "k8s-x" requested but AppArmor is not enabled`) {
		t.Errorf("apparmor on host without it: %v", err)
	}
	s, err := gen(t, WithAppArmor(SecurityProfile{Type: ProfileLocalhost, Localhost: "k8s-x"}, true))
	if err != nil || s.Process.ApparmorProfile != "k8s-x" {
		t.Errorf("apparmor = %q, %v", s.Process.ApparmorProfile, err)
	}
	for _, p := range []SecurityProfile{{Type: ProfileRuntimeDefault}, {Type: ProfileUnconfined}, {Type: ProfileLocalhost, Localhost: "unconfined"}} {
		if s, err := gen(t, WithAppArmor(p, false)); err != nil || s.Process.ApparmorProfile != "" {
			t.Errorf("apparmor %+v = %q, %v; want none", p, s.Process.ApparmorProfile, err)
		}
	}
	// A label on a host without SELinux is ignored, as containerd does.
	if s, err := gen(t, WithSELinux("system_u:system_r:container_t:s0", false)); err != nil || s.Process.SelinuxLabel != "" {
		t.Errorf("selinux on host without it: %q, %v; want no label, no error", s.Process.SelinuxLabel, err)
	}
	if s, err := gen(t, WithSELinux("system_u:system_r:container_t:s0", true)); err != nil || s.Process.SelinuxLabel != "system_u:system_r:container_t:s0" {
		t.Errorf("selinux on a host with it: %q, %v", s.Process.SelinuxLabel, err)
	}
}

func TestWithMounts(t *testing.T) {
	podMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 200000, Size: 65536}}
	ownMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 300000, Size: 1000}}
	full := &Features{IDMapMounts: true, RecursiveReadOnly: true}
	tests := []struct {
		name     string
		mounts   []Mount
		userNS   bool
		feat     *Features
		want     []specs.Mount
		wantProp string
		wantErr  error
	}{
		{
			name: "propagation and ro, parents first",
			mounts: []Mount{
				{HostPath: "/h/b", ContainerPath: "/data/sub", Propagation: PropagationHostToContainer},
				{HostPath: "/h/a/", ContainerPath: "/data", Readonly: true},
			},
			want: []specs.Mount{
				{Destination: "/data", Type: "bind", Source: "/h/a", Options: []string{"rbind", "rprivate", "ro"}},
				{Destination: "/data/sub", Type: "bind", Source: "/h/b", Options: []string{"rbind", "rslave"}},
			},
			wantProp: "rslave",
		},
		{
			name:     "bidirectional",
			mounts:   []Mount{{HostPath: "/h", ContainerPath: "/m", Propagation: PropagationBidirectional}},
			want:     []specs.Mount{{Destination: "/m", Type: "bind", Source: "/h", Options: []string{"rbind", "rshared"}}},
			wantProp: "rshared",
		},
		{
			name:   "userns: pod mappings by default, own when given",
			userNS: true, feat: full,
			mounts: []Mount{{HostPath: "/h1", ContainerPath: "/a"}, {HostPath: "/h2", ContainerPath: "/b", UIDMappings: ownMap, GIDMappings: ownMap}},
			want: []specs.Mount{
				{Destination: "/a", Type: "bind", Source: "/h1", Options: []string{"rbind", "rprivate"}, UIDMappings: podMap, GIDMappings: podMap},
				{Destination: "/b", Type: "bind", Source: "/h2", Options: []string{"rbind", "rprivate"}, UIDMappings: ownMap, GIDMappings: ownMap},
			},
		},
		{name: "userns without idmap support", userNS: true, feat: &Features{}, mounts: []Mount{{HostPath: "/h", ContainerPath: "/a"}}, wantErr: errdefs.ErrFailedPrecondition},
		{
			name: "rro", feat: full,
			mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Readonly: true, RecursiveReadOnly: true}},
			want:   []specs.Mount{{Destination: "/a", Type: "bind", Source: "/h", Options: []string{"rbind", "rprivate", "rro"}}},
		},
		{name: "rro unsupported", feat: &Features{IDMapMounts: true}, mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Readonly: true, RecursiveReadOnly: true}}, wantErr: errdefs.ErrFailedPrecondition},
		{name: "rro without ro", feat: full, mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", RecursiveReadOnly: true}}, wantErr: errdefs.ErrInvalidArgument},
		{
			name:   "extra options after the others, repeats dropped",
			mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Readonly: true, Options: []string{"noexec", "nosuid", "noexec", "nodev"}}},
			want:   []specs.Mount{{Destination: "/a", Type: "bind", Source: "/h", Options: []string{"rbind", "rprivate", "ro", "noexec", "nosuid", "nodev"}}},
		},
		{
			name:   "extra options on a userns pod's idmapped volume",
			userNS: true, feat: full,
			mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Options: []string{"noexec"}}},
			want:   []specs.Mount{{Destination: "/a", Type: "bind", Source: "/h", Options: []string{"rbind", "rprivate", "noexec"}, UIDMappings: podMap, GIDMappings: podMap}},
		},
		{
			name: "extra options with rro", feat: full,
			mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Readonly: true, RecursiveReadOnly: true, Options: []string{"nodev"}}},
			want:   []specs.Mount{{Destination: "/a", Type: "bind", Source: "/h", Options: []string{"rbind", "rprivate", "rro", "nodev"}}},
		},
		{name: "rw smuggled over a read-only volume", mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Readonly: true, Options: []string{"rw"}}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "propagation smuggled", mounts: []Mount{{HostPath: "/h", ContainerPath: "/a", Options: []string{"noexec", "rshared"}}}, wantErr: errdefs.ErrInvalidArgument},
		{
			name: "runtime whose features lack noexec", feat: &Features{MountOptions: []string{"rbind", "ro", "nosuid"}},
			mounts:  []Mount{{HostPath: "/h", ContainerPath: "/a", Options: []string{"noexec"}}},
			wantErr: errdefs.ErrFailedPrecondition,
		},
		{name: "relative host path", mounts: []Mount{{HostPath: "h", ContainerPath: "/a"}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "relative container path", mounts: []Mount{{HostPath: "/h", ContainerPath: "a"}}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := generatorFor(&specs.Spec{Linux: &specs.Linux{}})
			err := WithMounts(tt.mounts, tt.userNS, podMap, podMap, tt.feat)(g)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if !reflect.DeepEqual(g.Config.Mounts, tt.want) {
				t.Errorf("mounts = %+v\nwant %+v", g.Config.Mounts, tt.want)
			}
			if g.Config.Linux.RootfsPropagation != tt.wantProp {
				t.Errorf("rootfs propagation = %q, want %q", g.Config.Linux.RootfsPropagation, tt.wantProp)
			}
		})
	}
}

func TestMountReplacesDefault(t *testing.T) {
	s, err := gen(t, WithMounts([]Mount{{HostPath: "/h", ContainerPath: "/dev/shm"}}, false, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range s.Mounts {
		if m.Destination == "/dev/shm" {
			n++
			if m.Source != "/h" {
				t.Errorf("/dev/shm source = %s", m.Source)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d /dev/shm mounts, want 1", n)
	}
}

func TestWithSysfs(t *testing.T) {
	tests := []struct {
		name                 string
		userNS, podNet, priv bool
		want                 specs.Mount
	}{
		{"userns with owned netns: fresh ro sysfs", true, true, false, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}},
		{"privileged: rw", true, true, true, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev"}}},
		{"userns on host net: bind", true, false, false, specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := gen(t, WithSysfs(tt.userNS, tt.podNet, tt.priv))
			if err != nil {
				t.Fatal(err)
			}
			g := generatorFor(s)
			if got := s.Mounts[g.mount("/sys")]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("/sys = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestWithResourcesDropsMissingControllers(t *testing.T) {
	res := &Resources{
		CPUShares: 512, CPUQuota: 50000, CPUPeriod: 100000, CpusetCpus: "0", MemoryLimit: 1 << 26, PidsLimit: 100,
		Hugepages: []Hugepage{{PageSize: "2MB", Limit: 0}, {PageSize: "1GB", Limit: 0}},
		Unified:   map[string]string{"memory.high": "1000000"},
	}
	var logBuf bytes.Buffer
	logger := logrus.New()
	logger.SetOutput(&logBuf)
	logger.SetLevel(logrus.DebugLevel)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))

	v1 := &HostInfo{Controllers: parseProcCgroups(strings.NewReader("#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t1\t1\t1\nmemory\t4\t49\t1\nhugetlb\t0\t1\t1\npids\t8\t1\t1\n"))}
	s, err := GenerateSpec(ctx, WithResources(res, v1))
	if err != nil {
		t.Fatal(err)
	}
	r := s.Linux.Resources
	if r.HugepageLimits != nil || r.Unified != nil {
		t.Errorf("hugepages %v / unified %v kept on a v1 host without hugetlb", r.HugepageLimits, r.Unified)
	}
	if *r.CPU.Shares != 512 || *r.CPU.Quota != 50000 || *r.CPU.Period != 100000 || r.CPU.Cpus != "0" || *r.Memory.Limit != 1<<26 || *r.Pids.Limit != 100 {
		t.Errorf("resources = %+v", r)
	}
	for _, want := range []string{"dropping 2 hugepage limits: cgroup controller hugetlb not available", "dropping 1 unified cgroup settings: host is not cgroup v2"} {
		if !strings.Contains(logBuf.String(), want) {
			t.Errorf("log %q lacks %q", logBuf.String(), want)
		}
	}

	v2 := &HostInfo{CgroupV2: true, Controllers: parseV2Controllers("cpuset cpu io memory hugetlb pids\n")}
	s, err = gen(t, WithResources(res, v2))
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}, {Pagesize: "1GB", Limit: 0}}
	if !reflect.DeepEqual(s.Linux.Resources.HugepageLimits, want) || s.Linux.Resources.Unified["memory.high"] != "1000000" {
		t.Errorf("v2 resources = %+v", s.Linux.Resources)
	}
}

// A memory limit without a swap limit allows no swap where the kernel
// accounts it (containerd and CRI-O do the same); elsewhere the spec
// names no swap, which runc could not set.
func TestWithResourcesSwap(t *testing.T) {
	mem := map[string]bool{"memory": true}
	for _, tc := range []struct {
		name      string
		host      HostInfo
		mem, swap int64
		want      *int64 // the spec's swap; nil: none
		noMemory  bool
	}{
		{"memory alone, swap accounted", HostInfo{Controllers: mem, SwapController: true}, 64 << 20, 0, i64(64 << 20), false},
		{"memory alone, v2", HostInfo{CgroupV2: true, Controllers: mem, SwapController: true}, 64 << 20, 0, i64(64 << 20), false},
		{"memory alone, swap not accounted", HostInfo{Controllers: mem}, 64 << 20, 0, nil, false},
		{"swap given", HostInfo{Controllers: mem, SwapController: true}, 64 << 20, 128 << 20, i64(128 << 20), false},
		{"swap unlimited", HostInfo{Controllers: mem, SwapController: true}, 64 << 20, -1, i64(-1), false},
		{"memory unlimited", HostInfo{Controllers: mem, SwapController: true}, -1, 0, nil, false},
		{"no memory controller", HostInfo{Controllers: map[string]bool{"cpu": true}, SwapController: true}, 64 << 20, 0, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := gen(t, WithResources(&Resources{MemoryLimit: tc.mem, MemorySwapLimit: tc.swap}, &tc.host))
			if err != nil {
				t.Fatal(err)
			}
			m := s.Linux.Resources.Memory
			if tc.noMemory {
				if m != nil {
					t.Fatalf("memory %+v without a memory controller", m)
				}
				return
			}
			if got := m.Swap; (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Errorf("swap %v, want %v", ptrString(got), ptrString(tc.want))
			}
		})
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "none"
	}
	return strconv.FormatInt(*p, 10)
}

func TestV2CgroupPath(t *testing.T) {
	for in, want := range map[string]string{
		"0::/system.slice/pinrt.service\n":                  "/system.slice/pinrt.service",
		"12:memory:/x\n1:name=systemd:/y\n0::/init.scope\n": "/init.scope",
		"0::/\n": "/",
	} {
		if got, ok := v2CgroupPath([]byte(in)); !ok || got != want {
			t.Errorf("v2CgroupPath(%q) = %q, %v, want %q", in, got, ok, want)
		}
	}
	if got, ok := v2CgroupPath([]byte("12:memory:/x\n")); ok {
		t.Errorf("a v1-only file gave %q", got)
	}
}

func TestOOMScoreAdj(t *testing.T) {
	tests := []struct{ v, floor, want int }{
		{-998, 0, 0}, {-998, -999, -998}, {500, 0, 500}, {1500, 0, 1000}, {-1000, -1000, -1000},
	}
	for _, tt := range tests {
		if got := ClampOOMScoreAdj(tt.v, tt.floor); got != tt.want {
			t.Errorf("ClampOOMScoreAdj(%d, %d) = %d, want %d", tt.v, tt.floor, got, tt.want)
		}
		s, err := gen(t, WithOOMScoreAdj(tt.v, tt.floor))
		if err != nil || *s.Process.OOMScoreAdj != tt.want {
			t.Errorf("WithOOMScoreAdj(%d, %d) = %v, %v", tt.v, tt.floor, s.Process.OOMScoreAdj, err)
		}
	}
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Skip(err)
	}
	if want := strings.TrimSpace(string(b)); want != strconv.Itoa(OOMScoreAdjFloor()) {
		t.Errorf("OOMScoreAdjFloor() = %d, /proc says %s", OOMScoreAdjFloor(), want)
	}
}

func TestWithMaskedPaths(t *testing.T) {
	s, _ := gen(t, WithMaskedPaths(false, nil, nil))
	if !slices.Equal(s.Linux.MaskedPaths, DefaultMaskedPaths) || !slices.Equal(s.Linux.ReadonlyPaths, DefaultReadonlyPaths) {
		t.Errorf("nil lists did not give defaults")
	}
	s, _ = gen(t, WithMaskedPaths(false, []string{}, []string{"/x"}))
	if len(s.Linux.MaskedPaths) != 0 || !slices.Equal(s.Linux.ReadonlyPaths, []string{"/x"}) {
		t.Errorf("explicit lists = %v %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	s, _ = gen(t, WithMaskedPaths(true, nil, []string{"/x"}))
	if s.Linux.MaskedPaths != nil || s.Linux.ReadonlyPaths != nil {
		t.Errorf("privileged kept masks")
	}
}

func TestWithDevices(t *testing.T) {
	old := statDevice
	t.Cleanup(func() { statDevice = old })
	statDevice = func(p string) (string, int64, int64, uint32, error) {
		if p == "/dev/fuse" {
			return "c", 10, 229, 0o666, nil
		}
		return "", 0, 0, 0, os.ErrNotExist
	}
	s, err := gen(t, WithDevices([]Device{{HostPath: "/dev/fuse", ContainerPath: "/dev/fuse", Permissions: "rw"}}, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	fm := os.FileMode(0o666)
	wantDev := []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229, FileMode: &fm}}
	if !reflect.DeepEqual(s.Linux.Devices, wantDev) {
		t.Errorf("devices = %+v", s.Linux.Devices)
	}
	last := s.Linux.Resources.Devices[len(s.Linux.Resources.Devices)-1]
	if !last.Allow || last.Type != "c" || *last.Major != 10 || *last.Minor != 229 || last.Access != "rw" {
		t.Errorf("device rule = %+v", last)
	}
	for _, d := range []Device{{HostPath: "dev/x", ContainerPath: "/x"}, {HostPath: "/dev/fuse", ContainerPath: "/x", Permissions: "rwx"}, {HostPath: "/dev/none", ContainerPath: "/x"}} {
		if _, err := gen(t, WithDevices([]Device{d}, false, nil)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("device %+v: err = %v, want InvalidArgument", d, err)
		}
	}
}

// In a pod with a user namespace runc binds a device node from the host
// path equal to its container path: a device kubelet puts elsewhere is a
// bind mount of its host node, with its cgroup rule kept. One at its own
// path stays a device.
func TestWithDevicesUserNS(t *testing.T) {
	old := statDevice
	t.Cleanup(func() { statDevice = old })
	statDevice = func(p string) (string, int64, int64, uint32, error) { return "c", 1, 3, 0o666, nil }
	u := &PodUserNS{UIDMappings: []specs.LinuxIDMapping{{HostID: 100000, Size: 65536}}}
	u.GIDMappings = u.UIDMappings
	s, err := gen(t, WithDevices([]Device{
		{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rw"},
		{HostPath: "/dev/fuse", ContainerPath: "/dev/fuse/"},
	}, false, u))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 1 || s.Linux.Devices[0].Path != "/dev/fuse" {
		t.Errorf("devices = %+v, want only /dev/fuse", s.Linux.Devices)
	}
	i := specMount(s, "/dev/x")
	if i < 0 || s.Mounts[i].Source != "/dev/null" || !isBind(s.Mounts[i]) {
		t.Fatalf("mounts = %+v, want /dev/null bound at /dev/x", s.Mounts)
	}
	if last := s.Linux.Resources.Devices[len(s.Linux.Resources.Devices)-2]; !last.Allow || *last.Major != 1 || *last.Minor != 3 || last.Access != "rw" {
		t.Errorf("device rule = %+v, want the bound device allowed", last)
	}
}

func TestWithCgroupsPath(t *testing.T) {
	tests := []struct{ parent, sandbox, want string }{
		{"", "pod1", "/pinrt/pod1/c1"},
		{"/kubepods/burstable/podX", "pod1", "/kubepods/burstable/podX/pinrt-c1"},
	}
	for _, tt := range tests {
		s, err := gen(t, WithCgroupsPath(tt.parent, tt.sandbox, "c1"))
		if err != nil || s.Linux.CgroupsPath != tt.want {
			t.Errorf("cgroups path(%q,%q) = %q, %v; want %q", tt.parent, tt.sandbox, s.Linux.CgroupsPath, err, tt.want)
		}
	}
	if _, err := gen(t, WithCgroupsPath("", "../x", "c1")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad sandbox id: %v", err)
	}
}

func TestBuildContainerSpecUserns(t *testing.T) {
	root := writeRootfs(t)
	podMap := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
	c := &ContainerSpec{
		ID: "c1", SandboxID: "p1", Rootfs: root,
		Namespaces:     Namespaces{User: "/run/p/ns/user/p1", Net: "/run/p/ns/net/p1", IPC: "/run/p/ns/ipc/p1", UTS: "/run/p/ns/uts/p1", PIDMode: PIDContainer},
		PodUIDMappings: podMap, PodGIDMappings: podMap,
		ImageCmd: []string{"/bin/sh"}, ImageUser: "app", Hostname: "web",
		HostsPath: "/run/p/hosts", ShmPath: "/run/p/shm",
		Mounts:          []Mount{{HostPath: "/var/data", ContainerPath: "/data"}},
		Resources:       &Resources{OOMScoreAdj: -999, Hugepages: []Hugepage{{PageSize: "2MB"}}},
		Host:            &HostInfo{Controllers: map[string]bool{"cpu": true, "memory": true}, CgroupNS: true, OOMFloor: 0},
		RuntimeFeatures: &Features{IDMapMounts: true},
		Annotations:     map[string]string{"a": "b"},
	}
	s, err := BuildContainerSpec(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.UIDMappings != nil || s.Linux.GIDMappings != nil {
		t.Errorf("linux mappings set with a joined userns")
	}
	if s.Process.User.UID != 1000 || *s.Process.OOMScoreAdj != 0 || s.Linux.Resources.HugepageLimits != nil {
		t.Errorf("uid %d oom %d hugepages %v", s.Process.User.UID, *s.Process.OOMScoreAdj, s.Linux.Resources.HugepageLimits)
	}
	if s.Linux.CgroupsPath != "/pinrt/p1/c1" || s.Annotations["a"] != "b" || s.Root.Path != root {
		t.Errorf("cgroups %q annotations %v root %q", s.Linux.CgroupsPath, s.Annotations, s.Root.Path)
	}
	g := generatorFor(s)
	if m := s.Mounts[g.mount("/data")]; !reflect.DeepEqual(m.UIDMappings, podMap) {
		t.Errorf("/data mappings = %v", m.UIDMappings)
	}
	if m := s.Mounts[g.mount("/dev/shm")]; m.Source != "/run/p/shm" {
		t.Errorf("/dev/shm = %+v", m)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Errorf("default seccomp missing")
	}
	if !slices.Contains(s.Process.Env, "HOSTNAME=web") {
		t.Errorf("env %v lacks HOSTNAME", s.Process.Env)
	}

	c.RuntimeFeatures = nil
	if _, err := BuildContainerSpec(context.Background(), c); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("userns volume without runtime features: %v, want FailedPrecondition", err)
	}
	c.ID = "../evil"
	if _, err := BuildContainerSpec(context.Background(), c); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
}

func TestParseFeatures(t *testing.T) {
	b, err := os.ReadFile("testdata/runc-features.json")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseFeatures(b)
	if err != nil {
		t.Fatal(err)
	}
	if !f.IDMapMounts || !f.RecursiveReadOnly || f.Raw.OCIVersionMax != "1.3.0" || !slices.Contains(f.MountOptions, "rbind") {
		t.Errorf("features = %+v", f)
	}
	f, err = ParseFeatures([]byte(`{"ociVersionMin":"1.0.0","mountOptions":["ro"],"linux":{"mountExtensions":{"idmap":{"enabled":false}}}}`))
	if err != nil || f.IDMapMounts || f.RecursiveReadOnly {
		t.Errorf("features without idmap/rro = %+v, %v", f, err)
	}
	if _, err := ParseFeatures([]byte("unknown command features")); err == nil {
		t.Error("garbage parsed")
	}
}

func BenchmarkBuildContainerSpec(b *testing.B) {
	root := b.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		b.Fatal(err)
	}
	c := &ContainerSpec{
		ID: "c1", SandboxID: "p1", Rootfs: root, ImageCmd: []string{"/bin/sh"},
		Namespaces: Namespaces{Net: "/n", IPC: "/i", UTS: "/u", PIDMode: PIDContainer},
		Mounts:     []Mount{{HostPath: "/h", ContainerPath: "/d"}},
		Host:       &HostInfo{CgroupNS: true},
	}
	for b.Loop() {
		if _, err := BuildContainerSpec(context.Background(), c); err != nil {
			b.Fatal(err)
		}
	}
}

// generatorFor wraps a hand-made spec the way GenerateSpec wraps its base.
func generatorFor(s *specs.Spec) *Generator {
	g := generate.NewFromSpec(s)
	return &Generator{Generator: &g}
}

func TestValidateResources(t *testing.T) {
	tests := []struct {
		name                                  string
		shares, quota, period, mem, swap, oom int64
		cpus                                  string
		wantErr                               bool
	}{
		{name: "all unset"},
		{name: "typical", shares: 1024, quota: 50000, period: 100000, mem: 64 << 20, swap: 64 << 20, oom: -997, cpus: "0-1,3"},
		{name: "unlimited quota and swap", quota: -1, swap: -1},
		{name: "shares at the bounds", shares: MaxCPUShares},
		{name: "shares too big", shares: MaxCPUShares + 1, wantErr: true},
		{name: "quota below 1ms", quota: 999, wantErr: true},
		{name: "quota at the kernel's most", quota: MaxCPUQuota},
		{name: "quota past the kernel's most", quota: MaxCPUQuota + 1, wantErr: true},
		{name: "swap without memory", swap: 64 << 20, wantErr: true},
		{name: "period too short", period: 999, wantErr: true},
		{name: "memory exactly 6 MiB", mem: MinMemoryLimit},
		{name: "memory below 6 MiB", mem: MinMemoryLimit - 1, wantErr: true},
		{name: "swap -2", swap: -2, wantErr: true},
		{name: "cpuset garbage", cpus: "0,,1", wantErr: true},
		{name: "oom -1001", oom: -1001, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateResources(tt.shares, tt.quota, tt.period, tt.mem, tt.swap, tt.oom, tt.cpus, "")
			if tt.wantErr != errdefs.IsInvalidArgument(err) || (!tt.wantErr && err != nil) {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}
