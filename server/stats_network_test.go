package server

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/nsmgr"
)

// TestPodSandboxStatsNoInterface: a pod netns without any interface but
// loopback (which the counters skip) reports no network block rather
// than one without a default interface, which kubelet dereferences.
func TestPodSandboxStatsNoInterface(t *testing.T) {
	f := newStatsFixture(t)
	sb, _ := f.srv.sandboxes.Get(f.pod)
	f.srv.deps.NetCounters = fakeNet{sb.Pins["net"]: []nsmgr.NetDev{}}
	resp, err := f.srv.PodSandboxStats(context.Background(), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: f.pod})
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.Stats.Linux.Network; n != nil {
		t.Errorf("network = %v for a netns without interfaces, want none", n)
	}
	if resp.Stats.Linux.Cpu == nil || resp.Stats.Linux.Memory == nil {
		t.Errorf("cpu %v memory %v: the rest of the stats are gone too", resp.Stats.Linux.Cpu, resp.Stats.Linux.Memory)
	}
}
