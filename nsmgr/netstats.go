package nsmgr

import "sync"

// NetDev is the traffic of one network interface since it was created.
type NetDev struct {
	Name                                    string
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

// Counters reads interface counters inside pinned network namespaces
// through one rtnetlink socket in the caller's own namespace, opened on
// first use. It is safe for concurrent use; Close releases the socket.
type Counters struct {
	mu  sync.Mutex
	fd  int // the socket, -1 while closed
	seq uint32
	buf []byte
}

// NewCounters returns a reader whose socket is opened by the first NetDev.
func NewCounters() *Counters { return &Counters{fd: -1} }
