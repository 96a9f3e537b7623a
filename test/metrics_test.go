package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// freePort returns a loopback address nothing listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// sample finds the value of the series line starting with series.
func sample(body, series string) string {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func TestMetricsEndpoint(t *testing.T) {
	addr := freePort(t)
	d := StartDaemon(t, Options{Network: true, Config: fmt.Sprintf("[metrics]\naddress = %q\nenable_pprof = true\n", addr)})
	url := "http://" + addr
	before := scrape(t, url+"/metrics")
	const run = `method="/runtime.v1.RuntimeService/RunPodSandbox"`
	if v := sample(before, `pinrt_grpc_requests_total{code="OK",`+run+`}`); v != "" {
		t.Fatalf("RunPodSandbox counted %s times before any call", v)
	}
	id := d.RunPod(t, PodConfig("metrics"))
	for _, call := range []func() error{
		func() error {
			_, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			return err
		},
		func() error {
			_, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	// A refused call is counted under its code.
	_, _ = d.Runtime.PodSandboxStatus(Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: "0123456789ab"})
	after := scrape(t, url+"/metrics")
	for _, want := range []struct{ series, value string }{
		{`pinrt_grpc_requests_total{code="OK",` + run + `}`, "1"},
		{`pinrt_grpc_requests_total{code="OK",method="/runtime.v1.RuntimeService/RemovePodSandbox"}`, "1"},
		{`pinrt_grpc_request_errors_total{code="NotFound",method="/runtime.v1.RuntimeService/PodSandboxStatus"}`, "1"},
		{`pinrt_grpc_request_duration_seconds_count{` + run + `}`, "1"},
		{`pinrt_grpc_request_duration_seconds_bucket{` + run + `,le="+Inf"}`, "1"},
		{`pinrt_cni_operation_duration_seconds_count{operation="add"}`, "1"},
		{`pinrt_namespace_create_duration_seconds_count`, "1"},
		{`pinrt_pods{state="ready"}`, "0"},
	} {
		if got := sample(after, want.series); got != want.value {
			t.Errorf("%s = %q, want %q", want.series, got, want.value)
		}
	}
	// The metrics name the version the Version call reports.
	v, err := d.Runtime.Version(Ctx(t), &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if series := `pinrt_build_info{cri_version="v1",version="` + v.RuntimeVersion + `"}`; sample(after, series) != "1" {
		t.Errorf("%s is not 1 in:\n%s", series, after)
	}
	// Stop and remove both tear the network down: DEL is idempotent.
	if got := sample(after, `pinrt_cni_operation_duration_seconds_count{operation="del"}`); got != "1" && got != "2" {
		t.Errorf("CNI DEL counted %q times, want 1 or 2", got)
	}
	if !strings.Contains(scrape(t, url+"/debug/pprof/"), "goroutine") {
		t.Error("pprof index has no goroutine profile")
	}
	// With pprof on, allocations are sampled for the heap profile (off,
	// they are not, to save the daemon's memory): its first line,
	// "heap profile: live: bytes [allocated: bytes] @ heap/rate".
	heap := scrape(t, url+"/debug/pprof/heap?debug=1")
	var live, liveBytes, allocs, allocBytes, rate int
	if _, err := fmt.Sscanf(heap, "heap profile: %d: %d [%d: %d] @ heap/%d", &live, &liveBytes, &allocs, &allocBytes, &rate); err != nil || allocs == 0 || rate == 0 {
		t.Errorf("the heap profile sampled nothing (%v): %.200s", err, heap)
	}
}

func TestMetricsOffByDefault(t *testing.T) {
	d := StartDaemon(t, Options{})
	// The streaming server (exec, attach, port-forward) is the one TCP
	// listener a default daemon has.
	m := regexp.MustCompile(`streaming server is serving" url="http://127\.0\.0\.1:(\d+)"`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("no streaming server URL in the log")
	}
	streamPort, _ := strconv.Atoi(m[1])
	ports := listeningTCP(t, d.Pid())
	if len(ports) != 1 || ports[0] != streamPort {
		t.Errorf("the daemon listens on TCP ports %v without a metrics address, want only the streaming port %d", ports, streamPort)
	}
	if strings.Contains(d.Log(), "serving metrics") {
		t.Error("the daemon log says it serves metrics")
	}
}

// listeningTCP lists the ports of the TCP sockets in LISTEN state that
// pid holds.
func listeningTCP(t *testing.T, pid int) []int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, f := range []string{"tcp", "tcp6"} {
		file, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		s := bufio.NewScanner(file)
		for s.Scan() {
			fields := strings.Fields(s.Text())
			// st 0A is LISTEN; field 9 is the inode.
			if len(fields) > 9 && fields[3] == "0A" && inodes[fields[9]] {
				// local_address is hex IP:hex port.
				if i := strings.LastIndexByte(fields[1], ':'); i >= 0 {
					p, _ := strconv.ParseInt(fields[1][i+1:], 16, 32)
					ports = append(ports, int(p))
				}
			}
		}
		file.Close()
	}
	return ports
}
