package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func nsenter(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestPodsConcurrent starts 20 pods at once: each gets its own IP, pods
// reach each other, Stop releases the IP and Remove leaves nothing.
func TestPodsConcurrent(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: PodConfig(fmt.Sprintf("pod-%d", i))})
			if err != nil {
				errs <- err
				return
			}
			ids[i] = resp.PodSandboxId
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent RunPodSandbox: %v", err)
	}
	ips := map[string]string{}
	infos := map[string]*PodInfo{}
	for _, id := range ids {
		st, info := d.PodStatus(t, id)
		if st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Fatalf("pod %s is %v, want READY", id, st.State)
		}
		ip := st.GetNetwork().GetIp()
		if ip == "" {
			t.Fatalf("pod %s has no IP", id)
		}
		if other, dup := ips[ip]; dup {
			t.Fatalf("pods %s and %s share IP %s", id, other, ip)
		}
		ips[ip] = id
		infos[id] = info
	}
	leased := d.LeasedIPs(t)
	for ip := range ips {
		if !leased[ip] {
			t.Errorf("IP %s is not in the host-local store", ip)
		}
	}

	// Pod 0 reaches pod 1's IP from inside its own netns.
	ip1 := ""
	for ip, id := range ips {
		if id == ids[1] {
			ip1 = ip
		}
	}
	nsenter(t, "--net="+infos[ids[0]].Pins["net"], "busybox", "ping", "-c", "1", "-W", "3", ip1)

	// Stop releases the IP; Remove leaves nothing.
	st0, _ := d.PodStatus(t, ids[0])
	if _, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: ids[0]}); err != nil {
		t.Fatal(err)
	}
	if d.LeasedIPs(t)[st0.Network.Ip] {
		t.Errorf("IP %s still leased after StopPodSandbox", st0.Network.Ip)
	}
	for _, id := range ids {
		if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatalf("RemovePodSandbox(%s): %v", id, err)
		}
	}
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after removing every pod:\n%s", strings.Join(left, "\n"))
	}
	if l := d.LeasedIPs(t); len(l) > 0 {
		t.Errorf("IPs still leased: %v", l)
	}
}

func TestPodLifecycleSemantics(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	cfg := PodConfig("life")
	id := d.RunPod(t, cfg)

	_, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("second pod with the same metadata: %v, want AlreadyExists", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatalf("StopPodSandbox #%d: %v", i+1, err)
		}
	}
	st, _ := d.PodStatus(t, id)
	if st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("state after stop = %v, want NOTREADY", st.State)
	}
	list, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("ListPodSandbox(READY) = %v, %v; want none", list, err)
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"status": func() error {
			_, err := d.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.NotFound {
			t.Errorf("%s of a removed pod: %v, want NotFound", name, err)
		}
	}
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("remove of a removed pod: %v, want success (api.proto)", err)
	}
	if _, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("stop of an unknown pod: %v, want success", err)
	}
	// The name is free again; a running pod is stopped by Remove.
	id2 := d.RunPod(t, cfg)
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id2}); err != nil {
		t.Fatalf("RemovePodSandbox of a ready pod: %v", err)
	}
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
	}
}

func TestListFilters(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	a := PodConfig("list-a")
	a.Labels = map[string]string{"tier": "front"}
	b := PodConfig("list-b")
	b.Labels = map[string]string{"tier": "back"}
	idA, idB := d.RunPod(t, a), d.RunPod(t, b)
	list := func(f *runtimeapi.PodSandboxFilter) []string {
		resp, err := d.Runtime.ListPodSandbox(Ctx(t), &runtimeapi.ListPodSandboxRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, p := range resp.Items {
			ids = append(ids, p.Id)
		}
		return ids
	}
	if got := list(&runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "back"}}); len(got) != 1 || got[0] != idB {
		t.Errorf("label filter = %v, want [%s]", got, idB)
	}
	if got := list(&runtimeapi.PodSandboxFilter{Id: idA[:12]}); len(got) != 1 || got[0] != idA {
		t.Errorf("ID prefix filter = %v, want [%s]", got, idA)
	}
	if got := list(nil); len(got) != 2 {
		t.Errorf("unfiltered list = %v, want 2 pods", got)
	}
}

// nsOwner returns the (dev, ino) of the user namespace owning the
// namespace pinned at path.
func nsOwner(t testing.TB, path string) [2]uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS %s: %v", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

func nsID(t testing.TB, path string) [2]uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

func TestUsernsPods(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	const hostID = 100 * 65536
	id := d.RunPod(t, UsernsPod(PodConfig("userns-kubelet"), hostID))
	_, info := d.PodStatus(t, id)
	user, netns := info.Pins["user"], info.Pins["net"]
	if user == "" || netns == "" {
		t.Fatalf("pins = %v, want user and net", info.Pins)
	}
	for _, kind := range []string{"net", "ipc", "uts"} {
		if nsOwner(t, info.Pins[kind]) != nsID(t, user) {
			t.Errorf("the pod's %s namespace is not owned by its user namespace", kind)
		}
	}
	got := strings.Fields(nsenter(t, "--user="+user, "cat", "/proc/self/uid_map"))
	if want := []string{"0", fmt.Sprint(hostID), "65536"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("uid_map inside the pod = %v, want %v", got, want)
	}
	gotGid := strings.Fields(nsenter(t, "--user="+user, "cat", "/proc/self/gid_map"))
	if strings.Join(gotGid, " ") != strings.Join(got, " ") {
		t.Errorf("gid_map = %v, want the same as uid_map %v", gotGid, got)
	}

	// Two pods without mappings get disjoint blocks from the allocator.
	a := d.RunPod(t, UsernsPod(PodConfig("userns-a"), 0))
	b := d.RunPod(t, UsernsPod(PodConfig("userns-b"), 0))
	_, ia := d.PodStatus(t, a)
	_, ib := d.PodStatus(t, b)
	if len(ia.UIDMappings) != 1 || len(ib.UIDMappings) != 1 {
		t.Fatalf("allocated mappings = %v / %v, want one each", ia.UIDMappings, ib.UIDMappings)
	}
	ma, mb := ia.UIDMappings[0], ib.UIDMappings[0]
	if ma.Size != 65536 || mb.Size != 65536 || ma.HostID%65536 != 0 || mb.HostID%65536 != 0 {
		t.Errorf("allocated mappings %+v %+v, want aligned 65536-ID blocks", ma, mb)
	}
	if ma.HostID < mb.HostID+mb.Size && mb.HostID < ma.HostID+ma.Size || ma.HostID == hostID || mb.HostID == hostID {
		t.Errorf("allocated ranges overlap each other or kubelet's: %+v %+v", ma, mb)
	}
}

func TestHostNetworkPod(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	cfg := PodConfig("hostnet")
	cfg.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
	id := d.RunPod(t, cfg)
	st, info := d.PodStatus(t, id)
	if _, ok := info.Pins["net"]; ok {
		t.Errorf("host-network pod has a net pin: %v", info.Pins)
	}
	if st.GetNetwork().GetIp() != "" || len(info.CNIResult) > 0 {
		t.Errorf("host-network pod has a CNI result or IP: %v %s", st.Network, info.CNIResult)
	}
	if l := d.LeasedIPs(t); len(l) > 0 {
		t.Errorf("CNI leased %v for a host-network pod", l)
	}
}

// TestRestore kills the daemon: every pod comes back with the same IPs and
// mappings; a pod whose pins were unmounted meanwhile comes back
// NotReady, and can be stopped and removed.
func TestRestore(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	plain := d.RunPod(t, PodConfig("restore-plain"))
	userns := d.RunPod(t, UsernsPod(PodConfig("restore-userns"), 0))
	broken := d.RunPod(t, PodConfig("restore-broken"))
	before := map[string]*PodInfo{}
	ips := map[string]string{}
	for _, id := range []string{plain, userns, broken} {
		st, info := d.PodStatus(t, id)
		before[id], ips[id] = info, st.GetNetwork().GetIp()
	}
	d.Kill()
	for _, p := range before[broken].Pins {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{plain, userns} {
		st, info := d.PodStatus(t, id)
		if st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Errorf("pod %s after restart is %v, want READY", id, st.State)
		}
		if st.GetNetwork().GetIp() != ips[id] {
			t.Errorf("pod %s IP after restart = %q, want %q", id, st.GetNetwork().GetIp(), ips[id])
		}
		if fmt.Sprint(info.UIDMappings) != fmt.Sprint(before[id].UIDMappings) {
			t.Errorf("pod %s mappings after restart = %v, want %v", id, info.UIDMappings, before[id].UIDMappings)
		}
	}
	// The restored allocator knows the userns pod's range.
	next := d.RunPod(t, UsernsPod(PodConfig("restore-next"), 0))
	_, ni := d.PodStatus(t, next)
	if ni.UIDMappings[0].HostID == before[userns].UIDMappings[0].HostID {
		t.Errorf("a new pod got the restored pod's range %d", ni.UIDMappings[0].HostID)
	}

	st, _ := d.PodStatus(t, broken)
	if st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Fatalf("pod with unmounted pins is %v, want NOTREADY", st.State)
	}
	if _, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: broken}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: broken}); err != nil {
		t.Fatal(err)
	}
	if d.LeasedIPs(t)[ips[broken]] {
		t.Errorf("IP %s of the broken pod is still leased", ips[broken])
	}
}

func TestNetworkReadyFollowsConfDir(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ready := func() bool {
		st, err := d.Runtime.Status(Ctx(t), &runtimeapi.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range st.Status.Conditions {
			if c.Type == runtimeapi.NetworkReady {
				return c.Status
			}
		}
		t.Fatal("no NetworkReady condition")
		return false
	}
	if !ready() {
		t.Fatal("NetworkReady is false with a valid config")
	}
	conf := filepath.Join(d.CNIConfDir, "10-e2e.conflist")
	moved := filepath.Join(d.Dir, "saved.conflist")
	if err := os.Rename(conf, moved); err != nil {
		t.Fatal(err)
	}
	if ready() {
		t.Error("NetworkReady is true with an empty conf dir")
	}
	if err := os.Rename(moved, conf); err != nil {
		t.Fatal(err)
	}
	if !ready() {
		t.Error("NetworkReady did not come back when the config returned")
	}
}

func TestBadPodInputLeavesNothing(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	withNS := func(cfg *runtimeapi.PodSandboxConfig, uids, gids []*runtimeapi.IDMapping) *runtimeapi.PodSandboxConfig {
		cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: uids, Gids: gids}
		return cfg
	}
	m := func(c, h, l uint32) []*runtimeapi.IDMapping {
		return []*runtimeapi.IDMapping{{ContainerId: c, HostId: h, Length: l}}
	}
	good := m(0, 200*65536, 65536)
	tests := []struct {
		name string
		cfg  *runtimeapi.PodSandboxConfig
		want codes.Code
	}{
		{"no config", nil, codes.InvalidArgument},
		{"no metadata", &runtimeapi.PodSandboxConfig{}, codes.InvalidArgument},
		{"empty name", func() *runtimeapi.PodSandboxConfig { c := PodConfig("x"); c.Metadata.Name = ""; return c }(), codes.InvalidArgument},
		{"name with slash", PodConfig("a/b"), codes.InvalidArgument},
		{"name with dotdot", PodConfig(".."), codes.InvalidArgument},
		{"bad sysctl", func() *runtimeapi.PodSandboxConfig {
			c := PodConfig("sysctl")
			c.Linux.Sysctls = map[string]string{"kernel.panic": "1"}
			return c
		}(), codes.InvalidArgument},
		{"relative log dir", func() *runtimeapi.PodSandboxConfig {
			c := PodConfig("logdir")
			c.LogDirectory = "var/log/pods/x"
			return c
		}(), codes.InvalidArgument},
		{"two uid mappings", withNS(PodConfig("m1"), append(m(0, 200*65536, 65536), m(65536, 300*65536, 65536)...), good), codes.InvalidArgument},
		// Other lengths, alignments and uid/gid pairs are valid for the
		// kernel and accepted (TestUsernsCallerMappings).
		{"container id not 0", withNS(PodConfig("m3"), m(1, 200*65536, 65536), m(1, 200*65536, 65536)), codes.InvalidArgument},
		{"zero length", withNS(PodConfig("m4"), m(0, 200*65536, 0), m(0, 200*65536, 0)), codes.InvalidArgument},
		{"host root", withNS(PodConfig("m6"), m(0, 0, 65536), m(0, 0, 65536)), codes.InvalidArgument},
		{"ends at UINT32_MAX", withNS(PodConfig("m7"), m(0, 65535*65536, 65536), m(0, 65535*65536, 65536)), codes.InvalidArgument},
		{"unknown handler", PodConfig("handler"), codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := &runtimeapi.RunPodSandboxRequest{Config: tc.cfg}
			if tc.name == "unknown handler" {
				req.RuntimeHandler = "nope"
			}
			_, err := d.Runtime.RunPodSandbox(Ctx(t), req)
			if status.Code(err) != tc.want {
				t.Fatalf("RunPodSandbox = %v, want %v", err, tc.want)
			}
			if left := d.Leftovers(); len(left) > 0 {
				t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
			}
			if l := d.LeasedIPs(t); len(l) > 0 {
				t.Errorf("IPs leased: %v", l)
			}
		})
	}

	// A kubelet mapping overlapping another pod's range is refused too.
	first := d.RunPod(t, withNS(PodConfig("owner"), good, good))
	_, err := d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: withNS(PodConfig("overlap"), good, good)})
	if c := status.Code(err); c != codes.AlreadyExists && c != codes.InvalidArgument {
		t.Errorf("overlapping mapping = %v, want AlreadyExists or InvalidArgument", err)
	}
	if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}

	// A broken conflist: RunPodSandbox fails and no pin or IP remains.
	if err := os.WriteFile(filepath.Join(d.CNIConfDir, "10-e2e.conflist"), []byte(`{"cniVersion":"1.0.0","name":"pinrt-e2e","plugins":[{"type":"bridge","bridge":"`+d.Bridge+`","ipam":{"type":"host-local","dataDir":"`+d.IPAMDir+`","ranges":[[{"subnet":"not-a-subnet"}]]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: PodConfig("badnet")})
	if err == nil {
		t.Fatal("RunPodSandbox with a broken network config succeeded")
	}
	time.Sleep(10 * time.Millisecond)
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after a CNI failure:\n%s", strings.Join(left, "\n"))
	}
	if l := d.LeasedIPs(t); len(l) > 0 {
		t.Errorf("IPs leased after a CNI failure: %v", l)
	}
}
