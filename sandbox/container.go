package sandbox

import (
	"fmt"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ContainerState of a container.
//
//	CreateContainer
//	      |
//	      v
//	   Created ---- StartContainer ----> Running
//	      |                                 |
//	      | (stopped before start)          | exit, StopContainer, pod stop
//	      v                                 v
//	   Exited <-----------------------------+
//	      |
//	RemoveContainer (any state: a live one is killed first)
//	      v
//	  (removed)
//
// The runtime is the source of truth: the server refreshes the state from
// it (and conmon's exit file) before reporting, so a container that exits
// on its own, even while pinrt is down, becomes Exited with its real code.
type ContainerState string

// The container states, as CRI names them.
const (
	ContainerCreated ContainerState = "created"
	ContainerRunning ContainerState = "running"
	ContainerExited  ContainerState = "exited"
	ContainerUnknown ContainerState = "unknown"
)

// ContainerMount is one volume as CreateContainer asked for it.
type ContainerMount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Readonly      bool   `json:"readonly,omitempty"`
	// Propagation is the CRI enum value (0 private, 1 rslave, 2 rshared).
	Propagation       int32                  `json:"propagation,omitempty"`
	RecursiveReadOnly bool                   `json:"recursiveReadOnly,omitempty"`
	UIDMappings       []specs.LinuxIDMapping `json:"uidMappings,omitempty"`
	GIDMappings       []specs.LinuxIDMapping `json:"gidMappings,omitempty"`
	// Image is set for an image volume: the image as requested, with
	// ImageRef the ID it resolved to and ImageSubPath the part mounted.
	// HostPath is empty then; the image package knows where it is.
	Image        string `json:"image,omitempty"`
	ImageRef     string `json:"imageRef,omitempty"`
	ImageSubPath string `json:"imageSubPath,omitempty"`
	// MountOptions are the extra options asked for (noexec, nodev,
	// nosuid), validated, without repeats.
	MountOptions []string `json:"mountOptions,omitempty"`
}

// ContainerUser is the process identity the spec resolved.
type ContainerUser struct {
	UID                uint32   `json:"uid"`
	GID                uint32   `json:"gid"`
	SupplementalGroups []uint32 `json:"supplementalGroups,omitempty"`
}

// ContainerMetadata is what a container is; it never changes after
// CreateContainer.
type ContainerMetadata struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	Name      string `json:"name"`
	Attempt   uint32 `json:"attempt"`

	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Image is the image as the request named it; ImageID is the config
	// digest and ImageRef a digest reference (or the ID without one).
	Image    string `json:"image"`
	ImageID  string `json:"imageId"`
	ImageRef string `json:"imageRef"`
	// StopSignal is the pod's stop signal for the container, else the
	// image's STOPSIGNAL ("" means SIGTERM).
	StopSignal string `json:"stopSignal,omitempty"`
	// LogPath is the absolute CRI log path; "" means no log.
	LogPath string           `json:"logPath,omitempty"`
	Mounts  []ContainerMount `json:"mounts,omitempty"`
	User    ContainerUser    `json:"user"`
	// Handler is the runtime handler the container runs under (the pod's).
	Handler   string    `json:"runtimeHandler"`
	CreatedAt time.Time `json:"createdAt"`
	// Privileged is the security context's: node agents (Falco) read it
	// from the verbose status, as CRI-O gives it.
	Privileged bool `json:"privileged,omitempty"`
	// Restored marks a container made from a checkpoint archive: its
	// start restores the checkpoint's processes (CRIU) instead of
	// starting the image's.
	Restored bool `json:"restored,omitempty"`
}

// ContainerStatus is what changes during a container's life.
type ContainerStatus struct {
	State      ContainerState `json:"state"`
	Pid        int            `json:"pid,omitempty"`
	StartedAt  time.Time      `json:"startedAt,omitempty"`
	FinishedAt time.Time      `json:"finishedAt,omitempty"`
	ExitCode   int32          `json:"exitCode"`
	// Reason is Completed, Error, OOMKilled or MonitorGone once exited.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// RuntimePending marks a created container whose bundle is written
	// but which the OCI runtime does not have yet: StartContainer creates
	// it there (conmon, `runc create`) before starting it, as containerd
	// creates a task at start. Records without the field predate it and
	// were created in the runtime.
	RuntimePending bool `json:"runtimePending,omitempty"`
}

// Container is one container: metadata plus a locked status.
type Container struct {
	ContainerMetadata
	// record's Dir is <root>/containers/<id>; it is also the OCI bundle
	// (config.json) and conmon's exit directory.
	record[ContainerMetadata, ContainerStatus]
}

// NewContainer returns a Created container for md stored in dir.
func NewContainer(md ContainerMetadata, dir string) *Container {
	c := &Container{ContainerMetadata: md, record: record[ContainerMetadata, ContainerStatus]{Dir: dir, status: ContainerStatus{State: ContainerCreated}}}
	c.md = &c.ContainerMetadata
	return c
}

// Save writes state.json into c.Dir. config.json, the OCI spec, is written
// by the runtime driver as part of the bundle.
func (c *Container) Save() error {
	return c.save()
}

// LoadContainer reads a container from dir.
func LoadContainer(dir string) (*Container, error) {
	md, st, err := loadRecord[ContainerMetadata, ContainerStatus](dir, func(m *ContainerMetadata) string { return m.ID })
	if err != nil {
		return nil, err
	}
	if err := ValidateID(md.SandboxID); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	c := &Container{ContainerMetadata: *md, record: record[ContainerMetadata, ContainerStatus]{Dir: dir, status: st, loaded: true}}
	c.md = &c.ContainerMetadata
	return c, nil
}

// ContainerNameKey is the reservation key of a container: one name and
// attempt per sandbox.
func ContainerNameKey(sandboxID, name string, attempt uint32) string {
	return NameKey(name, sandboxID, "", attempt)
}
