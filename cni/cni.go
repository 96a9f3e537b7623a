// Package cni attaches pods to the node's network through CNI plugins
// (libcni), on the network namespace pinrt created and pinned for the pod.
//
// The network config is read from the conf dir on every call instead of
// being watched: a scan is a ReadDir plus parsing a few small files (see
// BenchmarkStatus), it cannot miss or reorder an event, and a config written
// a moment ago is seen by the very next Status or Setup.
//
// Every ADD result is kept in libcni's result cache under Config.CacheDir,
// which must be persistent. Teardown works from that cache, so it releases
// the pod's IPs with the config it was set up with, even after the config
// changed or the node rebooted and the netns is gone.
package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/pinrt/pinrt/internal/podnet"
)

// Config configures a Manager.
type Config struct {
	// ConfDir holds the network configs (*.conflist, *.conf, *.json).
	ConfDir string
	// PluginDirs are searched, in order, for plugin binaries.
	PluginDirs []string
	// CacheDir is libcni's result cache. It must survive reboots (it lives
	// under pinrt's persistent root, not /var/lib/cni, so that two runtimes
	// on one node never share cache entries).
	CacheDir string
	// DefaultNetwork makes New write a bridge network config into an empty
	// ConfDir.
	DefaultNetwork bool
}

// PortMapping is one host port forwarded to the pod.
type PortMapping = podnet.PortMapping

// Bandwidth is the pod's traffic shaping, in bits per second and bits.
type Bandwidth = podnet.Bandwidth

// Pod is what the network needs to know about a sandbox.
type Pod struct {
	ID, Name, Namespace, UID string // ID = sandbox id (also the CNI container ID)
	// NetNS is the pinned netns path; "" on teardown after a reboot.
	NetNS        string
	PortMappings []PortMapping
	Bandwidth    *Bandwidth
	// IPRanges are the node's pod subnets from kubelet (UpdateRuntimeConfig),
	// passed as the ipRanges capability: host-local allocates from them
	// when its config opts in with "capabilities": {"ipRanges": true}, and
	// libcni drops the argument for plugins that do not.
	IPRanges []string
}

// ErrRollback marks a failed Setup whose own DEL failed too: the pod may
// still hold what the ADD took (an IP), so the caller must keep what it
// needs to tear the pod's network down later, and retry.
var ErrRollback = errors.New("the rollback of the failed cni add failed")

// Result is the outcome of a pod's network setup.
type Result struct {
	IPs       []string        // "10.89.0.5", "fd00::5"; IPv4 first
	Interface string          // "eth0"
	Raw       json.RawMessage // the CNI result JSON as the plugins returned it
	Network   string          // the network name used
	// addrs are the pod's addresses and their interfaces, to announce.
	addrs []ifAddr
}

const (
	loopbackNetwork = "cni-loopback"
	// statusTimeout bounds the CNI STATUS verb, which kubelet polls.
	statusTimeout = 10 * time.Second
	// cleanupTimeout bounds the DEL that rolls back a failed ADD; it runs
	// on a fresh context because the caller's may be what failed.
	cleanupTimeout = time.Minute
)

// loopbackConf is the loopback network an older pinrt added for every pod
// besides the pod network. pinrt no longer runs it (the namespace helper
// brings lo up), but still deletes such an attachment found in the cache.
var loopbackConf = []byte(`{"cniVersion":"1.0.0","name":"cni-loopback","type":"loopback"}`)

// Manager runs CNI operations for pods. It is safe for concurrent use; calls
// for different pods run in parallel.
type Manager struct {
	cfg Config
	cni libcni.CNI
	lo  *libcni.PluginConfig

	mu     sync.Mutex
	last   *network // the network last used, to log changes once
	closed bool
}

// New returns a Manager for cfg. With cfg.DefaultNetwork it writes the
// default network config if cfg.ConfDir holds none.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.ConfDir == "" || len(cfg.PluginDirs) == 0 || cfg.CacheDir == "" {
		return nil, fmt.Errorf("cni: conf dir, plugin dirs and cache dir are required: %w", errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(cfg.CacheDir) {
		return nil, fmt.Errorf("cni: cache dir %q is not absolute: %w", cfg.CacheDir, errdefs.ErrInvalidArgument)
	}
	lo, err := libcni.NetworkPluginConfFromBytes(loopbackConf)
	if err != nil {
		return nil, fmt.Errorf("cni: loopback config: %w", err)
	}
	if cfg.DefaultNetwork {
		wrote, err := writeDefaultConfig(cfg.ConfDir)
		if err != nil {
			return nil, fmt.Errorf("cni: %w", err)
		}
		if wrote {
			log.G(ctx).WithField("file", filepath.Join(cfg.ConfDir, DefaultConfName)).Info("wrote default cni network config")
		}
	}
	cfg.PluginDirs = slices.Clone(cfg.PluginDirs)
	return &Manager{
		cfg: cfg,
		cni: libcni.NewCNIConfigWithCacheDir(cfg.PluginDirs, cfg.CacheDir, newPluginExec()),
		lo:  lo,
	}, nil
}

// network loads the current network and checks that it can run. Any
// error is ErrFailedPrecondition: the node's network is not ready.
func (m *Manager) network(ctx context.Context) (*network, error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cni manager is closed: %w", errdefs.ErrFailedPrecondition)
	}
	nw, err := loadNetwork(m.cfg.ConfDir)
	if err != nil {
		return nil, err
	}
	if err := checkPlugins(nw.list, m.cfg.PluginDirs); err != nil {
		return nil, err
	}
	m.mu.Lock()
	changed := !sameNetwork(m.last, nw)
	m.last = nw
	m.mu.Unlock()
	if changed {
		log.G(ctx).WithFields(log.Fields{
			"file": nw.file, "network": nw.list.Name, "plugins": pluginTypes(nw.list),
		}).Info("using cni network config")
	}
	return nw, nil
}

// Status returns nil exactly when a network config is usable: it parses
// and all its plugin binaries exist. Otherwise the error says why, and is
// ErrFailedPrecondition, or ErrUnavailable if a CNI 1.1 plugin reports it
// is not ready through the STATUS verb.
func (m *Manager) Status() error {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	nw, err := m.network(ctx)
	if err != nil {
		return err
	}
	// A no-op for configs older than 1.1.0, which have no STATUS verb.
	if err := m.cni.GetStatusNetworkList(ctx, nw.list); err != nil {
		return fmt.Errorf("network %q is not ready: %w: %w", nw.list.Name, errdefs.ErrUnavailable, err)
	}
	return nil
}

// Setup attaches the pod's netns (pod.NetNS) to the network: it runs ADD
// for the network on eth0. lo is already up: the namespace helper brought
// it up when it created the netns. If ADD fails, whatever it added is
// deleted again before Setup returns; should that DEL fail too, the error
// also wraps ErrRollback.
func (m *Manager) Setup(ctx context.Context, pod Pod) (_ *Result, retErr error) {
	if err := validatePodID(pod.ID); err != nil {
		return nil, err
	}
	if pod.NetNS == "" {
		return nil, fmt.Errorf("setup network for sandbox %s: no netns path: %w", pod.ID, errdefs.ErrInvalidArgument)
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", pod.ID))
	start := time.Now()
	nw, err := m.network(ctx)
	if err != nil {
		return nil, fmt.Errorf("setup network for sandbox %s: %w", pod.ID, err)
	}
	rt := runtimeConf(pod, IfName)

	defer func() {
		if retErr == nil {
			return
		}
		// DEL even the step that failed: a plugin may have allocated an
		// IP before failing, and DEL is idempotent for the rest.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		// A cancelled ADD leaves its delegated IPAM plugin running; it
		// must not reserve an IP after the DEL that releases it.
		m.killStrays(cctx, pod.ID)
		if err := m.cni.DelNetworkList(cctx, nw.list, rt); err != nil {
			// The ADD's error keeps its class (the first %w); the DEL's
			// is only told, with the mark that the pod is not clean.
			del := pluginError(cctx, "del", nw.list.Name, pod.ID, err)
			retErr = fmt.Errorf("%w; %w: %s", retErr, ErrRollback, del.Error())
		}
	}()

	res, err := m.cni.AddNetworkList(ctx, nw.list, rt)
	if err != nil {
		return nil, pluginError(ctx, "add", nw.list.Name, pod.ID, err)
	}
	out, err := toResult(nw.list.Name, res)
	if err != nil {
		return nil, fmt.Errorf("setup network for sandbox %s: %w: %w", pod.ID, errdefs.ErrUnknown, err)
	}
	announce(ctx, pod.NetNS, out.addrs)
	log.G(ctx).WithFields(log.Fields{"network": out.Network, "ips": out.IPs, "phase": "cni_add", "duration_ms": sinceMs(start)}).
		Debug("cni add done")
	return out, nil
}

// Teardown detaches the pod from every network it was set up on, using the
// cached config and arguments of its ADD, or with the current config for
// a pod with no cache entry (teardownUncached). It is idempotent: DEL of
// what is gone already succeeds. pod.NetNS may be ""
// or point to a netns that is gone; plugins then only release what they
// hold outside of it (IPs, host-side state), as the CNI spec allows.
func (m *Manager) Teardown(ctx context.Context, pod Pod) error {
	if err := validatePodID(pod.ID); err != nil {
		return err
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", pod.ID))
	start := time.Now()
	netns := usableNetNS(pod.NetNS)
	if netns != pod.NetNS {
		log.G(ctx).WithField("netns", pod.NetNS).Debug("netns is gone, tearing down without it")
	}
	atts, err := m.cni.GetCachedAttachments(pod.ID)
	if err != nil {
		// An unreadable cache must not stop a teardown: fall through to
		// the current config as if there were no cache.
		log.G(ctx).WithError(err).Warn("read cni result cache")
	}

	var errs []error
	tornDown := false
	var lo *libcni.NetworkAttachment
	for _, a := range atts {
		if a.Network == loopbackNetwork {
			lo = a
			continue
		}
		list, err := m.cachedList(ctx, a)
		if err != nil {
			errs = append(errs, fmt.Errorf("teardown network %q for sandbox %s: cached config: %w: %w", a.Network, pod.ID, errdefs.ErrUnknown, err))
			continue
		}
		rt := &libcni.RuntimeConf{
			ContainerID:    pod.ID,
			NetNS:          netns,
			IfName:         a.IfName,
			Args:           a.CniArgs,
			CapabilityArgs: a.CapabilityArgs,
		}
		if err := m.cni.DelNetworkList(ctx, list, rt); err != nil {
			errs = append(errs, pluginError(ctx, "del", list.Name, pod.ID, err))
			continue
		}
		tornDown = true
	}
	if !tornDown && len(errs) == 0 {
		errs = append(errs, m.teardownUncached(ctx, pod, netns))
	}
	// Only pods set up by an older pinrt, which ran the loopback plugin
	// as a network of its own, have a loopback attachment to delete.
	if lo != nil {
		p := pod
		p.NetNS = netns
		rt := loopbackRuntimeConf(runtimeConf(p, IfName))
		rt.Args = lo.CniArgs
		if err := m.cni.DelNetwork(ctx, m.lo, rt); err != nil {
			errs = append(errs, pluginError(ctx, "del", loopbackNetwork, pod.ID, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"phase": "cni_del", "duration_ms": sinceMs(start)}).Debug("cni del done")
	return nil
}

// teardownUncached runs DEL for a pod with no cache entry: pinrt may have
// died between the plugins' ADD and libcni writing the cache, and DEL with
// the current config releases what such an ADD took. Without a usable
// config nothing can run, and nothing says no ADD ran: the error
// (FailedPrecondition, as m.network's) keeps the pod for a later teardown,
// where a nil one let the caller drop the pod and the IP stay reserved.
func (m *Manager) teardownUncached(ctx context.Context, pod Pod, netns string) error {
	// That ADD's plugins may still run, orphaned by the dead daemon; they
	// go first, or one could reserve an IP after the DEL.
	m.killStrays(ctx, pod.ID)
	nw, err := m.network(ctx)
	if err != nil {
		return fmt.Errorf("teardown network for sandbox %s: no cached result, and no network config to run DEL with: %w", pod.ID, err)
	}
	p := pod
	p.NetNS = netns
	if err := m.cni.DelNetworkList(ctx, nw.list, runtimeConf(p, IfName)); err != nil {
		return pluginError(ctx, "del", nw.list.Name, pod.ID, err)
	}
	return nil
}

// killStrays kills the plugin processes still working for the pod (see
// strays_linux.go) and logs what it did; a failure only weakens the DEL
// that follows, so it does not stop it.
func (m *Manager) killStrays(ctx context.Context, podID string) {
	n, err := killStrays(ctx, podID)
	if err != nil {
		log.G(ctx).WithError(err).Warn("killing stray cni plugins")
	}
	if n > 0 {
		log.G(ctx).WithField("killed", n).Info("killed cni plugins left running by an interrupted add")
	}
}

// Check runs CNI CHECK for the pod's network, with the config and
// arguments cached by its ADD. It returns ErrNotFound if the pod has no
// cached network.
func (m *Manager) Check(ctx context.Context, pod Pod) error {
	if err := validatePodID(pod.ID); err != nil {
		return err
	}
	atts, err := m.cni.GetCachedAttachments(pod.ID)
	if err != nil {
		return fmt.Errorf("check network for sandbox %s: %w: %w", pod.ID, errdefs.ErrUnknown, err)
	}
	for _, a := range atts {
		if a.Network == loopbackNetwork || a.IfName != IfName {
			continue
		}
		list, err := m.cachedList(ctx, a)
		if err != nil {
			return fmt.Errorf("check network %q for sandbox %s: %w: %w", a.Network, pod.ID, errdefs.ErrUnknown, err)
		}
		rt := &libcni.RuntimeConf{
			ContainerID:    pod.ID,
			NetNS:          pod.NetNS,
			IfName:         a.IfName,
			Args:           a.CniArgs,
			CapabilityArgs: a.CapabilityArgs,
		}
		if err := m.cni.CheckNetworkList(ctx, list, rt); err != nil {
			return pluginError(ctx, "check", list.Name, pod.ID, err)
		}
		return nil
	}
	return fmt.Errorf("check network for sandbox %s: no cached cni result: %w", pod.ID, errdefs.ErrNotFound)
}

// Close stops the Manager; later Status and Setup calls fail. There is no
// watcher to stop (see the package doc), so it releases nothing.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

// cachedList rebuilds the network list an attachment was added with. A
// conflist whose plugins live in a side directory is not fully in the
// cache; the current config stands in for it if it has the same name.
func (m *Manager) cachedList(ctx context.Context, a *libcni.NetworkAttachment) (*libcni.NetworkConfigList, error) {
	// A config cached by an older pinrt may still hold a loopback plugin.
	list, err := libcni.NetworkConfFromBytes(a.Config)
	if err == nil && len(list.Plugins) > 0 {
		return withoutLoopback(list)
	}
	if err == nil {
		// A single-plugin .conf is cached as that plugin's config.
		var conf *libcni.PluginConfig
		if conf, err = libcni.NetworkPluginConfFromBytes(a.Config); err == nil {
			//nolint:staticcheck // see parseConfFile
			return libcni.ConfListFromConf(conf)
		}
	}
	if nw, nerr := m.network(ctx); nerr == nil && nw.list.Name == a.Network {
		return nw.list, nil
	}
	return nil, err
}

// sinceMs is the time since start in milliseconds, the unit of the
// duration_ms field that pinrt-bench reads from the debug log.
func sinceMs(start time.Time) float64 {
	return float64(time.Since(start).Microseconds()) / 1000
}

func loopbackRuntimeConf(rt *libcni.RuntimeConf) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: rt.ContainerID,
		NetNS:       rt.NetNS,
		IfName:      "lo",
		Args:        rt.Args,
	}
}

// pluginError classifies a libcni failure. A timeout, a cancel or a plugin
// asking to be retried later is ErrUnavailable, anything else ErrUnknown.
func pluginError(ctx context.Context, op, network, id string, err error) error {
	var class error = errdefs.ErrUnknown
	var cerr *types.Error
	switch {
	// libcni flattens the exec error to a string, so the context is
	// asked directly.
	case ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		class = errdefs.ErrUnavailable
	case errors.As(err, &cerr) && cerr.Code == types.ErrTryAgainLater:
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("cni %s network %q for sandbox %s: %w: %w", op, network, id, class, err)
}

// toResult converts a plugin result of any CNI version. Only addresses on
// interfaces inside the sandbox are the pod's; a result may also list the
// host side of a veth or the bridge, which carry no pod IPs but could.
func toResult(network string, res types.Result) (*Result, error) {
	raw, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("marshal cni result: %w", err)
	}
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert cni result: %w", err)
	}
	var v4, v6 []string
	var addrs []ifAddr
	for _, ipc := range cur.IPs {
		ifName := IfName
		if ipc.Interface != nil {
			i := *ipc.Interface
			if i >= 0 && i < len(cur.Interfaces) {
				if cur.Interfaces[i].Sandbox == "" {
					continue
				}
				ifName = cur.Interfaces[i].Name
			}
		}
		ip := ipc.Address.IP
		if ip4 := ip.To4(); ip4 != nil {
			v4 = append(v4, ip4.String())
			addrs = append(addrs, ifAddr{ifName: ifName, ip: ip4})
		} else if ip.To16() != nil {
			v6 = append(v6, ip.String())
			addrs = append(addrs, ifAddr{ifName: ifName, ip: ip})
		}
	}
	return &Result{
		IPs:       append(v4, v6...),
		Interface: IfName,
		Raw:       raw,
		Network:   network,
		addrs:     addrs,
	}, nil
}

// ifAddr is an address on an interface inside the sandbox.
type ifAddr struct {
	ifName string
	ip     net.IP
}
