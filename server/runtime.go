package server

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/version"
)

// Version answers kubelet's first call.
func (s *Server) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version:           "0.1.0",
		RuntimeName:       version.Name,
		RuntimeVersion:    version.Version,
		RuntimeApiVersion: version.CRIVersion,
	}, nil
}

// Status reports whether pinrt can run containers and pods can get a
// network. Both conditions are computed on every call, never cached, so
// a CNI config written later flips NetworkReady without a restart.
func (s *Server) Status(ctx context.Context, req *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	runtimeCond := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	if err := s.runtimeReady(); err != nil {
		runtimeCond.Status = false
		runtimeCond.Reason = "RuntimeNotReady"
		runtimeCond.Message = err.Error()
	}
	netCond := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: true}
	if s.deps.Network == nil {
		netCond.Status = false
		netCond.Reason = "NetworkPluginNotReady"
		netCond.Message = "no network plugin is configured"
	} else if err := s.deps.Network.Status(); err != nil {
		netCond.Status = false
		netCond.Reason = "NetworkPluginNotReady"
		netCond.Message = "network plugin is not ready: " + err.Error()
	}
	handlers, mountOpts := s.runtimeHandlers(ctx)
	resp := &runtimeapi.StatusResponse{
		Status:          &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{runtimeCond, netCond}},
		RuntimeHandlers: handlers,
		Features: &runtimeapi.RuntimeFeatures{
			// kubelet sends Strict only to runtimes that claim it, and
			// reads ContainerStatus.user back (container_status.go).
			SupplementalGroupsPolicy: true,
			// kubelet 1.37 declares VolumeBindMountOptions on the node from
			// this, and the scheduler then sends pods with bindMountOptions
			// whatever handler they name.
			MountOptions: mountOpts,
		},
	}
	if req.Verbose {
		cidr, _ := s.podCIDR.Load().(string)
		resp.Info = map[string]string{"podCIDR": cidr}
	}
	return resp, nil
}

// UpdateRuntimeConfig records the node's pod CIDR that kubelet sends. It is
// reported in the verbose Status and passed to CNI ADD as the ipRanges
// capability, which host-local uses when its config opts in; configs that
// name their own ranges are not changed.
func (s *Server) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	cidr := req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr()
	if cidr == "" {
		return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
	}
	for _, c := range strings.Split(cidr, ",") {
		if _, err := netip.ParsePrefix(strings.TrimSpace(c)); err != nil {
			return nil, invalid("pod CIDR %q: %v", cidr, err)
		}
	}
	if old, _ := s.podCIDR.Swap(cidr).(string); old != cidr {
		log.G(ctx).WithField("podCIDR", cidr).Info("pod CIDR set")
	}
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// runtimeHandlers lists every configured handler that can run containers,
// with the features its binary reports; kubelet refuses hostUsers: false
// pods unless the handler claims user namespaces. A handler whose binary
// is missing or whose probe failed is left out: advertising it would let
// kubelet schedule pods that can never start. mountOpts says whether every
// handler listed applies a volume's extra mount options, which the CRI
// asks of the runtime as a whole.
func (s *Server) runtimeHandlers(ctx context.Context) (handlers []*runtimeapi.RuntimeHandler, mountOpts bool) {
	probes := s.probeRuntimes(ctx)
	names := make([]string, 0, len(s.cfg.Runtime.Runtimes))
	for name := range s.cfg.Runtime.Runtimes {
		if probes[name] == nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	mountOpts = len(names) > 0
	for _, name := range names {
		f := &runtimeapi.RuntimeHandlerFeatures{}
		if feat, err := s.deps.Runtimes[name].Features(ctx); err == nil && feat != nil {
			// A userns pod's volumes are idmapped mounts.
			f.UserNamespaces = feat.IDMapMounts
			f.RecursiveReadOnlyMounts = feat.RecursiveReadOnly
			mountOpts = mountOpts && feat.AppliesVolumeMountOptions()
		} else {
			mountOpts = false
		}
		handlers = append(handlers, &runtimeapi.RuntimeHandler{Name: name, Features: f})
		// kubelet looks the default handler up by the empty name.
		if name == s.cfg.Runtime.DefaultRuntime {
			handlers = append(handlers, &runtimeapi.RuntimeHandler{Name: "", Features: f})
		}
	}
	return handlers, mountOpts
}

// runtimeReady checks that the default runtime and the monitor exist.
func (s *Server) runtimeReady() error {
	rt := s.cfg.Runtime
	if _, err := exec.LookPath(rt.Runtimes[rt.DefaultRuntime].Binary); err != nil {
		return err
	}
	_, err := exec.LookPath(rt.Conmon)
	return err
}

// RuntimeConfig reports the cgroup driver so kubelet can match it.
func (s *Server) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	driver := runtimeapi.CgroupDriver_CGROUPFS
	if s.deps.CgroupDriver.Name() == cgroups.DriverSystemd {
		driver = runtimeapi.CgroupDriver_SYSTEMD
	}
	return &runtimeapi.RuntimeConfigResponse{
		Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: driver},
	}, nil
}

// probeRuntimes checks every configured handler once, at start (Restore)
// or at the first use, and warns about each one that cannot run
// containers, saying why. The results never change: fixing a runtime
// means restarting the daemon, as changing the config does.
func (s *Server) probeRuntimes(ctx context.Context) map[string]error {
	s.probeOnce.Do(func() {
		s.probes = map[string]error{}
		for name, h := range s.cfg.Runtime.Runtimes {
			rt, ok := s.deps.Runtimes[name]
			var err error
			if !ok || rt == nil {
				err = fmt.Errorf("runtime handler %q: binary %q was not found at start: %w", name, h.Binary, errdefs.ErrFailedPrecondition)
			} else if err = rt.Probe(ctx); err != nil {
				err = fmt.Errorf("runtime handler %q cannot run containers: %w", name, err)
			}
			if err != nil {
				log.G(ctx).WithError(err).WithField("handler", name).Warn("not advertising runtime handler")
			}
			s.probes[name] = err
		}
	})
	return s.probes
}

// usableRuntime is the runtime new containers of handler get: one whose
// probe failed would fail every create with the runtime's own obscure
// message (crun 1.8.1: "unknown version specified"). Existing containers
// are still stopped and removed through runtimeFor.
func (s *Server) usableRuntime(ctx context.Context, handler string) (ContainerRuntime, error) {
	rt, err := s.runtimeFor(handler)
	if err != nil {
		return nil, err
	}
	if err := s.probeRuntimes(ctx)[handler]; err != nil {
		return nil, err
	}
	return rt, nil
}

// podCIDRs are the recorded pod CIDRs, nil before kubelet sent any.
func (s *Server) podCIDRs() []string {
	cidr, _ := s.podCIDR.Load().(string)
	if cidr == "" {
		return nil
	}
	var out []string
	for _, c := range strings.Split(cidr, ",") {
		out = append(out, strings.TrimSpace(c))
	}
	return out
}

// cidrNetwork hands the pod CIDR to every CNI ADD and DEL, so the pod
// paths need not know about it. A DEL without the ADD's cached
// configuration (a crash cut the ADD short) needs it as much as the ADD:
// an IPAM that takes its ranges from it alone refuses a DEL without.
type cidrNetwork struct {
	Network
	cidrs func() []string
}

func (n cidrNetwork) Setup(ctx context.Context, pod cni.Pod) (*cni.Result, error) {
	pod.IPRanges = n.cidrs()
	return n.Network.Setup(ctx, pod)
}

func (n cidrNetwork) Teardown(ctx context.Context, pod cni.Pod) error {
	pod.IPRanges = n.cidrs()
	return n.Network.Teardown(ctx, pod)
}
