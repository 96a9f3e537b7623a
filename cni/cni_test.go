package cni

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/cni/pkg/types"
	types040 "github.com/containernetworking/cni/pkg/types/040"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

func TestRuntimeConf(t *testing.T) {
	base := Pod{ID: "sb1", Name: "web", Namespace: "default", UID: "u-1", NetNS: "/run/pinrt/ns/net/sb1"}
	wantArgs := [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", "default"},
		{"K8S_POD_NAME", "web"},
		{"K8S_POD_INFRA_CONTAINER_ID", "sb1"},
		{"K8S_POD_UID", "u-1"},
	}
	tests := []struct {
		name     string
		ports    []PortMapping
		bw       *Bandwidth
		ranges   []string
		wantCaps string // CapabilityArgs as JSON
	}{
		{name: "no capabilities", wantCaps: `{}`},
		{
			name: "port mappings",
			ports: []PortMapping{
				{HostPort: 8080, ContainerPort: 80, Protocol: "TCP", HostIP: "127.0.0.1"},
				{HostPort: 5353, ContainerPort: 53, Protocol: "UDP"},
				{HostPort: 0, ContainerPort: 9000, Protocol: "TCP"}, // no host port: not a mapping
				{HostPort: 3868, ContainerPort: 3868, Protocol: "Sctp"},
				{HostPort: 22, ContainerPort: 2222}, // protocol defaults to tcp
			},
			wantCaps: `{"portMappings":[` +
				`{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":"127.0.0.1"},` +
				`{"hostPort":5353,"containerPort":53,"protocol":"udp"},` +
				`{"hostPort":3868,"containerPort":3868,"protocol":"sctp"},` +
				`{"hostPort":22,"containerPort":2222,"protocol":"tcp"}]}`,
		},
		{
			name:     "only container ports",
			ports:    []PortMapping{{ContainerPort: 80, Protocol: "TCP"}},
			wantCaps: `{}`,
		},
		{
			name:     "bandwidth",
			bw:       &Bandwidth{IngressRate: 1000000, IngressBurst: 2000000, EgressRate: 3000000, EgressBurst: 4000000},
			wantCaps: `{"bandwidth":{"ingressRate":1000000,"ingressBurst":2000000,"egressRate":3000000,"egressBurst":4000000}}`,
		},
		{
			name:     "pod CIDRs",
			ranges:   []string{"10.244.1.0/24", "fd00:1::/64"},
			wantCaps: `{"ipRanges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:1::/64"}]]}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := base
			pod.PortMappings, pod.Bandwidth, pod.IPRanges = tc.ports, tc.bw, tc.ranges
			rt := runtimeConf(pod, "eth0")
			if rt.ContainerID != "sb1" || rt.NetNS != "/run/pinrt/ns/net/sb1" || rt.IfName != "eth0" {
				t.Fatalf("rt = %+v", rt)
			}
			if !reflect.DeepEqual(rt.Args, wantArgs) {
				t.Fatalf("Args = %v", rt.Args)
			}
			caps, err := json.Marshal(rt.CapabilityArgs)
			if err != nil {
				t.Fatal(err)
			}
			if string(caps) != tc.wantCaps {
				t.Fatalf("CapabilityArgs = %s\nwant %s", caps, tc.wantCaps)
			}
		})
	}
}

func TestValidatePodID(t *testing.T) {
	for _, id := range []string{"", "../x", "a/b", "-a", "a b", ".x"} {
		if err := validatePodID(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("validatePodID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"a", "0123abcdef", "a.b_c-d"} {
		if err := validatePodID(id); err != nil {
			t.Errorf("validatePodID(%q) = %v", id, err)
		}
	}
}

func TestToResult(t *testing.T) {
	idx := func(i int) *int { return &i }
	cur := &types100.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*types100.Interface{{Name: "cni0"}, {Name: "eth0", Sandbox: "/ns"}, {Name: "net1", Sandbox: "/ns"}},
		IPs: []*types100.IPConfig{
			{Address: mustCIDR(t, "fd00::5/64"), Interface: idx(1)},
			{Address: mustCIDR(t, "10.1.0.1/24"), Interface: idx(0)}, // host side: not the pod's
			{Address: mustCIDR(t, "10.1.0.5/24"), Interface: idx(1)},
			{Address: mustCIDR(t, "10.2.0.5/24")}, // no interface: the pod's
			{Address: mustCIDR(t, "10.4.0.5/24"), Interface: idx(2)},
		},
	}
	old := &types040.Result{
		CNIVersion: "0.4.0",
		IPs:        []*types040.IPConfig{{Address: mustCIDR(t, "10.3.0.7/16")}},
	}
	tests := []struct {
		name     string
		res      types.Result
		wantIPs  []string
		announce string // the addresses to announce, on their interfaces, in the result's order
	}{
		{"1.0.0 with host interfaces", cur, []string{"10.1.0.5", "10.2.0.5", "10.4.0.5", "fd00::5"}, "eth0 fd00::5, eth0 10.1.0.5, eth0 10.2.0.5, net1 10.4.0.5"},
		{"0.4.0", old, []string{"10.3.0.7"}, "eth0 10.3.0.7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := toResult("n", tc.res)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.IPs, tc.wantIPs) || r.Network != "n" || r.Interface != "eth0" {
				t.Fatalf("result = %+v", r)
			}
			var announced []string
			for _, a := range r.addrs {
				announced = append(announced, a.ifName+" "+a.ip.String())
			}
			if got := strings.Join(announced, ", "); got != tc.announce {
				t.Errorf("addresses to announce: %s, want %s", got, tc.announce)
			}
			want, _ := json.Marshal(tc.res)
			if string(r.Raw) != string(want) {
				t.Fatalf("Raw = %s, want %s", r.Raw, want)
			}
		})
	}
}

func mustCIDR(t *testing.T, s string) net.IPNet {
	t.Helper()
	ipn, err := types.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return *ipn
}

// calls returns the fake plugins' call log, one line per call.
func (e *testEnv) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.plugins, "calls.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(e.plugins, "calls.log"))
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func (e *testEnv) cacheFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.cache, "results"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	return names
}

const cniArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb1;K8S_POD_UID=uid"

// TestSetupTeardownWithFakePlugins drives the whole ADD/DEL flow through
// libcni with sh plugins: order of calls, their arguments, the result, the
// cache, and teardown from the cache after the config is gone.
func TestSetupTeardownWithFakePlugins(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "fakeport", "loopback")
	// The loopback entry is skipped: the namespace helper brought lo up.
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"),
		`{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"loopback"},{"type":"fakenet"},{"type":"fakeport","capabilities":{"portMappings":true}}]}`, 0o644)
	m := e.manager(t)
	pod := Pod{
		ID: "sb1", Name: "web", Namespace: "ns", UID: "uid", NetNS: "/some/netns",
		PortMappings: []PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "TCP"}},
	}
	res, err := m.Setup(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.IPs, []string{"10.199.0.5", "fd00::5"}) || res.Network != "net" || res.Interface != "eth0" {
		t.Fatalf("result = %+v", res)
	}
	var raw types100.Result
	if err := json.Unmarshal(res.Raw, &raw); err != nil || len(raw.IPs) != 3 {
		t.Fatalf("Raw = %s (%v)", res.Raw, err)
	}
	wantAdd := []string{
		"fakenet ADD sb1 netns=/some/netns eth0 " + cniArgs,
		"fakeport ADD sb1 netns=/some/netns eth0 " + cniArgs,
	}
	if got := e.calls(t); !reflect.DeepEqual(got, wantAdd) {
		t.Fatalf("calls = %q\nwant %q", got, wantAdd)
	}
	// portmap gets the mappings and the previous plugin's result.
	var stdin struct {
		RuntimeConfig struct {
			PortMappings []portMapEntry `json:"portMappings"`
		} `json:"runtimeConfig"`
		PrevResult *types100.Result `json:"prevResult"`
	}
	b, err := os.ReadFile(filepath.Join(e.plugins, "fakeport.ADD.stdin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &stdin); err != nil {
		t.Fatal(err)
	}
	wantPM := []portMapEntry{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}}
	if !reflect.DeepEqual(stdin.RuntimeConfig.PortMappings, wantPM) || stdin.PrevResult == nil || len(stdin.PrevResult.IPs) != 3 {
		t.Fatalf("fakeport stdin = %s", b)
	}
	// fakenet declares no capability, so libcni must not pass it any.
	if b, _ := os.ReadFile(filepath.Join(e.plugins, "fakenet.ADD.stdin")); strings.Contains(string(b), "runtimeConfig") {
		t.Fatalf("fakenet got runtimeConfig: %s", b)
	}
	wantCache := []string{"net-sb1-eth0"}
	if got := e.cacheFiles(t); !reflect.DeepEqual(got, wantCache) {
		t.Fatalf("cache = %v, want %v", got, wantCache)
	}
	// The cached config, which DEL runs with, has no loopback either.
	if b, err := os.ReadFile(filepath.Join(e.cache, "results", "net-sb1-eth0")); err != nil || strings.Contains(string(b), "loopback") {
		t.Fatalf("cached result (%v) mentions loopback: %s", err, b)
	}
	if err := m.Check(ctx, pod); err != nil {
		t.Fatalf("Check() = %v", err)
	}
	e.calls(t)

	// The config goes away (as after an upgrade); teardown still runs the
	// network's plugins from the cache, and without the netns, which is
	// not a live namespace here.
	if err := os.Remove(filepath.Join(e.conf, "10-net.conflist")); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, Pod{ID: "sb1", NetNS: pod.NetNS}); err != nil {
		t.Fatal(err)
	}
	wantDel := []string{
		"fakeport DEL sb1 netns= eth0 " + cniArgs,
		"fakenet DEL sb1 netns= eth0 " + cniArgs,
	}
	if got := e.calls(t); !reflect.DeepEqual(got, wantDel) {
		t.Fatalf("calls = %q\nwant %q", got, wantDel)
	}
	// DEL got the cached capability args and the cached result.
	b, _ = os.ReadFile(filepath.Join(e.plugins, "fakeport.DEL.stdin"))
	stdin.RuntimeConfig.PortMappings, stdin.PrevResult = nil, nil
	if err := json.Unmarshal(b, &stdin); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stdin.RuntimeConfig.PortMappings, wantPM) || stdin.PrevResult == nil {
		t.Fatalf("fakeport DEL stdin = %s", b)
	}
	if got := e.cacheFiles(t); len(got) != 0 {
		t.Fatalf("cache after teardown = %v", got)
	}

	// Again: no cache, no config, no netns: nothing can run, and nothing
	// says no ADD ran (TestTeardownWithoutCacheOrConfig).
	if err := m.Teardown(ctx, Pod{ID: "sb1", NetNS: pod.NetNS}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second Teardown() = %v, want ErrFailedPrecondition", err)
	}
	if got := e.calls(t); len(got) != 0 {
		t.Fatalf("second teardown ran plugins: %q", got)
	}
	if err := m.Check(ctx, pod); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Check() after teardown = %v, want ErrNotFound", err)
	}
}

// TestTeardownDeletesLegacyLoopback: a pod set up by an older pinrt has a
// cached loopback network of its own, which teardown still deletes.
func TestTeardownDeletesLegacyLoopback(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet"), 0o644)
	m := e.manager(t)
	pod := Pod{ID: "sb1", Name: "web", Namespace: "ns", UID: "uid", NetNS: "/some/netns"}
	rt := runtimeConf(pod, IfName)
	if _, err := m.cni.AddNetwork(ctx, m.lo, loopbackRuntimeConf(rt)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	e.calls(t)
	if err := m.Teardown(ctx, Pod{ID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"fakenet DEL sb1 netns= eth0 " + cniArgs, "loopback DEL sb1 netns= lo " + cniArgs}
	if got := e.calls(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("calls = %q\nwant %q", got, want)
	}
	if got := e.cacheFiles(t); len(got) != 0 {
		t.Fatalf("cache after teardown = %v", got)
	}
}

func TestTeardownWithoutCacheUsesCurrentConfig(t *testing.T) {
	e := newEnv(t, "fakenet", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet"), 0o644)
	m := e.manager(t)
	if err := m.Teardown(context.Background(), Pod{ID: "sb9", Name: "web", Namespace: "ns", UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"fakenet DEL sb9 netns= eth0 IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb9;K8S_POD_UID=uid"}
	if got := e.calls(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("calls = %q\nwant %q", got, want)
	}
}

// TestTeardownWithoutCacheOrConfig: a pod with no cache entry may hold an
// IP that an ADD cut short by a kill reserved before libcni wrote the
// cache. With no network config to run DEL with, Teardown must not say
// the pod is clean (the caller then dropped its record and the IP stayed
// reserved for good): FailedPrecondition keeps it for a later teardown,
// which, once a config is back, runs DEL.
func TestTeardownWithoutCacheOrConfig(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "loopback")
	m := e.manager(t)
	pod := Pod{ID: "sb9", Name: "web", Namespace: "ns", UID: "uid"}
	if err := m.Teardown(ctx, pod); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Teardown() without cache or config = %v, want ErrFailedPrecondition", err)
	}
	if got := e.calls(t); len(got) != 0 {
		t.Fatalf("plugins ran without a config: %q", got)
	}
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet"), 0o644)
	if err := m.Teardown(ctx, pod); err != nil {
		t.Fatalf("Teardown() with a config back = %v", err)
	}
	want := []string{"fakenet DEL sb9 netns= eth0 IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb9;K8S_POD_UID=uid"}
	if got := e.calls(t); !reflect.DeepEqual(got, want) {
		t.Fatalf("calls = %q\nwant %q", got, want)
	}
}

// TestSetupReportsFailedRollback: an ADD that fails and whose own DEL
// fails too may have left the pod an IP. Setup says so (ErrRollback), and
// the ADD's error keeps its class, so the caller keeps the pod's record
// for a teardown that retries the DEL, and the gRPC code stays the ADD's.
func TestSetupReportsFailedRollback(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "fakeport", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet", "fakeport"), 0o644)
	writeFile(t, filepath.Join(e.plugins, "fakeport.fail"), "", 0o644)
	writeFile(t, filepath.Join(e.plugins, "fakenet.delfail"), "", 0o644)
	m := e.manager(t)
	pod := Pod{ID: "sb1", Name: "web", Namespace: "ns", UID: "uid", NetNS: "/some/netns"}
	_, err := m.Setup(ctx, pod)
	if !errors.Is(err, ErrRollback) || !errors.Is(err, errdefs.ErrUnknown) {
		t.Fatalf("Setup() = %v, want ErrUnknown and ErrRollback", err)
	}
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != 999 {
		t.Fatalf("Setup() = %v, the ADD's plugin error not kept first", err)
	}
	if !strings.Contains(err.Error(), "injected del failure") {
		t.Fatalf("Setup() = %v, the DEL's failure not told", err)
	}
	// The retry the caller makes once the plugin recovers releases it.
	e.calls(t)
	if err := os.Remove(filepath.Join(e.plugins, "fakenet.delfail")); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, Pod{ID: "sb1", Name: "web", Namespace: "ns", UID: "uid"}); err != nil {
		t.Fatalf("Teardown() after the failed rollback = %v", err)
	}
	if got := e.calls(t); len(got) != 2 {
		t.Fatalf("teardown calls = %q, want a DEL of each plugin", got)
	}
}

func TestSetupRollsBackOnFailure(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "fakeport", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet", "fakeport"), 0o644)
	writeFile(t, filepath.Join(e.plugins, "fakeport.fail"), "", 0o644)
	m := e.manager(t)
	pod := Pod{ID: "sb1", Name: "web", Namespace: "ns", UID: "uid", NetNS: "/some/netns"}
	_, err := m.Setup(ctx, pod)
	want := `cni add network "net" for sandbox sb1: unknown: plugin type="fakeport" failed (add): injected failure`
	if err == nil || err.Error() != want {
		t.Fatalf("Setup() = %v\nwant %s", err, want)
	}
	if !errors.Is(err, errdefs.ErrUnknown) {
		t.Fatalf("Setup() = %v, not ErrUnknown", err)
	}
	var cerr *types.Error
	if !errors.As(err, &cerr) || cerr.Code != 999 {
		t.Fatalf("Setup() = %v, plugin error not kept", err)
	}
	wantCalls := []string{
		"fakenet ADD sb1 netns=/some/netns eth0 " + cniArgs,
		"fakeport ADD sb1 netns=/some/netns eth0 " + cniArgs,
		"fakeport DEL sb1 netns=/some/netns eth0 " + cniArgs,
		"fakenet DEL sb1 netns=/some/netns eth0 " + cniArgs,
	}
	if got := e.calls(t); !reflect.DeepEqual(got, wantCalls) {
		t.Fatalf("calls = %q\nwant %q", got, wantCalls)
	}
	if got := e.cacheFiles(t); len(got) != 0 {
		t.Fatalf("cache after rollback = %v", got)
	}
}

func TestSetupErrors(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "loopback")
	m := e.manager(t)
	tests := []struct {
		name string
		pod  Pod
		want error
	}{
		{"bad id", Pod{ID: "../x", NetNS: "/ns"}, errdefs.ErrInvalidArgument},
		{"no netns", Pod{ID: "a"}, errdefs.ErrInvalidArgument},
		{"no network", Pod{ID: "a", NetNS: "/ns"}, errdefs.ErrFailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := m.Setup(ctx, tc.pod); !errors.Is(err, tc.want) {
				t.Fatalf("Setup() = %v, want %v", err, tc.want)
			}
		})
	}
	if err := m.Teardown(ctx, Pod{ID: "../x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Teardown(bad id) = %v", err)
	}
	// Canceled context: the plugin never runs and the error says retry.
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet"), 0o644)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Setup(cctx, Pod{ID: "a", NetNS: "/ns"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Setup(canceled) = %v, want ErrUnavailable", err)
	}
	if got := e.cacheFiles(t); len(got) != 0 {
		t.Fatalf("cache after canceled setup = %v", got)
	}
}

// TestTeardownSideDirPlugins: a conflist may take plugins from
// <conf dir>/<network name>/*.conf as well as inline ones. ADD runs them
// all, so the cached config DEL later runs with must hold them all too,
// or the side plugin (a portmap: its DNAT rules and the host port) is
// never deleted once the config has changed.
func TestTeardownSideDirPlugins(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "fakenet", "fakeport")
	writeFile(t, filepath.Join(e.conf, "10-net.conflist"), conflist("net", "fakenet"), 0o644)
	if err := os.Mkdir(filepath.Join(e.conf, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.conf, "net", "50-port.conf"), `{"type":"fakeport","capabilities":{"portMappings":true}}`, 0o644)
	m := e.manager(t)
	pod := Pod{ID: "sb1", Name: "web", Namespace: "ns", UID: "uid", NetNS: "/some/netns"}
	if _, err := m.Setup(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wantAdd := []string{"fakenet ADD sb1 netns=/some/netns eth0 " + cniArgs, "fakeport ADD sb1 netns=/some/netns eth0 " + cniArgs}
	if got := e.calls(t); !reflect.DeepEqual(got, wantAdd) {
		t.Fatalf("calls = %q\nwant %q", got, wantAdd)
	}
	if err := os.RemoveAll(filepath.Join(e.conf, "net")); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, pod); err != nil {
		t.Fatal(err)
	}
	wantDel := []string{"fakeport DEL sb1 netns= eth0 " + cniArgs, "fakenet DEL sb1 netns= eth0 " + cniArgs}
	if got := e.calls(t); !reflect.DeepEqual(got, wantDel) {
		t.Fatalf("calls = %q\nwant %q", got, wantDel)
	}
}
