package ocitest

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/oci"
)

// runtime is the method set consumers declare; both must satisfy it.
type runtime interface {
	Create(ctx context.Context, o oci.CreateOptions) (int, error)
	Start(ctx context.Context, id string) error
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error
	Delete(ctx context.Context, id string, force bool) error
	State(ctx context.Context, id string) (*oci.State, error)
	ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error)
	Update(ctx context.Context, id string, res *specs.LinuxResources) error
	ReopenLog(ctx context.Context, id string) error
	Features(ctx context.Context) (*oci.Features, error)
	CheckIDMap(ctx context.Context) error
}

var (
	_ runtime = (*Runtime)(nil)
	_ runtime = (*oci.Runtime)(nil)
)

func TestFakeLifecycle(t *testing.T) {
	ctx := context.Background()
	r := New()
	if _, err := r.Create(ctx, oci.CreateOptions{ID: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, oci.CreateOptions{ID: "c"}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second create: %v", err)
	}
	if err := r.Start(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx, "c", syscall.SIGTERM, time.Second); err != nil {
		t.Fatal(err)
	}
	st, _ := r.State(ctx, "c")
	if st.Status != oci.StatusStopped || st.ExitCode != 143 {
		t.Errorf("state = %+v", st)
	}
	if err := r.CheckIDMap(ctx); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("CheckIDMap = %v", err)
	}
	r.DeleteErr = errdefs.ErrUnavailable
	if err := r.Delete(ctx, "c", false); !errdefs.IsUnavailable(err) {
		t.Errorf("injected delete error = %v", err)
	}
	want := []string{"create c", "create c", "start c", "stop c", "delete c"}
	if len(r.Calls) != len(want) {
		t.Fatalf("calls = %v", r.Calls)
	}
	for i := range want {
		if r.Calls[i] != want[i] {
			t.Errorf("calls = %v, want %v", r.Calls, want)
		}
	}
}
