package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/sandbox"
)

// RunPodSandbox creates a pod: its pinned namespaces, its network and its
// state on disk.
func (s *Server) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	pr, err := s.podRequest(req)
	if err != nil {
		return nil, err
	}
	sb, err := s.runPod(ctx, pr)
	if err != nil {
		return nil, err
	}
	podEvent(ctx, sb, "created")
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb.ID}, nil
}

// StopPodSandbox stops the pod's containers and releases its network and
// namespaces. It is idempotent, and an unknown ID is not an error, as
// kubelet expects.
func (s *Server) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	sb, gone, err := lookupForRemoval(s.sandboxes, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	wasReady := sb.Status().State == sandbox.StateReady // kubelet repeats stops
	if err := s.stopPod(ctx, sb); err != nil {
		return nil, err
	}
	if wasReady {
		podEvent(ctx, sb, "stopped")
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox stops the pod if needed and deletes it. Removing a pod
// that is already gone succeeds, as api.proto requires.
func (s *Server) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	sb, gone, err := lookupForRemoval(s.sandboxes, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	if err := s.removePod(ctx, sb); err != nil {
		return nil, err
	}
	podEvent(ctx, sb, "removed")
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

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
	var items []*runtimeapi.PodSandbox
	for _, sb := range s.sandboxes.List() {
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
		items = append(items, &runtimeapi.PodSandbox{
			Id: sb.ID, Metadata: podMetadata(sb), State: st, CreatedAt: sb.CreatedAt.UnixNano(),
			Labels: sb.Labels, Annotations: sb.Annotations, RuntimeHandler: sb.Handler,
		})
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
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

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// podRequest validates a RunPodSandbox request and converts it into
// pinrt's own terms. Nothing has been created when it fails.
func (s *Server) podRequest(req *runtimeapi.RunPodSandboxRequest) (*podRequest, error) {
	cfg := req.GetConfig()
	m := cfg.GetMetadata()
	if m == nil {
		return nil, invalid("sandbox config metadata is missing")
	}
	for _, f := range []struct{ what, v string }{{"pod name", m.Name}, {"pod namespace", m.Namespace}, {"pod uid", m.Uid}} {
		if err := validName(f.what, f.v); err != nil {
			return nil, err
		}
	}
	if err := validate.LabelsAndAnnotations("pod", cfg.Labels, cfg.Annotations); err != nil {
		return nil, err
	}
	if d := cfg.LogDirectory; d != "" && (!filepath.IsAbs(d) || filepath.Clean(d) != d) {
		return nil, invalid("log directory %q must be a clean absolute path", d)
	}
	handler := req.RuntimeHandler
	if handler == "" {
		handler = s.cfg.Runtime.DefaultRuntime
	}
	if _, ok := s.cfg.Runtime.Runtimes[handler]; !ok {
		return nil, invalid("unknown runtime handler %q", handler)
	}
	hostname := cfg.Hostname
	if hostname == "" {
		hostname = hostnameFromName(m.Name)
	}
	if err := validate.Hostname(hostname); err != nil {
		return nil, err
	}
	linux := cfg.GetLinux()
	if sc := linux.GetSecurityContext(); sc != nil {
		if err := validRunAs("pod", sc.RunAsUser, "", sc.RunAsGroup); err != nil {
			return nil, err
		}
	}
	modes, err := namespaceModes(linux.GetSecurityContext().GetNamespaceOptions())
	if err != nil {
		return nil, err
	}
	if err := nsmgr.ValidateSysctls(linux.GetSysctls(), modes.Network == sandbox.ModePod, modes.IPC == sandbox.ModePod); err != nil {
		return nil, err
	}
	pr := &podRequest{
		md: sandbox.Metadata{
			Name: m.Name, Namespace: m.Namespace, UID: m.Uid, Attempt: m.Attempt,
			Labels: cfg.Labels, Annotations: cfg.Annotations, LogDirectory: cfg.LogDirectory,
			Handler: handler, Hostname: hostname, CgroupParent: linux.GetCgroupParent(), Modes: modes,
		},
		sysctls: linux.GetSysctls(),
	}
	if dns := cfg.DnsConfig; dns != nil {
		if err := validate.DNS(dns.Servers, dns.Searches, dns.Options); err != nil {
			return nil, err
		}
		pr.dns = &sandbox.DNS{Servers: dns.Servers, Searches: dns.Searches, Options: dns.Options}
	}
	if len(cfg.PortMappings) > maxPortMappings {
		return nil, invalid("%d port mappings, at most %d allowed", len(cfg.PortMappings), maxPortMappings)
	}
	for _, pm := range cfg.PortMappings {
		// An unknown enum value's String() is its number, which the
		// validator refuses along with the names it does not know.
		proto := strings.ToLower(pm.Protocol.String())
		if err := validate.PortMapping(proto, pm.ContainerPort, pm.HostPort, pm.HostIp); err != nil {
			return nil, err
		}
		pr.md.PortMappings = append(pr.md.PortMappings, sandbox.PortMapping{
			HostPort: pm.HostPort, ContainerPort: pm.ContainerPort, Protocol: proto, HostIP: pm.HostIp,
		})
	}
	bw, err := podBandwidth(cfg.Annotations)
	if err != nil {
		return nil, err
	}
	if bw != nil && modes.Network == sandbox.ModeNode {
		return nil, invalid("bandwidth annotations need a pod network, not the host's")
	}
	pr.md.Bandwidth = bw
	userns := linux.GetSecurityContext().GetNamespaceOptions().GetUsernsOptions()
	for _, u := range userns.GetUids() {
		pr.uids = append(pr.uids, specs.LinuxIDMapping{ContainerID: u.ContainerId, HostID: u.HostId, Size: u.Length})
	}
	for _, g := range userns.GetGids() {
		pr.gids = append(pr.gids, specs.LinuxIDMapping{ContainerID: g.ContainerId, HostID: g.HostId, Size: g.Length})
	}
	if modes.User != sandbox.ModePod && (len(pr.uids) > 0 || len(pr.gids) > 0) {
		return nil, invalid("user namespace mappings given without user namespace mode POD")
	}
	return pr, nil
}

// maxPortMappings bounds a pod's port mappings; kubelet sends one per
// container port, and a pod has far fewer.
const maxPortMappings = 1024

// hostnameFromName derives a hostname from the pod name when kubelet sends
// none: characters a DNS name can't hold become '-', and the result is cut
// to 63 characters.
func hostnameFromName(name string) string {
	h := strings.Map(func(r rune) rune {
		if validate.HostnameChar(r) {
			return r
		}
		return '-'
	}, name)
	// 63, not the kernel's 64: kubelet cuts pod hostnames there, and a
	// single label may not be longer.
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(strings.ReplaceAll(h, "..", "-"), "-.")
}

func namespaceModes(o *runtimeapi.NamespaceOption) (sandbox.NamespaceModes, error) {
	m := sandbox.NamespaceModes{Network: sandbox.ModePod, IPC: sandbox.ModePod, PID: sandbox.ModeContainer, User: sandbox.ModeNode}
	if o.GetNetwork() == runtimeapi.NamespaceMode_NODE {
		m.Network = sandbox.ModeNode
	}
	if o.GetIpc() == runtimeapi.NamespaceMode_NODE {
		m.IPC = sandbox.ModeNode
	}
	switch o.GetPid() {
	case runtimeapi.NamespaceMode_POD:
		m.PID = sandbox.ModePod
	case runtimeapi.NamespaceMode_NODE:
		m.PID = sandbox.ModeNode
	case runtimeapi.NamespaceMode_TARGET:
		return m, invalid("pid namespace mode TARGET is only valid for containers")
	}
	// No user namespace options at all means the host's, as for kubelet
	// before user namespaces existed; the enum's zero value is POD.
	switch u := o.GetUsernsOptions(); {
	case u == nil || u.Mode == runtimeapi.NamespaceMode_NODE:
	case u.Mode == runtimeapi.NamespaceMode_POD:
		m.User = sandbox.ModePod
	default:
		return m, invalid("user namespace mode %v is not supported (POD or NODE)", o.GetUsernsOptions().GetMode())
	}
	if m.User == sandbox.ModePod && (m.Network == sandbox.ModeNode || m.IPC == sandbox.ModeNode || m.PID == sandbox.ModeNode) {
		return m, invalid("a pod with its own user namespace cannot share the host's network, IPC or PID namespace")
	}
	return m, nil
}
