package nsmgr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// pinNetns pins a fresh network namespace (inside a user namespace with
// userns) and returns the pin. Everything is removed when tb ends.
func pinNetns(tb testing.TB, id string, userns bool) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces and links")
	}
	m, err := NewManager(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	req := CreateRequest{ID: id, Kinds: []Kind{Net}}
	if userns {
		req = fullRequest(id, 31, nil)
	}
	pins, err := m.Create(context.Background(), req)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = m.Remove(context.Background(), id) })
	return pins[Net]
}

// withHandle runs f with a netlink handle inside the namespace pinned at
// pin: the independent reader the tests compare Counters with.
func withHandle(tb testing.TB, pin string, f func(h *netlink.Handle)) {
	tb.Helper()
	ns, err := netns.GetFromPath(pin)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	f(h)
}

// addVeth links the namespace pinned at pin to the host as the CNI bridge
// plugin does: a veth whose pod end is eth0. The kernel gives the pod's
// namespace an nsid in the host's when it reports the host end's peer.
func addVeth(tb testing.TB, pin, hostName string) *netlink.Veth {
	tb.Helper()
	ns, err := netns.GetFromPath(pin)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = netlink.LinkDel(veth) })
	return veth
}

// oracle is what netlink inside the namespace reports, but loopback.
func oracle(tb testing.TB, pin string) map[string]netlink.LinkStatistics {
	out := map[string]netlink.LinkStatistics{}
	withHandle(tb, pin, func(h *netlink.Handle) {
		links, err := h.LinkList()
		if err != nil {
			tb.Fatal(err)
		}
		for _, l := range links {
			if a := l.Attrs(); a.Flags&net.FlagLoopback == 0 && a.Statistics != nil {
				out[a.Name] = *a.Statistics
			}
		}
	})
	return out
}

func TestCountersVeth(t *testing.T) {
	pin := pinNetns(t, "veth", false)
	host := addVeth(t, pin, fmt.Sprintf("pnt%d", os.Getpid()))
	// Traffic: the host sends a datagram to the pod end's address, which
	// makes it ARP for it through the veth: the pod's eth0 receives.
	hostAddr, podAddr := "169.254.231.1/30", "169.254.231.2/30"
	mustAddr := func(h *netlink.Handle, name, cidr string) {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(cidr)
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	hh, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	mustAddr(hh, host.Name, hostAddr)
	withHandle(t, pin, func(h *netlink.Handle) { mustAddr(h, "eth0", podAddr) })

	c := NewCounters()
	t.Cleanup(func() { _ = c.Close() })
	before := oracle(t, pin)
	conn, err := net.Dial("udp4", "169.254.231.2:9")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	var got []NetDev
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, _ = conn.Write([]byte("ping"))
		if got, err = c.NetDev(pin); err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].RxPackets > before["eth0"].RxPackets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("eth0 received nothing: %+v (before %+v)", got, before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := oracle(t, pin)
	d, lo, hi := got[0], before["eth0"], after["eth0"]
	if d.Name != "eth0" || len(after) != 1 {
		t.Fatalf("NetDev = %+v, netlink inside the netns has %+v", got, after)
	}
	for _, f := range []struct {
		name          string
		got, min, max uint64
	}{
		{"rx bytes", d.RxBytes, lo.RxBytes, hi.RxBytes},
		{"rx packets", d.RxPackets, lo.RxPackets, hi.RxPackets},
		{"tx bytes", d.TxBytes, lo.TxBytes, hi.TxBytes},
		{"tx packets", d.TxPackets, lo.TxPackets, hi.TxPackets},
		{"rx dropped", d.RxDropped, lo.RxDropped, hi.RxDropped},
	} {
		if f.got < f.min || f.got > f.max {
			t.Errorf("%s = %d, netlink inside the netns said %d before and %d after", f.name, f.got, f.min, f.max)
		}
	}
}

func TestCountersWithoutNsid(t *testing.T) {
	// Nothing links the namespace to the host's, so it has no nsid yet:
	// NetDev has to assign one. The namespace is owned by a pod user
	// namespace, as with userns pods.
	pin := pinNetns(t, "nonsid", true)
	withHandle(t, pin, func(h *netlink.Handle) {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "in0"}, PeerName: "in1"}); err != nil {
			t.Fatal(err)
		}
	})
	nsid := func() int {
		ns, err := netns.GetFromPath(pin)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ns.Close() }()
		id, err := netlink.GetNetNsIdByFd(int(ns))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if id := nsid(); id != -1 {
		t.Fatalf("the new namespace already has nsid %d", id)
	}
	c := NewCounters()
	t.Cleanup(func() { _ = c.Close() })
	for i := range 2 {
		got, err := c.NetDev(pin)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if len(got) != 2 || got[0].Name != "in0" && got[1].Name != "in0" {
			t.Fatalf("call %d: NetDev = %+v, want in0 and in1", i, got)
		}
	}
	if id := nsid(); id < 0 {
		t.Errorf("nsid after NetDev = %d, want one assigned", id)
	}
}

func TestCountersErrors(t *testing.T) {
	pin := pinNetns(t, "errors", false)
	notNetns := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notNetns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := NewCounters()
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.NetDev(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing pin: err = %v, want NotFound", err)
	}
	if _, err := c.NetDev(notNetns); err == nil {
		t.Error("a file that is no netns: no error")
	}
	// The failed request must not disturb the next one.
	if got, err := c.NetDev(pin); err != nil || len(got) != 0 {
		t.Errorf("after a failure: NetDev = %+v, %v; want no interfaces (lo only)", got, err)
	}
}

func TestCountersConcurrent(t *testing.T) {
	pins := []string{pinNetns(t, "conc-a", false), pinNetns(t, "conc-b", false)}
	for i, pin := range pins {
		addVeth(t, pin, fmt.Sprintf("pnc%d-%d", i, os.Getpid()))
	}
	c := NewCounters()
	t.Cleanup(func() { _ = c.Close() })
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 50 {
				got, err := c.NetDev(pins[i%2])
				if err != nil || len(got) != 1 || got[0].Name != "eth0" {
					t.Errorf("NetDev = %+v, %v", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkNetDev reads one pod's counters, the per-pod cost of
// ListPodSandboxStats. Entering the namespace for a netlink handle
// (netlink.NewHandleAt, what pinrt did before) is there for comparison.
func BenchmarkNetDev(b *testing.B) {
	pin := pinNetns(b, "netbench", false)
	addVeth(b, pin, fmt.Sprintf("pnb%d", os.Getpid()))
	b.Run("nsid", func(b *testing.B) {
		c := NewCounters()
		b.Cleanup(func() { _ = c.Close() })
		b.ReportAllocs()
		for b.Loop() {
			if devs, err := c.NetDev(pin); err != nil || len(devs) != 1 {
				b.Fatal(devs, err)
			}
		}
	})
	b.Run("setns", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if devs := oracle(b, pin); len(devs) != 1 {
				b.Fatal(devs)
			}
		}
	})
}
