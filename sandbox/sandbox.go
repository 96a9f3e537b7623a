// Package sandbox is pinrt's model of pod sandboxes and containers: their
// immutable metadata, their mutable status with its state machine, the
// in-memory stores with name reservation, and their on-disk state, written
// atomically and loaded again at restart.
//
// It performs no namespace, network or runtime operation itself; the
// server drives those and records the outcome here.
package sandbox

import (
	"encoding/json"
	"strconv"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/internal/podnet"
)

// State of a sandbox.
//
//	   RunPodSandbox
//	        |
//	        v
//	      Ready ---- restore finds a pin closed ----+
//	        |                                       |
//	 StopPodSandbox                                 |
//	        v                                       v
//	     NotReady <---------------------------------+
//	        |
//	RemovePodSandbox
//	        v
//	    (removed)
//
// A sandbox never goes back from NotReady to Ready: its namespaces are
// gone, and kubelet creates a new sandbox instead.
type State string

// The sandbox states.
const (
	StateReady    State = "ready"
	StateNotReady State = "notready"
)

// NamespaceMode says whether a namespace is the pod's own or the host's.
type NamespaceMode string

// The namespace modes, as CRI names them.
const (
	ModePod       NamespaceMode = "pod"
	ModeNode      NamespaceMode = "node"
	ModeContainer NamespaceMode = "container"
)

// NamespaceModes are the pod's namespace choices.
type NamespaceModes struct {
	Network NamespaceMode `json:"network"`
	IPC     NamespaceMode `json:"ipc"`
	PID     NamespaceMode `json:"pid"`
	User    NamespaceMode `json:"user"`
}

// Metadata is what a sandbox is; it never changes after RunPodSandbox.
type Metadata struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	Attempt   uint32 `json:"attempt"`

	Labels       map[string]string `json:"labels,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	LogDirectory string            `json:"logDirectory,omitempty"`
	Handler      string            `json:"runtimeHandler,omitempty"`
	Hostname     string            `json:"hostname,omitempty"`
	CgroupParent string            `json:"cgroupParent,omitempty"`
	CreatedAt    time.Time         `json:"createdAt"`

	Modes NamespaceModes `json:"namespaceModes"`
	// Pins maps a namespace kind (user, net, ipc, uts) to its pin path.
	Pins map[string]string `json:"pins,omitempty"`
	// UIDMappings and GIDMappings are the pod's user namespace mappings;
	// Allocated says pinrt's allocator handed them out (else kubelet did).
	UIDMappings []specs.LinuxIDMapping `json:"uidMappings,omitempty"`
	GIDMappings []specs.LinuxIDMapping `json:"gidMappings,omitempty"`
	Allocated   bool                   `json:"allocated,omitempty"`

	// IPs are the pod's addresses from CNI, IPv4 first.
	IPs []string `json:"ips,omitempty"`
	// Network is the CNI network name used, CNIResult its full result.
	Network   string          `json:"network,omitempty"`
	CNIResult json.RawMessage `json:"cniResult,omitempty"`

	// Files are the pod files the containers bind-mount.
	HostnamePath string `json:"hostnamePath,omitempty"`
	HostsPath    string `json:"hostsPath,omitempty"`
	ResolvPath   string `json:"resolvPath,omitempty"`
	ShmPath      string `json:"shmPath,omitempty"`
	// InfraID is the pause container of a shared-PID pod, "" otherwise;
	// InfraPid its process, as the OCI runtime created it.
	InfraID  string `json:"infraId,omitempty"`
	InfraPid int    `json:"infraPid,omitempty"`
	// PortMappings and Bandwidth are kept for CNI DEL.
	PortMappings []PortMapping `json:"portMappings,omitempty"`
	Bandwidth    *Bandwidth    `json:"bandwidth,omitempty"`
}

// PortMapping is one CRI port mapping, kept for CNI DEL.
type PortMapping = podnet.PortMapping

// Bandwidth is the pod's traffic shaping, kept for CNI DEL.
type Bandwidth = podnet.Bandwidth

// Status is what changes during a sandbox's life.
type Status struct {
	State     State     `json:"state"`
	StoppedAt time.Time `json:"stoppedAt,omitempty"`
	// Reason says why a sandbox is NotReady without a Stop (restore).
	Reason string `json:"reason,omitempty"`
	// NetworkTornDown records that CNI DEL succeeded: the pod's IPs are
	// released, so it can never be Ready again, and a later stop or
	// remove need not run DEL a second time.
	NetworkTornDown bool `json:"networkTornDown,omitempty"`
}

// Sandbox is one pod sandbox: metadata plus a locked status, stored in
// Dir, <root>/sandboxes/<id>.
type Sandbox struct {
	Metadata
	record[Metadata, Status]
}

// New returns a Ready sandbox for md stored in dir.
func New(md Metadata, dir string) *Sandbox {
	sb := &Sandbox{Metadata: md, record: record[Metadata, Status]{Dir: dir, status: Status{State: StateReady}}}
	sb.md = &sb.Metadata
	return sb
}

// NameKey is the reservation key of a pod: the same name, namespace, uid
// and attempt may exist only once. Each part is quoted, so the key is
// unambiguous: kubelet's "x_y"+"z" and "x"+"y_z" once collided when the
// parts were joined with "_".
func NameKey(name, namespace, uid string, attempt uint32) string {
	return strconv.Quote(name) + " " + strconv.Quote(namespace) + " " + strconv.Quote(uid) + " " + strconv.FormatUint(uint64(attempt), 10)
}
