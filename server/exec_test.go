package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci/ocitest"
)

// fakeStreams hands out fixed URLs and records the pods closed.
type fakeStreams struct{ closed []string }

func (f *fakeStreams) GetExec(*runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	return &runtimeapi.ExecResponse{Url: "http://s/exec/t"}, nil
}

func (f *fakeStreams) GetAttach(*runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	return &runtimeapi.AttachResponse{Url: "http://s/attach/t"}, nil
}

func (f *fakeStreams) GetPortForward(*runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	return &runtimeapi.PortForwardResponse{Url: "http://s/portforward/t"}, nil
}

func (f *fakeStreams) ClosePod(id string) { f.closed = append(f.closed, id) }

func TestStreamingEntryPoints(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod := mustRunPod(t, f, "p")
	stopped := mustRunPod(t, f, "q")
	created, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	streams := &fakeStreams{}
	f.srv.SetStreams(streams)
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: stopped.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if len(streams.closed) != 1 || streams.closed[0] != stopped.PodSandboxId {
		t.Fatalf("StopPodSandbox closed the streams of %v, want [%s]", streams.closed, stopped.PodSandboxId)
	}

	tests := []struct {
		name    string
		call    func() (string, error)
		wantURL string
		wantErr error
	}{
		{"exec unknown container", func() (string, error) {
			r, err := f.srv.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: "nope", Cmd: []string{"true"}, Stdout: true})
			return r.GetUrl(), err
		}, "", errdefs.ErrNotFound},
		{"exec empty command", func() (string, error) {
			r, err := f.srv.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: created.ContainerId, Stdout: true})
			return r.GetUrl(), err
		}, "", errdefs.ErrInvalidArgument},
		{"exec in a created container", func() (string, error) {
			r, err := f.srv.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: created.ContainerId, Cmd: []string{"true"}, Stdout: true})
			return r.GetUrl(), err
		}, "", errdefs.ErrFailedPrecondition},
		{"attach to a created container", func() (string, error) {
			r, err := f.srv.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: created.ContainerId, Stdout: true})
			return r.GetUrl(), err
		}, "", errdefs.ErrFailedPrecondition},
		{"port-forward unknown pod", func() (string, error) {
			r, err := f.srv.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: "nope", Port: []int32{80}})
			return r.GetUrl(), err
		}, "", errdefs.ErrNotFound},
		{"port-forward into a stopped pod", func() (string, error) {
			r, err := f.srv.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: stopped.PodSandboxId, Port: []int32{80}})
			return r.GetUrl(), err
		}, "", errdefs.ErrFailedPrecondition},
		{"port-forward into a ready pod", func() (string, error) {
			r, err := f.srv.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: pod.PodSandboxId, Port: []int32{80}})
			return r.GetUrl(), err
		}, "http://s/portforward/t", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, err := tc.call()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || url != tc.wantURL {
				t.Fatalf("got %q, %v; want %q", url, err, tc.wantURL)
			}
		})
	}
}

func TestStreamingWithoutServer(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod := mustRunPod(t, f, "p")
	_, err := f.srv.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: pod.PodSandboxId, Port: []int32{80}})
	if !errdefs.IsNotImplemented(err) {
		t.Fatalf("PortForward without a streaming server: %v, want NotImplemented", err)
	}
	// Stopping a pod needs no streaming server.
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
}

func mustRunPod(t *testing.T, f *ctrFixture, name string) *runtimeapi.RunPodSandboxResponse {
	t.Helper()
	resp, err := f.srv.RunPodSandbox(context.Background(), unitPod(name, false))
	if err != nil {
		t.Fatalf("RunPodSandbox(%s): %v", name, err)
	}
	return resp
}

// A timed-out ExecSync stays a DeadlineExceeded error, as kubelet's
// prober needs, and carries what the command wrote before the timeout.
func TestExecSyncTimeoutKeepsOutput(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, false)
	ctx := context.Background()
	id := f.started(t, pod, "c")
	long := strings.Repeat("x", 3*partialOutputMax) + "last words"
	f.rt.Exec = ocitest.ExecResult{Stdout: []byte(long), Stderr: []byte("warn\n"), ExitCode: -1,
		Err: fmt.Errorf("command timed out after 1s: %w", context.DeadlineExceeded)}
	_, err := f.srv.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh"}, Timeout: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecSync = %v, want DeadlineExceeded", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "last words") || !strings.Contains(msg, `stderr "warn\n"`) {
		t.Errorf("error %q lacks the output written before the timeout", msg)
	}
	if len(msg) > 3*partialOutputMax {
		t.Errorf("error is %d bytes; each stream's share should be bounded by %d", len(msg), partialOutputMax)
	}
}

// An ExecSync whose output fills both of the runtime's 16 MiB buffers
// still answers, with its exit code, in a reply kubelet and crictl take
// (16 MiB at most); the output keeps its beginning.
func TestExecSyncReplyFitsAMessage(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, false)
	id := f.started(t, pod, "c")
	for _, tc := range []struct{ stdout, stderr int }{
		{16 << 20, 16 << 20}, {16 << 20, 10}, {10, 16 << 20}, {8 << 20, 8 << 20},
	} {
		f.rt.Exec = ocitest.ExecResult{Stdout: bytes.Repeat([]byte("o"), tc.stdout), Stderr: bytes.Repeat([]byte("e"), tc.stderr), ExitCode: 3}
		resp, err := f.srv.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh"}})
		if err != nil {
			t.Fatal(err)
		}
		if n := proto.Size(resp); n > 16<<20 || resp.ExitCode != 3 {
			t.Errorf("%d + %d bytes of output: a reply of %d bytes, exit code %d; want at most 16 MiB and 3", tc.stdout, tc.stderr, n, resp.ExitCode)
		}
		if tc.stderr == 10 && len(resp.Stderr) != 10 || tc.stdout == 10 && len(resp.Stdout) != 10 {
			t.Errorf("a 10-byte stream was cut: stdout %d, stderr %d bytes", len(resp.Stdout), len(resp.Stderr))
		}
	}
}

// recordingStreams records the requests handed to the streaming server.
type recordingStreams struct {
	fakeStreams
	exec    []string
	attach  []string
	forward []string
}

func (r *recordingStreams) GetExec(req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	r.exec = append(r.exec, req.ContainerId)
	return r.fakeStreams.GetExec(req)
}

func (r *recordingStreams) GetAttach(req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	r.attach = append(r.attach, req.ContainerId)
	return r.fakeStreams.GetAttach(req)
}

func (r *recordingStreams) GetPortForward(req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	r.forward = append(r.forward, req.PodSandboxId)
	return r.fakeStreams.GetPortForward(req)
}

// A request naming its container or pod by a unique prefix hands the
// streaming server the full ID: it looks the target up again when the
// client connects, by when the prefix may name another one, and
// StopPodSandbox closes a pod's forwards by its full ID.
func TestStreamingRequestsCarryFullIDs(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod := mustRunPod(t, f, "p")
	c, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatal(err)
	}
	streams := &recordingStreams{}
	f.srv.SetStreams(streams)
	if _, err := f.srv.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: c.ContainerId[:12], Cmd: []string{"true"}, Stdout: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: c.ContainerId[:12], Stdout: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: pod.PodSandboxId[:12], Port: []int32{80}}); err != nil {
		t.Fatal(err)
	}
	if len(streams.exec) != 1 || streams.exec[0] != c.ContainerId || len(streams.attach) != 1 || streams.attach[0] != c.ContainerId {
		t.Errorf("exec and attach handed on %v and %v, want the full ID %s", streams.exec, streams.attach, c.ContainerId)
	}
	if len(streams.forward) != 1 || streams.forward[0] != pod.PodSandboxId {
		t.Errorf("port-forward handed on %v, want the full ID %s", streams.forward, pod.PodSandboxId)
	}
}
