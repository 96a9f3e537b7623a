// Package server implements the CRI v1 RuntimeService and ImageService.
//
// It is the only package that knows the CRI protobuf types. A handler
// converts its request, calls one domain operation on the packages below
// (nsmgr, cni, sandbox, image, oci) through the small interfaces declared
// here, and converts the result. Errors are returned as errdefs classes;
// the interceptors in instrument.go map them to gRPC codes.
package server

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/nri"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// Network is the pod network (package cni).
type Network interface {
	// Status is nil exactly when a usable network config exists.
	Status() error
	Setup(ctx context.Context, pod cni.Pod) (*cni.Result, error)
	Teardown(ctx context.Context, pod cni.Pod) error
}

// Namespaces creates and pins pod namespaces (package nsmgr).
type Namespaces interface {
	Create(ctx context.Context, req nsmgr.CreateRequest) (nsmgr.Pins, error)
	Open(ctx context.Context, id string, kinds []nsmgr.Kind) (nsmgr.Pins, error)
	Remove(ctx context.Context, id string) error
}

// Images is the image store and rootfs mounter (package image).
type Images interface {
	Pull(ctx context.Context, ref string, auth *image.Auth, opts ...image.PullOption) (*image.Image, error)
	Get(ref string) (*image.Image, error)
	List() []image.Image
	Remove(ctx context.Context, ref string) error
	FsUsage() (bytes, inodes uint64, err error)
	// ConfigFile is the whole image config (platform, history), for a
	// verbose ImageStatus.
	ConfigFile(ref string) (*v1.ConfigFile, error)
	Root() string
	MountRootfs(ctx context.Context, req image.MountRequest) (string, error)
	// MountImageVolume mounts an image read-only for a container and
	// returns the host path to bind.
	MountImageVolume(ctx context.Context, req image.VolumeRequest) (string, error)
	// UnmountRootfs unmounts a container's image volumes and rootfs.
	UnmountRootfs(ctx context.Context, containerID, podID, dir string) error
	ReleasePod(ctx context.Context, podID string) error
	Usage(dir string) (bytes, inodes uint64, err error)
	// TopLayerFiles calls fn with each regular file of an image's top
	// layer (a checkpoint image's files).
	TopLayerFiles(ref string, fn func(name string, r io.Reader) error) error
}

// Shm mounts a pod's shared /dev/shm.
type Shm interface {
	Mount(path string, uid, gid uint32) error
	Unmount(path string) error
}

// ContainerRuntime is one OCI runtime handler (package oci, *oci.Runtime).
type ContainerRuntime interface {
	Create(ctx context.Context, o oci.CreateOptions) (int, error)
	// Prepare writes a container's bundle without creating it in the
	// runtime; CreatePrepared creates it there later (at its start).
	Prepare(o oci.CreateOptions) error
	CreatePrepared(ctx context.Context, id string) (int, error)
	// Reset undoes an interrupted CreatePrepared, back to the bundle.
	Reset(ctx context.Context, id string) error
	// WaitRestore waits for the restore an interrupted CreatePrepared
	// of a checkpoint left under way: the pid and true once it runs.
	WaitRestore(ctx context.Context, id string, wait time.Duration) (int, bool)
	Start(ctx context.Context, id string) error
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error
	Delete(ctx context.Context, id string, force bool) error
	// Reap deletes an exited container from the OCI runtime and keeps
	// its state for State, ExitState and a later Delete.
	Reap(ctx context.Context, id string) error
	State(ctx context.Context, id string) (*oci.State, error)
	// ExitState is the state of a container whose exit conmon recorded,
	// without a runtime call; ok is false while it has not exited.
	ExitState(id string) (st *oci.State, ok bool)
	// ExitFile is where conmon writes the container's exit file, "" for
	// a container the runtime has no record of.
	ExitFile(id string) string
	ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error)
	Update(ctx context.Context, id string, res *specs.LinuxResources) error
	// FinishUpdate completes an Update a crash cut short, so that the
	// cgroup and config.json agree again; a no-op without one.
	FinishUpdate(ctx context.Context, id string) error
	ReopenLog(ctx context.Context, id string) error
	// Checkpoint dumps a running container with CRIU into imageDir (its
	// log into workDir) and leaves it running.
	Checkpoint(ctx context.Context, id, imageDir, workDir string) error
	Features(ctx context.Context) (*oci.Features, error)
	CheckIDMap(ctx context.Context) error
	// Probe fails when the runtime cannot run the containers pinrt makes.
	Probe(ctx context.Context) error
}

var (
	_ Shm              = sandbox.Tmpfs{}
	_ Network          = (*cni.Manager)(nil)
	_ Namespaces       = (*nsmgr.Manager)(nil)
	_ Images           = (*image.Store)(nil)
	_ ContainerRuntime = (*oci.Runtime)(nil)
)

// Deps are the side-effect boundaries the server drives, plus the ID
// allocator, which is a plain in-memory model.
type Deps struct {
	Network    Network
	Namespaces Namespaces
	IDs        *nsmgr.Allocator
	Images     Images
	// Runtimes are the OCI runtimes by handler name. A configured handler
	// whose binary was missing at start has no entry.
	Runtimes map[string]ContainerRuntime
	// Shm defaults to sandbox.Tmpfs.
	Shm Shm
	// Cgroups defaults to a reader of the host's /sys/fs/cgroup, closed by
	// Close.
	Cgroups Cgroups
	// NetCounters defaults to an nsmgr.Counters, closed by Close.
	NetCounters NetCounters
	// Metrics records pinrt's operations; nil records nothing.
	Metrics Recorder
	// CgroupDriver places pods and containers in cgroups; nil means
	// cgroupfs under runtime.cgroup_parent.
	CgroupDriver cgroups.Driver
	// CDI resolves CDI devices; nil refuses containers that ask for one.
	CDI *oci.CDIRegistry
	// Pause is the static binary the pause process of shared-PID pods
	// runs as `<Pause> pause` (pinrt-exec); "" runs the daemon's own.
	Pause string
}

// Server serves CRI. RPCs not built yet answer Unimplemented through the
// embedded generated types.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	cfg  *conf.Config
	deps Deps

	sandboxes *sandbox.Store[*sandbox.Sandbox]
	podNames  *sandbox.Names

	containers *sandbox.Store[*sandbox.Container]
	ctrNames   *sandbox.Names
	hostPaths  *hostPaths
	pause      pauseRootfs
	// reserve is room kept for the records a stop or removal needs.
	reserve *reserve

	// probes are the handlers' probe results, taken once (probeRuntimes).
	probeOnce sync.Once
	probes    map[string]error
	streams   Streams // nil until SetStreams
	// nri relays lifecycle events to NRI plugins; a nil *nri.NRI (NRI
	// disabled) until SetNRI.
	nri    NRI
	stats  *statsState
	events *eventBus
	exits  exitWatcher
	// monitors watch each running container's conmon (monitors.go).
	monitors monitorWatch
	// resources caches the limits ContainerStatus reports.
	resources resourcesCache
	// reaping bounds the background deletes of exited containers.
	reaping chan struct{}
	// starting holds the IDs of containers whose start is being
	// recorded: their exits wait for it (startContainer).
	starting sync.Map
	oom      *podOOM
	// podResources are the last UpdatePodSandboxResources of each pod
	// (*runtimeapi.UpdatePodSandboxResourcesRequest), and podCIDR the
	// last UpdateRuntimeConfig's (string); both only in memory: kubelet
	// sends them again after a restart.
	podResources sync.Map
	podCIDR      atomic.Value
	// stopBackground ends the loops New started.
	stopBackground context.CancelFunc
}

// New returns a server for cfg driving deps.
func New(cfg *conf.Config, deps Deps) *Server {
	if deps.Shm == nil {
		deps.Shm = sandbox.Tmpfs{}
	}
	if deps.Cgroups == nil {
		deps.Cgroups = cgroups.NewReader(cgroups.DefaultRoot)
	}
	if deps.CgroupDriver == nil {
		// cgroupfs takes any parent: New cannot fail for it.
		deps.CgroupDriver, _ = cgroups.New(cgroups.DriverCgroupfs, cfg.Runtime.CgroupParent)
	}
	if deps.NetCounters == nil {
		deps.NetCounters = nsmgr.NewCounters()
	}
	instrumentDeps(&deps)
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, deps: deps, reaping: make(chan struct{}, reapParallel),
		sandboxes: sandbox.NewStore[*sandbox.Sandbox]("sandbox"),
		podNames:  sandbox.NewNames(),

		containers: sandbox.NewStore[*sandbox.Container]("container"),
		ctrNames:   sandbox.NewNames(),

		stats:          newStatsState(),
		oom:            newPodOOM(),
		events:         newEventBus(),
		stopBackground: cancel,
		nri:            (*nri.NRI)(nil),
	}
	s.hostPaths = newHostPaths(s.mountsUnder)
	s.reserve = newReserve(cfg.Root)
	if s.deps.Network != nil {
		s.deps.Network = cidrNetwork{Network: s.deps.Network, cidrs: s.podCIDRs}
	}
	interval := cfg.Metrics.DiskUsageInterval.Std()
	if interval <= 0 {
		interval = DefaultDiskUsageInterval
	}
	go s.diskUsageLoop(ctx, interval)
	return s
}

// Restore probes the runtime handlers and loads the pods and containers
// recorded on disk. It runs before the socket opens, so kubelet never sees
// a half-restored runtime.
func (s *Server) Restore(ctx context.Context) {
	s.probeRuntimes(ctx)
	s.sweepCheckpoints(ctx)
	doomed := s.restorePods(ctx)
	s.restoreContainers(ctx, doomed)
	s.teardownPods(ctx, doomed)
	s.finishStops(ctx)
	s.pruneExits(ctx)
	s.reserve.fill(ctx)
}

// Register adds both CRI services to g.
func (s *Server) Register(g *grpc.Server) {
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	runtimeapi.RegisterImageServiceServer(g, s)
}

// EndStreams ends the GetContainerEvents streams, so a graceful stop of
// the gRPC server is not held up by subscribers that never hang up.
func (s *Server) EndStreams() { s.events.close() }

// Close releases what the server holds. It leaves pods and containers
// running: they outlive the daemon by design.
func (s *Server) Close(ctx context.Context) error {
	s.stopBackground()
	s.events.close()
	if s.exits.w != nil {
		_ = s.exits.w.Close()
	}
	s.closeMonitors()
	// The stats readers hold a netlink socket and cgroup files open.
	for _, d := range []any{s.deps.NetCounters, s.deps.Cgroups} {
		if c, ok := d.(io.Closer); ok {
			_ = c.Close()
		}
	}
	return nil
}

// placeContainerCgroup is the cgroupsPath of container id in the pod, from the
// cgroup driver, after making sure the pod's parent exists.
func (s *Server) placeContainerCgroup(ctx context.Context, kubeletParent, sandboxID, id string) (string, error) {
	parent, err := s.deps.CgroupDriver.PodParent(kubeletParent, sandboxID)
	if err != nil {
		return "", err
	}
	if err := s.deps.CgroupDriver.EnsurePod(ctx, parent); err != nil {
		return "", fmt.Errorf("creating the pod cgroup %s: %w", parent, err)
	}
	return s.deps.CgroupDriver.ContainerPath(parent, id), nil
}
