package test

import (
	"context"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestEvents(t *testing.T) {
	e := newCtrEnv(t)
	t.Run("Lifecycle", e.testEventsLifecycle)
	t.Run("StuckSubscriber", e.testEventsStuckSubscriber)
	// Stops the shared daemon: keep it last.
	t.Run("ShutdownEndsStreams", e.testEventsShutdown)
}

// testEventsShutdown keeps a subscriber on its own connection, as kubelet
// does, across SIGTERM: the daemon must end the stream cleanly instead of
// waiting out its shutdown timeout for it.
func (e *ctrEnv) testEventsShutdown(t *testing.T) {
	conn, err := grpc.NewClient("unix://"+e.d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := runtimeapi.NewRuntimeServiceClient(conn).GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is only open on the server once a call went through.
	if _, err := e.d.Runtime.Version(Ctx(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		ended <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := e.d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("SIGTERM to exit with a subscriber: %v", took)
	// The default shutdown_timeout is 10s: finishing before it means
	// the stream did not hold the graceful stop.
	if took > 8*time.Second {
		t.Errorf("shutdown with an open event stream took %v", took)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, io.EOF) {
			t.Errorf("the stream ended with %v, want a clean end (EOF)", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the stream did not end with the daemon")
	}
}

// subscribe opens a GetContainerEvents stream that ends with the test.
func (e *ctrEnv) subscribe(t *testing.T) runtimeapi.RuntimeService_GetContainerEventsClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := e.d.Runtime.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

type recvd struct {
	ev *runtimeapi.ContainerEventResponse
	at time.Time
}

func (e *ctrEnv) testEventsLifecycle(t *testing.T) {
	stream := e.subscribe(t)
	evs := make(chan recvd, 64)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				close(evs)
				return
			}
			evs <- recvd{ev, time.Now()}
		}
	}()
	pod, podCfg := e.pod(t, PodConfig("events"))
	id := e.run(t, pod, podCfg, e.ctr("short", "sh", "-c", "sleep 1; exit 3"))
	next := func(want runtimeapi.ContainerEventType) recvd {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case r, ok := <-evs:
				if !ok {
					t.Fatalf("stream ended before %v", want)
				}
				if r.ev.ContainerId != id {
					continue
				}
				if r.ev.ContainerEventType != want {
					t.Fatalf("got %v, want %v", r.ev.ContainerEventType, want)
				}
				return r
			case <-timeout:
				t.Fatalf("no %v event within 10s", want)
			}
		}
	}
	created := next(runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	if created.ev.PodSandboxStatus.GetId() != pod || created.ev.PodSandboxStatus.GetMetadata().GetName() != "events" {
		t.Errorf("CREATED carries pod status %v", created.ev.PodSandboxStatus)
	}
	started := next(runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	if len(started.ev.ContainersStatuses) != 1 || started.ev.ContainersStatuses[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("STARTED carries %v", started.ev.ContainersStatuses)
	}
	stopped := next(runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	var st *runtimeapi.ContainerStatus
	for _, cs := range stopped.ev.ContainersStatuses {
		if cs.Id == id {
			st = cs
		}
	}
	if st == nil || st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 3 {
		t.Fatalf("STOPPED carries %v", stopped.ev.ContainersStatuses)
	}
	// conmon dates the exit; the event must follow it promptly, not at
	// the next poll (the bound leaves a loaded machine some seconds).
	lag := stopped.at.Sub(time.Unix(0, st.FinishedAt))
	t.Logf("exit noticed %v after it happened", lag)
	if lag > 5*time.Second {
		t.Errorf("exit event came %v after the exit", lag)
	}
	if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	deleted := next(runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	if created.ev.CreatedAt >= started.ev.CreatedAt || started.ev.CreatedAt >= stopped.ev.CreatedAt || stopped.ev.CreatedAt >= deleted.ev.CreatedAt {
		t.Errorf("event times out of order: %d %d %d %d", created.ev.CreatedAt, started.ev.CreatedAt, stopped.ev.CreatedAt, deleted.ev.CreatedAt)
	}
	for _, want := range [][]string{
		{"level=info", "container created", "pod=e2e/events", "id=" + id[:12]},
		{"level=info", "container started", "pod=e2e/events"},
		{"level=info", "container exited", "exitCode=3", "reason=Error"},
		{"level=info", "container removed", "id=" + id[:12]},
		{"level=info", "pod created", "pod=e2e/events", "id=" + pod[:12]},
	} {
		if !e.logHas(want...) {
			t.Errorf("the daemon log has no line with %q", want)
		}
	}
}

// logHas says whether the daemon log holds a line with every part.
func (e *ctrEnv) logHas(parts ...string) bool {
	for _, line := range strings.Split(e.d.Log(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}

func (e *ctrEnv) testEventsStuckSubscriber(t *testing.T) {
	// Subscribed and never read: its queue and the gRPC window fill up.
	_ = e.subscribe(t)
	start := time.Now()
	for i := range 10 {
		pod, podCfg := e.pod(t, PodConfig("stuck-"+string(rune('a'+i))))
		id := e.run(t, pod, podCfg, e.ctr("c", "true"))
		e.waitExit(t, id, 10*time.Second)
		if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("10 pod lifecycles with a stuck subscriber took %v", time.Since(start))
	// A live subscriber still gets events.
	stream := e.subscribe(t)
	pod, podCfg := e.pod(t, PodConfig("after-stuck"))
	id := e.create(t, pod, podCfg, e.ctr("c", "true"))
	ev, err := stream.Recv()
	if err != nil || ev.ContainerId != id || ev.ContainerEventType != runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT {
		t.Fatalf("fresh subscriber got %v, %v", ev, err)
	}
}

// TestLifecycleLogsAtInfo checks what an operator sees at the default
// level: one line per pod and container step, naming them, and nothing
// for kubelet's routine refused calls.
func TestLifecycleLogsAtInfo(t *testing.T) {
	e := newCtrEnvWith(t, "", func(o *Options) {
		// Top-level keys go before the tables of the config.
		o.Config = "log_level = \"info\"\n" + o.Config
		o.ConfigLogLevel = true
	})
	ctx := Ctx(t)
	pod, podCfg := e.pod(t, PodConfig("loginfo"))
	id := e.run(t, pod, podCfg, e.ctr("app", "sleep", "3600"))
	rt := e.d.Runtime
	if _, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "0123456789abcdef"}); err == nil {
		t.Fatal("status of an unknown container succeeded")
	}
	steps := []func() error{
		func() error {
			_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0})
			return err
		},
		func() error {
			_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		},
		func() error {
			_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
			return err
		},
		func() error {
			_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	short, podShort := "id="+id[:12], "id="+pod[:12]
	for _, want := range [][]string{
		{"pod created", "pod=e2e/loginfo", podShort},
		{"container created", "container=app", short},
		{"container started", short},
		{"container exited", short, "exitCode=137", "reason=Error"},
		{"container stopped", short},
		{"container removed", short},
		{"pod stopped", podShort},
		{"pod removed", podShort},
	} {
		if !e.logHas(append(want, "level=info")...) {
			t.Errorf("no info line with %q", want)
		}
	}
	log := e.d.Log()
	if strings.Contains(log, "level=debug") || strings.Contains(log, "0123456789abcdef") {
		t.Errorf("debug lines or the refused call logged at info:\n%s", log)
	}
}
