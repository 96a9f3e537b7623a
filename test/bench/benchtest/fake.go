// Package benchtest provides a hand-written in-memory CRI server for testing
// the bench scenarios without a real runtime. It serves the few RPCs the
// tool uses over a unix socket and lets tests inject failures per method.
package benchtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type sandbox struct {
	config *runtimeapi.PodSandboxConfig
	state  runtimeapi.PodSandboxState
	ip     string
}

type container struct {
	sandbox string
	labels  map[string]string
	command []string
	state   runtimeapi.ContainerState
}

// Stop is a StopContainer call: its timeout and the stopped container's
// command.
type Stop struct {
	Timeout int64
	Command []string
}

// Server is an in-memory CRI runtime. The zero value is not usable; call
// Start.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	Socket string

	mu         sync.Mutex
	grpc       *grpc.Server
	sandboxes  map[string]*sandbox
	containers map[string]*container
	images     map[string]bool
	nextID     int
	hostIDs    []uint32
	fail       map[string]int
	calls      map[string]int
	stops      []Stop
	// NoContainers makes every container RPC return Unimplemented, like a
	// runtime that only does sandboxes so far.
	NoContainers bool
	// ChangeIPOnRestart gives every sandbox a new IP when Restart is called.
	ChangeIPOnRestart bool
}

// Start serves on socket (a path inside the test's temp dir) until Stop.
func Start(socket string) (*Server, error) {
	s := &Server{
		Socket:     socket,
		sandboxes:  map[string]*sandbox{},
		containers: map[string]*container{},
		images:     map[string]bool{},
		fail:       map[string]int{},
		calls:      map[string]int{},
	}
	return s, s.serve()
}

func (s *Server) serve() error {
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	runtimeapi.RegisterImageServiceServer(g, s)
	s.mu.Lock()
	s.grpc = g
	s.mu.Unlock()
	go func() { _ = g.Serve(ln) }()
	return nil
}

// Stop stops serving; state is kept.
func (s *Server) Stop() {
	s.mu.Lock()
	g := s.grpc
	s.mu.Unlock()
	g.Stop()
}

// Restart stops and serves again with the same state, like a runtime that
// restores its pods from disk.
func (s *Server) Restart() error {
	s.Stop()
	s.mu.Lock()
	if s.ChangeIPOnRestart {
		for _, sb := range s.sandboxes {
			sb.ip += "0"
		}
	}
	s.mu.Unlock()
	return s.serve()
}

// FailNext makes the next n calls of method (e.g. "RunPodSandbox") fail
// with codes.Internal.
func (s *Server) FailNext(method string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[method] = n
}

// Calls returns how many times method was called.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// Stops returns the StopContainer calls of running containers, in call
// order.
func (s *Server) Stops() []Stop {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Stop(nil), s.stops...)
}

// UsernsHostIDs returns the HostId of every UID mapping received by
// RunPodSandbox, in call order.
func (s *Server) UsernsHostIDs() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint32(nil), s.hostIDs...)
}

// Counts returns the number of live sandboxes and containers.
func (s *Server) Counts() (sandboxes, containers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sandboxes), len(s.containers)
}

// enter counts a call and returns the injected error, if any. It must be
// called with s.mu held.
func (s *Server) enter(method string) error {
	s.calls[method]++
	if s.fail[method] > 0 {
		s.fail[method]--
		return status.Errorf(codes.Internal, "injected failure in %s", method)
	}
	return nil
}

func (s *Server) containerRPC(method string) error {
	if s.NoContainers {
		s.calls[method]++
		return status.Errorf(codes.Unimplemented, "method %s not implemented", method)
	}
	return s.enter(method)
}

func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("Version"); err != nil {
		return nil, err
	}
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "fake", RuntimeVersion: "0.0.1", RuntimeApiVersion: "v1"}, nil
}

func (s *Server) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("RunPodSandbox"); err != nil {
		return nil, err
	}
	md := req.GetConfig().GetMetadata()
	for _, sb := range s.sandboxes {
		o := sb.config.GetMetadata()
		if o.GetName() == md.GetName() && o.GetNamespace() == md.GetNamespace() && o.GetUid() == md.GetUid() && o.GetAttempt() == md.GetAttempt() {
			return nil, status.Errorf(codes.AlreadyExists, "sandbox %s exists", md.GetName())
		}
	}
	for _, m := range req.GetConfig().GetLinux().GetSecurityContext().GetNamespaceOptions().GetUsernsOptions().GetUids() {
		s.hostIDs = append(s.hostIDs, m.GetHostId())
	}
	s.nextID++
	id := fmt.Sprintf("sb%d", s.nextID)
	sb := &sandbox{config: req.GetConfig(), state: runtimeapi.PodSandboxState_SANDBOX_READY}
	if req.GetConfig().GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() != runtimeapi.NamespaceMode_NODE {
		sb.ip = fmt.Sprintf("10.0.%d.%d", s.nextID/250, s.nextID%250+1)
	}
	s.sandboxes[id] = sb
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

func (s *Server) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("PodSandboxStatus"); err != nil {
		return nil, err
	}
	sb, ok := s.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "sandbox %s", req.GetPodSandboxId())
	}
	st := &runtimeapi.PodSandboxStatus{Id: req.GetPodSandboxId(), Metadata: sb.config.GetMetadata(), State: sb.state, Labels: sb.config.GetLabels()}
	if sb.ip != "" {
		st.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: sb.ip}
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: st}, nil
}

func (s *Server) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("StopPodSandbox"); err != nil {
		return nil, err
	}
	if sb, ok := s.sandboxes[req.GetPodSandboxId()]; ok {
		sb.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (s *Server) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("RemovePodSandbox"); err != nil {
		return nil, err
	}
	id := req.GetPodSandboxId()
	for cid, c := range s.containers {
		if c.sandbox == id {
			delete(s.containers, cid)
		}
	}
	delete(s.sandboxes, id)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (s *Server) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("ListPodSandbox"); err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListPodSandboxResponse{}
	for id, sb := range s.sandboxes {
		if !matches(sb.config.GetLabels(), req.GetFilter().GetLabelSelector()) {
			continue
		}
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{Id: id, Metadata: sb.config.GetMetadata(), State: sb.state, Labels: sb.config.GetLabels()})
	}
	return resp, nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (s *Server) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("CreateContainer"); err != nil {
		return nil, err
	}
	if _, ok := s.sandboxes[req.GetPodSandboxId()]; !ok {
		return nil, status.Errorf(codes.NotFound, "sandbox %s", req.GetPodSandboxId())
	}
	if !s.images[req.GetConfig().GetImage().GetImage()] {
		return nil, status.Errorf(codes.NotFound, "image %s", req.GetConfig().GetImage().GetImage())
	}
	// Like CRI-O (whose conmon creates the log file, not its directory),
	// the container's log directory must exist: kubelet creates it.
	if dir, lp := req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath(); dir != "" && lp != "" {
		if _, err := os.Stat(filepath.Dir(filepath.Join(dir, lp))); err != nil {
			return nil, status.Errorf(codes.Unknown, "container create failed: exit status 1: %v", err)
		}
	}
	s.nextID++
	id := fmt.Sprintf("c%d", s.nextID)
	s.containers[id] = &container{sandbox: req.GetPodSandboxId(), labels: req.GetConfig().GetLabels(), command: req.GetConfig().GetCommand(), state: runtimeapi.ContainerState_CONTAINER_CREATED}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (s *Server) setState(method, id string, st runtimeapi.ContainerState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC(method); err != nil {
		return err
	}
	c, ok := s.containers[id]
	if !ok {
		return status.Errorf(codes.NotFound, "container %s", id)
	}
	c.state = st
	return nil
}

func (s *Server) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	return &runtimeapi.StartContainerResponse{}, s.setState("StartContainer", req.GetContainerId(), runtimeapi.ContainerState_CONTAINER_RUNNING)
}

func (s *Server) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	s.mu.Lock()
	if c, ok := s.containers[req.GetContainerId()]; ok && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		s.stops = append(s.stops, Stop{Timeout: req.GetTimeout(), Command: c.command})
	}
	s.mu.Unlock()
	return &runtimeapi.StopContainerResponse{}, s.setState("StopContainer", req.GetContainerId(), runtimeapi.ContainerState_CONTAINER_EXITED)
}

func (s *Server) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("RemoveContainer"); err != nil {
		return nil, err
	}
	delete(s.containers, req.GetContainerId())
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (s *Server) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("ContainerStatus"); err != nil {
		return nil, err
	}
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %s", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: req.GetContainerId(), State: c.state, Labels: c.labels}}, nil
}

func (s *Server) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("ListContainers"); err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListContainersResponse{}
	for id, c := range s.containers {
		if matches(c.labels, req.GetFilter().GetLabelSelector()) {
			resp.Containers = append(resp.Containers, &runtimeapi.Container{Id: id, PodSandboxId: c.sandbox, State: c.state, Labels: c.labels})
		}
	}
	return resp, nil
}

// ListContainerStats reports every container, with no usage figures.
func (s *Server) ListContainerStats(context.Context, *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("ListContainerStats"); err != nil {
		return nil, err
	}
	resp := &runtimeapi.ListContainerStatsResponse{}
	for id, c := range s.containers {
		resp.Stats = append(resp.Stats, &runtimeapi.ContainerStats{Attributes: &runtimeapi.ContainerAttributes{Id: id, Labels: c.labels}})
	}
	return resp, nil
}

func (s *Server) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("ImageStatus"); err != nil {
		return nil, err
	}
	if !s.images[req.GetImage().GetImage()] {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:fake", RepoTags: []string{req.GetImage().GetImage()}}}, nil
}

func (s *Server) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.enter("PullImage"); err != nil {
		return nil, err
	}
	s.images[req.GetImage().GetImage()] = true
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:fake"}, nil
}

// ExecSync runs nothing: "echo ARGS..." answers ARGS and a newline on
// stdout, anything else exits 0 with no output. The container must be
// running.
func (s *Server) ExecSync(_ context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.containerRPC("ExecSync"); err != nil {
		return nil, err
	}
	c, ok := s.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %s", req.GetContainerId())
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not running", req.GetContainerId())
	}
	resp := &runtimeapi.ExecSyncResponse{}
	if cmd := req.GetCmd(); len(cmd) > 0 && cmd[0] == "echo" {
		resp.Stdout = []byte(strings.Join(cmd[1:], " ") + "\n")
	}
	return resp, nil
}
