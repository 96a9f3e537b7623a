package cni

import (
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/pinrt/pinrt/internal/validate"
)

// IfName is the interface name every pod gets for its network.
const IfName = "eth0"

// portMapEntry and bandwidthEntry are the JSON shapes the portmap and
// bandwidth plugins expect under runtimeConfig. They are typed (not maps)
// so that a field name typo fails the unit test, not a pod.
type portMapEntry struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// ipRangeEntry is one range of host-local's ipRanges capability.
type ipRangeEntry struct {
	Subnet string `json:"subnet"`
}

type bandwidthEntry struct {
	IngressRate  uint64 `json:"ingressRate"`
	IngressBurst uint64 `json:"ingressBurst"`
	EgressRate   uint64 `json:"egressRate"`
	EgressBurst  uint64 `json:"egressBurst"`
}

// validatePodID checks the ID up front against the shared rule, which is
// stricter than libcni's own: an InvalidArgument instead of a plugin
// error, and an ID safe in the cache file names built from it.
func validatePodID(id string) error { return validate.ID("sandbox", id) }

// runtimeConf builds the libcni arguments for pod on interface ifName. It is
// a pure function so CNI_ARGS and the capability args can be tested without
// running a plugin.
func runtimeConf(pod Pod, ifName string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: pod.ID,
		NetNS:       pod.NetNS,
		IfName:      ifName,
		// IgnoreUnknown first: plugins that parse CNI_ARGS strictly (the
		// reference plugins do) otherwise reject the K8S_* keys.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", pod.ID},
			{"K8S_POD_UID", pod.UID},
		},
		CapabilityArgs: map[string]any{},
	}
	var ports []portMapEntry
	for _, p := range pod.PortMappings {
		// kubelet sends every container port; only those with a host
		// port are mappings, as in containerd and CRI-O.
		if p.HostPort <= 0 {
			continue
		}
		proto := strings.ToLower(p.Protocol)
		if proto == "" {
			proto = "tcp"
		}
		ports = append(ports, portMapEntry{
			HostPort:      p.HostPort,
			ContainerPort: p.ContainerPort,
			Protocol:      proto,
			HostIP:        p.HostIP,
		})
	}
	if len(ports) > 0 {
		rt.CapabilityArgs["portMappings"] = ports
	}
	if len(pod.IPRanges) > 0 {
		// One range set per subnet: a dual-stack pod gets one address of
		// each family.
		var sets [][]ipRangeEntry
		for _, r := range pod.IPRanges {
			sets = append(sets, []ipRangeEntry{{Subnet: r}})
		}
		rt.CapabilityArgs["ipRanges"] = sets
	}
	if b := pod.Bandwidth; b != nil {
		rt.CapabilityArgs["bandwidth"] = bandwidthEntry{
			IngressRate:  b.IngressRate,
			IngressBurst: b.IngressBurst,
			EgressRate:   b.EgressRate,
			EgressBurst:  b.EgressBurst,
		}
	}
	return rt
}
