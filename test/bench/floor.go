package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The floor of the read calls is what ContainerStatus, ListContainers,
// ListPodSandbox and ListContainerStats cost through this gRPC transport and client when the
// runtime's handlers cost nothing. The status scenario captures the
// runtime's own replies, serves them again from a server that does
// nothing but marshal them (pinrt-bench floor-server, a process of its
// own as a runtime is), and times the same calls against it, a round
// after each round against the runtime. A runtime's
// figure over its floor is what the runtime itself adds; a target below
// the floor cannot be met by any runtime that sends the same reply.

// Floor op names: the same calls against the floor server.
const (
	floorSuffix             = " floor"
	OpContainerStatusFloor  = OpContainerStatus + floorSuffix
	OpContainerStatusVFloor = OpContainerStatusV + floorSuffix
	OpListContainersFloor   = OpListContainers + floorSuffix
	OpListPodSandboxFloor   = OpListPodSandbox + floorSuffix
	OpListCtrStatsFloor     = OpListCtrStats + floorSuffix
)

// FloorReplies are a runtime's replies, as it marshalled them.
type FloorReplies struct {
	ListContainers []byte            `json:"list_containers"`
	ListPodSandbox []byte            `json:"list_pod_sandbox"`
	ListCtrStats   []byte            `json:"list_container_stats"`
	Status         map[string][]byte `json:"status"`         // container ID → ContainerStatusResponse
	StatusVerbose  map[string][]byte `json:"status_verbose"` // the same with Verbose
}

// StartFloor starts a floor server for replies and returns its endpoint
// and a function that stops it.
type StartFloor func(ctx context.Context, replies *FloorReplies) (endpoint string, stop func(), err error)

// CaptureFloor asks c for the replies the status scenario times: the
// three lists and every container's status, plain and verbose.
func CaptureFloor(ctx context.Context, c *Client, ids []string) (*FloorReplies, error) {
	rep := &FloorReplies{Status: map[string][]byte{}, StatusVerbose: map[string][]byte{}}
	call := func(dst *[]byte, rpc func(context.Context) (proto.Message, error)) error {
		rctx, cancel := c.rpc(ctx)
		defer cancel()
		m, err := rpc(rctx)
		if err != nil {
			return err
		}
		*dst, err = proto.Marshal(m)
		return err
	}
	if err := call(&rep.ListContainers, func(ctx context.Context) (proto.Message, error) {
		return c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	}); err != nil {
		return nil, fmt.Errorf("ListContainers: %w", err)
	}
	if err := call(&rep.ListPodSandbox, func(ctx context.Context) (proto.Message, error) {
		return c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	}); err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	if err := call(&rep.ListCtrStats, func(ctx context.Context) (proto.Message, error) {
		return c.Runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
	}); err != nil {
		return nil, fmt.Errorf("ListContainerStats: %w", err)
	}
	for _, id := range ids {
		for _, verbose := range []bool{false, true} {
			var b []byte
			if err := call(&b, func(ctx context.Context) (proto.Message, error) {
				return c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
			}); err != nil {
				return nil, fmt.Errorf("ContainerStatus %s: %w", id, err)
			}
			if verbose {
				rep.StatusVerbose[id] = b
			} else {
				rep.Status[id] = b
			}
		}
	}
	return rep, nil
}

// floorServer answers the read calls with the captured replies. They are
// unmarshalled once; each call marshals its reply again, as any runtime
// does.
type floorServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	containers      *runtimeapi.ListContainersResponse
	sandboxes       *runtimeapi.ListPodSandboxResponse
	stats           *runtimeapi.ListContainerStatsResponse
	status, verbose map[string]*runtimeapi.ContainerStatusResponse
}

func newFloorServer(rep *FloorReplies) (*floorServer, error) {
	s := &floorServer{
		containers: &runtimeapi.ListContainersResponse{},
		sandboxes:  &runtimeapi.ListPodSandboxResponse{},
		stats:      &runtimeapi.ListContainerStatsResponse{},
		status:     map[string]*runtimeapi.ContainerStatusResponse{},
		verbose:    map[string]*runtimeapi.ContainerStatusResponse{},
	}
	if err := proto.Unmarshal(rep.ListContainers, s.containers); err != nil {
		return nil, fmt.Errorf("ListContainers reply: %w", err)
	}
	if err := proto.Unmarshal(rep.ListPodSandbox, s.sandboxes); err != nil {
		return nil, fmt.Errorf("ListPodSandbox reply: %w", err)
	}
	if err := proto.Unmarshal(rep.ListCtrStats, s.stats); err != nil {
		return nil, fmt.Errorf("ListContainerStats reply: %w", err)
	}
	for _, set := range []struct {
		from map[string][]byte
		to   map[string]*runtimeapi.ContainerStatusResponse
	}{{rep.Status, s.status}, {rep.StatusVerbose, s.verbose}} {
		for id, b := range set.from {
			m := &runtimeapi.ContainerStatusResponse{}
			if err := proto.Unmarshal(b, m); err != nil {
				return nil, fmt.Errorf("ContainerStatus reply of %s: %w", id, err)
			}
			set.to[id] = m
		}
	}
	return s, nil
}

func (s *floorServer) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return s.containers, nil
}

func (s *floorServer) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return s.sandboxes, nil
}

func (s *floorServer) ListContainerStats(context.Context, *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return s.stats, nil
}

func (s *floorServer) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	m := s.status
	if req.GetVerbose() {
		m = s.verbose
	}
	if r, ok := m[req.GetContainerId()]; ok {
		return r, nil
	}
	return nil, status.Errorf(codes.NotFound, "container %q was not captured", req.GetContainerId())
}

// ServeFloor reads FloorReplies as JSON from r and serves them on a unix
// socket until ctx ends. The socket exists once the server accepts.
func ServeFloor(ctx context.Context, socket string, r io.Reader) error {
	var rep FloorReplies
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return fmt.Errorf("reading the replies: %w", err)
	}
	s, err := newFloorServer(&rep)
	if err != nil {
		return err
	}
	// Listen on a temporary name and rename it into place, so a waiter
	// that sees the socket can connect.
	tmp := socket + ".tmp"
	_ = os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, socket); err != nil {
		_ = ln.Close()
		return err
	}
	defer func() { _ = os.Remove(socket) }()
	// The same message size limits as the runtimes measured.
	g := grpc.NewServer(grpc.MaxRecvMsgSize(maxMsgSize), grpc.MaxSendMsgSize(maxMsgSize))
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
