package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pinrt/pinrt/version"
)

func TestObserve(t *testing.T) {
	m := New()
	m.ObserveRPC("/runtime.v1.RuntimeService/Version", time.Millisecond, nil)
	m.ObserveRPC("/runtime.v1.RuntimeService/ContainerStatus", time.Millisecond, status.Error(codes.NotFound, "gone"))
	m.ObservePull(time.Second, 1000, nil)
	m.ObservePull(time.Second, 0, errors.New("registry down"))
	m.ObserveCNI("add", time.Millisecond, nil)
	m.ObserveCNI("del", time.Millisecond, errors.New("plugin failed"))
	m.ObserveNamespaces(time.Millisecond, nil)
	m.ObserveRestore("pod", nil)
	m.ObserveRestore("container", errors.New("bad record"))
	if err := m.CollectStates(func() Counts {
		return Counts{Pods: map[string]int{"ready": 2}, Containers: map[string]int{"running": 3, "exited": 0}}
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		metric string
		want   string
	}{
		{"rpc ok", "pinrt_grpc_requests_total", `pinrt_grpc_requests_total{code="OK",method="/runtime.v1.RuntimeService/Version"} 1`},
		{"rpc not found", "pinrt_grpc_request_errors_total", `pinrt_grpc_request_errors_total{code="NotFound",method="/runtime.v1.RuntimeService/ContainerStatus"} 1`},
		{"pull failure", "pinrt_image_pulls_total", `pinrt_image_pulls_total{result="failure"} 1`},
		{"pull bytes", "pinrt_image_pull_bytes_total", `pinrt_image_pull_bytes_total 1000`},
		{"cni del error", "pinrt_cni_operation_errors_total", `pinrt_cni_operation_errors_total{operation="del"} 1`},
		{"restore failure", "pinrt_restores_total", `pinrt_restores_total{kind="container",result="failure"} 1`},
		{"pods ready", "pinrt_pods", `pinrt_pods{state="ready"} 2`},
		{"containers running", "pinrt_containers", `pinrt_containers{state="running"} 3`},
		{"build info", "pinrt_build_info", `pinrt_build_info{cri_version="v1",version="` + version.Version + `"} 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := testutil.CollectAndFormat(m.reg, expfmt.TypeTextPlain, tc.metric)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tc.want+"\n") {
				t.Errorf("%s:\n%s\nwant the line %s", tc.metric, b, tc.want)
			}
		})
	}
	if n := testutil.CollectAndCount(m.reg, "pinrt_grpc_request_duration_seconds"); n != 2 {
		t.Errorf("%d latency series, want one per method (2)", n)
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.ObserveRPC("/x", time.Millisecond, nil)
	m.ObservePull(time.Second, 1, nil)
	m.ObserveCNI("add", time.Second, nil)
	m.ObserveNamespaces(time.Second, nil)
	m.ObserveRestore("pod", nil)
	if err := m.CollectStates(func() Counts { return Counts{} }); err != nil {
		t.Fatal(err)
	}
}

func TestServe(t *testing.T) {
	tests := []struct {
		name       string
		pprof      bool
		path       string
		wantCode   int
		wantInBody string
	}{
		{"metrics", false, "/metrics", http.StatusOK, "go_goroutines"},
		{"no pprof unless asked", false, "/debug/pprof/", http.StatusNotFound, ""},
		{"pprof", true, "/debug/pprof/", http.StatusOK, "goroutine"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New()
			l, err := Serve("127.0.0.1:0", m.Handler(tc.pprof))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			resp, err := http.Get("http://" + l.Addr() + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantInBody) {
				t.Errorf("GET %s = %d (%d bytes), want %d containing %q", tc.path, resp.StatusCode, len(body), tc.wantCode, tc.wantInBody)
			}
		})
	}
	if _, err := Serve("256.0.0.1:1", http.NotFoundHandler()); err == nil {
		t.Error("Serve on a bad address succeeded")
	}
}
