package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// restore starts N sandboxes, restarts the runtime and measures how long
// until it answers again and until each sandbox is listed Ready with the
// IPs it had before. The returned wall time is that of the restart, from
// the restart command's start until every sandbox is back (or timed out).
func (r *runner) restore(ctx context.Context) time.Duration {
	r.rec.Declare(OpRunPodSandbox, OpPodSandboxStatus)
	if r.cfg.WithContainers {
		r.declarePodOps()
		r.ensureImage(ctx)
	}
	r.rec.Declare(OpRestartCmd, OpRestartVersion, OpRestartReady)
	if r.cfg.WithContainers {
		r.rec.Declare(OpRestartRunning)
	}
	r.rec.DeclareAggregate(OpRestartAllReady)

	pods, setupWall := r.startPods(ctx, ScenarioRestore, r.cfg.WithContainers)
	r.setMetric("setup_wall_ms", ms(setupWall))
	// Record the IPs the runtime reports now; only sandboxes whose status
	// worked before the restart are checked after it.
	var alive []*benchPod
	for _, p := range pods {
		err := r.rec.timed(OpPodSandboxStatus, func() error {
			ips, err := r.sandboxStatus(ctx, p)
			p.ips = ips
			return err
		})
		if err == nil {
			alive = append(alive, p)
		}
	}
	r.walls[OpRunPodSandbox] = setupWall
	r.walls[OpPodSandboxStatus] = setupWall

	start := time.Now()
	_ = r.rec.timed(OpRestartCmd, func() error { return r.cfg.Restart(ctx) })
	deadline := start.Add(r.cfg.WaitTimeout)
	if err := r.waitVersion(ctx, deadline); err != nil {
		r.rec.Fail(OpRestartVersion, err)
	} else {
		r.rec.Observe(OpRestartVersion, time.Since(start))
	}
	r.waitRestored(ctx, alive, start, deadline)
	wall := time.Since(start)

	r.teardownAll(ctx, pods)
	return wall
}

// waitVersion polls Version on a fresh connection each time: a connection
// that saw the old daemon die may be in reconnect backoff, and that delay
// belongs to the client, not to the runtime being measured.
func (r *runner) waitVersion(ctx context.Context, deadline time.Time) error {
	target, err := Target(r.endpoint())
	if err != nil {
		return err
	}
	var last error
	for time.Now().Before(deadline) {
		c, err := Dial(target, min(time.Second, r.cfg.RPCTimeout))
		if err != nil {
			return err
		}
		rctx, cancel := c.rpc(ctx)
		_, last = c.Runtime.Version(rctx, &runtimeapi.VersionRequest{Version: "v1"})
		cancel()
		_ = c.Close()
		if last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("runtime did not answer Version within %s: %w", r.cfg.WaitTimeout, last)
}

func (r *runner) endpoint() string { return r.c.conn.Target() }

// waitRestored polls until each sandbox is listed READY and its status has
// the same IPs as before the restart, and (with containers) each container
// is RUNNING. Every pod not back by the deadline is an error.
func (r *runner) waitRestored(ctx context.Context, pods []*benchPod, start, deadline time.Time) {
	pending := map[string]*benchPod{}
	for _, p := range pods {
		pending[p.id] = p
	}
	lastErr := map[string]error{}
	for len(pending) > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		ready, err := r.listReady(ctx)
		if err != nil {
			for id := range pending {
				lastErr[id] = fmt.Errorf("ListPodSandbox: %w", err)
			}
		}
		for id, p := range pending {
			if !ready[id] {
				if err == nil {
					lastErr[id] = fmt.Errorf("sandbox %s not listed READY", id)
				}
				continue
			}
			if err := r.checkRestored(ctx, p); err != nil {
				lastErr[id] = err
				continue
			}
			d := time.Since(start)
			r.rec.Observe(OpRestartReady, d)
			delete(pending, id)
		}
		if len(pending) > 0 {
			time.Sleep(10 * pollInterval)
		}
	}
	ids := make([]string, 0, len(pending))
	for id := range pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		cause := lastErr[id]
		if cause == nil {
			cause = fmt.Errorf("sandbox %s never checked", id)
		}
		r.rec.Fail(OpRestartReady, fmt.Errorf("not restored after %s: %w", r.cfg.WaitTimeout, cause))
	}
	if len(pending) == 0 && len(pods) > 0 {
		r.rec.Observe(OpRestartAllReady, time.Since(start))
	} else if len(pods) > 0 {
		r.rec.Fail(OpRestartAllReady, fmt.Errorf("%d of %d sandboxes not restored", len(pending), len(pods)))
	}
}

func (r *runner) listReady(ctx context.Context) (map[string]bool, error) {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.ListPodSandbox(rctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{LabelRun: r.cfg.RunID}},
	})
	if err != nil {
		return nil, err
	}
	ready := map[string]bool{}
	for _, s := range resp.GetItems() {
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			ready[s.GetId()] = true
		}
	}
	return ready, nil
}

// checkRestored compares the sandbox's IPs with those recorded before the
// restart and checks that its containers still run. A changed IP is a real
// failure (the pod lost its network), which polling will not fix, but it is
// retried anyway in case the runtime reports a partial status at first.
func (r *runner) checkRestored(ctx context.Context, p *benchPod) error {
	ips, err := r.sandboxStatus(ctx, p)
	if err != nil {
		return err
	}
	if !slices.Equal(ips, p.ips) {
		return fmt.Errorf("sandbox %s IPs %v after restart, %v before", p.id, ips, p.ips)
	}
	for _, id := range p.containers {
		st, err := r.containerState(ctx, id)
		if err != nil {
			return err
		}
		if st != runtimeapi.ContainerState_CONTAINER_RUNNING {
			return fmt.Errorf("container %s is %s after restart", id, st)
		}
	}
	return nil
}

// ReadRSS returns the resident set size of pid in KiB, from
// /proc/<pid>/status.
func ReadRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseRSS(string(b))
}

func parseRSS(status string) (int64, error) {
	for line := range strings.Lines(status) {
		v, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", strings.TrimSpace(line))
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, fmt.Errorf("no VmRSS in status (kernel thread or zombie?)")
}

// PIDFromFile returns a PID func that reads the PID from path each time, so
// it follows a daemon restarted with a new PID file.
func PIDFromFile(path string) func() (int, error) {
	return func() (int, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, fmt.Errorf("pid file %s: %w", path, err)
		}
		return pid, nil
	}
}
