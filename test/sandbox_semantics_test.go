package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removeAllAndCheck removes every pod and fails the test if any pin,
// sandbox directory, mount, leased IP or pod cgroup directory remains.
func removeAllAndCheck(t *testing.T, d *Daemon) {
	t.Helper()
	ctx := Ctx(t)
	list, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range list.Items {
		if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			t.Errorf("RemovePodSandbox(%s): %v", p.Id, err)
		}
		left = append(left, podCgroupDirs(p.Id)...)
	}
	left = append(left, d.Leftovers()...)
	for ip := range d.LeasedIPs(t) {
		left = append(left, "IP "+ip)
	}
	if len(left) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
	}
}

// api.proto: stopping or removing a pod or container that does not exist
// (or no longer exists) must not return an error; kubelet retries removals
// whose answers it lost. A malformed ID is still InvalidArgument.
func TestStopRemoveUnknownSucceed(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	gone := d.RunPod(t, PodConfig("gone"))
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: gone}); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(id string) error{
		"StopPodSandbox": func(id string) error {
			_, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			return err
		},
		"RemovePodSandbox": func(id string) error {
			_, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
			return err
		},
		"StopContainer": func(id string) error {
			_, err := d.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
			return err
		},
		"RemoveContainer": func(id string) error {
			_, err := d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		},
	}
	for _, tc := range []struct {
		name string
		id   string
		code codes.Code
	}{
		{"removed", gone, codes.OK},
		{"never existed", strings.Repeat("5a", 32), codes.OK},
		{"empty", "", codes.InvalidArgument},
		{"malformed", "../x", codes.InvalidArgument},
	} {
		for rpc, call := range calls {
			if err := call(tc.id); status.Code(err) != tc.code {
				t.Errorf("%s %s(%q) = %v, want %v", tc.name, rpc, tc.id, err, tc.code)
			}
		}
	}
	removeAllAndCheck(t, d)
}

// A second pinrt on the same --root (with its own run dir and socket) is
// refused before it loads or writes anything: it would find none of the
// first daemon's pins and rewrite every pod on disk as NotReady.
func TestSecondDaemonOnSameRootRefused(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	id := d.RunPod(t, PodConfig("keep"))
	statusFile := filepath.Join(d.Root, "sandboxes", id, "state.json")
	before, err := os.ReadFile(statusFile)
	if err != nil {
		t.Fatal(err)
	}
	args := d.Args()
	for i, a := range args {
		switch a {
		case "--runroot":
			args[i+1] = filepath.Join(d.Dir, "run2")
		case "--listen":
			args[i+1] = filepath.Join(d.Dir, "second.sock")
		}
	}
	t.Cleanup(func() { ForceCleanup(filepath.Join(d.Dir, "run2")) })
	out, err := runWithTimeout(exec.Command(Binary(t), args...), 20*time.Second)
	if err == nil {
		t.Fatalf("second pinrt started on the same root:\n%s", out)
	}
	if !strings.Contains(out, "already running on root "+d.Root) {
		t.Errorf("second pinrt's message = %q, want it to say another pinrt is running on root %s", out, d.Root)
	}
	after, err := os.ReadFile(statusFile)
	if err != nil || string(after) != string(before) {
		t.Errorf("the pod's state file changed: %v\nbefore %s\nafter  %s", err, before, after)
	}
	st, _ := d.PodStatus(t, id)
	if st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod state after the refused daemon = %v, want READY", st.State)
	}
	removeAllAndCheck(t, d)
}

// Values that end up in resolv.conf, hosts, hostname, procfs or the
// portmap plugin are refused unless they are exactly one value: a newline
// in a DNS option used to add a nameserver line.
func TestHostilePodValuesRefused(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	for _, tc := range []struct {
		name string
		mut  func(c *runtimeapi.PodSandboxConfig)
		msg  string
	}{
		{"DNS option with nameserver line", func(c *runtimeapi.PodSandboxConfig) {
			c.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 6.6.6.6"}}
		}, "DNS option"},
		{"DNS search with space", func(c *runtimeapi.PodSandboxConfig) {
			c.DnsConfig = &runtimeapi.DNSConfig{Searches: []string{"svc options rotate"}}
		}, "DNS search domain"},
		{"DNS server name", func(c *runtimeapi.PodSandboxConfig) {
			c.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"6.6.6.6\nsearch evil"}}
		}, "is not an IP address"},
		{"hostname with newline", func(c *runtimeapi.PodSandboxConfig) { c.Hostname = "h\n6.6.6.6 kubernetes" }, "hostname"},
		{"sysctl value with newline", func(c *runtimeapi.PodSandboxConfig) {
			c.Linux.Sysctls = map[string]string{"net.ipv4.ping_group_range": "0 1\n0 2147483647"}
		}, "contains a newline"},
		{"unknown protocol", func(c *runtimeapi.PodSandboxConfig) {
			c.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol(9), ContainerPort: 80, HostPort: 8080}}
		}, `protocol "9"`},
		{"container port 0", func(c *runtimeapi.PodSandboxConfig) {
			c.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 0, HostPort: 8080}}
		}, "container port 0"},
		{"host port 70000", func(c *runtimeapi.PodSandboxConfig) {
			c.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 80, HostPort: 70000}}
		}, "host port 70000"},
		{"cgroup parent leaving the hierarchy", func(c *runtimeapi.PodSandboxConfig) { c.Linux.CgroupParent = "../../../evil" }, `cgroup parent "../../../evil"`},
		{"host_ip not an IP", func(c *runtimeapi.PodSandboxConfig) {
			c.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 80, HostPort: 8080, HostIp: "evil"}}
		}, `host_ip "evil"`},
	} {
		cfg := PodConfig("hostile")
		tc.mut(cfg)
		_, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want InvalidArgument with %q", tc.name, err, tc.msg)
		}
	}
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("refused pods left:\n%s", strings.Join(left, "\n"))
	}
	if l := d.LeasedIPs(t); len(l) > 0 {
		t.Errorf("refused pods leased IPs: %v", l)
	}

	// A valid config gives exactly the lines asked for.
	cfg := PodConfig("dns")
	cfg.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"10.0.0.10", "fd00::10"}, Searches: []string{"ns.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5", "edns0"}}
	id := d.RunPod(t, cfg)
	resolv, err := os.ReadFile(filepath.Join(d.RunRoot, "sandboxes", id, "resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	want := "nameserver 10.0.0.10\nnameserver fd00::10\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5 edns0\n"
	if string(resolv) != want {
		t.Errorf("resolv.conf = %q, want %q", resolv, want)
	}
	removeAllAndCheck(t, d)
}

// Twenty pods with 1 MB of annotations each once made every
// ListPodSandbox fail with ResourceExhausted: such a pod is now refused,
// and twenty pods at the bound still list.
func TestListStaysUnderMessageLimit(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	huge := PodConfig("huge")
	huge.Annotations = map[string]string{"blob": strings.Repeat("x", 1<<20)}
	_, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: huge})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "labels and annotations are") {
		t.Errorf("pod with 1 MB of annotations: %v, want InvalidArgument", err)
	}
	const pods = 20
	for i := range pods {
		cfg := PodConfig(fmt.Sprintf("big-%d", i))
		// 200 KiB each: 4 MB in all, under the bound of one pod.
		cfg.Annotations = map[string]string{"blob": strings.Repeat("x", 200<<10)}
		d.RunPod(t, cfg)
	}
	list, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(list.Items) != pods {
		t.Fatalf("ListPodSandbox: %d items, %v; want %d", len(list.GetItems()), err, pods)
	}
	removeAllAndCheck(t, d)
}

func usernsMapped(cfg *runtimeapi.PodSandboxConfig, hostID, length uint32) *runtimeapi.PodSandboxConfig {
	m := []*runtimeapi.IDMapping{{HostId: hostID, ContainerId: 0, Length: length}}
	cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m, Gids: m}
	return cfg
}

// Caller mappings are accepted whenever the kernel takes them (critest
// sends host ID 1000, length 100000); one overlapping a live pod's range
// is refused naming that pod and range, before and after a restart.
func TestUsernsCallerMappings(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	id := d.RunPod(t, usernsMapped(PodConfig("userns-critest"), 1000, 100000))
	_, info := d.PodStatus(t, id)
	got := strings.Fields(nsenter(t, "--user="+info.Pins["user"], "cat", "/proc/self/uid_map"))
	if strings.Join(got, " ") != "0 1000 100000" {
		t.Errorf("uid_map inside the pod = %v, want 0 1000 100000", got)
	}
	clash := func() {
		t.Helper()
		_, err := d.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: usernsMapped(PodConfig("userns-clash"), 50000, 1000)})
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, id) || !strings.Contains(msg, "1000-100999") || !strings.Contains(msg, "50000-50999") {
			t.Errorf("overlapping caller range: %v, want InvalidArgument naming pod %s and both ranges", err, id)
		}
	}
	clash()
	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	clash()
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	other := d.RunPod(t, usernsMapped(PodConfig("userns-clash"), 50000, 1000))
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: other}); err != nil {
		t.Fatal(err)
	}
	removeAllAndCheck(t, d)
}
