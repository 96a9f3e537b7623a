// Package nritest is a hand-written fake of pinrt's NRI relay for unit
// tests of package server: it records the events and answers with the
// adjustments, updates, evictions and errors a test sets.
package nritest

import (
	"context"
	"sync"

	"github.com/containerd/nri/pkg/api"

	"github.com/pinrt/pinrt/nri"
)

// Fake records events as "Event name" (the pod's or container's name).
type Fake struct {
	mu     sync.Mutex
	events []string

	// Adjust, Update and Evict answer CreateContainer.
	Adjust *api.ContainerAdjustment
	Update []*api.ContainerUpdate
	Evict  []*api.ContainerEviction
	// Check runs the caller's check on Adjust, as pinrt's validator does.
	Check bool
	// UpdateReply answers UpdateContainer.
	UpdateReply []*api.ContainerUpdate
	// CreateErr fails CreateContainer, RunPodErr RunPodSandbox,
	// StartErr StartContainer and UpdatePodErr UpdatePodSandbox, as a
	// plugin's refusal would.
	CreateErr, RunPodErr, StartErr, UpdatePodErr error
	// PodResources are the resources UpdatePodSandbox was told, last.
	PodResources, PodOverhead *api.LinuxResources
	// BeforeStop runs as StopContainer begins, before it records the
	// event: a test holds a plugin's answer there.
	BeforeStop func()
	blocked    int
}

// Events returns the events seen so far.
func (f *Fake) Events() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

// Blocked is how many callers hold BlockSync now.
func (f *Fake) Blocked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked
}

func (f *Fake) record(event, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, event+" "+name)
}

func (f *Fake) BlockSync() func() {
	f.mu.Lock()
	f.blocked++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.blocked--
			f.mu.Unlock()
		})
	}
}

func (f *Fake) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	f.record("RunPodSandbox", pod.GetName())
	return f.RunPodErr
}

func (f *Fake) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, overhead, res *api.LinuxResources) error {
	f.record("UpdatePodSandbox", pod.GetName())
	f.mu.Lock()
	f.PodResources, f.PodOverhead = res, overhead
	f.mu.Unlock()
	return f.UpdatePodErr
}

func (f *Fake) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	f.record("PostUpdatePodSandbox", pod.GetName())
	return nil
}

func (f *Fake) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	f.record("StopPodSandbox", pod.GetName())
	return nil
}

func (f *Fake) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	f.record("RemovePodSandbox", pod.GetName())
	return nil
}

func (f *Fake) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container, check nri.CheckFunc) (*nri.Adjustment, error) {
	f.record("CreateContainer", c.GetName())
	if f.CreateErr != nil {
		return nil, f.CreateErr
	}
	if check != nil && f.Adjust != nil && f.Check {
		if err := check(f.Adjust); err != nil {
			return nil, err
		}
	}
	return &nri.Adjustment{Adjust: f.Adjust, Update: f.Update, Evict: f.Evict}, nil
}

func (f *Fake) PostCreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	f.record("PostCreateContainer", c.GetName())
	return nil
}

func (f *Fake) StartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	f.record("StartContainer", c.GetName())
	return f.StartErr
}

func (f *Fake) PostStartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	f.record("PostStartContainer", c.GetName())
	return nil
}

func (f *Fake) UpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, []*api.ContainerEviction, error) {
	f.record("UpdateContainer", c.GetName())
	return f.UpdateReply, nil, nil
}

func (f *Fake) PostUpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	f.record("PostUpdateContainer", c.GetName())
	return nil
}

func (f *Fake) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	if f.BeforeStop != nil {
		f.BeforeStop()
	}
	f.record("StopContainer", c.GetName())
	return nil, nil
}

func (f *Fake) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	f.record("RemoveContainer", c.GetName())
	return nil
}
