package cnitest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/cni"
)

// network is the method set a consumer of cni.Manager declares; both the
// real Manager and the fake must satisfy it.
type network interface {
	Status() error
	Setup(context.Context, cni.Pod) (*cni.Result, error)
	Teardown(context.Context, cni.Pod) error
	Close() error
}

var (
	_ network = (*cni.Manager)(nil)
	_ network = (*Fake)(nil)
)

func TestFake(t *testing.T) {
	ctx := context.Background()
	f := &Fake{}
	a, err := f.Setup(ctx, cni.Pod{ID: "a", NetNS: "/ns/a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Setup(ctx, cni.Pod{ID: "b", NetNS: "/ns/b"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.Setup(ctx, cni.Pod{ID: "a", NetNS: "/ns/a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{a.IPs[0], b.IPs[0], again.IPs[0]}; !reflect.DeepEqual(got, []string{"10.89.0.2", "10.89.0.3", "10.89.0.2"}) {
		t.Fatalf("IPs = %v", got)
	}
	if err := f.Teardown(ctx, cni.Pod{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	if got := f.Attached(); !reflect.DeepEqual(got, map[string]string{"b": "10.89.0.3"}) {
		t.Fatalf("Attached = %v", got)
	}

	f.SetupErr = errdefs.ErrUnavailable
	if _, err := f.Setup(ctx, cni.Pod{ID: "c", NetNS: "/ns/c"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Setup err = %v", err)
	}
	f.StatusErr = errdefs.ErrFailedPrecondition
	if err := f.Status(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Status err = %v", err)
	}
	f.TeardownErr = errdefs.ErrUnknown
	if err := f.Teardown(ctx, cni.Pod{ID: "b"}); !errors.Is(err, errdefs.ErrUnknown) {
		t.Fatalf("Teardown err = %v", err)
	}
	var ops []string
	for _, c := range f.Calls() {
		ops = append(ops, c.Op+":"+c.Pod.ID)
	}
	want := []string{"Setup:a", "Setup:b", "Setup:a", "Teardown:a", "Setup:c", "Teardown:b"}
	if !reflect.DeepEqual(ops, want) {
		t.Fatalf("calls = %v, want %v", ops, want)
	}
	if err := f.Close(); err != nil || !f.Closed() {
		t.Fatalf("Close = %v, Closed = %v", err, f.Closed())
	}
}

// A Setup whose rollback failed leaves the pod attached, as the real
// Manager's does, and says so with cni.ErrRollback.
func TestFakeRollbackErr(t *testing.T) {
	ctx := context.Background()
	f := &Fake{RollbackErr: errors.New("bridge: DEL failed")}
	_, err := f.Setup(ctx, cni.Pod{ID: "a", NetNS: "/ns/a"})
	if !errors.Is(err, cni.ErrRollback) || !errors.Is(err, f.RollbackErr) || !errors.Is(err, errdefs.ErrUnknown) {
		t.Fatalf("Setup err = %v, want ErrUnknown, cni.ErrRollback and RollbackErr", err)
	}
	if _, ok := f.Attached()["a"]; !ok {
		t.Fatalf("Attached = %v, want a kept", f.Attached())
	}
	if err := f.Teardown(ctx, cni.Pod{ID: "a"}); err != nil || len(f.Attached()) != 0 {
		t.Fatalf("Teardown = %v, Attached = %v", err, f.Attached())
	}
}
