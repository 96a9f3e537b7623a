package test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestReusedIPReachable gives a new pod the IP a removed pod had, as
// host-local does once it has handed out a /24 (kubelet's default pod
// CIDR) in turn: the host's neighbour entry must name the new pod's MAC
// at once, not the old one's for up to a minute, in which kubelet's
// probes of the new pod time out. The network has two addresses: a
// pod that stays holds one, as other pods keep a node's bridge up (the
// kernel forgets a bridge's neighbours when its last port goes), so the
// second pod must get the first one's. The second pod has a user
// namespace, which owns its netns. IPv4 needs a gratuitous ARP, IPv6 an
// unsolicited neighbour advertisement.
func TestReusedIPReachable(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) {
		d := StartDaemon(t, Options{Network: true})
		prefix := strings.TrimSuffix(d.Subnet, "0/24")
		reusedIPReachable(t, d, d.Subnet, prefix+"10", prefix+"11")
	})
	t.Run("IPv6", func(t *testing.T) {
		d := StartDaemon(t, Options{Network: true})
		var a, b int
		if _, err := fmt.Sscanf(d.Subnet, "10.%d.%d.0/24", &a, &b); err != nil {
			t.Fatal(err)
		}
		prefix := fmt.Sprintf("fd00:10:%d:%d::", a, b)
		reusedIPReachable(t, d, prefix+"/64", prefix+"10", prefix+"11")
	})
}

// reusedIPReachable replaces d's network by a bridge network of subnet
// whose range is keep and addr, and plays the reuse of addr.
func reusedIPReachable(t *testing.T, d *Daemon, subnet, keep, addr string) {
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pinrt-e2e", "plugins": [{
  "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "rangeStart": %q, "rangeEnd": %q}]]}}]}`,
		d.Bridge, d.IPAMDir, subnet, keep, addr)
	if err := os.WriteFile(filepath.Join(d.CNIConfDir, "10-e2e.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	d.RunPod(t, PodConfig("keep"))
	waitDAD(t, d.Bridge)
	first := d.RunPod(t, PodConfig("first"))
	st, info := d.PodStatus(t, first)
	if ip := st.GetNetwork().GetIp(); ip != addr {
		t.Fatalf("first pod's IP = %q, want the network's second address %s", ip, addr)
	}
	// A refused connection (the pod's kernel answers with a reset) makes
	// the host resolve the pod's MAC.
	requireRefused(t, addr)
	if got, want := hostNeighbour(t, d.Bridge, addr), podMAC(t, info); got != want {
		t.Fatalf("host's neighbour entry for %s = %q, want the first pod's %s", addr, got, want)
	}
	if _, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}

	second := d.RunPod(t, UsernsPod(PodConfig("second"), 0))
	st, info = d.PodStatus(t, second)
	if ip := st.GetNetwork().GetIp(); ip != addr {
		t.Fatalf("second pod's IP = %q, want the first pod's %s", ip, addr)
	}
	want := podMAC(t, info)
	var got string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = hostNeighbour(t, d.Bridge, addr); got == want {
			break
		}
	}
	if got != want {
		t.Fatalf("host's neighbour entry for %s = %q after the second pod started, want its MAC %s (the first pod's MAC until the entry expires: no announcement)", addr, got, want)
	}
	requireRefused(t, addr)
}

// requireRefused connects to a closed port of ip, which must answer with
// a reset, not let the connection time out.
func requireRefused(t *testing.T, ip string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "9"), 3*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("connected to %s:9, which nothing listens on", ip)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connecting to %s:9: %v, want connection refused (the host cannot reach the pod)", ip, err)
	}
}

// waitDAD waits for the bridge's IPv6 addresses to end their duplicate
// address detection: the host answers nothing from a tentative gateway
// address, as the bridge plugin made it at the first pod's ADD.
func waitDAD(t *testing.T, dev string) {
	t.Helper()
	waitFor(t, 10*time.Second, dev+"'s addresses to end their DAD", func() bool {
		out, err := exec.Command("ip", "-6", "addr", "show", "dev", dev, "tentative").CombinedOutput()
		if err != nil {
			t.Fatalf("ip -6 addr show dev %s tentative: %v\n%s", dev, err, out)
		}
		return len(strings.TrimSpace(string(out))) == 0
	})
}

// hostNeighbour is the MAC of the host's neighbour entry for ip on dev,
// "" if it has none.
func hostNeighbour(t *testing.T, dev, ip string) string {
	t.Helper()
	out, err := exec.Command("ip", "neigh", "show", ip, "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("ip neigh show %s dev %s: %v\n%s", ip, dev, err, out)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "lladdr" {
			return f[i+1]
		}
	}
	return ""
}

// podMAC is the MAC of eth0 in the pod's pinned netns (asked over
// netlink: the host's /sys names the host's interfaces).
func podMAC(t *testing.T, info *PodInfo) string {
	t.Helper()
	f := strings.Fields(nsenter(t, "--net="+info.Pins["net"], "ip", "-o", "link", "show", "eth0"))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "link/ether" {
			return f[i+1]
		}
	}
	t.Fatalf("no MAC for the pod's eth0 in %q", f)
	return ""
}
