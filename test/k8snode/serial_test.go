package k8snode

import (
	"regexp"
	"testing"
)

// The serial suite's host skip must take the two specs that need
// CAP_SYS_RESOURCE and none of the OOM score specs that this host can
// pass, by their names as the JUnit report has them.
func TestOOMScoreHostSkip(t *testing.T) {
	const prefix = "[It] [sig-node] Container Manager Misc Validate OOM score adjustments [Feature:OOMScoreAdj] once the node is setup "
	skip := oomScoreHostSkip.re
	for name, want := range map[string]bool{
		prefix + "container runtime's oom-score-adj should be -999 [Serial] [sig-node, Serial, Feature:OOMScoreAdj]":                               true,
		prefix + "Kubelet's oom-score-adj should be -999 [Serial] [sig-node, Serial, Feature:OOMScoreAdj]":                                         true,
		prefix + "with test pods guaranteed container's oom-score-adj should be -998 [Serial] [sig-node, Serial, Feature:OOMScoreAdj]":             false,
		prefix + "with test pods burstable container's oom-score-adj should be between [2, 1000) [Serial] [sig-node, Serial, Feature:OOMScoreAdj]": false,
	} {
		if got := skip.MatchString(name); got != want {
			t.Errorf("host skip matches %q: %v, want %v", name, got, want)
		}
	}
	if !regexp.MustCompile(serialNodeE2EFocus).MatchString("[It] [sig-node] Restart Container Runtime Network should recover from ip leak [Disruptive] [Serial] [Slow] [sig-node, Serial, Slow, Disruptive]") {
		t.Errorf("the serial focus misses the runtime restart spec")
	}
}

func TestUnitSetting(t *testing.T) {
	unit := "[Service]\nRestart=always\nRestartSec=5\nOOMScoreAdjust=-999\n"
	for key, want := range map[string]string{"Restart": "always", "RestartSec": "5", "OOMScoreAdjust": "-999", "KillMode": ""} {
		if got := unitSetting(unit, key); got != want {
			t.Errorf("unitSetting(%s) = %q, want %q", key, got, want)
		}
	}
}

// Each name PINRT_NODE_E2E_SUITES may hold picks its suite: a name that
// picks nothing must fail the run, not leave a suite out (a key that no
// longer matched once ran only the serial suite in CI).
func TestPickSuites(t *testing.T) {
	n := &node{}
	all := []suite{n.conformanceSuite("kubectl"), n.nodeE2ESuite(), n.nodeE2ESerialSuite()}
	got, err := pickSuites(all, defaultSuites)
	if err != nil || len(got) != 3 {
		t.Fatalf("the default suites: %d picked, %v; want all 3", len(got), err)
	}
	got, err = pickSuites(all, "e2e_node.test conformance.test")
	if err != nil || len(got) != 2 || got[0].binary != "conformance.test" || got[1].id() != "e2e_node.test" {
		t.Errorf("two suites: %v, %v; want conformance.test then e2e_node.test", got, err)
	}
	for _, names := range []string{"conformance", "e2e_node.test typo", ""} {
		if _, err := pickSuites(all, names); err == nil {
			t.Errorf("pickSuites(%q): no error", names)
		}
	}
}
