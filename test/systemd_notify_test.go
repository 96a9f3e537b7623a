package test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestSystemdNotify runs the daemon as systemd runs contrib/pinrt.service
// (Type=notify): with NOTIFY_SOCKET set. The daemon must say READY=1 once
// it serves and STOPPING=1 when it stops, and the variable must not reach
// the processes it starts: runc start with NOTIFY_SOCKET set waits for
// the container itself to notify, which a pod's container never does.
func TestSystemdNotify(t *testing.T) {
	RequireRoot(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	expect := func(state string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("notify socket closed before %s", state)
				}
				if strings.Contains(m, state) {
					return
				}
			case <-deadline:
				t.Fatalf("no %s on NOTIFY_SOCKET after 30s", state)
			}
		}
	}

	e := newCtrEnvWith(t, "", func(o *Options) { o.Env = append(o.Env, "NOTIFY_SOCKET="+sock) })
	expect("READY=1")

	pod, podCfg := e.pod(t, PodConfig("notify"))
	id := e.create(t, pod, podCfg, e.ctr("sleeper", "sleep", "600"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.d.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("StartContainer under NOTIFY_SOCKET: %v", err)
	}
	if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container state %v, want RUNNING", st.State)
	}
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}

	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	expect("STOPPING=1")
	// The pod cleanup needs a daemon again.
	if err := e.d.Start(); err != nil {
		t.Fatal(err)
	}
	expect("READY=1")
}
