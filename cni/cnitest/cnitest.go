// Package cnitest provides Fake, a hand-written in-memory stand-in for
// cni.Manager, for unit tests of the packages that attach pods to the
// network.
package cnitest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/cni"
)

// Call records one Setup or Teardown.
type Call struct {
	Op  string // "Setup" or "Teardown"
	Pod cni.Pod
}

// Fake has the method set of cni.Manager. It hands out IPs 10.89.0.2,
// 10.89.0.3, ... in Setup order and records every call. The *Err fields,
// when set, are returned instead of doing anything (a failed Setup
// allocates nothing, like the real Manager after its rollback).
type Fake struct {
	StatusErr   error
	SetupErr    error
	TeardownErr error
	// RollbackErr makes Setup fail as an ADD whose own DEL failed too:
	// the pod keeps its IP (until a Teardown), and the error wraps
	// cni.ErrRollback and RollbackErr.
	RollbackErr error

	mu       sync.Mutex
	calls    []Call
	next     int
	attached map[string]string // sandbox id -> IP
	closed   bool
}

// Status returns StatusErr.
func (f *Fake) Status() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.StatusErr
}

// Setup records the call and returns the pod's IP, the same one again if
// the pod is already attached.
func (f *Fake) Setup(_ context.Context, pod cni.Pod) (*cni.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, Call{Op: "Setup", Pod: pod})
	if f.SetupErr != nil {
		return nil, f.SetupErr
	}
	if pod.ID == "" || pod.NetNS == "" {
		return nil, fmt.Errorf("fake cni setup: empty id or netns: %w", errdefs.ErrInvalidArgument)
	}
	if f.attached == nil {
		f.attached = map[string]string{}
	}
	ip, ok := f.attached[pod.ID]
	if !ok {
		f.next++
		ip = fmt.Sprintf("10.89.%d.%d", (f.next+1)/256, (f.next+1)%256)
		f.attached[pod.ID] = ip
	}
	if f.RollbackErr != nil {
		return nil, fmt.Errorf("fake cni add failed: %w; %w: %w", errdefs.ErrUnknown, cni.ErrRollback, f.RollbackErr)
	}
	raw, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"ips":        []map[string]string{{"address": ip + "/16"}},
	})
	return &cni.Result{IPs: []string{ip}, Interface: cni.IfName, Raw: raw, Network: "fake"}, nil
}

// Teardown records the call and releases the pod's IP. It is idempotent.
func (f *Fake) Teardown(_ context.Context, pod cni.Pod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, Call{Op: "Teardown", Pod: pod})
	if f.TeardownErr != nil {
		return f.TeardownErr
	}
	delete(f.attached, pod.ID)
	return nil
}

// Close marks the fake closed.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// Calls returns a copy of the calls so far.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}

// Attached returns the IP of each attached sandbox.
func (f *Fake) Attached() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]string, len(f.attached))
	for k, v := range f.attached {
		m[k] = v
	}
	return m
}

// Closed reports whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}
