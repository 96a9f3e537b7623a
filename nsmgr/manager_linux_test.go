package nsmgr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates user, net, IPC and UTS namespaces and bind-mounts them")
	}
}

func requireNsenter(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s from util-linux to join the pinned namespaces: %v", tool, err)
		}
	}
}

// podMapping returns a distinct 65536-ID range per test pod.
func podMapping(n uint32) []specs.LinuxIDMapping {
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: (1000 + n) * BlockSize, Size: BlockSize}}
}

func fullRequest(id string, n uint32, sysctls map[string]string) CreateRequest {
	return CreateRequest{
		ID: id, Kinds: []Kind{User, Net, IPC, UTS},
		UIDMappings: podMapping(n), GIDMappings: podMapping(n), Sysctls: sysctls,
	}
}

// newTestManager returns a Manager on a fresh directory whose pins are
// all removed when the test ends, before t.TempDir's own cleanup.
func newTestManager(t *testing.T) (*Manager, string) {
	t.Helper()
	dir := t.TempDir()
	m, err := NewManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, k := range allKinds {
			entries, _ := os.ReadDir(filepath.Join(dir, "ns", string(k)))
			for _, e := range entries {
				if err := m.Remove(context.Background(), e.Name()); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
	return m, dir
}

func mustCreate(t *testing.T, m *Manager, req CreateRequest) Pins {
	t.Helper()
	pins, err := m.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create(%s): %v", req.ID, err)
	}
	return pins
}

// assertClean fails unless dir holds no mount, no pin file and the test
// process has no child (unshare, cat) left.
func assertClean(t *testing.T, dir string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			t.Errorf("mount left behind: %s", line)
		}
	}
	for _, k := range allKinds {
		entries, _ := os.ReadDir(filepath.Join(dir, "ns", string(k)))
		for _, e := range entries {
			t.Errorf("pin file left behind: %s/%s", k, e.Name())
		}
	}
	if kids := childPIDs(t); len(kids) > 0 {
		t.Errorf("child processes left behind: %v", kids)
	}
}

// childPIDs lists the live and zombie children of the test process.
func childPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	me := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the ")" closing comm: state, ppid, ...
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		if f := strings.Fields(string(rest)); len(f) > 1 && f[1] == strconv.Itoa(me) {
			kids = append(kids, pid)
		}
	}
	return kids
}

func nsID(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func ownerOf(t *testing.T, pin string) unix.Stat_t {
	t.Helper()
	f, err := os.Open(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ufd, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS %s: %v", pin, err)
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func nsenter(args ...string) (string, error) {
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestCreateValidation(t *testing.T) {
	m, err := NewManager(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	noZero := []specs.LinuxIDMapping{{ContainerID: 1, HostID: 2 * BlockSize, Size: BlockSize}}
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want string
	}{
		{"bad ID", CreateRequest{ID: "../x", Kinds: []Kind{Net}},
			`invalid sandbox ID "../x": must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$ and not contain "..": invalid argument`},
		{"unknown kind", CreateRequest{ID: "a", Kinds: []Kind{"mnt"}}, `unknown namespace kind "mnt": invalid argument`},
		{"user without mappings", CreateRequest{ID: "a", Kinds: []Kind{User, Net}},
			"user namespace needs a uid mapping for container ID 0: invalid argument"},
		{"root not mapped", CreateRequest{ID: "a", Kinds: []Kind{User}, UIDMappings: podMapping(1), GIDMappings: noZero},
			"user namespace needs a gid mapping for container ID 0: invalid argument"},
		{"mappings without user", CreateRequest{ID: "a", Kinds: []Kind{Net}, UIDMappings: podMapping(1), GIDMappings: podMapping(1)},
			"ID mappings given but no user namespace requested: invalid argument"},
		{"net sysctl with host net", CreateRequest{ID: "a", Kinds: []Kind{IPC}, Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}},
			`sysctl "net.ipv4.ip_forward" needs a pod network namespace, the pod uses the host's: invalid argument`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Create(context.Background(), tc.req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("Create = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := NewManager("relative"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("NewManager(relative) = %v, want InvalidArgument", err)
	}
}

func TestCreatePinsOwnedNamespaces(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	pins := mustCreate(t, m, fullRequest("pod1", 1, nil))

	want := Pins{}
	for _, k := range allKinds {
		want[k] = filepath.Join(dir, "ns", string(k), "pod1")
	}
	if fmt.Sprint(pins) != fmt.Sprint(want) {
		t.Fatalf("pins = %v, want %v", pins, want)
	}
	for _, k := range allKinds {
		if fi, err := os.Stat(filepath.Dir(pins[k])); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("pin directory of %s: %v, %v; want mode 0700", k, fi.Mode(), err)
		}
	}
	user := nsID(t, pins[User])
	host := nsID(t, "/proc/self/ns/user")
	if user.Ino == host.Ino {
		t.Fatal("pinned user namespace is the host's")
	}
	for _, k := range []Kind{Net, IPC, UTS} {
		if o := ownerOf(t, pins[k]); o.Ino != user.Ino || o.Dev != user.Dev {
			t.Errorf("%s namespace owned by user ns %d, want the pinned one %d", k, o.Ino, user.Ino)
		}
	}
	// The pinned userns maps exactly the requested range.
	out, err := nsenter("--user="+pins[User], "cat", "/proc/self/uid_map")
	if err != nil || strings.Join(strings.Fields(out), " ") != "0 65601536 65536" {
		t.Errorf("uid_map inside = %q, %v", out, err)
	}
	if kids := childPIDs(t); len(kids) > 0 {
		t.Errorf("child still running after Create: %v", kids)
	}
}

func TestSysfsMountNeedsOwnedNetns(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	m, _ := newTestManager(t)
	pod := mustCreate(t, m, fullRequest("pod", 2, nil))
	hostOwned := mustCreate(t, m, CreateRequest{ID: "hostowned", Kinds: []Kind{Net}})

	// unshare -m gives the shell a private mount namespace owned by the
	// pod userns, so the sysfs mount never reaches the host.
	mountSysfs := []string{"--", "unshare", "-m", "sh", "-c", "mount -t sysfs sysfs /sys && ls /sys/class/net"}
	out, err := nsenter(append([]string{"--user=" + pod[User], "--net=" + pod[Net]}, mountSysfs...)...)
	if err != nil || out != "lo" {
		t.Fatalf("sysfs mount in pod userns + owned netns: %q, %v; want success listing only lo", out, err)
	}
	// Negative control: same userns, a netns owned by the host userns.
	out, err = nsenter(append([]string{"--user=" + pod[User], "--net=" + hostOwned[Net]}, mountSysfs...)...)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Fatalf("sysfs mount with a host-owned netns: %q, %v; want permission denied", out, err)
	}
}

func TestSysctlsApplyInsideOnly(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	hostShmmax, err := os.ReadFile("/proc/sys/kernel/shmmax")
	if err != nil {
		t.Fatal(err)
	}
	hostPort, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := newTestManager(t)
	pins := mustCreate(t, m, fullRequest("pod", 3, map[string]string{
		"net/ipv4/ip_unprivileged_port_start": "123",
		"kernel.shmmax":                       "123456",
	}))
	if out, err := nsenter("--net="+pins[Net], "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); err != nil || out != "123" {
		t.Errorf("ip_unprivileged_port_start in pod netns = %q, %v; want 123", out, err)
	}
	if out, err := nsenter("--ipc="+pins[IPC], "cat", "/proc/sys/kernel/shmmax"); err != nil || out != "123456" {
		t.Errorf("kernel.shmmax in pod IPC ns = %q, %v; want 123456", out, err)
	}
	if now, _ := os.ReadFile("/proc/sys/kernel/shmmax"); !bytes.Equal(now, hostShmmax) {
		t.Errorf("host kernel.shmmax changed: %q -> %q", hostShmmax, now)
	}
	if now, _ := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); !bytes.Equal(now, hostPort) {
		t.Errorf("host ip_unprivileged_port_start changed: %q -> %q", hostPort, now)
	}
}

func TestSysctlRefusedByKernelRollsBack(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	for _, tc := range []struct {
		name    string
		sysctls map[string]string
		want    string
	}{
		{"unknown sysctl", map[string]string{"net.ipv4.no_such_knob": "1"},
			"pod namespaces: sysctl net.ipv4.no_such_knob: open /proc/sys/net/ipv4/no_such_knob: no such file or directory: invalid argument"},
		{"bad value", map[string]string{"net.ipv4.ip_unprivileged_port_start": "banana"},
			`pod namespaces: sysctl net.ipv4.ip_unprivileged_port_start="banana": write /proc/sys/net/ipv4/ip_unprivileged_port_start: invalid argument: invalid argument`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Create(context.Background(), fullRequest("pod", 4, tc.sysctls))
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("Create = %v, want %q", err, tc.want)
			}
			assertClean(t, dir)
		})
	}
}

func TestHostUserNamespaceWithPodNetns(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	m, dir := newTestManager(t)
	pins := mustCreate(t, m, CreateRequest{ID: "hostuser", Kinds: []Kind{Net, IPC, UTS},
		Sysctls: map[string]string{"net.ipv4.ip_unprivileged_port_start": "77"}})
	if _, ok := pins[User]; ok || len(pins) != 3 {
		t.Fatalf("pins = %v, want net, ipc and uts only", pins)
	}
	if _, err := os.Stat(filepath.Join(dir, "ns", "user", "hostuser")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("user pin exists for a host-userns pod: %v", err)
	}
	host := nsID(t, "/proc/self/ns/user")
	for _, k := range []Kind{Net, IPC, UTS} {
		if o := ownerOf(t, pins[k]); o.Ino != host.Ino {
			t.Errorf("%s namespace owned by %d, want the host userns %d", k, o.Ino, host.Ino)
		}
		if nsID(t, pins[k]).Ino == nsID(t, "/proc/self/ns/"+string(k)).Ino {
			t.Errorf("%s pin is the host's own namespace", k)
		}
	}
	if out, err := nsenter("--net="+pins[Net], "cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"); err != nil || out != "77" {
		t.Errorf("sysctl in pod netns = %q, %v; want 77", out, err)
	}
	if _, err := m.Open(context.Background(), "hostuser", []Kind{Net, IPC, UTS}); err != nil {
		t.Errorf("Open: %v", err)
	}
}

func TestPinsOutliveCreatorAndReopen(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	// Create in another process that exits: a daemon restart.
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), createInChildEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("create in child: %v: %s", err, out)
	}
	fresh, err := NewManager(dir)
	if err != nil {
		t.Fatal(err)
	}
	pins, err := fresh.Open(context.Background(), "restart", allKinds)
	if err != nil {
		t.Fatalf("Open after the creator exited: %v", err)
	}
	for _, k := range allKinds {
		if pins[k] != m.Path(k, "restart") {
			t.Errorf("pins[%s] = %q, want %q", k, pins[k], m.Path(k, "restart"))
		}
	}
	if o, u := ownerOf(t, pins[Net]), nsID(t, pins[User]); o.Ino != u.Ino {
		t.Errorf("reopened netns owned by %d, want %d", o.Ino, u.Ino)
	}
}

func TestOpenReportsBrokenPins(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	mustCreate(t, m, fullRequest("pod", 5, nil))
	mustCreate(t, m, CreateRequest{ID: "hostnet", Kinds: []Kind{Net, UTS}})
	mustCreate(t, m, CreateRequest{ID: "closed", Kinds: []Kind{Net}})
	if err := unix.Unmount(m.Path(Net, "closed"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	// A user pin of the wrong type: the net namespace of "hostnet".
	wrongType := m.Path(User, "hostnet")
	if err := os.WriteFile(wrongType, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(m.Path(Net, "hostnet"), wrongType, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		id    string
		kinds []Kind
		class error
		want  string
	}{
		{"missing", "nosuch", []Kind{Net}, errdefs.ErrNotFound,
			fmt.Sprintf(`net namespace of sandbox "nosuch": pin %s/ns/net/nosuch is missing: not found`, dir)},
		{"missing kind", "hostnet", []Kind{Net, IPC}, errdefs.ErrNotFound,
			fmt.Sprintf(`ipc namespace of sandbox "hostnet": pin %s/ns/ipc/hostnet is missing: not found`, dir)},
		{"closed", "closed", []Kind{Net}, errdefs.ErrNotFound,
			fmt.Sprintf(`net namespace of sandbox "closed" is closed: %s/ns/net/closed is no longer an nsfs mount: not found`, dir)},
		{"wrong type", "hostnet", []Kind{User, Net}, errdefs.ErrFailedPrecondition,
			fmt.Sprintf(`user namespace of sandbox "hostnet": pin %s/ns/user/hostnet holds a namespace of another type (0x40000000): failed precondition`, dir)},
		{"bad ID", "../pod", []Kind{Net}, errdefs.ErrInvalidArgument,
			`invalid sandbox ID "../pod": must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$ and not contain "..": invalid argument`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Open(context.Background(), tc.id, tc.kinds)
			if !errors.Is(err, tc.class) || err.Error() != tc.want {
				t.Fatalf("Open = %v\nwant %q", err, tc.want)
			}
		})
	}

	// Wrong owner: pod's netns belongs to its userns, not the daemon's.
	_, err := m.Open(context.Background(), "pod", []Kind{Net})
	want := fmt.Sprintf(`net namespace of sandbox "pod" is owned by user namespace %d, not by the daemon's user namespace (%d): failed precondition`,
		nsID(t, m.Path(User, "pod")).Ino, nsID(t, "/proc/self/ns/user").Ino)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != want {
		t.Fatalf("Open without the user pin = %v\nwant %q", err, want)
	}
	// Wrong owner the other way: a userns pod whose netns is host-owned.
	mustCreate(t, m, CreateRequest{ID: "swap", Kinds: []Kind{Net}})
	if err := os.WriteFile(m.Path(User, "swap"), nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(m.Path(User, "pod"), m.Path(User, "swap"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	_, err = m.Open(context.Background(), "swap", []Kind{User, Net})
	want = fmt.Sprintf(`net namespace of sandbox "swap" is owned by user namespace %d, not by the pinned user namespace (%d): failed precondition`,
		nsID(t, "/proc/self/ns/user").Ino, nsID(t, m.Path(User, "pod")).Ino)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != want {
		t.Fatalf("Open with a host-owned netns = %v\nwant %q", err, want)
	}

	for _, id := range []string{"pod", "hostnet", "closed", "swap"} {
		if err := m.Remove(context.Background(), id); err != nil {
			t.Fatalf("Remove(%s): %v", id, err)
		}
	}
	assertClean(t, dir)
}

func TestRemoveIsIdempotent(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	mustCreate(t, m, fullRequest("pod", 6, nil))
	for i := range 2 {
		if err := m.Remove(context.Background(), "pod"); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
		assertClean(t, dir)
	}
	// Half-made: a pin file that was never mounted, a stacked double
	// mount, and kinds that were never created.
	mustCreate(t, m, CreateRequest{ID: "half", Kinds: []Kind{Net}})
	if err := unix.Mount(m.Path(Net, "half"), m.Path(Net, "half"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path(User, "half"), nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(context.Background(), "half"); err != nil {
		t.Fatalf("Remove half-made: %v", err)
	}
	assertClean(t, dir)
	if err := m.Remove(context.Background(), "never-created"); err != nil {
		t.Fatalf("Remove of an unknown sandbox: %v", err)
	}
	if err := m.Remove(context.Background(), ".."); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Remove(..) = %v, want InvalidArgument", err)
	}
}

func TestCreateFailureAtEachStepLeavesNothing(t *testing.T) {
	requireRoot(t)
	steps := []string{"mkdir", "unshare", "idmap", "setns", "start"}
	for _, k := range allKinds {
		steps = append(steps, "file:"+string(k), "mount:"+string(k))
	}
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			m, dir := newTestManager(t)
			m.failAt = step
			_, err := m.Create(context.Background(), fullRequest("pod", 7, map[string]string{"kernel.shmmax": "1234"}))
			if !errors.Is(err, errInjected) || err.Error() != "step "+step+": injected failure" {
				t.Fatalf("Create = %v, want the injected failure at %s", err, step)
			}
			assertClean(t, dir)
			// The same ID can be created afterwards.
			m.failAt = ""
			mustCreate(t, m, fullRequest("pod", 7, nil))
		})
	}
}

func TestCreateExistingPinIsKept(t *testing.T) {
	requireRoot(t)
	m, dir := newTestManager(t)
	mustCreate(t, m, CreateRequest{ID: "pod", Kinds: []Kind{Net}})
	_, err := m.Create(context.Background(), fullRequest("pod", 8, nil))
	want := fmt.Sprintf("net namespace pin %s/ns/net/pod already exists: already exists", dir)
	if !errors.Is(err, errdefs.ErrAlreadyExists) || err.Error() != want {
		t.Fatalf("Create over an existing pin = %v, want %q", err, want)
	}
	// The first sandbox's pin is untouched; the new user pin was undone.
	if _, err := m.Open(context.Background(), "pod", []Kind{Net}); err != nil {
		t.Fatalf("existing pin broken by the failed Create: %v", err)
	}
	if _, err := os.Stat(m.Path(User, "pod")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("user pin of the failed Create left behind: %v", err)
	}
	if kids := childPIDs(t); len(kids) > 0 {
		t.Fatalf("child left behind: %v", kids)
	}
}

func TestCreateUserNamespaceFailures(t *testing.T) {
	requireRoot(t)
	t.Run("process exits before the handshake", func(t *testing.T) {
		m, dir := newTestManager(t)
		m.catPath = "/nonexistent/cat" // unshare(2) succeeds, the exec fails
		_, err := m.Create(context.Background(), fullRequest("pod", 10, nil))
		want := "unshare exited before it ran cat (exit status 127): unshare: failed to execute /nonexistent/cat: No such file or directory: unknown"
		if !errors.Is(err, errdefs.ErrUnknown) || err.Error() != want {
			t.Fatalf("Create = %v, want %q", err, want)
		}
		assertClean(t, dir)
	})
	t.Run("mapping refused by the kernel", func(t *testing.T) {
		m, dir := newTestManager(t)
		req := fullRequest("pod", 12, nil)
		// Container IDs 0-9 mapped twice: validation passes, the kernel
		// refuses overlapping ranges.
		req.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1012 * BlockSize, Size: 10}, {ContainerID: 5, HostID: 1012*BlockSize + 100, Size: 10}}
		_, err := m.Create(context.Background(), req)
		want := fmt.Sprintf("write uid_map \"0 %d 10\\n5 %d 10\\n\": write /proc/", 1012*BlockSize, 1012*BlockSize+100)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(err, unix.EINVAL) || !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("Create = %v, want EINVAL from %q...", err, want)
		}
		assertClean(t, dir)
	})
	t.Run("context canceled", func(t *testing.T) {
		m, dir := newTestManager(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := m.Create(ctx, fullRequest("pod", 11, nil))
		if !errors.Is(err, context.Canceled) || err.Error() != "create pod namespaces: context canceled" {
			t.Fatalf("Create = %v, want context canceled", err)
		}
		assertClean(t, dir)
	})
	t.Run("no handshake in time", func(t *testing.T) {
		m, dir := newTestManager(t)
		// A cat that never echoes.
		m.catPath = filepath.Join(t.TempDir(), "mute")
		if err := os.WriteFile(m.catPath, []byte("#!/bin/sh\nexec sleep 10\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		m.readyTimeout = 100 * time.Millisecond
		_, err := m.Create(context.Background(), fullRequest("pod", 13, nil))
		if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "unshare did not run cat within 100ms: context deadline exceeded" {
			t.Fatalf("Create = %v, want the handshake timeout", err)
		}
		assertClean(t, dir)
	})
	t.Run("unshare missing", func(t *testing.T) {
		// Found out when the daemon starts, not at the first pod.
		t.Setenv("PATH", t.TempDir())
		_, err := NewManager(t.TempDir())
		want := `pod user namespaces need unshare (util-linux, coreutils): exec: "unshare": executable file not found in $PATH: failed precondition`
		if !errors.Is(err, exec.ErrNotFound) || !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != want {
			t.Fatalf("NewManager = %v, want %q", err, want)
		}
	})
}

func TestCreateAllHostIsNoop(t *testing.T) {
	m, dir := newTestManager(t)
	pins, err := m.Create(context.Background(), CreateRequest{ID: "pod"})
	if err != nil || len(pins) != 0 {
		t.Fatalf("Create with no kinds = %v, %v; want empty pins", pins, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ns")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Create with no kinds touched the run dir: %v", err)
	}
}

func TestHostnameSetInUTSNamespace(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	host, _ := os.Hostname()
	m, _ := newTestManager(t)
	req := fullRequest("named", 4, map[string]string{"kernel.shmmax": "654321"})
	req.Hostname = "web-0"
	pins := mustCreate(t, m, req)
	if out, err := nsenter("--uts="+pins[UTS], "cat", "/proc/sys/kernel/hostname"); err != nil || out != "web-0" {
		t.Errorf("hostname in the pod UTS namespace = %q, %v; want web-0", out, err)
	}
	if out, err := nsenter("--ipc="+pins[IPC], "cat", "/proc/sys/kernel/shmmax"); err != nil || out != "654321" {
		t.Errorf("sysctls after the hostname argument = %q, %v; want 654321", out, err)
	}
	if now, _ := os.Hostname(); now != host {
		t.Errorf("host hostname changed: %q -> %q", host, now)
	}
}

func TestHostnameValidation(t *testing.T) {
	m, _ := newTestManager(t)
	for _, tc := range []struct {
		name string
		req  CreateRequest
	}{
		{"without UTS", CreateRequest{ID: "h1", Kinds: []Kind{Net}, Hostname: "x"}},
		{"too long", CreateRequest{ID: "h2", Kinds: []Kind{UTS}, Hostname: strings.Repeat("a", 65)}},
		{"with slash", CreateRequest{ID: "h3", Kinds: []Kind{UTS}, Hostname: "a/b"}},
		{"sysctl-like", CreateRequest{ID: "h4", Kinds: []Kind{UTS}, Hostname: "kernel/x=1"}},
	} {
		if _, err := m.Create(context.Background(), tc.req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: Create = %v, want InvalidArgument", tc.name, err)
		}
	}
}

// TestLoopbackUpInNetns: Create brings lo up in every netns it
// creates, owned by a pod userns or by the host's, so that no CNI
// loopback plugin has to run.
func TestLoopbackUpInNetns(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs ip from iproute2 to read the link flags: %v", err)
	}
	tests := []struct {
		name string
		req  CreateRequest
	}{
		{"userns-owned", fullRequest("lo-userns", 5, nil)},
		{"host-owned", CreateRequest{ID: "lo-host", Kinds: []Kind{Net, UTS}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTestManager(t)
			pins := mustCreate(t, m, tc.req)
			out, err := nsenter("--net="+pins[Net], "ip", "-o", "link", "show", "lo")
			if err != nil || !strings.Contains(out, "<LOOPBACK,UP,LOWER_UP>") {
				t.Fatalf("lo in the pod netns: %v: %s, want <LOOPBACK,UP,LOWER_UP>", err, out)
			}
		})
	}
}
