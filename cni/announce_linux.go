package cni

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"

	"github.com/containerd/log"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// announce sends a gratuitous ARP from each of the pod's interfaces for
// each IPv4 address the plugins gave it, from inside the pod's netns.
//
// An IP is used again once its pod is gone (host-local hands out a /24's
// addresses in turn), and the host's neighbour entry for it still names
// the old pod's MAC, REACHABLE for up to 45 s and then probed by unicast
// for 8 s more: everything the host sends the new pod (kubelet's probes,
// a port-forward, traffic through the bridge's gateway) goes nowhere
// meanwhile. The bridge plugin sets arp_notify, but brings the interface
// up before it has an address, so the kernel announces nothing. A
// gratuitous ARP is what the kernel would have sent: it overrides the
// entry on the host and on every other pod of the bridge.
//
// It is best effort: a pod whose announcement fails still works once
// the stale entry expires, so a failure is logged, not returned.
func announce(ctx context.Context, netns string, addrs []ifAddr) {
	if len(addrs) == 0 || netns == "" {
		return
	}
	err := ns.WithNetNSPath(netns, func(ns.NetNS) error {
		for _, a := range addrs {
			if err := sendGratuitousARP(a.ifName, a.ip); err != nil {
				return fmt.Errorf("%s %s: %w", a.ifName, a.ip, err)
			}
		}
		return nil
	})
	if err != nil {
		log.G(ctx).WithError(err).Warn("gratuitous ARP for the pod's addresses")
	}
}

// sendGratuitousARP broadcasts an ARP request for ip from ip (RFC 5227's
// announcement) on the interface named ifName of the current netns, if
// it is an Ethernet interface.
func sendGratuitousARP(ifName string, ip net.IP) error {
	ifc, err := net.InterfaceByName(ifName)
	if err != nil {
		return err
	}
	if len(ifc.HardwareAddr) != 6 || ifc.Flags&net.FlagPointToPoint != 0 {
		return nil // no ARP on it: a tunnel, an L3 device
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifc.Index, Halen: 6}
	copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	return unix.Sendto(fd, arpAnnouncement(ifc.HardwareAddr, ip), 0, to)
}

// arpAnnouncement is an Ethernet/IPv4 ARP request whose sender and
// target address are both ip, and whose target hardware address is zero.
func arpAnnouncement(mac net.HardwareAddr, ip net.IP) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)      // hardware type: Ethernet
	binary.BigEndian.PutUint16(b[2:], 0x0800) // protocol type: IPv4
	b[4], b[5] = 6, 4                         // address lengths
	binary.BigEndian.PutUint16(b[6:], 1)      // operation: request
	copy(b[8:14], mac)
	copy(b[14:18], ip.To4())
	copy(b[24:28], ip.To4())
	return b
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
