package nsmgr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// netlinkTimeout bounds each wait for the kernel's reply.
const netlinkTimeout = 5 * time.Second

// NetDev returns the counters of every interface but loopback in the
// network namespace pinned at pin, without entering it.
//
// The daemon's own socket asks for the links of the pod's namespace by its
// nsid (RTM_GETLINK with IFLA_TARGET_NETNSID, Linux 4.20): the number the
// daemon's namespace knows the pod's by. RTM_GETNSID looks it up from the
// pin's fd, and RTM_NEWNSID assigns one to a namespace that has none yet
// (the CNI bridge's veth gives most pods one). Entering the namespace
// instead (netlink.NewHandleAt: a locked thread, two setns and a new
// socket) cost ~210 µs per pod and call; this ~30 µs, and no socket or
// thread is tied to a pod, so nothing has to be closed when it stops.
//
// The pin stays open until the dump is read: it keeps the namespace alive,
// so its nsid cannot be freed and reused by another pod's meanwhile.
// /sys/class/net cannot be used: sysfs shows the namespace of whoever
// mounted it, not the caller's.
func (c *Counters) NetDev(pin string) ([]NetDev, error) {
	nsfd, err := unix.Open(pin, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("netns %s: %w", pin, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("netns %s: %w", pin, err)
	}
	defer func() { _ = unix.Close(nsfd) }()
	c.mu.Lock()
	defer c.mu.Unlock()
	devs, err := c.netDev(nsfd)
	if err != nil {
		// A reply left unread would be taken for the next request's.
		c.closeLocked()
		return nil, fmt.Errorf("network counters of netns %s: %w", pin, err)
	}
	return devs, nil
}

// Close closes the socket; a later NetDev opens a new one.
func (c *Counters) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
	return nil
}

func (c *Counters) closeLocked() {
	if c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}

func (c *Counters) netDev(nsfd int) ([]NetDev, error) {
	if c.fd < 0 {
		if err := c.open(); err != nil {
			return nil, err
		}
	}
	nsid, err := c.nsid(nsfd)
	if err != nil {
		return nil, err
	}
	if nsid < 0 {
		// -1 asks the kernel for any free id. EEXIST: someone else
		// assigned one since.
		err := c.exchange(unix.RTM_NEWNSID, unix.NLM_F_ACK, nsidBody(nsfd, -1), nil)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("assigning an nsid: %w", err)
		}
		if nsid, err = c.nsid(nsfd); err != nil {
			return nil, err
		}
		if nsid < 0 {
			return nil, errors.New("the kernel assigned no nsid")
		}
	}
	return c.links(nsid)
}

func (c *Counters) open() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	// Strict checking makes the kernel refuse a request it does not
	// understand instead of ignoring the attribute: a dump that ignored
	// IFLA_TARGET_NETNSID would list the host's links as the pod's.
	for _, err := range []error{
		unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}),
		unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv),
	} {
		if err != nil {
			_ = unix.Close(fd)
			return fmt.Errorf("netlink socket: %w", err)
		}
	}
	c.fd = fd
	if c.buf == nil {
		// Larger than any dump skb the kernel builds (32 KiB at most).
		c.buf = make([]byte, 64<<10)
	}
	return nil
}

// nsidBody is a struct rtgenmsg (padded to 4 bytes) with NETNSA_FD and,
// if nsid is not 0, NETNSA_NSID.
func nsidBody(nsfd int, nsid int32) []byte {
	b := make([]byte, 4, 20)
	b = appendAttr32(b, unix.NETNSA_FD, uint32(nsfd))
	if nsid != 0 {
		b = appendAttr32(b, unix.NETNSA_NSID, uint32(nsid))
	}
	return b
}

// nsid is the id of the namespace open at nsfd, -1 if it has none.
func (c *Counters) nsid(nsfd int) (int32, error) {
	nsid, found := int32(-1), false
	err := c.exchange(unix.RTM_GETNSID, 0, nsidBody(nsfd, 0), func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWNSID || len(data) < 4 {
			return fmt.Errorf("unexpected reply %d to RTM_GETNSID", typ)
		}
		return eachAttr(data[4:], func(t uint16, v []byte) {
			if t == unix.NETNSA_NSID && len(v) >= 4 {
				nsid, found = int32(binary.NativeEndian.Uint32(v)), true
			}
		})
	})
	if err != nil {
		return 0, fmt.Errorf("RTM_GETNSID: %w", err)
	}
	if !found {
		return 0, errors.New("RTM_GETNSID: no NETNSA_NSID in the reply")
	}
	return nsid, nil
}

// links dumps the links of the namespace the daemon's knows as nsid.
func (c *Counters) links(nsid int32) ([]NetDev, error) {
	body := make([]byte, unix.SizeofIfInfomsg, unix.SizeofIfInfomsg+8)
	body = appendAttr32(body, unix.IFLA_TARGET_NETNSID, uint32(nsid))
	var out []NetDev
	err := c.exchange(unix.RTM_GETLINK, unix.NLM_F_DUMP, body, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWLINK || len(data) < unix.SizeofIfInfomsg {
			return fmt.Errorf("unexpected reply %d to RTM_GETLINK", typ)
		}
		flags := binary.NativeEndian.Uint32(data[8:12])
		var (
			d        NetDev
			stats    []byte
			target   = int32(-1)
			hasStats bool
		)
		if err := eachAttr(data[unix.SizeofIfInfomsg:], func(t uint16, v []byte) {
			switch t {
			case unix.IFLA_IFNAME:
				d.Name = unix.ByteSliceToString(v)
			case unix.IFLA_STATS64:
				stats, hasStats = v, len(v) >= 8*8
			case unix.IFLA_TARGET_NETNSID:
				if len(v) >= 4 {
					target = int32(binary.NativeEndian.Uint32(v))
				}
			}
		}); err != nil {
			return err
		}
		// Every link of a dump in another namespace carries its nsid; a
		// kernel that ignored the attribute sent the host's links.
		if target != nsid {
			return fmt.Errorf("link %q is not from nsid %d", d.Name, nsid)
		}
		if flags&unix.IFF_LOOPBACK != 0 || !hasStats {
			return nil
		}
		// struct rtnl_link_stats64 starts with rx/tx packets, bytes,
		// errors and dropped.
		u := func(i int) uint64 { return binary.NativeEndian.Uint64(stats[8*i:]) }
		d.RxPackets, d.TxPackets, d.RxBytes, d.TxBytes = u(0), u(1), u(2), u(3)
		d.RxErrors, d.TxErrors, d.RxDropped, d.TxDropped = u(4), u(5), u(6), u(7)
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("RTM_GETLINK: %w", err)
	}
	return out, nil
}

// exchange sends one request and hands each reply message to each until
// the reply is complete: the one message of a plain request, NLMSG_DONE
// after a dump, the ack with NLM_F_ACK. A netlink error is returned as its
// errno.
func (c *Counters) exchange(typ, flags uint16, body []byte, each func(typ uint16, data []byte) error) error {
	c.seq++
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], c.seq)
	msg = append(msg, body...)
	if _, err := unix.Write(c.fd, msg); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	for {
		// MSG_TRUNC makes recvfrom return the datagram's real size, so a
		// reply larger than the buffer is noticed instead of cut short.
		n, from, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_TRUNC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		if n > len(c.buf) {
			return fmt.Errorf("netlink reply of %d bytes truncated", n)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		for b := c.buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("malformed netlink message of %d bytes", l)
			}
			mtyp, mflags, seq := binary.NativeEndian.Uint16(b[4:6]), binary.NativeEndian.Uint16(b[6:8]), binary.NativeEndian.Uint32(b[8:12])
			data := b[unix.NLMSG_HDRLEN:l]
			b = b[min(nlmAlign(l), len(b)):]
			if seq != c.seq {
				continue
			}
			switch {
			case mtyp == unix.NLMSG_ERROR || mtyp == unix.NLMSG_DONE:
				// Both carry an errno (0 for an ack, or the end of a
				// dump that succeeded).
				if len(data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(data[0:4])); errno < 0 {
						return unix.Errno(-errno)
					}
				}
				return nil
			case each != nil:
				if err := each(mtyp, data); err != nil {
					return err
				}
			}
			if flags&(unix.NLM_F_DUMP|unix.NLM_F_ACK) == 0 && mflags&unix.NLM_F_MULTI == 0 {
				return nil
			}
		}
	}
}

// nlaTypeMask strips the nested and byte-order flags off an attribute type.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

func appendAttr32(b []byte, typ uint16, v uint32) []byte {
	b = binary.NativeEndian.AppendUint16(b, 8)
	b = binary.NativeEndian.AppendUint16(b, typ)
	return binary.NativeEndian.AppendUint32(b, v)
}

// eachAttr calls f with the type and payload of every rtattr in b.
func eachAttr(b []byte, f func(typ uint16, v []byte)) error {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return fmt.Errorf("malformed netlink attribute of %d bytes", l)
		}
		f(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[unix.SizeofRtAttr:l])
		b = b[min(nlmAlign(l), len(b)):]
	}
	return nil
}
