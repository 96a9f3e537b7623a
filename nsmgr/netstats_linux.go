package nsmgr

import (
	"errors"
	"fmt"
	"os"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetDevStats reads the counters of every interface but loopback in the
// network namespace pinned at pin, without starting a process.
//
// The netlink socket is opened inside the namespace (netlink switches a
// locked thread in and back for the socket() call only) and the counters
// come from RTM_GETLINK. /sys/class/net cannot be used: sysfs shows the
// namespace of whoever mounted it, not the caller's.
func NetDevStats(pin string) ([]NetDev, error) {
	ns, err := netns.GetFromPath(pin)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("netns %s: %w", pin, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("netns %s: %w", pin, err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", pin, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links in netns %s: %w", pin, err)
	}
	var out []NetDev
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&netFlagLoopback != 0 || a.Statistics == nil {
			continue
		}
		s := a.Statistics
		out = append(out, NetDev{
			Name: a.Name, RxBytes: s.RxBytes, RxPackets: s.RxPackets, RxErrors: s.RxErrors, RxDropped: s.RxDropped,
			TxBytes: s.TxBytes, TxPackets: s.TxPackets, TxErrors: s.TxErrors, TxDropped: s.TxDropped,
		})
	}
	return out, nil
}
