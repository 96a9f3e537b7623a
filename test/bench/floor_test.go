package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/bench"
)

// inProcessFloor serves the replies from a goroutine instead of a
// process, and counts the servers still running.
type inProcessFloor struct {
	t       *testing.T
	running int
}

func (f *inProcessFloor) start(ctx context.Context, rep *bench.FloorReplies) (string, func(), error) {
	dir, err := os.MkdirTemp("", "pbf")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "floor.sock")
	body, err := json.Marshal(rep)
	if err != nil {
		return "", nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bench.ServeFloor(sctx, sock, bytes.NewReader(body)) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			return "", nil, errors.New("floor server did not listen")
		}
	}
	f.running++
	return "unix://" + sock, func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("ServeFloor: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			f.t.Errorf("the floor socket is left after the stop: %v", err)
		}
		os.RemoveAll(dir)
		f.running--
	}, nil
}

func TestStatusTimesTheFloor(t *testing.T) {
	srv, c := startFake(t)
	floor := &inProcessFloor{t: t}
	cfg := bench.Config{N: 3, P: 2, Containers: 2, StatsRounds: 2, Image: testImage, Floor: floor.start}
	res, err := bench.Run(context.Background(), c, bench.ScenarioStatus, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]want{
		bench.OpContainerStatus: {12, 0}, bench.OpContainerStatusFloor: {12, 0}, bench.OpContainerStatusVFloor: {12, 0},
		bench.OpListContainers: {2, 0}, bench.OpListContainersFloor: {2, 0}, bench.OpListPodSandboxFloor: {2, 0},
		bench.OpListCtrStats: {2, 0}, bench.OpListCtrStatsFloor: {2, 0},
	} {
		if o := op(t, res, name); o.Count != w.count || o.Errors != w.errors {
			t.Errorf("%s: count %d errors %d, want %d/%d (samples %q)", name, o.Count, o.Errors, w.count, w.errors, o.ErrorSamples)
		}
	}
	for _, m := range []string{"list_containers_reply_bytes", "container_status_reply_bytes", "list_container_stats_reply_bytes"} {
		if res.Metrics[m] <= 0 {
			t.Errorf("%s not reported: %v", m, res.Metrics)
		}
	}
	if floor.running != 0 {
		t.Errorf("%d floor servers still running", floor.running)
	}
	if sb, ctr := srv.Counts(); sb != 0 || ctr != 0 {
		t.Errorf("%d sandboxes and %d containers left", sb, ctr)
	}
}

func TestStatusFloorThatCannotStart(t *testing.T) {
	_, c := startFake(t)
	cfg := bench.Config{N: 1, Containers: 1, StatsRounds: 1, Image: testImage,
		Floor: func(context.Context, *bench.FloorReplies) (string, func(), error) {
			return "", nil, errors.New("no floor here")
		}}
	res, err := bench.Run(context.Background(), c, bench.ScenarioStatus, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o := op(t, res, bench.OpListContainersFloor); o.Errors != 1 {
		t.Errorf("floor failure counted %d times, want 1", o.Errors)
	}
	if !hasSample(res, "no floor here") {
		t.Errorf("the floor's failure is not shown: %+v", res.Ops)
	}
}

func TestFloorServesTheCapturedReplies(t *testing.T) {
	list := &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "a", PodSandboxId: "p", State: runtimeapi.ContainerState_CONTAINER_RUNNING, Labels: map[string]string{"k": "v"}},
	}}
	pods := &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "p"}}}
	stats := &runtimeapi.ListContainerStatsResponse{Stats: []*runtimeapi.ContainerStats{
		{Attributes: &runtimeapi.ContainerAttributes{Id: "a"}, Cpu: &runtimeapi.CpuUsage{Timestamp: 1, UsageCoreNanoSeconds: &runtimeapi.UInt64Value{Value: 7}}},
	}}
	plain := &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: "a", State: runtimeapi.ContainerState_CONTAINER_RUNNING}}
	verbose := &runtimeapi.ContainerStatusResponse{Status: plain.Status, Info: map[string]string{"info": "{}"}}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rep := &bench.FloorReplies{
		ListContainers: marshal(list), ListPodSandbox: marshal(pods), ListCtrStats: marshal(stats),
		Status: map[string][]byte{"a": marshal(plain)}, StatusVerbose: map[string][]byte{"a": marshal(verbose)},
	}
	floor := &inProcessFloor{t: t}
	ep, stop, err := floor.start(context.Background(), rep)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	c, err := bench.Dial(ep, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if got, err := c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil || !proto.Equal(got, list) {
		t.Errorf("ListContainers = %v, %v", got, err)
	}
	if got, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil || !proto.Equal(got, pods) {
		t.Errorf("ListPodSandbox = %v, %v", got, err)
	}
	if got, err := c.Runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{}); err != nil || !proto.Equal(got, stats) {
		t.Errorf("ListContainerStats = %v, %v", got, err)
	}
	if got, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "a"}); err != nil || !proto.Equal(got, plain) {
		t.Errorf("ContainerStatus = %v, %v", got, err)
	}
	if got, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "a", Verbose: true}); err != nil || !proto.Equal(got, verbose) {
		t.Errorf("verbose ContainerStatus = %v, %v", got, err)
	}
	if _, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "b"}); status.Code(err) != codes.NotFound {
		t.Errorf("status of an uncaptured container: %v, want NotFound", err)
	}
	if _, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("RunPodSandbox on the floor: %v, want Unimplemented", err)
	}
}

func TestServeFloorRefusesBadReplies(t *testing.T) {
	dir, err := os.MkdirTemp("", "pbf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "floor.sock")
	for name, in := range map[string]string{
		"not JSON":             "{",
		"not a list":           `{"list_containers":"` + "/////w==" + `"}`,
		"not a stats list":     `{"list_container_stats":"` + "/////w==" + `"}`,
		"not a status message": `{"status":{"a":"/////w=="}}`,
	} {
		if err := bench.ServeFloor(context.Background(), sock, bytes.NewReader([]byte(in))); err == nil {
			t.Errorf("%s: served", name)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("%s: socket left: %v", name, err)
		}
	}
}
