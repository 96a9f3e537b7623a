package test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// A node runs for months and sees hundreds of thousands of pods. What a
// pod's life takes from the daemon (a file descriptor, a goroutine, a
// child it must reap) must come back when the pod goes, or the node
// fails long after the fault, at its file limit or out of memory.
// TestNoHoldingsAfterChurn takes the daemon's measure after two warm-up
// rounds of everything kubelet and kubectl do with a pod, the error
// paths among them, and again after eight more rounds: a leak of one
// per round shows as eight.

// churnRounds is how many measured rounds run after the warm-up.
const churnRounds = 8

// holdings is what the daemon holds between two pods.
type holdings struct {
	fds, goroutines, threads, children, zombies int
	// files counts what is under the daemon's root and run directories.
	files int
	// heapObjects is the live heap's object count after a collection.
	heapObjects int
	// kinds counts the fds by what they are: a path, or a socket, a pipe
	// or an anonymous inode without its number.
	kinds map[string]int
}

func (h holdings) String() string {
	return fmt.Sprintf("%d fds, %d goroutines, %d threads, %d children (%d zombies), %d files, %d heap objects", h.fds, h.goroutines, h.threads, h.children, h.zombies, h.files, h.heapObjects)
}

func TestNoHoldingsAfterChurn(t *testing.T) {
	addr := freePort(t)
	e := newCtrEnvWith(t, fmt.Sprintf("[metrics]\naddress = %q\nenable_pprof = true\n", addr))
	img := e.pushStreamImage(t)
	// An image of its own, pulled and removed in every round.
	extra := e.reg.Push(t, "churn:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "churn", Content: []byte("churn\n")}}}}))
	pprof := "http://" + addr + "/debug/pprof/goroutine?debug=1"
	var ids []string
	for i := range 2 {
		ids = append(ids, e.churnRound(t, img, extra, i)...)
	}
	base := e.holdings(t, pprof)
	baseStacks := scrape(t, pprof)
	for i := 2; i < 2+churnRounds; i++ {
		ids = append(ids, e.churnRound(t, img, extra, i)...)
	}
	// Whatever ends after its pod (a stream's last goroutine, a reaped
	// monitor) gets a few seconds.
	var now holdings
	deadline := time.Now().Add(15 * time.Second)
	for {
		now = e.holdings(t, pprof)
		if !now.leaks(base) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("after the warm-up: %v; after %d more rounds: %v", base, churnRounds, now)
	if now.leaks(base) {
		t.Errorf("the daemon holds more after %d pods than before them:\nbefore: %v\nafter:  %v\nmore fds of:\n%sgoroutines before:\n%s\ngoroutines after:\n%s",
			churnRounds, base, now, fdDiff(base, now), baseStacks, scrape(t, pprof))
	}
	left := e.d.Leftovers()
	for ip := range e.d.LeasedIPs(t) {
		left = append(left, "IP "+ip)
	}
	// No veth of any of them is left on the test bridge.
	ports, _ := os.ReadDir("/sys/class/net/" + e.d.Bridge + "/brif")
	for _, p := range ports {
		left = append(left, "bridge port "+p.Name())
	}
	left = append(left, outlivers(ids)...)
	left = append(left, filesNaming(t, []string{e.d.Root, e.d.RunRoot}, ids)...)
	if len(left) > 0 {
		t.Errorf("left behind after every pod was removed: %v", left)
	}
}

// filesNaming lists the files and directories under dirs whose path
// holds one of ids: a record, exit file, socket or cache entry of a pod
// or container that is gone.
func filesNaming(t *testing.T, dirs, ids []string) []string {
	t.Helper()
	var out []string
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			for _, id := range ids {
				if strings.Contains(p, id) {
					out = append(out, "file "+p)
					break
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("walking %s: %v", dir, err)
		}
	}
	return out
}

// outlivers lists the cgroups (in any hierarchy, up to three levels
// deep) and the processes (conmon, runc) that name one of ids.
func outlivers(ids []string) []string {
	var out []string
	for _, id := range ids {
		for _, pat := range []string{"/sys/fs/cgroup/*/*" + id, "/sys/fs/cgroup/*/*/*" + id, "/sys/fs/cgroup/*/*/*/*" + id} {
			dirs, _ := filepath.Glob(pat)
			for _, d := range dirs {
				out = append(out, "cgroup "+d)
			}
		}
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, id := range ids {
			if strings.Contains(string(b), id) {
				out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " "))
				break
			}
		}
	}
	return out
}

// leaks says whether h holds more than base by more than what a few
// idle connections or a late stream explain, which never grows with the
// number of pods. Threads are reported, not judged: Go keeps the threads
// a busy moment made.
func (h holdings) leaks(base holdings) bool {
	return h.fds > base.fds+3 || h.goroutines > base.goroutines+6 || h.children > base.children || h.zombies > 0 || h.files > base.files ||
		h.heapObjects > base.heapObjects+heapSlack
}

// fdKind strips the inode number of a socket, pipe or anonymous inode.
var fdKind = regexp.MustCompile(`^(socket|pipe|anon_inode:[^:]*):?\[?\d*\]?$`)

// fdDiff lists the kinds of fd now holds more of than base.
func fdDiff(base, now holdings) string {
	var b strings.Builder
	for k, n := range now.kinds {
		if n > base.kinds[k] {
			fmt.Fprintf(&b, "  %s: %d, was %d\n", k, n, base.kinds[k])
		}
	}
	return b.String()
}

// heapSlack is how many more live heap objects the daemon may hold after
// the measured rounds: over 40 rounds the count moved by about 200, all
// of it in the first ten; one pod's records are hundreds of objects.
const heapSlack = 1000

// holdings measures the daemon from outside: /proc for its fds, threads
// and children, pprof for its goroutines.
func (e *ctrEnv) holdings(t *testing.T, pprof string) holdings {
	t.Helper()
	pid := e.d.Pid()
	var h holdings
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	h.fds = len(fds)
	h.kinds = map[string]int{}
	for _, fd := range fds {
		link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		h.kinds[fdKind.ReplaceAllString(link, "$1")]++
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^Threads:\s+(\d+)`).FindSubmatch(st); m != nil {
		h.threads, _ = strconv.Atoi(string(m[1]))
	}
	m := regexp.MustCompile(`goroutine profile: total (\d+)`).FindStringSubmatch(scrape(t, pprof))
	if m == nil {
		t.Fatal("no goroutine total in the goroutine profile")
	}
	h.goroutines, _ = strconv.Atoi(m[1])
	// gc=1: counted after a collection, so only what is still reachable.
	heap := scrape(t, strings.Replace(pprof, "goroutine?", "heap?gc=1&", 1))
	m = regexp.MustCompile(`# HeapObjects = (\d+)`).FindStringSubmatch(heap)
	if m == nil {
		t.Fatal("no HeapObjects in the heap profile")
	}
	h.heapObjects, _ = strconv.Atoi(m[1])
	for _, dir := range []string{e.d.Root, e.d.RunRoot} {
		_ = filepath.WalkDir(dir, func(string, os.DirEntry, error) error { h.files++; return nil })
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		h.children++
		if f[0] == "Z" {
			h.zombies++
		}
	}
	return h
}

// churnRound runs one pod through what kubelet and kubectl do with it,
// failures included, and removes it; it returns the IDs of the pod and
// its containers. Odd rounds are user namespace pods.
func (e *ctrEnv) churnRound(t *testing.T, img, extra string, i int) []string {
	t.Helper()
	cfg := PodConfig(fmt.Sprintf("churn-%d", i))
	if i%2 == 1 {
		cfg = UsernsPod(cfg, 0)
	}
	cfg.LogDirectory = filepath.Join(e.d.Dir, "logs", cfg.Metadata.Name)
	pod := e.d.RunPod(t, cfg)
	s := &streamEnv{ctrEnv: e, pod: pod, podCfg: cfg, img: img}
	srv := e.ctr("server", "/bin/httpserver")
	srv.Image.Image = img
	echo := e.ctr("echo", "cat")
	echo.Image.Image = img
	echo.Stdin = true
	s.server = s.runCtr(t, srv)
	s.echo = s.runCtr(t, echo)

	s.churnExec(t)
	s.churnStreams(t)
	e.pull(t, extra)
	imgRemove(t, e.d, extra)
	s.churnReads(t)
	s.churnRefusals(t)

	if i == 0 {
		if ports, _ := os.ReadDir("/sys/class/net/" + e.d.Bridge + "/brif"); len(ports) != 1 {
			t.Fatalf("%d ports on the test bridge with one pod, want 1", len(ports))
		}
		if len(filesNaming(t, []string{e.d.Root, e.d.RunRoot}, []string{pod})) == 0 {
			t.Fatal("filesNaming sees no file of a running pod")
		}
		if seen := outlivers(append([]string{pod}, s.ctrs...)); !slices.ContainsFunc(seen, func(o string) bool { return strings.HasPrefix(o, "cgroup ") }) ||
			!slices.ContainsFunc(seen, func(o string) bool { return strings.HasPrefix(o, "process ") }) {
			t.Fatalf("outlivers sees no cgroup or no process of a running pod: %v", seen)
		}
	}
	for _, id := range s.ctrs {
		if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
	}
	if _, err := e.d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	return append(s.ctrs, pod)
}

// churnExec: ExecSync that answers, that times out, and a streaming exec
// with stdin.
func (s *streamEnv) churnExec(t *testing.T) {
	t.Helper()
	if out := s.mustExec(t, s.server, "echo", "hi"); out != "hi\n" {
		t.Fatalf("ExecSync echo = %q", out)
	}
	_, err := s.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: s.server, Cmd: []string{"sleep", "5"}, Timeout: 1})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ExecSync past its timeout: %v, want DeadlineExceeded", err)
	}
	out, _, err := s.streamExec(t, s.echo, strings.NewReader("in\n"), "cat")
	if err != nil || out != "in\n" {
		t.Fatalf("streaming exec of cat = %q, %v", out, err)
	}
	// With a terminal, as kubectl exec -it.
	u := s.execURL(t, s.server, []string{"sh", "-c", "echo tty"}, false, true)
	var tty lockedBuffer
	if err := spdyStream(Ctx(t), u, streamOpts{stdout: &tty, tty: true}); err != nil || !strings.Contains(tty.String(), "tty") {
		t.Fatalf("exec with a terminal = %q, %v", tty.String(), err)
	}
}

// churnStreams: an attach that detaches, a port-forward of a few
// requests, and one to a port nothing listens on.
func (s *streamEnv) churnStreams(t *testing.T) {
	t.Helper()
	s.attachDetach(t, "ping")

	local, stop := s.forward(t, 8080)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for j := range 5 {
		if got, err := get(client, local, "/"+strconv.Itoa(j)); err != nil || got != "hello /"+strconv.Itoa(j) {
			t.Fatalf("request %d through the forward: %q, %v", j, got, err)
		}
	}
	stop()
	// As kubectl port-forward to a port nothing listens on: the request
	// fails, the forward's error stream says why.
	closed, stop := s.forward(t, 8081)
	defer stop()
	if got, err := get(client, closed, "/"); err == nil {
		t.Fatalf("a request through a forward to a closed port answered %q", got)
	}
}

// churnReads: the status and stats calls kubelet makes all the time, a
// log reopen, resource updates of the pod and of a container, and an
// events stream that sees a container's life.
func (s *streamEnv) churnReads(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(Ctx(t))
	defer cancel()
	events, err := s.d.Runtime.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	short := s.runCtr(t, s.ctr("short", "sh", "-c", "echo done"))
	s.waitExit(t, short, 30*time.Second)
	calls := []func() error{
		func() error {
			_, err := s.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: s.server, Verbose: true})
			return err
		},
		func() error {
			_, err := s.d.Runtime.PodSandboxStatus(Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: s.pod, Verbose: true})
			return err
		},
		func() error {
			_, err := s.d.Runtime.ContainerStats(Ctx(t), &runtimeapi.ContainerStatsRequest{ContainerId: s.server})
			return err
		},
		func() error {
			_, err := s.d.Runtime.ListContainerStats(Ctx(t), &runtimeapi.ListContainerStatsRequest{})
			return err
		},
		func() error {
			_, err := s.d.Runtime.ListPodSandboxStats(Ctx(t), &runtimeapi.ListPodSandboxStatsRequest{})
			return err
		},
		func() error {
			_, err := s.d.Runtime.ReopenContainerLog(Ctx(t), &runtimeapi.ReopenContainerLogRequest{ContainerId: s.echo})
			return err
		},
		func() error {
			_, err := s.d.Runtime.UpdatePodSandboxResources(Ctx(t), &runtimeapi.UpdatePodSandboxResourcesRequest{
				PodSandboxId: s.pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 1024, MemoryLimitInBytes: 512 << 20},
			})
			return err
		},
		func() error {
			_, err := s.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
				ContainerId: s.server, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 256 << 20},
			})
			return err
		},
	}
	for k, call := range calls {
		if err := call(); err != nil {
			t.Fatalf("call %d: %v", k, err)
		}
	}
	for {
		ev, err := events.Recv()
		if err != nil {
			t.Fatalf("GetContainerEvents: %v", err)
		}
		if ev.ContainerId == short && ev.ContainerEventType == runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
			return
		}
	}
}

// churnRefusals: requests refused for what they name or ask for.
func (s *streamEnv) churnRefusals(t *testing.T) {
	t.Helper()
	_, err := s.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: "0123456789ab"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("ContainerStatus of an unknown ID: %v, want NotFound", err)
	}
	bad := s.ctr("bad", "true")
	bad.Mounts = []*runtimeapi.Mount{{HostPath: "relative/path", ContainerPath: "/x"}}
	_, err = s.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: s.pod, Config: bad, SandboxConfig: s.podCfg})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateContainer with a relative host path: %v, want InvalidArgument", err)
	}
	missing := s.ctr("missing", "/no/such/binary")
	id := s.create(t, s.pod, s.podCfg, missing)
	if _, err := s.d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: id}); err == nil {
		t.Fatal("StartContainer of a missing binary succeeded")
	}
	if _, err := s.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("RemoveContainer of a container that failed to start: %v", err)
	}
	if _, err := s.d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: s.reg.Ref("no/such:image")}}); status.Code(err) != codes.NotFound {
		t.Fatalf("PullImage of a missing image: %v, want NotFound", err)
	}
	// Pods that cannot run: an unknown handler, a runtime that is not
	// there.
	for h, want := range map[string]codes.Code{"nosuch": codes.InvalidArgument, "missing": codes.FailedPrecondition} {
		cfg := UsernsPod(PodConfig("refused-"+h), 0)
		_, err := s.d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: h})
		if status.Code(err) != want {
			t.Fatalf("RunPodSandbox with handler %s: %v, want %v", h, err, want)
		}
	}
}

// settledAfterCuts waits until the image store holds only want. A pull
// whose last caller gave up once its layers were in may still record its
// image (the work is done, and the next kubelet retry finds it): such an
// image is listed, so it is removed here; what must not stay is anything
// no listed image owns.
func settledAfterCuts(t *testing.T, d *Daemon, want []string) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for _, img := range imgList(t, d, "") {
			t.Logf("a cut-off pull recorded its image %s; removing it", img.Id)
			imgRemove(t, d, img.Id)
		}
		if got = storeEntries(t, d); slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(got, want) {
		extra, missing := entriesDiff(want, got)
		t.Fatalf("the image store (no image listed) has %d entries no image owns: %v; and lacks %v", len(extra), extra, missing)
	}
}

// TestNoHoldingsAfterCancelledPulls: kubelet cancels a pull when the pod
// that wanted the image goes, and a client times out. A pull cut off at
// any point of its download gives back what it took: its connections,
// goroutines and staged files.
func TestNoHoldingsAfterCancelledPulls(t *testing.T) {
	addr := freePort(t)
	// A daemon with no other image: the store must come back to empty.
	e := &ctrEnv{
		d:   StartDaemon(t, Options{Config: fmt.Sprintf("[metrics]\naddress = %q\nenable_pprof = true\n", addr)}),
		reg: testimage.StartRegistry(t),
	}
	pprof := "http://" + addr + "/debug/pprof/goroutine?debug=1"
	payload := make([]byte, 4<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	img := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "payload", Content: payload}}}})
	ref := e.reg.Push(t, "cancelled:1", img)
	top := testimage.TopLayer(t, img)
	// The payload's layer at about 8 MB/s: a pull lasts half a second.
	e.reg.Intercept(onBlob(top, throttled(64, 8*time.Millisecond, -1, nil)))
	defer e.reg.Intercept(nil)
	none := storeEntries(t, e.d)
	// cut pulls with a deadline after, and says whether it cut the pull
	// off; one that finished first is removed again.
	cut := func(after time.Duration) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), after)
		defer cancel()
		_, err := e.d.Image.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err == nil {
			imgRemove(t, e.d, ref)
		}
		return err != nil
	}
	cut(time.Minute)
	cut(200 * time.Millisecond)
	settledAfterCuts(t, e.d, none)
	base := e.holdings(t, pprof)
	cutOff := 0
	for i := range churnRounds {
		if cut(time.Duration(50+i*40) * time.Millisecond) {
			cutOff++
		}
	}
	if cutOff < churnRounds/2 {
		t.Fatalf("only %d of %d pulls were cut off: the check checks little", cutOff, churnRounds)
	}
	settledAfterCuts(t, e.d, none)
	var now holdings
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if now = e.holdings(t, pprof); !now.leaks(base) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after two pulls: %v; after %d more, %d of them cut off: %v", base, churnRounds, cutOff, now)
	if now.leaks(base) {
		t.Errorf("the daemon holds more after %d cancelled pulls than before them:\nbefore: %v\nafter:  %v\nmore fds of:\n%sgoroutines:\n%s",
			churnRounds, base, now, fdDiff(base, now), scrape(t, pprof))
	}
}
