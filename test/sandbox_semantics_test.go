package test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// api.proto: stopping or removing a pod or container that does not exist
// (or no longer exists) must not return an error; kubelet retries removals
// whose answers it lost. A malformed ID is still InvalidArgument.
func TestStopRemoveUnknownSucceed(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	ctx := Ctx(t)
	gone := d.RunPod(t, PodConfig("gone"))
	if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: gone}); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(id string) error{
		"StopPodSandbox": func(id string) error {
			_, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			return err
		},
		"RemovePodSandbox": func(id string) error {
			_, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
			return err
		},
		"StopContainer": func(id string) error {
			_, err := d.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
			return err
		},
		"RemoveContainer": func(id string) error {
			_, err := d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		},
	}
	for _, tc := range []struct {
		name string
		id   string
		code codes.Code
	}{
		{"removed", gone, codes.OK},
		{"never existed", strings.Repeat("5a", 32), codes.OK},
		{"empty", "", codes.InvalidArgument},
		{"malformed", "../x", codes.InvalidArgument},
	} {
		for rpc, call := range calls {
			if err := call(tc.id); status.Code(err) != tc.code {
				t.Errorf("%s %s(%q) = %v, want %v", tc.name, rpc, tc.id, err, tc.code)
			}
		}
	}
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
	}
}
