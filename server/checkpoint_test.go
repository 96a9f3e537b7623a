package server

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCheckpointUnimplemented(t *testing.T) {
	s := newPodFixture(t).srv
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
	}{
		{"CheckpointContainer", func() error {
			_, err := s.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: "c1"})
			return err
		}},
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
			if !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "CRIU") {
				t.Fatalf("err = %v, want NotImplemented naming CRIU", err)
			}
		})
	}
}
