package test

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// reopenStdio is a shell function that reopens the process's stdio by
// path for writing, as nginx's image does with its logs linked to
// /dev/stdout, writes "wrote <who> <path>" into each and reports on its
// original stdout "result <who> <path> ok|denied".
const reopenStdio = `r() { for p in /dev/stdout /dev/stderr /proc/self/fd/1; do ` +
	`if (echo "wrote $1 $p" >$p); then echo "result $1 $p ok"; else echo "result $1 $p denied"; fi; done; }; `

// reopenResults reads the result lines of who from out.
func reopenResults(out, who string) map[string]string {
	res := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(strings.TrimSpace(l))
		if len(f) == 4 && f[0] == "result" && f[1] == who {
			res[f[2]] = f[3]
		}
	}
	return res
}

var stdioPaths = []string{"/dev/stdout", "/dev/stderr", "/proc/self/fd/1"}

// TestStdioReopen is issue 21's nginx crash loop: in a pod with a user
// namespace the container's root could not reopen /dev/stdout, because
// the pipes behind it belonged to host root, unmapped there. It checks
// the container's process (conmon's pipes), ExecSync and a streaming exec
// (pinrt's pipes), that what was written that way reaches the CRI log and
// the exec's output, and that a non-root user gets the same in a pod with
// a user namespace as in one without.
func TestStdioReopen(t *testing.T) {
	e := newCtrEnv(t)
	s := &streamEnv{ctrEnv: e}
	usernsPod, usernsCfg := e.pod(t, UsernsPod(PodConfig("stdio-userns"), 0))
	hostPod, hostCfg := e.pod(t, PodConfig("stdio-host"))

	check := func(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name string, uid int64) *reopenRun {
		t.Helper()
		cfg := e.ctr(name, "sh", "-c", reopenStdio+"r main; exec sleep 1000")
		if uid >= 0 {
			cfg.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: uid}
		}
		id := e.run(t, pod, podCfg, cfg)
		run := &reopenRun{res: map[string]map[string]string{}, owners: map[int]uint32{}}
		pid := e.info(t, id).Pid
		for fd := range 3 {
			var st syscall.Stat_t
			if err := syscall.Stat(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), &st); err != nil {
				t.Fatalf("stat the main process's fd %d: %v", fd, err)
			}
			run.owners[fd] = st.Uid
		}
		logPath := e.status(t, id).LogPath
		waitFor(t, 10*time.Second, "the main process's results in its log", func() bool {
			run.log = readCRILogIfAny(t, logPath)
			return len(reopenResults(run.logText("stdout"), "main")) == len(stdioPaths)
		})
		run.res["main"] = reopenResults(run.logText("stdout"), "main")

		resp, err := e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", reopenStdio + "r execsync"}, Timeout: 20})
		if err != nil {
			t.Fatalf("ExecSync: %v", err)
		}
		run.out, run.errOut = map[string]string{}, map[string]string{}
		run.out["execsync"], run.errOut["execsync"] = string(resp.Stdout), string(resp.Stderr)
		run.res["execsync"] = reopenResults(string(resp.Stdout), "execsync")

		out, errOut, err := s.streamExec(t, id, nil, "sh", "-c", reopenStdio+"r stream")
		if err != nil {
			t.Fatalf("streaming exec: %v (stderr %q)", err, errOut)
		}
		run.out["stream"], run.errOut["stream"] = out, errOut
		run.res["stream"] = reopenResults(out, "stream")
		return run
	}

	t.Run("RootInUserns", func(t *testing.T) {
		run := check(t, usernsPod, usernsCfg, "root-userns", -1)
		defer func() {
			if t.Failed() {
				t.Logf("outputs:\n%s", run)
			}
		}()
		for who, r := range run.res {
			for _, p := range stdioPaths {
				if r[p] != "ok" {
					t.Errorf("%s: reopening %s as the container's root: %q, want ok", who, p, r[p])
				}
			}
		}
		// The pipes are the pod root's on the host; stdin is /dev/null,
		// which must stay root's.
		if want := podRootUID(t, e, usernsPod); run.owners[1] != want || run.owners[2] != want {
			t.Errorf("stdout and stderr pipes owned by %d and %d on the host, want the pod's root %d", run.owners[1], run.owners[2], want)
		}
		if run.owners[0] != 0 {
			t.Errorf("stdin (/dev/null) owned by %d, want 0: the host's /dev/null was chowned", run.owners[0])
		}
		// What was written through the reopened paths reached the log and
		// the exec output, on the right stream.
		for _, w := range []struct{ stream, text string }{
			{"stdout", "wrote main /dev/stdout"}, {"stderr", "wrote main /dev/stderr"}, {"stdout", "wrote main /proc/self/fd/1"},
		} {
			if !slices.Contains(strings.Split(run.logText(w.stream), "\n"), w.text) {
				t.Errorf("the CRI log's %s lacks %q", w.stream, w.text)
			}
		}
		for _, who := range []string{"execsync", "stream"} {
			for _, p := range []string{"/dev/stdout", "/proc/self/fd/1"} {
				if !strings.Contains(run.out[who], "wrote "+who+" "+p+"\n") {
					t.Errorf("%s stdout lacks what was written to %s", who, p)
				}
			}
			if !strings.Contains(run.errOut[who], "wrote "+who+" /dev/stderr\n") {
				t.Errorf("%s stderr lacks what was written to /dev/stderr", who)
			}
		}
	})

	// A non-root user gets in a pod with a user namespace exactly what it
	// gets without one (where runc chowns the pipes to it).
	t.Run("NonRootSameAsWithoutUserns", func(t *testing.T) {
		userns := check(t, usernsPod, usernsCfg, "user-userns", 1000)
		host := check(t, hostPod, hostCfg, "user-host", 1000)
		for _, who := range []string{"main", "execsync", "stream"} {
			if len(host.res[who]) != len(stdioPaths) {
				t.Errorf("%s without a user namespace: results %v, want one per path", who, host.res[who])
			}
			if !maps.Equal(userns.res[who], host.res[who]) {
				t.Errorf("%s as uid 1000: with a user namespace %v, without %v", who, userns.res[who], host.res[who])
			}
		}
		if want := podRootUID(t, e, usernsPod) + 1000; userns.owners[1] != want {
			t.Errorf("uid 1000's stdout pipe owned by %d on the host, want %d", userns.owners[1], want)
		}
		if host.owners[1] != 1000 {
			t.Errorf("without a user namespace uid 1000's stdout pipe is owned by %d, want 1000 (runc chowns it)", host.owners[1])
		}
		if t.Failed() {
			t.Logf("with a user namespace:\n%s\nwithout:\n%s", userns, host)
		} else {
			t.Logf("uid 1000 in both pods: %v", userns.res)
		}
	})

	// A container with a terminal: its pty is the runtime's, untouched,
	// and it still works, logs and reopens /dev/stdout.
	t.Run("TTYContainer", func(t *testing.T) {
		cfg := e.ctr("tty-userns", "sh", "-c", "echo tty-term=$TERM; echo tty-reopen >/dev/stdout && echo tty-reopened; exec sleep 1000")
		cfg.Tty = true
		id := e.run(t, usernsPod, usernsCfg, cfg)
		logPath := e.status(t, id).LogPath
		waitFor(t, 10*time.Second, "the TTY container's output in its log", func() bool {
			var all strings.Builder
			for _, l := range readCRILogIfAny(t, logPath) {
				all.WriteString(l.text)
			}
			return strings.Contains(all.String(), "tty-reopened")
		})
		var all strings.Builder
		for _, l := range readCRILogIfAny(t, logPath) {
			all.WriteString(l.text)
		}
		for _, want := range []string{"tty-term=xterm", "tty-reopen"} {
			if !strings.Contains(all.String(), want) {
				t.Errorf("the TTY container's log %q lacks %q", all.String(), want)
			}
		}
		if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("TTY container is %v, want running", st.State)
		}
	})

	// A TTY exec (kubectl exec -it) gets TERM=xterm, as the container's
	// own terminal does, unless the container sets TERM; an exec without
	// a terminal gets none. And its root can reopen /dev/stdout too.
	t.Run("ExecTTYTerm", func(t *testing.T) {
		plain := e.run(t, usernsPod, usernsCfg, e.ctr("term-plain", "sleep", "1000"))
		withTerm := e.ctr("term-set", "sleep", "1000")
		withTerm.Envs = []*runtimeapi.KeyValue{{Key: "TERM", Value: []byte("vt100")}}
		set := e.run(t, usernsPod, usernsCfg, withTerm)
		for _, tc := range []struct {
			name string
			id   string
			tty  bool
			want string
		}{
			{name: "tty", id: plain, tty: true, want: "TERM=[xterm]"},
			{name: "tty, container sets TERM", id: set, tty: true, want: "TERM=[vt100]"},
			{name: "no tty", id: plain, tty: false, want: "TERM=[]"},
			{name: "no tty, container sets TERM", id: set, tty: false, want: "TERM=[vt100]"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cmd := []string{"sh", "-c", "echo TERM=[$TERM]; echo reopen >/dev/stdout && echo reopened"}
				u := s.execURL(t, tc.id, cmd, false, tc.tty)
				var out, errOut bytes.Buffer
				o := streamOpts{stdout: &out, tty: tc.tty}
				if !tc.tty {
					o.stderr = &errOut
				}
				if err := spdyStream(Ctx(t), u, o); err != nil {
					t.Fatalf("exec: %v (stderr %q)", err, errOut.String())
				}
				got := strings.ReplaceAll(out.String(), "\r\n", "\n")
				if !strings.Contains(got, tc.want+"\n") {
					t.Errorf("exec output %q, want %q", got, tc.want)
				}
				if !strings.Contains(got, "reopened\n") {
					t.Errorf("exec output %q: reopening /dev/stdout failed (stderr %q)", got, errOut.String())
				}
			})
		}
		// ExecSync has no terminal, and no TERM.
		resp, err := e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: plain, Cmd: []string{"sh", "-c", "echo TERM=[$TERM]"}, Timeout: 20})
		if err != nil || string(resp.Stdout) != "TERM=[]\n" {
			t.Errorf("ExecSync TERM: %q, %v; want TERM=[]", resp.GetStdout(), err)
		}
	})

	// Attach still reaches a userns container's stdin and stdout through
	// conmon's (now chowned) pipes.
	t.Run("Attach", func(t *testing.T) {
		// Each read reopens /dev/stdin: conmon's stdin pipe is the
		// container's too.
		cfg := e.ctr("attach-userns", "sh", "-c", `while read l </dev/stdin; do echo "got $l"; done; echo "stdin gone"`)
		cfg.Stdin = true
		id := e.run(t, usernsPod, usernsCfg, cfg)
		u := s.attachURL(t, id, false)
		inR, inW := io.Pipe()
		var out lockedBuffer
		done := make(chan error, 1)
		go func() { done <- spdyStream(Ctx(t), u, streamOpts{stdin: inR, stdout: &out, stderr: io.Discard}) }()
		waitFor(t, 10*time.Second, "the attached shell's echo", func() bool {
			fmt.Fprintf(inW, "ping\n")
			time.Sleep(100 * time.Millisecond)
			return strings.Contains(out.String(), "got ping")
		})
		inW.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("attach did not end after the client's stdin closed")
		}
		lines := readCRILogIfAny(t, e.status(t, id).LogPath)
		if !slices.ContainsFunc(lines, func(l criLine) bool { return l.text == "got ping" }) {
			t.Errorf("the log of the attached shell lacks its echo: %+v", lines)
		}
	})
}

// reopenRun is what one container's processes saw and wrote.
type reopenRun struct {
	// res is per process ("main", "execsync", "stream") per path.
	res map[string]map[string]string
	// owners are the host owners of the main process's fds 0-2.
	owners map[int]uint32
	log    []criLine
	// out and errOut are the execs' output.
	out, errOut map[string]string
}

// logText is the log's lines of stream, one a line.
func (r *reopenRun) logText(stream string) string {
	var b strings.Builder
	for _, l := range r.log {
		if l.stream == stream {
			b.WriteString(l.text + "\n")
		}
	}
	return b.String()
}

func (r *reopenRun) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "log stdout:\n%slog stderr:\n%s", r.logText("stdout"), r.logText("stderr"))
	for _, who := range []string{"execsync", "stream"} {
		fmt.Fprintf(&b, "%s stdout:\n%s%s stderr:\n%s", who, r.out[who], who, r.errOut[who])
	}
	return b.String()
}

// podRootUID is the host UID of the pod's root.
func podRootUID(t *testing.T, e *ctrEnv, pod string) uint32 {
	t.Helper()
	_, info := e.d.PodStatus(t, pod)
	if len(info.UIDMappings) == 0 || info.UIDMappings[0].ContainerID != 0 {
		t.Fatalf("pod mappings %+v, want one starting at 0", info.UIDMappings)
	}
	return info.UIDMappings[0].HostID
}

// readCRILogIfAny is readCRILog for a log that may be missing or empty.
func readCRILogIfAny(t *testing.T, path string) []criLine {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || len(b) == 0 {
		return nil
	}
	return readCRILog(t, path)
}
