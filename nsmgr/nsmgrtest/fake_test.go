package nsmgrtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/nsmgr"
)

// manager is the method set a consumer declares; the fake must satisfy it
// exactly as *nsmgr.Manager does.
type manager interface {
	Create(context.Context, nsmgr.CreateRequest) (nsmgr.Pins, error)
	Open(context.Context, string, []nsmgr.Kind) (nsmgr.Pins, error)
	Remove(context.Context, string) error
	Path(nsmgr.Kind, string) string
}

var (
	_ manager = (*Manager)(nil)
	_ manager = (*nsmgr.Manager)(nil)
)

func TestFakeLifecycle(t *testing.T) {
	ctx := context.Background()
	m := New("/run/test")
	pins, err := m.Create(ctx, nsmgr.CreateRequest{ID: "p", Kinds: []nsmgr.Kind{nsmgr.Net, nsmgr.UTS}})
	if err != nil {
		t.Fatal(err)
	}
	want := nsmgr.Pins{nsmgr.Net: "/run/test/ns/net/p", nsmgr.UTS: "/run/test/ns/uts/p"}
	if fmt.Sprint(pins) != fmt.Sprint(want) {
		t.Fatalf("pins = %v, want %v", pins, want)
	}
	if _, err := m.Create(ctx, nsmgr.CreateRequest{ID: "p", Kinds: []nsmgr.Kind{nsmgr.Net}}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second Create = %v, want AlreadyExists", err)
	}
	if got, err := m.Open(ctx, "p", []nsmgr.Kind{nsmgr.Net}); err != nil || got[nsmgr.Net] != want[nsmgr.Net] {
		t.Fatalf("Open = %v, %v", got, err)
	}
	if _, err := m.Open(ctx, "p", []nsmgr.Kind{nsmgr.IPC}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Open of an absent kind = %v, want NotFound", err)
	}
	for range 2 {
		if err := m.Remove(ctx, "p"); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	if m.Pinned("p") != nil {
		t.Fatal("pins kept after Remove")
	}
	var methods []string
	for _, c := range m.Calls() {
		methods = append(methods, c.Method+" "+c.ID)
	}
	if got, want := fmt.Sprint(methods), "[Create p Create p Open p Open p Remove p Remove p]"; got != want {
		t.Fatalf("calls = %s, want %s", got, want)
	}
}

func TestFakeErrorInjection(t *testing.T) {
	ctx := context.Background()
	m := New("/run/test")
	boom := fmt.Errorf("boom: %w", errdefs.ErrUnavailable)
	m.CreateErr = boom
	if _, err := m.Create(ctx, nsmgr.CreateRequest{ID: "p", Kinds: []nsmgr.Kind{nsmgr.Net}}); !errors.Is(err, boom) {
		t.Fatalf("Create = %v, want injected error", err)
	}
	if m.Pinned("p") != nil {
		t.Fatal("failed Create recorded pins")
	}
	m.CreateErr = nil
	if _, err := m.Create(ctx, nsmgr.CreateRequest{ID: "p", Kinds: []nsmgr.Kind{nsmgr.Net}}); err != nil {
		t.Fatal(err)
	}
	m.OpenErr["p"] = boom
	if _, err := m.Open(ctx, "p", []nsmgr.Kind{nsmgr.Net}); !errors.Is(err, boom) {
		t.Fatalf("Open = %v, want injected error", err)
	}
	m.RemoveErr["p"] = boom
	if err := m.Remove(ctx, "p"); !errors.Is(err, boom) {
		t.Fatalf("Remove = %v, want injected error", err)
	}
	if m.Pinned("p") == nil {
		t.Fatal("failed Remove dropped the pins")
	}
	// The fake validates like the real Manager before any side effect.
	if _, err := m.Create(ctx, nsmgr.CreateRequest{ID: "../x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Create with a bad ID = %v, want InvalidArgument", err)
	}
	if _, err := m.Create(ctx, nsmgr.CreateRequest{ID: "q", Sysctls: map[string]string{"net.ipv4.ip_forward": "1"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Create with a host-net sysctl = %v, want InvalidArgument", err)
	}
}
