package cgroups

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	systemddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

func TestPodParentAndContainerPath(t *testing.T) {
	fs, _ := New(DriverCgroupfs, "/pinrt")
	sd, _ := New(DriverSystemd, "/pinrt")
	for _, tc := range []struct {
		name          string
		d             Driver
		kubelet       string
		wantParent    string
		wantContainer string
		wantErr       error
	}{
		{"cgroupfs default", fs, "", "/pinrt/sb", "/pinrt/sb/pinrt-c", nil},
		{"cgroupfs kubelet", fs, "/kubepods/burstable/pod1", "/kubepods/burstable/pod1", "/kubepods/burstable/pod1/pinrt-c", nil},
		{"cgroupfs relative", fs, "kubepods", "", "", errdefs.ErrInvalidArgument},
		{"systemd default", sd, "", "pinrt-sb.slice", "pinrt-sb.slice:pinrt:c", nil},
		{"systemd kubelet", sd, "kubepods-burstable-pod1.slice", "kubepods-burstable-pod1.slice", "kubepods-burstable-pod1.slice:pinrt:c", nil},
		{"systemd kubelet path", sd, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice", "kubepods-burstable-pod1.slice", "kubepods-burstable-pod1.slice:pinrt:c", nil},
		{"systemd path refused", sd, "/kubepods/burstable/pod1", "", "", errdefs.ErrInvalidArgument},
		{"systemd path not the slice's refused", sd, "/other.slice/kubepods-burstable-pod1.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd root slice path refused", sd, "/", "", "", errdefs.ErrInvalidArgument},
		{"systemd top-level slice as a path", sd, "/test.slice", "test.slice", "test.slice:pinrt:c", nil},
		{"systemd nested slice as a path refused", sd, "/kubepods-burstable.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd nested slice path", sd, "/kubepods.slice/kubepods-burstable.slice", "kubepods-burstable.slice", "kubepods-burstable.slice:pinrt:c", nil},
		{"systemd dotdot refused", sd, "../x.slice", "", "", errdefs.ErrInvalidArgument},
		// runc splits the container's "slice:prefix:name" at every colon,
		// and systemd takes one in a unit name: the pod would be made
		// and every container of it refused by runc.
		{"systemd colon refused", sd, "kubepods-a:b.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd colon in a path refused", sd, "/x:y.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd newline refused", sd, "kubepods-a\nb.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd non-ASCII refused", sd, "kubepods-é.slice", "", "", errdefs.ErrInvalidArgument},
		{"systemd underscore and dot", sd, "kubepods-pod1_2.x.slice", "kubepods-pod1_2.x.slice", "kubepods-pod1_2.x.slice:pinrt:c", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.d.PodParent(tc.kubelet, "sb")
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if p != tc.wantParent || tc.d.ContainerPath(p, "c") != tc.wantContainer {
				t.Errorf("parent %q path %q, want %q %q", p, tc.d.ContainerPath(p, "c"), tc.wantParent, tc.wantContainer)
			}
		})
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := New("systemd", "/kubepods"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("systemd with a path parent: %v", err)
	}
	if _, err := New("openrc", "/pinrt"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown driver: %v", err)
	}
}

// fakeManager answers like systemd: every job is "done" unless result or
// an error says otherwise.
type fakeManager struct {
	startErr, stopErr error
	result            string
	started, stopped  []string
	closed            bool
}

func (f *fakeManager) StartTransientUnitContext(_ context.Context, name, _ string, _ []systemddbus.Property, ch chan<- string) (int, error) {
	if f.startErr != nil {
		return 0, f.startErr
	}
	f.started = append(f.started, name)
	ch <- f.res()
	return 1, nil
}

func (f *fakeManager) StopUnitContext(_ context.Context, name, _ string, ch chan<- string) (int, error) {
	if f.stopErr != nil {
		return 0, f.stopErr
	}
	f.stopped = append(f.stopped, name)
	ch <- f.res()
	return 1, nil
}

func (f *fakeManager) Close() { f.closed = true }

func (f *fakeManager) res() string {
	if f.result == "" {
		return "done"
	}
	return f.result
}

func fakeSystemd(m *fakeManager) *systemdDriver {
	d := newSystemd("pinrt.slice")
	d.dial = func(context.Context) (unitManager, error) { return m, nil }
	return d
}

func TestSystemdSlices(t *testing.T) {
	ctx := context.Background()
	exists := godbus.Error{Name: "org.freedesktop.systemd1.UnitExists"}
	noUnit := godbus.Error{Name: "org.freedesktop.systemd1.NoSuchUnit"}
	for _, tc := range []struct {
		name        string
		m           *fakeManager
		wantEnsure  bool // EnsurePod succeeds
		wantRemove  bool // RemovePod succeeds
		wantStopped []string
	}{
		{"fresh", &fakeManager{}, true, true, []string{"pinrt-sb.slice"}},
		{"slice already there, gone at removal", &fakeManager{startErr: exists, stopErr: noUnit}, true, true, nil},
		{"job failed", &fakeManager{result: "failed"}, false, false, []string{"pinrt-sb.slice"}},
		{"bus broken", &fakeManager{startErr: errors.New("connection closed"), stopErr: errors.New("connection closed")}, false, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := fakeSystemd(tc.m)
			if err := d.EnsurePod(ctx, "pinrt-sb.slice"); (err == nil) != tc.wantEnsure {
				t.Errorf("EnsurePod: %v", err)
			}
			if err := d.RemovePod(ctx, "", "sb"); (err == nil) != tc.wantRemove {
				t.Errorf("RemovePod: %v", err)
			}
			if !reflect.DeepEqual(tc.m.stopped, tc.wantStopped) {
				t.Errorf("stopped %v, want %v", tc.m.stopped, tc.wantStopped)
			}
		})
	}
	m := &fakeManager{}
	if err := fakeSystemd(m).RemovePod(ctx, "kubepods-pod1.slice", "sb"); err != nil || len(m.stopped) > 0 {
		t.Errorf("a kubelet slice was stopped (%v, %v)", m.stopped, err)
	}
}

func TestCgroupfsRemovePod(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"pinrt/sb", "memory/pinrt/sb", "cpu/pinrt/sb"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := &cgroupfs{root: root, parent: "/pinrt"}
	for range 2 { // the second removal finds nothing and succeeds
		if err := d.RemovePod(context.Background(), "", "sb"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"pinrt/sb", "memory/pinrt/sb", "cpu/pinrt/sb"} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}

// A closed bus (systemd or dbus restarted) costs one redial, not a failed
// request; in the VM the first connection was closed under a call when
// it was still tied to the request that dialled it.
func TestSystemdRedialsOnce(t *testing.T) {
	broken := &fakeManager{stopErr: errors.New("dbus: connection closed by user")}
	good := &fakeManager{}
	dials := 0
	d := newSystemd("pinrt.slice")
	d.dial = func(ctx context.Context) (unitManager, error) {
		if ctx.Done() != nil {
			t.Error("dialled with a cancellable context: godbus would close the connection with it")
		}
		dials++
		if dials == 1 {
			return broken, nil
		}
		return good, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := d.RemovePod(ctx, "", "sb"); err != nil {
		t.Fatalf("RemovePod: %v", err)
	}
	if dials != 2 || !broken.closed || len(good.stopped) != 1 {
		t.Errorf("dials %d, broken closed %v, stopped on the new connection %v", dials, broken.closed, good.stopped)
	}
}

// TestFSPath: statistics are read where each driver's runtime put the
// cgroup. runc's systemd driver makes "slice:prefix:name" the scope
// <prefix>-<name>.scope inside the slice, whose directory nests every
// dash-separated prefix, as systemd does.
func TestFSPath(t *testing.T) {
	fs, err := New(DriverCgroupfs, "/pinrt")
	if err != nil {
		t.Fatal(err)
	}
	sd, err := New(DriverSystemd, "pinrt.slice")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d    Driver
		in   string
		want string
	}{
		{fs, "/pinrt/pod1/pinrt-c1", "/pinrt/pod1/pinrt-c1"},
		{fs, "/kubepods/burstable/pod1/", "/kubepods/burstable/pod1"},
		{fs, "relative/path", ""},
		{fs, "/a/../../etc", ""},
		{sd, "pinrt-pod1.slice", "/pinrt.slice/pinrt-pod1.slice"},
		{sd, "kubepods-burstable-podab12.slice", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab12.slice"},
		{sd, "kubepods-burstable-podab12.slice:pinrt:c1", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab12.slice/pinrt-c1.scope"},
		{sd, "-.slice:pinrt:c1", "/pinrt-c1.scope"},
		{sd, "pinrt.slice:pinrt:sub.slice", "/pinrt.slice/sub.slice"},
		{sd, "/pinrt/pod1", ""},
		{sd, "pinrt.slice:pinrt:../x", ""},
		{sd, "a:b", ""},
		{sd, "bad--name.slice", ""},
	} {
		if got := tc.d.FSPath(tc.in); got != tc.want {
			t.Errorf("%s FSPath(%q) = %q, want %q", tc.d.Name(), tc.in, got, tc.want)
		}
	}
	// The two halves fit: a container's path sits inside its pod's.
	for _, d := range []Driver{fs, sd} {
		parent, err := d.PodParent("", "pod1")
		if err != nil {
			t.Fatal(err)
		}
		pod, ctr := d.FSPath(parent), d.FSPath(d.ContainerPath(parent, "c1"))
		if pod == "" || !strings.HasPrefix(ctr, pod+"/") {
			t.Errorf("%s: container cgroup %q is not inside the pod's %q", d.Name(), ctr, pod)
		}
	}
}
