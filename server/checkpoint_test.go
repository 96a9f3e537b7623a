package server

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCheckpointPodUnimplemented(t *testing.T) {
	s := newPodFixture(t).srv
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
	}{
		{"CheckpointPod", func() error {
			_, err := s.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: "p1"})
			return err
		}},
		{"RestorePod", func() error {
			_, err := s.RestorePod(ctx, &runtimeapi.RestorePodRequest{CheckpointPath: "/x.tar"})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "pinrt") {
				t.Fatalf("err = %v, want NotImplemented saying what pinrt lacks", err)
			}
		})
	}
}

// TestCheckpointUnimplementedOverGRPC asks over a socket, through the
// interceptors, as a CRI client does: each pod RPC must answer exactly
// Unimplemented, with a message saying what is missing, and a container
// checkpoint of an unknown container NotFound. A pod RPC left to
// the embedded Unimplemented server would say only "method not
// implemented". (kubelet 1.37 has the pod RPCs in its CRI client but no
// caller of them yet.)
func TestCheckpointUnimplementedOverGRPC(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(UnaryInterceptor), grpc.ChainStreamInterceptor(StreamInterceptor))
	newPodFixture(t).srv.Register(g)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"CheckpointPod", func() error {
			_, err := c.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: "p1", OutputPath: "/ckpt", ContainerIds: []string{"c1"}})
			return err
		}, "checkpointing pod p1: pinrt checkpoints containers"},
		{"RestorePod", func() error {
			_, err := c.RestorePod(ctx, &runtimeapi.RestorePodRequest{CheckpointPath: "/ckpt", Config: &runtimeapi.PodSandboxConfig{}})
			return err
		}, `restoring a pod from "/ckpt": pinrt has no checkpoint restore`},
	}
	_, err = c.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: "c1", Location: filepath.Join(t.TempDir(), "x.tar")})
	if status.Code(err) != codes.NotFound {
		t.Errorf("CheckpointContainer of an unknown container: %v, want NotFound", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != codes.Unimplemented || !strings.HasPrefix(status.Convert(err).Message(), tc.want) {
				t.Fatalf("err = %v, want Unimplemented starting %q", err, tc.want)
			}
		})
	}
}
