// Package conformance is Kubernetes' e2e suite (test/e2e of the release
// pinned in ../go.mod) cut down to the packages that hold the specs of a
// node: test/e2e/common (node, storage, network), where node
// conformance's specs are, test/e2e/node, SIG Node's own specs (in-place
// pod resize, pods extended, pre-stop hooks, security context, runtime
// classes, mount propagation), test/e2e/kubectl, SIG CLI's (kubectl
// exec, attach, cp, logs, port-forward, debug), and test/e2e/network,
// SIG Network's, of which make node-e2e runs the [Conformance] host port
// spec (the rest want kube-proxy, cluster DNS or more nodes). Through
// test/e2e/network the binary links test/e2e/apps too, and with it the
// last [NodeConformance] spec of e2e.test: a Job's containers restarted
// by their restart rules ([FeatureGate:ContainerRestartRules], beta and
// on by default). The spec code, the framework and the suite set-up
// (e2e.RunE2ETests) are upstream's, unchanged; only what the binary links
// is less than e2e.test, so it builds in a fraction of the time.
//
// test/k8snode's TestNodeConformance runs the binary (go test -c) under
// the ginkgo CLI against a node whose runtime is pinrt.
package conformance

import (
	"flag"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// SIG Node's and SIG CLI's specs beside test/e2e/common's, which
	// e2e imports.
	_ "k8s.io/kubernetes/test/e2e/kubectl"
	_ "k8s.io/kubernetes/test/e2e/node"

	// SIG Network's, for the host port spec: kubelet hands a pod's
	// host ports to the runtime, which hands them to CNI.
	_ "k8s.io/kubernetes/test/e2e/network"

	// The framework's defaults, as e2e.test sets them up.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
