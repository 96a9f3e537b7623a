package cni

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/containerd/log"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// announce tells the pod's link that each address the plugins gave the
// pod is now at its interface's MAC, from inside the pod's netns: a
// gratuitous ARP for an IPv4 address, an unsolicited neighbour
// advertisement for an IPv6 one.
//
// An IP is used again once its pod is gone (host-local hands out a /24's
// addresses in turn), and the host's neighbour entry for it still names
// the old pod's MAC, REACHABLE for up to 45 s and then probed by unicast
// for 8 s more: everything the host sends the new pod (kubelet's probes,
// a port-forward, traffic through the bridge's gateway) goes nowhere
// meanwhile. The bridge plugin sets arp_notify, but brings the interface
// up before it has an address, so the kernel announces nothing, and it
// sends no advertisement for IPv6 at all (ndisc_notify is off). The
// announcement is what the kernel would have sent: it overrides the
// entry on the host and on every other pod of the bridge.
//
// It is best effort: a pod whose announcement fails still works once
// the stale entry expires, so a failure is logged, not returned.
func announce(ctx context.Context, netns string, addrs []ifAddr) {
	if len(addrs) == 0 || netns == "" {
		return
	}
	err := ns.WithNetNSPath(netns, func(ns.NetNS) error {
		// Each address on its own: an IPv6 one still tentative (DAD)
		// refuses the bind, and must not cost the IPv4 one after it its
		// announcement.
		var errs []error
		for _, a := range addrs {
			if err := announceAddr(a.ifName, a.ip); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", a.ifName, a.ip, err))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		log.G(ctx).WithError(err).Warn("announcing the pod's addresses")
	}
}

// announceAddr announces ip on the interface named ifName of the
// current netns, if it is an Ethernet interface.
func announceAddr(ifName string, ip net.IP) error {
	ifc, err := net.InterfaceByName(ifName)
	if err != nil {
		return err
	}
	if len(ifc.HardwareAddr) != 6 || ifc.Flags&net.FlagPointToPoint != 0 {
		return nil // no neighbour discovery on it: a tunnel, an L3 device
	}
	if noARP, err := isNoARP(ifName); err != nil || noARP {
		return err // an ipvlan in L3 mode: its master answers for it
	}
	if ip4 := ip.To4(); ip4 != nil {
		return sendGratuitousARP(ifc, ip4)
	}
	return sendUnsolicitedNA(ifc, ip)
}

// isNoARP reports whether the interface named ifName of the current
// netns has IFF_NOARP, which the kernel does no ARP or neighbour
// discovery on, and which Go's net.Interface leaves out of its flags.
func isNoARP(ifName string) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(ifName)
	if err != nil {
		return false, err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return false, fmt.Errorf("SIOCGIFFLAGS: %w", err)
	}
	return ifr.Uint16()&unix.IFF_NOARP != 0, nil
}

// sendGratuitousARP broadcasts an ARP request for ip from ip (RFC 5227's
// announcement) on ifc.
func sendGratuitousARP(ifc *net.Interface, ip net.IP) error {
	// Protocol 0: a socket that only sends, which no frame is copied to.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	// The kernel waits for an RCU grace period in every packet socket's
	// release (synchronize_net), 6-16 ms here: RunPodSandbox need not.
	defer func() { go unix.Close(fd) }()
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifc.Index, Halen: 6}
	copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	return unix.Sendto(fd, arpAnnouncement(ifc.HardwareAddr, ip), 0, to)
}

// sendUnsolicitedNA multicasts a neighbour advertisement for ip, from
// ip, to all nodes on ifc (RFC 4861, 7.2.6). The kernel fills in the
// ICMPv6 checksum of a raw ICMPv6 socket; a receiver drops the message
// unless its hop limit is 255. Binding to ip fails while ip is
// tentative, when no node may be told of it yet.
func sendUnsolicitedNA(ifc *net.Interface, ip net.IP) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifc.Index); err != nil {
		return err
	}
	from := &unix.SockaddrInet6{ZoneId: uint32(ifc.Index)}
	copy(from.Addr[:], ip.To16())
	if err := unix.Bind(fd, from); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	to := &unix.SockaddrInet6{ZoneId: uint32(ifc.Index)}
	copy(to.Addr[:], net.IPv6linklocalallnodes)
	return unix.Sendto(fd, neighbourAdvertisement(ifc.HardwareAddr, ip), 0, to)
}

// neighbourAdvertisement is an ICMPv6 neighbour advertisement for ip
// with the override flag and ip's target link-layer address option, mac,
// and a zero checksum for the kernel to fill in.
func neighbourAdvertisement(mac net.HardwareAddr, ip net.IP) []byte {
	b := make([]byte, 32)
	b[0] = 136  // type: neighbour advertisement
	b[4] = 0x20 // flags: override, neither router nor solicited
	copy(b[8:24], ip.To16())
	b[24], b[25] = 2, 1 // option: target link-layer address, 8 bytes
	copy(b[26:32], mac)
	return b
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
