package k8snode

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// A ginkgo JUnit report of a run: the specs it ran, the ones it did not
// select (skipped with no reason), one on the skip list, one that skipped
// itself, one that passed on its retry, and the per-process suite nodes.
const junitSample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="Kubernetes e2e suite">
    <testcase name="[SynchronizedBeforeSuite]" status="passed"></testcase>
    <testcase name="[It] [sig-node] Pods should be submitted and removed [NodeConformance] [Conformance] [sig-node, NodeConformance, Conformance]" status="passed"></testcase>
    <testcase name="[It] [sig-node] Pod InPlace Resize Container valid increase of CPU [sig-node]" status="failed"><failure message="Timed out after 300s.&#xA;Expected pod to be resized" type="failed">[FAILED] Timed out after 300s.</failure></testcase>
    <testcase name="[It] [sig-apps] Deployment should roll over [Conformance] [sig-apps, Conformance]" status="skipped"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-node] PrivilegedPod should enable privileged commands [NodeConformance] [sig-node, NodeConformance]" status="skipped"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-node] AppArmor should enforce a profile [sig-node]" status="skipped"><skipped message="skipped - Only supported for node OS distro [gci ubuntu] (not debian)"></skipped></testcase>
    <testcase name="[It] [sig-node] Probing container should be ready immediately after startupProbe succeeds [sig-node]" status="passed"><system-err>&gt; Enter [It] should be ready&#xA;[FAILED] Failure recorded during attempt 1:&#xA;Pod became ready in 3.2s, more than 2s after startupProbe succeeded&#xA;In [It] at: probe.go:1 @ 11/30/26 15:19:30.22&#xA;&#xA;Attempt #1 Failed.  Retrying ↺ @ 11/30/26 15:19:30.22&#xA;</system-err></testcase>
    <testcase name="[SynchronizedAfterSuite]" status="passed"></testcase>
    <testcase name="[SynchronizedBeforeSuite]" status="failed"></testcase>
    <testcase name="[It] [sig-node] Pods should be interrupted [sig-node]" status="interrupted"><error message="Interrupted by User" type="interrupted">...</error></testcase>
  </testsuite>
</testsuites>
`

func TestReadJUnit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(path, []byte(junitSample), 0o644); err != nil {
		t.Fatal(err)
	}
	skips := []skipEntry{{re: regexp.MustCompile(`\[sig-node\] PrivilegedPod should enable privileged commands`), reason: "no dummy links"}}
	var r conformanceResult
	conf := (&node{}).conformanceSuite("kubectl")
	r.readJUnit(t, path, skips, conf, regexp.MustCompile("."))
	wantPassed := []string{"[It] [sig-node] Pods should be submitted and removed [NodeConformance] [Conformance] [sig-node, NodeConformance, Conformance]",
		"[It] [sig-node] Probing container should be ready immediately after startupProbe succeeds [sig-node]"}
	wantFlaked := []string{"[It] [sig-node] Probing container should be ready immediately after startupProbe succeeds [sig-node]: Pod became ready in 3.2s, more than 2s after startupProbe succeeded"}
	wantFailed := []string{"[It] [sig-node] Pod InPlace Resize Container valid increase of CPU [sig-node]: Timed out after 300s.", "[SynchronizedBeforeSuite]",
		"[It] [sig-node] Pods should be interrupted [sig-node]: Interrupted by User"}
	if !slices.Equal(r.passed, wantPassed) {
		t.Errorf("passed %q, want %q (no suite nodes)", r.passed, wantPassed)
	}
	if !slices.Equal(r.flaked, wantFlaked) {
		t.Errorf("flaked %q, want %q (passed on a retry, with its first failure)", r.flaked, wantFlaked)
	}
	if !slices.Equal(r.failed, wantFailed) {
		t.Errorf("failed %q, want %q (with the failure's first line; a failed suite node too)", r.failed, wantFailed)
	}
	if r.listed != 1 {
		t.Errorf("%d listed skips, want 1: PrivilegedPod", r.listed)
	}
	wantUnlisted := []string{"[It] [sig-node] AppArmor should enforce a profile [sig-node]: skipped - Only supported for node OS distro [gci ubuntu] (not debian)"}
	if !slices.Equal(r.unlisted, wantUnlisted) {
		t.Errorf("unlisted %q, want %q (not the unselected sig-apps spec)", r.unlisted, wantUnlisted)
	}

	// Narrowed by a focus, a listed spec outside it is not counted.
	var narrow conformanceResult
	narrow.readJUnit(t, path, skips, conf, regexp.MustCompile("Pods"))
	if narrow.listed != 0 {
		t.Errorf("focus Pods: %d listed skips, want 0", narrow.listed)
	}
}

// The feature clause of the label filter, as readJUnit applies it to a
// spec's name.
func TestSelectedFeatures(t *testing.T) {
	for name, want := range map[string]bool{
		"[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]":                                                                           true,
		"[sig-node] Security Context When creating a pod with HostUsers must create the user namespace if set to false [LinuxOnly] [Feature:UserNamespacesSupport]": true,
		"[sig-node] Downward API [Feature:PodLevelResources] [FeatureGate:PodLevelResources] should provide default limits [Beta]":                                  true,
		"[sig-node] Probing container [Feature:NodeLogQuery] should return the kubelet logs":                                                                        false,
		"[sig-node] [Feature:ContainerStopSignals] [FeatureGate:ContainerStopSignals] StopSignal [Alpha] [Feature:OffByDefault]":                                    false,
		"[sig-node] [Feature:UserNamespacesSupport] something new [Alpha] [Feature:OffByDefault]":                                                                   false,
	} {
		if got := selectedFeatures(name, features); got != want {
			t.Errorf("selectedFeatures(%q) = %v, want %v", name, got, want)
		}
	}
}
