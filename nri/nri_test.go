package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// fakeRuntime is the runtime side a plugin is synchronized with.
type fakeRuntime struct {
	pods    []*api.PodSandbox
	mu      sync.Mutex
	updates []*api.ContainerUpdate
}

func (f *fakeRuntime) Snapshot(context.Context) ([]*api.PodSandbox, []*api.Container, error) {
	return f.pods, []*api.Container{{Id: "c1", PodSandboxId: "p1", Name: "c"}}, nil
}

func (f *fakeRuntime) UpdateContainers(_ context.Context, u []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.updates = append(f.updates, u...)
	return nil, nil
}

// testPlugin adds an env var, or hangs in CreateContainer when hang is set.
type testPlugin struct {
	synced chan []*api.PodSandbox
	hang   chan struct{}
}

func (p *testPlugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	p.synced <- pods
	return nil, nil
}

func (p *testPlugin) CreateContainer(ctx context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if p.hang != nil {
		select {
		case <-p.hang:
		case <-ctx.Done():
		}
	}
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("SEEN", c.GetName())
	return adj, nil, nil
}

// startNRI starts NRI with the given request timeout: a short one only
// where the test is about a plugin that does not answer, since a
// loaded machine's round trip may take longer than that.
func startNRI(t *testing.T, rt Runtime, requestTimeout time.Duration) (*NRI, Config) {
	t.Helper()
	// A short dir: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := Config{
		SocketPath: filepath.Join(dir, "run", "nri.sock"), PluginPath: filepath.Join(dir, "plugins"),
		PluginConfigPath: filepath.Join(dir, "conf.d"), RegistrationTimeout: 10 * time.Second, RequestTimeout: requestTimeout,
	}
	n, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	fi, err := os.Stat(cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600: any local user could rewrite containers", fi.Mode().Perm())
	}
	return n, cfg
}

func connect(t *testing.T, cfg Config, p *testPlugin, name string) stub.Stub {
	t.Helper()
	s, err := stub.New(p, stub.WithSocketPath(cfg.SocketPath), stub.WithPluginName(name), stub.WithPluginIdx("10"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func TestSyncAndAdjust(t *testing.T) {
	rt := &fakeRuntime{pods: []*api.PodSandbox{{Id: "p1", Name: "one"}, {Id: "p2", Name: "two"}}}
	n, cfg := startNRI(t, rt, 10*time.Second)
	p := &testPlugin{synced: make(chan []*api.PodSandbox, 1)}
	connect(t, cfg, p, "adder")
	select {
	case pods := <-p.synced:
		if len(pods) != 2 || pods[1].GetName() != "two" {
			t.Errorf("synchronized pods = %v", pods)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin was never synchronized")
	}
	// Registration completes after the sync: wait for the plugin to be
	// in the list by asking until it answers.
	deadline := time.Now().Add(5 * time.Second)
	for {
		adj, err := n.CreateContainer(context.Background(), &api.PodSandbox{Id: "p1"}, &api.Container{Id: "c2", PodSandboxId: "p1", Name: "web"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(adj.Adjust.GetEnv(), func(kv *api.KeyValue) bool { return kv.Key == "SEEN" && kv.Value == "web" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no adjustment from the plugin: %v", adj.Adjust)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// An adjustment the runtime cannot apply is refused, naming its plugin.
	check := func(a *api.ContainerAdjustment) error {
		if len(a.GetEnv()) == 0 {
			return errors.New("check saw no adjustment")
		}
		return errors.New("cannot apply this")
	}
	_, err := n.CreateContainer(context.Background(), &api.PodSandbox{Id: "p1"}, &api.Container{Id: "c3", PodSandboxId: "p1", Name: "bad"}, check)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `"10-adder"`) || !strings.Contains(err.Error(), "cannot apply this") {
		t.Errorf("err = %v, want FailedPrecondition naming 10-adder", err)
	}
}

// A plugin that does not answer holds a creation for the request timeout
// at most, and is then dropped.
func TestHungPluginBounded(t *testing.T) {
	n, cfg := startNRI(t, &fakeRuntime{}, 500*time.Millisecond)
	hang := make(chan struct{})
	defer close(hang)
	p := &testPlugin{synced: make(chan []*api.PodSandbox, 1), hang: hang}
	connect(t, cfg, p, "hanger")
	<-p.synced
	// Registration completes after the sync, so a creation right after it
	// may not reach the plugin yet: create until one does, which only the
	// request timeout ends. A sleep here failed on a loaded host.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		start := time.Now()
		ctr := &api.Container{Id: fmt.Sprintf("c%d", i), PodSandboxId: "p1", Name: fmt.Sprintf("c%d", i)}
		if _, err := n.CreateContainer(context.Background(), &api.PodSandbox{Id: "p1"}, ctr, nil); err != nil {
			t.Fatalf("a hung plugin failed the creation: %v", err)
		}
		d := time.Since(start)
		if d > 3*time.Second {
			t.Errorf("a hung plugin held the creation %v with a %v request timeout", d, cfg.RequestTimeout)
		}
		if d >= cfg.RequestTimeout {
			break // it waited for the hung plugin, and went on without it
		}
		if time.Now().After(deadline) {
			t.Fatal("no creation reached the hung plugin")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The plugin is dropped now, or soon: the adaptation closes it after
	// the timed-out request returns (a creation at once waited for it
	// again under -race in CI). From then on no creation waits the
	// whole request timeout.
	deadline = time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		start := time.Now()
		ctr := &api.Container{Id: fmt.Sprintf("after%d", i), PodSandboxId: "p1", Name: fmt.Sprintf("after%d", i)}
		if _, err := n.CreateContainer(context.Background(), &api.PodSandbox{Id: "p1"}, ctr, nil); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		if d < cfg.RequestTimeout {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dropped plugin still delays creations after 10s: %v", d)
		}
	}
}

func TestDisabledIsNoop(t *testing.T) {
	var n *NRI
	defer n.BlockSync()()
	adj, err := n.CreateContainer(context.Background(), nil, nil, nil)
	if err != nil || adj == nil || adj.Adjust != nil {
		t.Errorf("disabled CreateContainer = %v, %v", adj, err)
	}
	if err := n.RunPodSandbox(context.Background(), nil); err != nil {
		t.Error(err)
	}
	if err := n.Start(Config{}); err != nil {
		t.Error(err)
	}
	n.Stop()
	if _, err := New(Config{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("New without a runtime: %v", err)
	}
}

// BenchmarkCreateContainerNoPlugin is what NRI enabled, with no plugin
// connected, adds to every CreateContainer: the event through the
// adaptation (its built-in validator included).
func BenchmarkCreateContainerNoPlugin(b *testing.B) {
	dir, err := os.MkdirTemp("", "nri-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{SocketPath: filepath.Join(dir, "nri.sock"), PluginPath: filepath.Join(dir, "p"), PluginConfigPath: filepath.Join(dir, "c")}
	n, err := New(cfg, &fakeRuntime{})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Start(cfg); err != nil {
		b.Fatal(err)
	}
	defer n.Stop()
	pod := &api.PodSandbox{Id: "p1", Name: "pod", Namespace: "ns", Uid: "u", Labels: map[string]string{"app": "x"}}
	ctr := &api.Container{Id: "c1", PodSandboxId: "p1", Name: "c", Args: []string{"sleep", "1000"}, Env: []string{"PATH=/bin", "A=1"}}
	for range 10 {
		ctr.Mounts = append(ctr.Mounts, &api.Mount{Destination: "/v", Source: "/tmp", Type: "bind", Options: []string{"rbind", "ro"}})
	}
	for b.Loop() {
		unblock := n.BlockSync()
		if _, err := n.CreateContainer(context.Background(), pod, ctr, nil); err != nil {
			b.Fatal(err)
		}
		unblock()
	}
}

// podUpdater sees pod updates and refuses one of 1 CPU share.
type podUpdater struct {
	testPlugin
	mu   sync.Mutex
	seen []string
}

func (p *podUpdater) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, overhead, res *api.LinuxResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, fmt.Sprintf("update %s %d+%d", pod.GetId(), res.GetCpu().GetShares().GetValue(), overhead.GetCpu().GetShares().GetValue()))
	if res.GetCpu().GetShares().GetValue() == 1 {
		return errors.New("1 share is too little")
	}
	return nil
}

func (p *podUpdater) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, "post "+pod.GetId())
	return nil
}

func TestUpdatePodSandbox(t *testing.T) {
	n, cfg := startNRI(t, &fakeRuntime{}, 10*time.Second)
	p := &podUpdater{testPlugin: testPlugin{synced: make(chan []*api.PodSandbox, 1)}}
	s, err := stub.New(p, stub.WithSocketPath(cfg.SocketPath), stub.WithPluginName("pods"), stub.WithPluginIdx("10"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	<-p.synced
	shares := func(v uint64) *api.LinuxResources {
		return &api.LinuxResources{Cpu: &api.LinuxCPU{Shares: api.UInt64(v)}}
	}
	pod := &api.PodSandbox{Id: "p1"}
	// Registration completes after the sync: ask until the plugin hears.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := n.UpdatePodSandbox(context.Background(), pod, shares(10), shares(512)); err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		heard := len(p.seen) > 0
		p.mu.Unlock()
		if heard {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin never saw UpdatePodSandbox")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n.PostUpdatePodSandbox(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	err = n.UpdatePodSandbox(context.Background(), pod, nil, shares(1))
	// The adaptation passes a plugin's own refusal on without its name.
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "too little") {
		t.Errorf("err = %v, want FailedPrecondition with the plugin's reason", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	want := []string{"update p1 512+10", "post p1", "update p1 1+0"}
	if !slices.Equal(p.seen, want) {
		t.Errorf("the plugin saw %q, want %q", p.seen, want)
	}
}
