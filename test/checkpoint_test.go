package test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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

// checkpointWorkload counts in /tmp/count every 0.2 s, keeps a TCP
// connection established inside its pod (a listener and a client that
// never sends; busybox's nc ends at the end of its stdin, so each
// reads from a sleep), has written /data-file and deleted /etc/group of its
// image: what a forensic checkpoint must capture and leave running.
const checkpointWorkload = `echo hello > /data-file; rm /etc/group
sleep 100000 | nc -l -p 8080 > /dev/null &
sleep 0.5; sleep 100001 | nc 127.0.0.1 8080 > /dev/null &
i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done`

// checkpointctlBinary builds (once per machine) the CRIU project's
// checkpoint archive reader.
func checkpointctlBinary(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("PINRT_VM_CACHE")
	if cache == "" {
		cache = "/var/cache/pinrt-vm"
	}
	repo := RepoRoot()
	return lastLine(t, runTool(t, 10*time.Minute, repo, nil, "bash", filepath.Join(repo, "test/checkpointctl/build.sh"), cache))
}

// requireCRIU fails, never skips, without CRIU: make deps installs it.
func requireCRIU(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("criu", "check").CombinedOutput(); err != nil {
		t.Fatalf("criu check: %v\n%s(make deps installs CRIU: hack/criu.sh)", err, out)
	}
}

// TestCheckpointContainer checkpoints running containers the way an
// operator and kubelet do (crictl checkpoint, the CRI call kubelet's
// /checkpoint endpoint makes), in a plain pod, in user namespaces (one
// with the pod's PID namespace shared) and in the host's network
// namespace, and reads the archive with checkpointctl, as forensic tools
// do. The
// container keeps running through it: its counter goes on and its TCP
// connection stays established.
func TestCheckpointContainer(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	c := &crictlEnv{ctrEnv: e, bin: crictlBinary(t)}
	ckctl := checkpointctlBinary(t)
	sharedPID := func(cfg *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig {
		cfg.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
		return cfg
	}
	hostNet := PodConfig("ck-hostnet")
	hostNet.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
	for _, tc := range []struct {
		name string
		cfg  *runtimeapi.PodSandboxConfig
		// tcp: the workload holds its connection; not in the host's
		// network namespace, whose ports the test leaves alone.
		tcp bool
	}{
		{"plain", PodConfig("ck-plain"), true},
		{"userns", UsernsPod(PodConfig("ck-userns"), 3500000), true},
		// The container joins the pod's PID namespace (the pause's) and,
		// with it, a user namespace it did not make.
		{"userns-sharedpid", sharedPID(UsernsPod(PodConfig("ck-sharedpid"), 3600000)), true},
		{"hostnetwork", hostNet, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, podCfg := e.pod(t, tc.cfg)
			workload := checkpointWorkload
			if !tc.tcp {
				workload = strings.Join(slices.DeleteFunc(strings.Split(workload, "\n"), func(l string) bool { return strings.Contains(l, "nc ") }), "\n")
			}
			ctr := e.ctr("worker", "sh", "-c", workload)
			ctr.Linux.SecurityContext.NamespaceOptions.Pid = tc.cfg.Linux.SecurityContext.NamespaceOptions.Pid
			id := e.run(t, pod, podCfg, ctr)
			if tc.tcp {
				waitEstablished(t, e, id)
			}
			// The counter runs: the files the workload changes first are
			// changed.
			counter(t, e, id)
			out := filepath.Join(t.TempDir(), "worker.tar")
			c.run(t, "checkpoint", "--export="+out, id)

			before := counter(t, e, id)
			time.Sleep(time.Second)
			if after := counter(t, e, id); after <= before {
				t.Errorf("the counter stood still after the checkpoint (%d, then %d): the container was left frozen", before, after)
			}
			if st := e.status(t, id).State; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
				t.Errorf("container is %v after the checkpoint", st)
			}
			if n := established(t, e, id); tc.tcp && n != 2 {
				t.Errorf("%d established TCP sockets after the checkpoint, want the connection's 2", n)
			}

			files := testimage.TarFileAt(t, out)
			for _, f := range []string{"checkpoint/pstree.img", "checkpoint/inventory.img", "stats-dump", "dump.log", "config.dump", "spec.dump", "rootfs-diff.tar"} {
				if _, ok := files[f]; !ok {
					t.Errorf("no %s in the archive", f)
				}
			}
			var deleted []string
			if err := json.Unmarshal(files["deleted.files"], &deleted); err != nil || len(deleted) != 1 || deleted[0] != "/etc/group" {
				t.Errorf("deleted.files = %s (%v), want [\"/etc/group\"]", files["deleted.files"], err)
			}
			diff := testimage.TarFiles(t, bytes.NewReader(files["rootfs-diff.tar"]))
			if got := string(diff["data-file"]); got != "hello\n" {
				t.Errorf("rootfs-diff.tar data-file = %q", got)
			}

			show := runOut(t, ckctl, "show", out)
			for _, want := range []string{"worker", e.busybox, id[:12], "runc"} {
				if !strings.Contains(show, want) {
					t.Errorf("checkpointctl show lacks %q:\n%s", want, show)
				}
			}
			tree := runOut(t, ckctl, "inspect", "--all", out)
			wants := []string{"Pod name: " + podCfg.Metadata.Name, "Kubernetes namespace: " + podCfg.Metadata.Namespace, "/tmp/count"}
			if tc.tcp {
				wants = append(wants, "nc -l -p 8080", "sleep 100001", "ESTABLISHED")
			}
			for _, want := range wants {
				if !strings.Contains(tree, want) {
					t.Errorf("checkpointctl inspect lacks %q:\n%s", want, tree)
				}
			}
			checkpointDumpsGone(t, e)
		})
	}
}

// TestCheckpointRefusals: what cannot be checkpointed is refused with
// its code, leaving nothing behind and the operator's files untouched.
func TestCheckpointRefusals(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	pod, podCfg := e.pod(t, PodConfig("ck-refuse"))
	running := e.run(t, pod, podCfg, e.ctr("running", "sleep", "100000"))
	exited := e.run(t, pod, podCfg, e.ctr("exited", "true"))
	e.waitExit(t, exited, 30*time.Second)
	dir := t.TempDir()
	taken := filepath.Join(dir, "taken.tar")
	if err := os.WriteFile(taken, []byte("the operator's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		id, path string
		want     codes.Code
	}{
		{"exited container", exited, filepath.Join(dir, "x.tar"), codes.FailedPrecondition},
		{"unknown container", strings.Repeat("ab", 32), filepath.Join(dir, "x.tar"), codes.NotFound},
		{"location taken", running, taken, codes.AlreadyExists},
		{"relative location", running, "x.tar", codes.InvalidArgument},
		{"location in a missing directory", running, filepath.Join(dir, "no", "x.tar"), codes.InvalidArgument},
	} {
		_, err := e.d.Runtime.CheckpointContainer(Ctx(t), &runtimeapi.CheckpointContainerRequest{ContainerId: tc.id, Location: tc.path})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if b, _ := os.ReadFile(taken); string(b) != "the operator's" {
		t.Errorf("the taken location now holds %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in the locations' directory, want the one there before", len(ents))
	}
	checkpointDumpsGone(t, e)
}

// TestCheckpointKilled kills the daemon while a checkpoint is under way,
// at a different instant each round: after the restart the container
// still runs (CRIU never leaves it frozen), no archive is at the
// location, partial or whole-but-unacknowledged is fine only whole, and
// no dump is left under the state root.
func TestCheckpointKilled(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	pod, podCfg := e.pod(t, PodConfig("ck-killed"))
	id := e.run(t, pod, podCfg, e.ctr("worker", "sh", "-c", checkpointWorkload))
	waitEstablished(t, e, id)
	dir := t.TempDir()
	for round, delay := range []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond} {
		out := filepath.Join(dir, "round"+strconv.Itoa(round)+".tar")
		done := make(chan error, 1)
		rt := e.d.Runtime
		go func() {
			_, err := rt.CheckpointContainer(Ctx(t), &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: out})
			done <- err
		}()
		time.Sleep(delay)
		if err := e.d.Restart(); err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
		acked := <-done == nil
		// A dump that outlived the daemon may still be finishing: the
		// container is unfrozen when CRIU is done.
		deadline := time.Now().Add(30 * time.Second)
		for {
			before, ok1 := tryCounter(e, id)
			time.Sleep(500 * time.Millisecond)
			if after, ok2 := tryCounter(e, id); ok1 && ok2 && after > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d (kill after %v): the container stays frozen", round, delay)
			}
		}
		if st := e.status(t, id).State; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("round %d: container is %v", round, st)
		}
		if _, err := os.Stat(out); err == nil {
			// Named only once complete: then it must read to its end.
			if files := testimage.TarFileAt(t, out); files["config.dump"] == nil || files["checkpoint/pstree.img"] == nil {
				t.Errorf("round %d: the archive at the location is incomplete", round)
			}
		} else if acked {
			t.Errorf("round %d: the checkpoint was acknowledged but no archive is there", round)
		}
		checkpointDumpsGone(t, e)
	}
	// And it can be checkpointed again afterwards.
	out := filepath.Join(dir, "after.tar")
	if _, err := e.d.Runtime.CheckpointContainer(Ctx(t), &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: out}); err != nil {
		t.Fatalf("checkpoint after the kills: %v", err)
	}
}

// counter reads the workload's counter, once the workload has written
// it: a read may come before its first write, or between the shell's
// truncation of the file and its write.
func counter(t *testing.T, e *ctrEnv, id string) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if n, ok := tryCounter(e, id); ok {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s: no counter to read in /tmp/count after 30s", id)
		}
	}
}

// tryCounter reads the workload's counter; ok is false while it cannot
// be read (exec refuses a frozen container).
func tryCounter(e *ctrEnv, id string) (n int, ok bool) {
	resp, err := e.d.Runtime.ExecSync(context.Background(), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"cat", "/tmp/count"}, Timeout: 10})
	if err != nil || resp.ExitCode != 0 {
		return 0, false
	}
	n, err = strconv.Atoi(strings.TrimSpace(string(resp.Stdout)))
	return n, err == nil
}

// established counts the container's established TCP sockets, from the
// kernel's tables of its network namespace (state 01).
func established(t *testing.T, e *ctrEnv, id string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(e.mustExec(t, id, "cat", "/proc/net/tcp", "/proc/net/tcp6"), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[3] == "01" {
			n++
		}
	}
	return n
}

func waitEstablished(t *testing.T, e *ctrEnv, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for established(t, e, id) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the workload's TCP connection never came up:\n%s", e.mustExec(t, id, "cat", "/proc/net/tcp", "/proc/net/tcp6"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkpointDumpsGone checks that no dump directory is left under the
// daemon's state root, once a dump that outlived a killed daemon ended.
func checkpointDumpsGone(t *testing.T, e *ctrEnv) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ents, _ := os.ReadDir(filepath.Join(e.d.Root, "checkpoints"))
		if len(ents) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d dump directories left in %s/checkpoints", len(ents), e.d.Root)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runOut runs a tool and returns its output; a failure fails t.
func runOut(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}
