package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A second pinrt on the same --root (with its own run dir and socket) is
// refused before it loads or writes anything: it would find none of the
// first daemon's pins and rewrite every pod on disk as NotReady.
func TestSecondDaemonOnSameRootRefused(t *testing.T) {
	d := StartDaemon(t, Options{Network: true})
	id := d.RunPod(t, PodConfig("keep"))
	statusFile := filepath.Join(d.Root, "sandboxes", id, "status.json")
	before, err := os.ReadFile(statusFile)
	if err != nil {
		t.Fatal(err)
	}
	args := d.Args()
	for i, a := range args {
		switch a {
		case "--runroot":
			args[i+1] = filepath.Join(d.Dir, "run2")
		case "--listen":
			args[i+1] = filepath.Join(d.Dir, "second.sock")
		}
	}
	t.Cleanup(func() { ForceCleanup(filepath.Join(d.Dir, "run2")) })
	out, err := runWithTimeout(exec.Command(Binary(t), args...), 20*time.Second)
	if err == nil {
		t.Fatalf("second pinrt started on the same root:\n%s", out)
	}
	if !strings.Contains(out, "already running on root "+d.Root) {
		t.Errorf("second pinrt's message = %q, want it to say another pinrt is running on root %s", out, d.Root)
	}
	after, err := os.ReadFile(statusFile)
	if err != nil || string(after) != string(before) {
		t.Errorf("the pod's status file changed: %v\nbefore %s\nafter  %s", err, before, after)
	}
	st, _ := d.PodStatus(t, id)
	if st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod state after the refused daemon = %v, want READY", st.State)
	}
}
