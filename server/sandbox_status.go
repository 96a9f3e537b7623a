package server

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/sandbox"
)

// PodSandboxStatus reports a pod's state and IPs.
func (s *Server) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	sb, err := s.sandboxes.Get(req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: podStatus(sb)}
	if req.Verbose {
		if resp.Info, err = s.podInfo(sb); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// ListPodSandbox lists pods matching the filter.
func (s *Server) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f := req.GetFilter()
	list := s.sandboxes.List()
	// Allocated together, as ListContainers' messages.
	items := make([]*runtimeapi.PodSandbox, 0, len(list))
	msgs := make([]runtimeapi.PodSandbox, len(list))
	metas := make([]runtimeapi.PodSandboxMetadata, len(list))
	for i, sb := range list {
		st := podState(sb)
		if f != nil {
			if f.Id != "" && !strings.HasPrefix(sb.ID, f.Id) {
				continue
			}
			if f.State != nil && f.State.State != st {
				continue
			}
			if !labelsMatch(sb.Labels, f.LabelSelector) {
				continue
			}
		}
		m, md := &msgs[i], &metas[i]
		md.Name, md.Namespace, md.Uid, md.Attempt = sb.Name, sb.Namespace, sb.UID, sb.Attempt
		m.Id, m.Metadata, m.State, m.CreatedAt = sb.ID, md, st, sb.CreatedAt.UnixNano()
		m.Labels, m.Annotations, m.RuntimeHandler = sb.Labels, sb.Annotations, sb.Handler
		items = append(items, m)
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func podState(sb *sandbox.Sandbox) runtimeapi.PodSandboxState {
	if sb.Status().State == sandbox.StateReady {
		return runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return runtimeapi.PodSandboxState_SANDBOX_NOTREADY
}

func podMetadata(sb *sandbox.Sandbox) *runtimeapi.PodSandboxMetadata {
	return &runtimeapi.PodSandboxMetadata{Name: sb.Name, Namespace: sb.Namespace, Uid: sb.UID, Attempt: sb.Attempt}
}

func podStatus(sb *sandbox.Sandbox) *runtimeapi.PodSandboxStatus {
	st := &runtimeapi.PodSandboxStatus{
		Id: sb.ID, Metadata: podMetadata(sb), State: podState(sb), CreatedAt: sb.CreatedAt.UnixNano(),
		Labels: sb.Labels, Annotations: sb.Annotations, RuntimeHandler: sb.Handler,
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: namespaceOption(sb)}},
	}
	if len(sb.IPs) > 0 && podState(sb) == runtimeapi.PodSandboxState_SANDBOX_READY {
		st.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: sb.IPs[0]}
		for _, ip := range sb.IPs[1:] {
			st.Network.AdditionalIps = append(st.Network.AdditionalIps, &runtimeapi.PodIP{Ip: ip})
		}
	}
	return st
}

func toMode(m sandbox.NamespaceMode) runtimeapi.NamespaceMode {
	switch m {
	case sandbox.ModeNode:
		return runtimeapi.NamespaceMode_NODE
	case sandbox.ModeContainer:
		return runtimeapi.NamespaceMode_CONTAINER
	}
	return runtimeapi.NamespaceMode_POD
}

func namespaceOption(sb *sandbox.Sandbox) *runtimeapi.NamespaceOption {
	o := &runtimeapi.NamespaceOption{
		Network: toMode(sb.Modes.Network), Ipc: toMode(sb.Modes.IPC), Pid: toMode(sb.Modes.PID),
		UsernsOptions: &runtimeapi.UserNamespace{Mode: toMode(sb.Modes.User)},
	}
	for _, m := range sb.UIDMappings {
		o.UsernsOptions.Uids = append(o.UsernsOptions.Uids, &runtimeapi.IDMapping{HostId: m.HostID, ContainerId: m.ContainerID, Length: m.Size})
	}
	for _, m := range sb.GIDMappings {
		o.UsernsOptions.Gids = append(o.UsernsOptions.Gids, &runtimeapi.IDMapping{HostId: m.HostID, ContainerId: m.ContainerID, Length: m.Size})
	}
	return o
}

// podInfo is the verbose PodSandboxStatus info. A stopped pod's pins
// are gone (the stop removed them), so it lists none: a tool that would
// nsenter a pod must not be handed paths that no longer exist.
func (s *Server) podInfo(sb *sandbox.Sandbox) (map[string]string, error) {
	st := sb.Status()
	info := map[string]any{
		"uidMappings": sb.UIDMappings,
		"gidMappings": sb.GIDMappings,
		"allocated":   sb.Allocated,
		"configPath":  filepath.Join(sb.Dir, "config.json"),
		"status":      st,
	}
	if st.StoppedAt.IsZero() {
		info["pins"] = sb.Pins
		spec, pid := s.podSpec(sb)
		info["runtimeSpec"] = spec
		if pid > 0 {
			info["pid"] = pid
		}
	}
	if len(sb.CNIResult) > 0 {
		info["cniResult"] = sb.CNIResult
	}
	if r, ok := s.podResources.Load(sb.ID); ok {
		info["resources"] = r
	}
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("encoding sandbox info: %w", errdefs.ErrInternal)
	}
	return map[string]string{"info": string(b)}, nil
}

// podSpec describes a Ready pod as the OCI runtime spec of its own
// process, the shape containerd and CRI-O give the verbose status of a
// pod (their pause container's config.json). Node agents read it there:
// Multus and the network tools built on CRI find a pod's network
// namespace in info.runtimeSpec.linux.namespaces. A pinrt pod has no
// process unless its containers share one PID namespace, so the spec is
// its record's (config.json: the pinned namespaces, hostname, cgroup and
// the io.kubernetes.cri.sandbox-* annotations) with its ID mappings. A
// shared-PID pod's pause process adds its PID namespace, and its pid is
// returned, as containerd's info.pid.
func (s *Server) podSpec(sb *sandbox.Sandbox) (*specs.Spec, int) {
	spec := sb.Spec()
	spec.Linux.UIDMappings, spec.Linux.GIDMappings = sb.UIDMappings, sb.GIDMappings
	if sb.InfraID == "" || sb.InfraPid <= 0 {
		return spec, 0
	}
	// The pause process is InfraPid until conmon recorded its exit.
	rt, err := s.runtimeFor(sb.Handler)
	if err != nil {
		return spec, 0
	}
	if _, exited := rt.ExitState(sb.InfraID); exited {
		return spec, 0
	}
	pidNS := specs.LinuxNamespace{Type: specs.PIDNamespace, Path: fmt.Sprintf("/proc/%d/ns/pid", sb.InfraPid)}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, pidNS)
	return spec, sb.InfraPid
}
