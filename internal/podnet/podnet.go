// Package podnet holds pinrt's one definition of a pod's port mappings
// and traffic shaping. The sandbox package keeps them in the pod's state
// for CNI DEL and the cni package hands them to the portmap and bandwidth
// plugins; both name these types, so the two can't drift.
package podnet

// PortMapping is one host port forwarded to the pod. The JSON names are
// those of the sandbox state on disk.
type PortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"` // tcp, udp or sctp, in any case
	HostIP        string `json:"hostIP,omitempty"`
}

// Bandwidth is the pod's traffic shaping, in bits per second and bits.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}
