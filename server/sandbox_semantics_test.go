package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/internal/validate"
)

// Labels and annotations come back in every List response; a pod or
// container with more than the API server's 256 KiB is refused, so a List
// response stays under the gRPC message limit.
func TestLabelsAndAnnotationsAreBounded(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	over := map[string]string{"big": strings.Repeat("x", validate.MaxMetadataBytes)}
	under := map[string]string{"big": strings.Repeat("x", validate.MaxMetadataBytes-len("big")-len("app")-len("web"))}
	for _, tc := range []struct {
		name        string
		labels, ann map[string]string
		want        error
	}{
		{"annotations over", map[string]string{"app": "web"}, over, errdefs.ErrInvalidArgument},
		{"labels over", over, nil, errdefs.ErrInvalidArgument},
		{"exactly at the bound", map[string]string{"app": "web"}, under, nil},
	} {
		t.Run(tc.name+"/pod", func(t *testing.T) {
			req := unitPod("big-"+strings.ReplaceAll(tc.name, " ", "-"), false)
			req.Config.Labels, req.Config.Annotations = tc.labels, tc.ann
			_, err := f.srv.RunPodSandbox(ctx, req)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("RunPodSandbox = %v, want %v", err, tc.want)
			}
		})
		t.Run(tc.name+"/container", func(t *testing.T) {
			cfg := unitCtr("c-" + strings.ReplaceAll(tc.name, " ", "-"))
			cfg.Labels, cfg.Annotations = tc.labels, tc.ann
			_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("CreateContainer = %v, want %v", err, tc.want)
			}
		})
	}
}
