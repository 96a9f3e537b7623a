// Package nri is the runtime side of the Node Resource Interface: it runs
// containerd/nri's adaptation (the plugin socket, pre-installed plugins,
// registration and synchronization) and relays pod and container
// lifecycle events to the plugins. The adjustments and updates plugins
// return are handed back to the caller (package server), which applies
// them through oci; this package knows nothing of pinrt's stores.
//
// A nil *NRI is NRI disabled: every method is a no-op, so callers need no
// checks of their own.
package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
)

// Config is the [nri] section, with containerd's names.
type Config struct {
	SocketPath          string
	PluginPath          string
	PluginConfigPath    string
	RegistrationTimeout time.Duration
	RequestTimeout      time.Duration
	// RuntimeName and RuntimeVersion are told to plugins.
	RuntimeName, RuntimeVersion string
}

// Runtime is what a connecting plugin is synchronized with, and what
// carries out the updates plugins ask for on their own.
type Runtime interface {
	// Snapshot lists every pod and container the runtime knows.
	Snapshot(ctx context.Context) ([]*api.PodSandbox, []*api.Container, error)
	// UpdateContainers applies updates and returns those that failed.
	UpdateContainers(ctx context.Context, updates []*api.ContainerUpdate) ([]*api.ContainerUpdate, error)
}

// NRI relays events to the connected plugins.
type NRI struct {
	a *adaptation.Adaptation
}

// New prepares NRI; Start opens the socket and starts the plugins.
func New(cfg Config, rt Runtime) (*NRI, error) {
	if rt == nil {
		return nil, fmt.Errorf("NRI without a runtime: %w", errdefs.ErrInvalidArgument)
	}
	// The adaptation keeps its timeouts in package variables: one NRI a
	// process.
	if cfg.RegistrationTimeout > 0 {
		adaptation.SetPluginRegistrationTimeout(cfg.RegistrationTimeout)
	}
	if cfg.RequestTimeout > 0 {
		adaptation.SetPluginRequestTimeout(cfg.RequestTimeout)
	}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		pods, ctrs, err := rt.Snapshot(ctx)
		if err != nil {
			return err
		}
		updates, err := cb(ctx, pods, ctrs)
		if err != nil {
			return err
		}
		if len(updates) == 0 {
			return nil
		}
		failed, err := rt.UpdateContainers(ctx, updates)
		if err != nil || len(failed) > 0 {
			log.G(ctx).WithError(err).Warnf("NRI: %d of %d updates a plugin asked for at synchronization failed", len(failed), len(updates))
		}
		return nil
	}
	name := cfg.RuntimeName
	if name == "" {
		name = "pinrt"
	}
	opts := []adaptation.Option{
		adaptation.WithSocketPath(cfg.SocketPath),
		adaptation.WithPluginPath(cfg.PluginPath),
		adaptation.WithPluginConfigPath(cfg.PluginConfigPath),
		// A plugin must not move a container out of the pod's pinned
		// namespaces or its user namespace; the validator names the
		// plugin that tried.
		adaptation.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true, RejectNamespaceAdjustment: true}),
		adaptation.WithBuiltinPlugins(checker()),
	}
	a, err := adaptation.New(name, cfg.RuntimeVersion, syncFn, rt.UpdateContainers, opts...)
	if err != nil {
		return nil, fmt.Errorf("NRI: %w", err)
	}
	return &NRI{a: a}, nil
}

// Start opens the plugin socket (mode 0600 in a 0700 directory: a plugin
// can rewrite any container, so only root may connect) and starts the
// pre-installed plugins.
func (n *NRI) Start(cfg Config) error {
	if n == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(cfg.SocketPath), 0o700); err != nil {
		return fmt.Errorf("NRI socket directory: %w", err)
	}
	if err := n.a.Start(); err != nil {
		return fmt.Errorf("starting NRI: %w", err)
	}
	if err := os.Chmod(cfg.SocketPath, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("NRI socket: %w", err)
	}
	return nil
}

// Stop closes the socket and disconnects the plugins.
func (n *NRI) Stop() {
	if n != nil {
		n.a.Stop()
	}
}

// BlockSync keeps plugins from synchronizing until the returned function
// runs. A pod or container being created holds it from the event until it
// is in the store, so a plugin connecting meanwhile sees it either in the
// synchronization or as an event, never neither.
func (n *NRI) BlockSync() func() {
	if n == nil {
		return func() {}
	}
	b := n.a.BlockPluginSync()
	return b.Unblock
}

// Adjustment is what plugins asked for when a container was created.
type Adjustment struct {
	Adjust *api.ContainerAdjustment
	Update []*api.ContainerUpdate
	Evict  []*api.ContainerEviction
}

// refused marks a plugin's refusal or invalid request; the adaptation's
// error already names the plugin.
func refused(event string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("NRI %s: %w: %w", event, err, errdefs.ErrFailedPrecondition)
}

// RunPodSandbox tells plugins a pod was created.
func (n *NRI) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	if n == nil {
		return nil
	}
	return refused("RunPodSandbox", n.a.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}))
}

// UpdatePodSandbox tells plugins about a pod's new resources (the sum of
// its containers') and overhead, before they are applied. An error is a
// refusal: the update must fail.
func (n *NRI) UpdatePodSandbox(ctx context.Context, pod *api.PodSandbox, overhead, res *api.LinuxResources) error {
	if n == nil {
		return nil
	}
	_, err := n.a.UpdatePodSandbox(ctx, &api.UpdatePodSandboxRequest{Pod: pod, OverheadLinuxResources: overhead, LinuxResources: res})
	return refused("UpdatePodSandbox", err)
}

// PostUpdatePodSandbox tells plugins a pod's resources changed.
func (n *NRI) PostUpdatePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	if n == nil {
		return nil
	}
	return refused("PostUpdatePodSandbox", n.a.PostUpdatePodSandbox(ctx, &api.PostUpdatePodSandboxRequest{Pod: pod}))
}

// StopPodSandbox tells plugins a pod was stopped.
func (n *NRI) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	if n == nil {
		return nil
	}
	return refused("StopPodSandbox", n.a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod}))
}

// RemovePodSandbox tells plugins a pod was removed.
func (n *NRI) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	if n == nil {
		return nil
	}
	return refused("RemovePodSandbox", n.a.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod}))
}

// CreateContainer asks plugins for their adjustments to a container
// about to be created. An error is a refusal: the creation must fail.
// check, when set, tries the merged adjustment first, so that one pinrt
// cannot apply is refused naming the plugins that made it.
func (n *NRI) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, check CheckFunc) (*Adjustment, error) {
	if n == nil {
		return &Adjustment{}, nil
	}
	if check != nil {
		ctx = context.WithValue(ctx, checkKey{}, check)
	}
	rpl, err := n.a.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, refused("CreateContainer", err)
	}
	return &Adjustment{Adjust: rpl.GetAdjust(), Update: rpl.GetUpdate(), Evict: rpl.GetEvict()}, nil
}

// PostCreateContainer tells plugins a container was created.
func (n *NRI) PostCreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if n == nil {
		return nil
	}
	return refused("PostCreateContainer", n.a.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr}))
}

// StartContainer tells plugins a container is about to start.
func (n *NRI) StartContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if n == nil {
		return nil
	}
	return refused("StartContainer", n.a.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr}))
}

// PostStartContainer tells plugins a container started.
func (n *NRI) PostStartContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if n == nil {
		return nil
	}
	return refused("PostStartContainer", n.a.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: ctr}))
}

// UpdateContainer asks plugins about new resources for a container; the
// updates may include this container's (the resources to really set).
func (n *NRI) UpdateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, res *api.LinuxResources) ([]*api.ContainerUpdate, []*api.ContainerEviction, error) {
	if n == nil {
		return nil, nil, nil
	}
	rpl, err := n.a.UpdateContainer(ctx, &api.UpdateContainerRequest{Pod: pod, Container: ctr, LinuxResources: res})
	if err != nil {
		return nil, nil, refused("UpdateContainer", err)
	}
	return rpl.GetUpdate(), rpl.GetEvict(), nil
}

// PostUpdateContainer tells plugins a container's resources changed.
func (n *NRI) PostUpdateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if n == nil {
		return nil
	}
	return refused("PostUpdateContainer", n.a.PostUpdateContainer(ctx, &api.PostUpdateContainerRequest{Pod: pod, Container: ctr}))
}

// StopContainer tells plugins a container stopped; they may update others.
func (n *NRI) StopContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	if n == nil {
		return nil, nil
	}
	rpl, err := n.a.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, refused("StopContainer", err)
	}
	return rpl.GetUpdate(), nil
}

// RemoveContainer tells plugins a container was removed.
func (n *NRI) RemoveContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if n == nil {
		return nil
	}
	return refused("RemoveContainer", n.a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr}))
}
