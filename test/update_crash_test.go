package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// gatedRuntime is runc whose `update` reads its resources from stdin,
// writes its pid to <gate>.held and waits until <gate>.open exists: once
// held, the update no longer needs the daemon (its output goes to
// <gate>.out).
const gatedRuntime = `#!/bin/sh
for a; do
	if [ "$a" = update ]; then
		cat >%[1]s.resources
		echo $$ >%[1]s.held
		while [ ! -e %[1]s.open ]; do sleep 0.05; done
		exec /usr/local/bin/runc "$@" <%[1]s.resources >>%[1]s.out 2>&1
	fi
done
exec /usr/local/bin/runc "$@"
`

// TestUpdateFinishedAfterCrash: a daemon killed in the middle of an
// UpdateContainerResources, before `runc update` changed the cgroup or
// after it did and before config.json recorded it, finishes the update
// when it starts again: ContainerStatus reports the limits the cgroup
// has, and they are the update's.
func TestUpdateFinishedAfterCrash(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	wrapper := filepath.Join(t.TempDir(), "gated-runc")
	if err := os.WriteFile(wrapper, []byte(fmt.Sprintf(gatedRuntime, gate)), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newCtrEnvWith(t, fmt.Sprintf("[runtime.runtimes.gated]\nbinary = %q\n", wrapper))
	for _, tc := range []struct {
		name string
		// runcDone says whether the held `runc update` runs to its end
		// after the kill, or dies with it.
		runcDone bool
		limit    int64
	}{
		{"before runc update", false, 96 << 20},
		{"after runc update", true, 112 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.Remove(gate + ".open")
			_ = os.Remove(gate + ".held")
			podCfg := PodConfig("updcrash")
			podCfg.LogDirectory = filepath.Join(e.d.Dir, "logs", "updcrash")
			pr, err := e.d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: "gated"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = os.WriteFile(gate+".open", nil, 0o644)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if _, err := e.d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pr.PodSandboxId}); err != nil && e.d.Running() {
					t.Errorf("RemovePodSandbox: %v", err)
				}
			})
			cfg := e.ctr("c", "sleep", "1000")
			cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}
			id := e.run(t, pr.PodSandboxId, podCfg, cfg)
			pid := e.info(t, id).Pid
			cgroupLimit := func() string {
				t.Helper()
				l, err := MemoryLimit(pid)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}

			done := make(chan error, 1)
			go func() {
				_, err := e.d.Runtime.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{
					ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: tc.limit},
				})
				done <- err
			}()
			var held int
			waitFor(t, 20*time.Second, "runc update held", func() bool {
				b, err := os.ReadFile(gate + ".held")
				held, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				return err == nil && held > 0
			})
			e.d.Kill()
			<-done
			if !tc.runcDone {
				_ = syscall.Kill(held, syscall.SIGKILL)
			}
			if err := os.WriteFile(gate+".open", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// Ended, or a zombie its new parent has yet to reap.
			waitFor(t, 20*time.Second, "the held runc update to end", func() bool {
				st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(held), "stat"))
				return err != nil || strings.Contains(string(st), ") Z ")
			})
			// The held update that outlives the daemon changes the cgroup
			// and not config.json. The harness closes its connection
			// before the SIGKILL, so the daemon sees the call canceled
			// first: the update must not be killed for that.
			if got := cgroupLimit(); tc.runcDone != (got == strconv.FormatInt(tc.limit, 10)) {
				t.Fatalf("before the restart the cgroup's limit is %s (runc update ran to its end: %v; its output: %q)", got, tc.runcDone, readFile(t, gate+".out"))
			}
			if err := e.d.Start(); err != nil {
				t.Fatal(err)
			}
			got := e.status(t, id).GetResources().GetLinux().GetMemoryLimitInBytes()
			cg := cgroupLimit()
			if got != tc.limit || cg != strconv.FormatInt(tc.limit, 10) {
				t.Errorf("after the restart ContainerStatus says %d and the cgroup %s; want both %d", got, cg, tc.limit)
			}
			if _, err := os.Stat(filepath.Join(e.d.Root, "containers", id, "update.pending")); !os.IsNotExist(err) {
				t.Errorf("pending update left after the restart: %v", err)
			}
		})
	}
}
