package nsmgr

import "net"

// NetDev is the traffic of one network interface since it was created.
type NetDev struct {
	Name                                    string
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

const netFlagLoopback = net.FlagLoopback

// Counters reads interface counters inside pinned network namespaces.
type Counters struct{}

// NetDev returns the counters of the interfaces in the netns pinned at pin.
func (Counters) NetDev(pin string) ([]NetDev, error) { return NetDevStats(pin) }
