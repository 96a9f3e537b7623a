// Command nriplugin is the NRI plugin pinrt's e2e tests run: built on
// containerd/nri's stub, as third-party plugins are, it records every
// event it sees in a file and adjusts containers as its flags say.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	mu     sync.Mutex
	events *os.File

	only   string // adjust only containers of this name ("" = all)
	env    string // KEY=VALUE added to the environment
	nofile uint64 // RLIMIT_NOFILE soft and hard, 0 = leave
	rlimit string // an rlimit type set to 1024, possibly one that does not exist
	oom    int    // oom_score_adj, 0 = leave
	ann    string // annotation key=value
	netns  string // a network namespace path to move the container to
	hang   string // container name whose CreateContainer never answers
	// crashAfter makes the plugin exit in the middle of its crashAfter'th
	// CreateContainer, without answering (0 = never).
	crashAfter int
	creates    int
	device     string // path:major:minor of a char device to add
	mount      string // host:container read-only bind to add
	hook       string // file a createRuntime hook writes the container ID to
	cgroup     string // cgroupfs parent the container's cgroup is moved under
	cdi        string // a CDI device to inject
	// syncDelay holds Synchronize open after it is recorded.
	syncDelay time.Duration
}

// record appends one line to the event file; the tests poll it.
func (p *plugin) record(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.events, format+"\n", args...)
	_ = p.events.Sync()
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	names := make([]string, 0, len(pods))
	for _, pod := range pods {
		names = append(names, pod.GetName())
	}
	p.record("SYNC pods=%d containers=%d names=%s", len(pods), len(ctrs), strings.Join(names, ","))
	time.Sleep(p.syncDelay)
	p.record("SYNCED")
	return nil, nil
}

func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("RunPodSandbox %s", pod.GetName())
	return nil
}

func (p *plugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, res *api.LinuxResources) error {
	p.record("UpdatePodSandbox %s shares=%d", pod.GetName(), res.GetCpu().GetShares().GetValue())
	return nil
}

func (p *plugin) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("PostUpdatePodSandbox %s", pod.GetName())
	return nil
}

func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("StopPodSandbox %s", pod.GetName())
	return nil
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.record("RemovePodSandbox %s", pod.GetName())
	return nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.record("CreateContainer %s/%s", pod.GetName(), c.GetName())
	p.mu.Lock()
	p.creates++
	crash := p.crashAfter > 0 && p.creates >= p.crashAfter
	p.mu.Unlock()
	if crash {
		p.record("CRASH")
		os.Exit(3)
	}
	if p.hang != "" && c.GetName() == p.hang {
		select {} // until killed
	}
	adj := &api.ContainerAdjustment{}
	if p.only != "" && c.GetName() != p.only {
		return adj, nil, nil
	}
	if k, v, ok := strings.Cut(p.env, "="); ok {
		adj.AddEnv(k, v)
	}
	if k, v, ok := strings.Cut(p.ann, "="); ok {
		adj.AddAnnotation(k, v)
	}
	if p.nofile > 0 {
		adj.AddRlimit("RLIMIT_NOFILE", p.nofile, p.nofile)
	}
	if p.rlimit != "" {
		adj.AddRlimit(p.rlimit, 1024, 1024)
	}
	if p.oom != 0 {
		adj.SetLinuxOomScoreAdj(&p.oom)
	}
	if path, mm, ok := strings.Cut(p.device, ":"); ok {
		var major, minor int64
		if _, err := fmt.Sscanf(mm, "%d:%d", &major, &minor); err != nil {
			return nil, nil, err
		}
		adj.AddDevice(&api.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor, FileMode: api.FileMode(0o666)})
	}
	if src, dst, ok := strings.Cut(p.mount, ":"); ok {
		adj.AddMount(&api.Mount{Source: src, Destination: dst, Type: "bind", Options: []string{"rbind", "ro"}})
	}
	if p.hook != "" {
		adj.AddHooks(&api.Hooks{CreateRuntime: []*api.Hook{{Path: "/bin/sh", Args: []string{"sh", "-c", "cat >/dev/null; echo " + c.GetId() + " >" + p.hook}}}})
	}
	if p.cdi != "" {
		adj.AddCDIDevice(&api.CDIDevice{Name: p.cdi})
	}
	if p.cgroup != "" {
		adj.SetLinuxCgroupsPath(p.cgroup + "/" + c.GetId())
	}
	if p.netns != "" {
		adj.AddOrReplaceNamespace(&api.LinuxNamespace{Type: "network", Path: p.netns})
	}
	return adj, nil, nil
}

func (p *plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.record("PostCreateContainer %s/%s", pod.GetName(), c.GetName())
	return nil
}

func (p *plugin) StartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.record("StartContainer %s/%s", pod.GetName(), c.GetName())
	return nil
}

func (p *plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.record("PostStartContainer %s/%s", pod.GetName(), c.GetName())
	return nil
}

func (p *plugin) UpdateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.record("UpdateContainer %s/%s", pod.GetName(), c.GetName())
	return nil, nil
}

func (p *plugin) PostUpdateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.record("PostUpdateContainer %s/%s", pod.GetName(), c.GetName())
	return nil
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	p.record("StopContainer %s/%s", pod.GetName(), c.GetName())
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.record("RemoveContainer %s/%s", pod.GetName(), c.GetName())
	return nil
}

func main() {
	var (
		p            plugin
		socket, name string
		idx, events  string
	)
	flag.StringVar(&socket, "socket", "", "NRI socket")
	flag.StringVar(&name, "name", "e2e", "plugin name")
	flag.StringVar(&idx, "idx", "50", "plugin index")
	flag.StringVar(&events, "events", "", "file the events are appended to")
	flag.StringVar(&p.only, "only", "", "adjust only containers of this name")
	flag.StringVar(&p.env, "env", "", "KEY=VALUE to add")
	flag.Uint64Var(&p.nofile, "nofile", 0, "RLIMIT_NOFILE to set")
	flag.IntVar(&p.oom, "oom", 0, "oom_score_adj to set")
	flag.StringVar(&p.rlimit, "rlimit", "", "rlimit type to set to 1024")
	flag.StringVar(&p.ann, "annotation", "", "key=value annotation to add")
	flag.StringVar(&p.netns, "netns", "", "network namespace to move containers to")
	flag.StringVar(&p.hang, "hang", "", "container name whose creation never gets an answer")
	flag.StringVar(&p.device, "device", "", "path:major:minor of a char device to add")
	flag.StringVar(&p.mount, "mount", "", "host:container read-only bind to add")
	flag.StringVar(&p.hook, "hook", "", "file a createRuntime hook writes the container ID to")
	flag.StringVar(&p.cgroup, "cgroup", "", "cgroupfs parent to move containers' cgroups under")
	flag.StringVar(&p.cdi, "cdi", "", "CDI device to inject")
	flag.DurationVar(&p.syncDelay, "sync-delay", 0, "how long Synchronize takes")
	flag.IntVar(&p.crashAfter, "crash-after", 0, "exit in the middle of this many'th CreateContainer")
	flag.Parse()
	f, err := os.OpenFile(events, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	p.events = f
	s, err := stub.New(&p, stub.WithSocketPath(socket), stub.WithPluginName(name), stub.WithPluginIdx(idx))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		p.record("EXIT %v", err)
		os.Exit(1)
	}
}
