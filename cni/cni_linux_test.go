package cni

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

const realPluginDir = "/opt/cni/bin"

func requireRootCNI(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, a bridge and veths")
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(realPluginDir, p)); err != nil {
			t.Skipf("needs the CNI plugins in %s (make deps): %v", realPluginDir, err)
		}
	}
	for _, b := range []string{"ip", "nsenter", "/bin/busybox"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s: %v", b, err)
		}
	}
}

// pinNetNS creates a network namespace, optionally inside a fresh user
// namespace that then owns it (as pinrt does for userns pods), and pins
// it by bind-mounting it onto path. The pin is removed on cleanup, also on
// failure.
func pinNetNS(t testing.TB, path string, userns bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("unmount %s: %v", path, err)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove %s: %v", path, err)
		}
	})

	cmd := exec.Command("/bin/busybox", "sleep", "600")
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if userns {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 20, Size: 65536}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 20, Size: 65536}}
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start netns holder: %v", err)
	}
	// The namespaces exist from the clone on; the helper only has to live
	// until the bind mount holds its own reference.
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	src := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("pin netns: %v", err)
	}
}

// ownedByInitUserNS reports whether the netns pinned at path belongs to
// the host user namespace.
func ownedByInitUserNS(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ufd, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("NS_GET_USERNS: %v", err)
	}
	defer unix.Close(ufd)
	var owner, self unix.Stat_t
	if err := unix.Fstat(ufd, &owner); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/user", &self); err != nil {
		t.Fatal(err)
	}
	return owner.Ino == self.Ino && owner.Dev == self.Dev
}

func nsRun(t *testing.T, netns string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + netns}, args...)...).CombinedOutput()
	return string(out), err
}

func randHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

const testNetName = "pinrt-test"

// newBridgeManager writes a conflist for a private test bridge into root
// and returns a Manager for it, with host-local's leases and the result
// cache under root. The bridge is deleted on cleanup.
func newBridgeManager(t testing.TB, root string) (m *Manager, ipamDir, cacheDir string) {
	t.Helper()
	ctx := context.Background()
	confDir, cacheDir, ipamDir := filepath.Join(root, "net.d"), filepath.Join(root, "cache"), filepath.Join(root, "ipam")
	if err := os.Mkdir(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	bridge := "pt" + randHex(t, 6) // 14 chars, under IFNAMSIZ
	t.Cleanup(func() {
		// The bridge plugin creates it on the first ADD; it outlives DEL.
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			t.Errorf("delete bridge %s: %v: %s", bridge, err, out)
		}
	})
	octet, err := rand.Int(rand.Reader, big.NewInt(250))
	if err != nil {
		t.Fatal(err)
	}
	subnet := fmt.Sprintf("10.199.%d.0/24", octet.Int64()+1)
	writeFile(t, filepath.Join(confDir, "10-test.conflist"), fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": false, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}`, testNetName, bridge, subnet, ipamDir), 0o644)

	m, err = New(ctx, Config{ConfDir: confDir, PluginDirs: []string{realPluginDir}, CacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, ipamDir, cacheDir
}

// TestBridgeNetworkRoot attaches two pods, one of them in a netns owned by
// a non-init user namespace, to a private test bridge and checks their
// addresses, lo, connectivity, IP release and teardown without the netns.
// No ipMasq and no portmap: the test must not touch the host firewall, and
// no isGateway, which would turn on the host's ip_forward.
func TestBridgeNetworkRoot(t *testing.T) {
	requireRootCNI(t)
	ctx := context.Background()
	root := t.TempDir()
	m, ipamDir, cacheDir := newBridgeManager(t, root)
	if err := m.Status(); err != nil {
		t.Fatalf("Status() = %v", err)
	}

	nsDir := filepath.Join(root, "ns")
	if err := os.Mkdir(nsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	pods := []Pod{
		{ID: "userns-" + randHex(t, 4), Name: "a", Namespace: "default", UID: "uid-a", NetNS: filepath.Join(nsDir, "a")},
		{ID: "plain-" + randHex(t, 4), Name: "b", Namespace: "default", UID: "uid-b", NetNS: filepath.Join(nsDir, "b")},
	}
	pinNetNS(t, pods[0].NetNS, true)
	pinNetNS(t, pods[1].NetNS, false)
	if ownedByInitUserNS(t, pods[0].NetNS) {
		t.Fatal("netns a is owned by the host userns; the test would not cover userns pods")
	}
	if !ownedByInitUserNS(t, pods[1].NetNS) {
		t.Fatal("netns b is not owned by the host userns")
	}

	var ips []string
	for _, p := range pods {
		res, err := m.Setup(ctx, p)
		if err != nil {
			t.Fatalf("Setup(%s) = %v", p.ID, err)
		}
		// Keep the teardown on failure of a later assertion; it is
		// idempotent, so the explicit teardowns below don't conflict.
		t.Cleanup(func() { m.Teardown(context.Background(), Pod{ID: p.ID}) })
		if len(res.IPs) != 1 || res.Network != testNetName || res.Interface != "eth0" {
			t.Fatalf("Setup(%s) = %+v", p.ID, res)
		}
		ips = append(ips, res.IPs[0])

		out, err := nsRun(t, p.NetNS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil || !strings.Contains(out, " "+res.IPs[0]+"/24 ") {
			t.Fatalf("eth0 in %s: %v: %s, want %s", p.ID, err, out, res.IPs[0])
		}
		if _, err := os.Stat(filepath.Join(ipamDir, testNetName, res.IPs[0])); err != nil {
			t.Fatalf("host-local holds no lease for %s: %v", res.IPs[0], err)
		}
		if err := m.Check(ctx, p); err != nil {
			t.Fatalf("Check(%s) = %v", p.ID, err)
		}
	}
	if ips[0] == ips[1] {
		t.Fatalf("both pods got %s", ips[0])
	}

	for i, j := range []int{1, 0} {
		out, err := nsRun(t, pods[i].NetNS, "/bin/busybox", "ping", "-c1", "-W2", ips[j])
		if err != nil {
			t.Fatalf("ping %s -> %s: %v: %s", pods[i].ID, ips[j], err, out)
		}
	}

	// Pod a: normal teardown with a live netns, then again.
	if err := m.Teardown(ctx, pods[0]); err != nil {
		t.Fatalf("Teardown(a) = %v", err)
	}
	if _, err := os.Stat(filepath.Join(ipamDir, testNetName, ips[0])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease of %s kept after teardown: %v", ips[0], err)
	}
	if out, err := nsRun(t, pods[0].NetNS, "ip", "link", "show", "eth0"); err == nil {
		t.Fatalf("eth0 still in netns a after teardown: %s", out)
	}
	if err := m.Teardown(ctx, pods[0]); err != nil {
		t.Fatalf("second Teardown(a) = %v", err)
	}

	// Pod b: the netns is gone first, as after a reboot. The IP is
	// released from the cache alone.
	if err := unix.Unmount(pods[1].NetNS, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pods[1].NetNS); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, pods[1]); err != nil {
		t.Fatalf("Teardown(b) without netns = %v", err)
	}
	if _, err := os.Stat(filepath.Join(ipamDir, testNetName, ips[1])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease of %s kept after teardown: %v", ips[1], err)
	}
	if err := m.Teardown(ctx, Pod{ID: pods[1].ID}); err != nil {
		t.Fatalf("second Teardown(b) = %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(cacheDir, "results")); len(entries) != 0 {
		t.Fatalf("cache not empty after teardown: %d entries", len(entries))
	}
}

// BenchmarkSetupTeardownRoot measures one pod's ADD (lo + bridge) and DEL
// with the real plugins, on one pinned netns.
func BenchmarkSetupTeardownRoot(b *testing.B) {
	requireRootCNI(b)
	ctx := context.Background()
	root := b.TempDir()
	m, _, _ := newBridgeManager(b, root)
	pod := Pod{ID: "bench-" + randHex(b, 4), Name: "b", Namespace: "default", UID: "u", NetNS: filepath.Join(root, "netns")}
	pinNetNS(b, pod.NetNS, true)
	for b.Loop() {
		if _, err := m.Setup(ctx, pod); err != nil {
			b.Fatal(err)
		}
		if err := m.Teardown(ctx, pod); err != nil {
			b.Fatal(err)
		}
	}
}

// An announcement is RFC 5227's: an ARP request from and for the
// address, with a zero target hardware address.
func TestARPAnnouncement(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0x42, 0xac, 0x11, 0x00, 0x02}
	got := arpAnnouncement(mac, net.ParseIP("10.88.0.7"))
	want := []byte{
		0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01, // Ethernet, IPv4, request
		0x02, 0x42, 0xac, 0x11, 0x00, 0x02, 10, 88, 0, 7, // sender
		0, 0, 0, 0, 0, 0, 10, 88, 0, 7, // target
	}
	if !bytes.Equal(got, want) {
		t.Errorf("announcement\n%x, want\n%x", got, want)
	}
}

// An unsolicited advertisement is RFC 4861's: for and from the address,
// with the override flag and the target's link-layer address.
func TestNeighbourAdvertisement(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0x42, 0xac, 0x11, 0x00, 0x02}
	got := neighbourAdvertisement(mac, net.ParseIP("fd00:10::7"))
	want := []byte{
		136, 0, 0, 0, 0x20, 0, 0, 0, // type, code, checksum (the kernel's), override
		0xfd, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, // target
		2, 1, 0x02, 0x42, 0xac, 0x11, 0x00, 0x02, // target link-layer address
	}
	if !bytes.Equal(got, want) {
		t.Errorf("advertisement\n%x, want\n%x", got, want)
	}
}

// An interface without neighbour discovery is left alone, for either
// family; one that is not there is an error (logged by announce).
func TestAnnounceNeedsEthernet(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "::1"} {
		if err := announceAddr("lo", net.ParseIP(ip)); err != nil {
			t.Errorf("%s on lo: %v, want nothing sent and no error", ip, err)
		}
	}
	if err := announceAddr("nosuch0", net.ParseIP("10.0.0.1")); err == nil {
		t.Error("on a missing interface: no error")
	}
}

// An interface with IFF_NOARP (an ipvlan in L3 mode) gets no
// announcement: on a veth, an IPv6 address it does not hold
// is announced (and refused, as no bind to it works) with ARP on, and
// left alone with ARP off.
func TestAnnounceSkipsNoARP(t *testing.T) {
	requireRootCNI(t)
	netns := filepath.Join(t.TempDir(), "net")
	pinNetNS(t, netns, false)
	ipIn := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("nsenter", append([]string{"--net=" + netns, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	announceIn := func() error {
		return ns.WithNetNSPath(netns, func(ns.NetNS) error { return announceAddr("d0", net.ParseIP("fd00:10::7")) })
	}
	ipIn("link", "add", "d0", "type", "veth", "peer", "name", "d1")
	ipIn("link", "set", "d0", "up")
	if err := announceIn(); err == nil {
		t.Fatal("announced an address d0 does not hold without an error: the test cannot tell a skip")
	}
	ipIn("link", "set", "d0", "arp", "off")
	if err := announceIn(); err != nil {
		t.Errorf("on a NOARP interface: %v, want it left alone", err)
	}
}

// BenchmarkAnnounce is the announcement of one address after every
// ADD, on a veth in a pinned netns: it is on RunPodSandbox's path.
func BenchmarkAnnounce(b *testing.B) {
	requireRootCNI(b)
	netns := filepath.Join(b.TempDir(), "net")
	pinNetNS(b, netns, false)
	for _, args := range [][]string{{"link", "add", "d0", "type", "veth", "peer", "name", "d1"}, {"link", "set", "d0", "up"}, {"link", "set", "d1", "up"}, {"addr", "add", "10.99.0.2/24", "dev", "d0"}, {"-6", "addr", "add", "fd00:99::2/64", "dev", "d0", "nodad"}} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + netns, "ip"}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
	}
	ctx := context.Background()
	for _, c := range []struct{ name, ip string }{{"v4", "10.99.0.2"}, {"v6", "fd00:99::2"}} {
		b.Run(c.name, func(b *testing.B) {
			addrs := []ifAddr{{ifName: "d0", ip: net.ParseIP(c.ip)}}
			for i := 0; i < b.N; i++ {
				announce(ctx, netns, addrs)
			}
		})
	}
}

// TestAnnounceContinuesAfterAFailure: one address that cannot be
// announced (an IPv6 address still tentative, or not held, as here)
// must not keep the pod's other addresses from being announced. A
// dual-stack result lists the IPv6 address first when its range comes
// first, and its IPv4 address then went unannounced.
func TestAnnounceContinuesAfterAFailure(t *testing.T) {
	requireRootCNI(t)
	netns := filepath.Join(t.TempDir(), "net")
	pinNetNS(t, netns, false)
	for _, args := range [][]string{
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"link", "set", "d0", "up"}, {"link", "set", "d1", "up"},
		{"addr", "add", "10.98.0.2/24", "dev", "d0"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + netns, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// A packet socket on d1, the peer, sees what d0 sends.
	var fd int
	err := ns.WithNetNSPath(netns, func(ns.NetNS) error {
		ifc, err := net.InterfaceByName("d1")
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP))); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifc.Index})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		t.Fatal(err)
	}

	announce(context.Background(), netns, []ifAddr{
		{ifName: "d0", ip: net.ParseIP("fd00:98::2")}, // not on d0: refused
		{ifName: "d0", ip: net.ParseIP("10.98.0.2").To4()},
	})
	want := net.ParseIP("10.98.0.2").To4()
	buf := make([]byte, 128)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			t.Fatalf("no ARP announcement of %s after the IPv6 address failed: %v", want, err)
		}
		if n >= 28 && bytes.Equal(buf[14:18], want) && bytes.Equal(buf[24:28], want) {
			return
		}
	}
}
