package k8snode

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// deselected is what make node-e2e never selects, as upstream's node
// conformance jobs leave it out: slow, serial, disruptive and flaky
// specs. Specs that need a feature beyond the default set are left out
// by the label filter (selectedLabels), but for features.
const deselected = `\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]`

// features are the [Feature:...] specs make node-e2e runs besides: those
// of a runtime's CRI features that kubelet enables by default, as
// upstream's feature jobs run them against containerd and CRI-O. User
// namespaces (hostUsers: false: the user namespace, volumes' owners,
// fsGroup, kubelet's metrics), the supplemental groups policy (Merge
// and Strict, which ask the runtime for the image's groups and report
// them back), pod-level resources (the downward API's defaults from
// them), environment variables from files (kubelet reads them, the
// containers get them) and runtime handlers (an unknown one refused).
// A spec that also needs a feature that is off by default stays out.
var features = []string{"UserNamespacesSupport", "SupplementalGroupsPolicy", "PodLevelResources", "EnvFiles", "RuntimeHandler"}

// The specs make node-e2e selects: every [NodeConformance] spec, every
// spec of SIG Node (in-place resize, pre-stop hooks, pods extended and
// the rest of test/e2e/node, and the [Conformance] specs of
// test/e2e/common/node that are not node conformance) and of SIG CLI
// (kubectl exec, attach, cp, logs, port-forward, debug and the rest of
// test/e2e/kubectl), and SIG Network's host port spec (pods on one port
// with other host IPs and protocols; SIG Network's others want
// kube-proxy, cluster DNS or more nodes); of those, the ones that need
// no feature or only features. ginkgo selects by the label filter,
// which takes all of SIG Network, and then by the focus, which is the
// text each selected spec's name holds unless PINRT_NODE_E2E_FOCUS
// narrows it.
var selectedLabels = "(NodeConformance || sig-node || sig-cli || sig-network) && (!/^Feature:/ || Feature:" +
	strings.Join(features, " || Feature:") + ") && !Feature:OffByDefault"

const selectedName = `\[NodeConformance\]|\[sig-node\]|\[sig-cli\]|\[sig-network\] HostPort `

// featureTag is a [Feature:...] tag in a spec's name; the framework
// makes each one a label too.
var featureTag = regexp.MustCompile(`\[Feature:([^\]]*)\]`)

// selectedFeatures says whether the label filter's feature clause takes
// a spec by its name: no feature tag, or one of features and not
// OffByDefault.
func selectedFeatures(name string, features []string) bool {
	tags := featureTag.FindAllStringSubmatch(name, -1)
	if len(tags) == 0 {
		return true
	}
	for _, t := range tags {
		if t[1] == "OffByDefault" {
			return false
		}
	}
	return slices.ContainsFunc(tags, func(t []string) bool { return slices.Contains(features, t[1]) })
}

// nodeE2EFeatures are the [Feature:...] specs of test/e2e_node the node
// e2e suite runs besides: features (its ImageVolume specs, which e2e.test
// has too, among them) and procMount: Unmasked, beta and on by default,
// whose specs want a pod's /proc unmasked in a user namespace and masked
// without one.
var nodeE2EFeatures = append(slices.Clip(features), "ProcMountType", "ImageVolume")

// testHandlerConf gives pinrt the runtime handler e2e_node's RuntimeClass
// specs (pod overhead) expect a node to have, "test-handler"
// (e2enode.PreconfiguredRuntimeClassHandler), as the containerd and CRI-O
// configurations of upstream's node e2e jobs have it: runc again.
const testHandlerConf = `[runtime.runtimes.test-handler]
binary = "runc"
type = "oci"
`

// suite is one of the build's e2e binaries and what a run takes of it.
type suite struct {
	name   string // as the log names it
	binary string // in the build directory
	// labels is ginkgo's --label-filter; a spec it selects is also one
	// whose name holds selected and whose features are among features
	// (readJUnit counts listed skips by that).
	labels, selected string
	features         []string
	// focusEnv names the variable that narrows the focus (selected).
	focusEnv string
	// focusFile is ginkgo's --focus-file: where a selected spec is.
	focusFile string
	args      []string // the binary's own flags
	// setup readies the node for the suite, if it needs more.
	setup func(*testing.T)
	// key names the suite in PINRT_NODE_E2E_SUITES and its output
	// directory; the binary's name less .test when empty.
	key string
	// serial runs the specs one at a time, and takes the [Serial] and
	// [Disruptive] specs that deselected leaves out of the others.
	serial bool
	// env is added to the suite's environment.
	env []string
	// cwd is where the suite runs (its output directory when empty).
	cwd string
}

// id is the suite's key.
func (s suite) id() string {
	if s.key != "" {
		return s.key
	}
	return s.binary
}

// pickSuites are the suites named in names (PINRT_NODE_E2E_SUITES), in
// all's order; a name of no suite is an error, never a suite left out.
func pickSuites(all []suite, names string) ([]suite, error) {
	var out []suite
	known := map[string]bool{}
	for _, s := range all {
		known[s.id()] = true
		if slices.Contains(strings.Fields(names), s.id()) {
			out = append(out, s)
		}
	}
	for _, n := range strings.Fields(names) {
		if !known[n] {
			return nil, fmt.Errorf("PINRT_NODE_E2E_SUITES names %q, which is none of %s", n, defaultSuites)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("PINRT_NODE_E2E_SUITES names no suite: %s", defaultSuites)
	}
	return out, nil
}

// deselected is what the suite never selects.
func (s suite) deselected() string {
	if s.serial {
		return deselectedSerial
	}
	return deselection()
}

// conformanceSuite is conformance.test: test/e2e's specs of a node.
func (n *node) conformanceSuite(kubectl string) suite {
	return suite{
		name: "node conformance", binary: "conformance.test",
		labels: selectedLabels, selected: selectedName, features: features,
		focusEnv: "PINRT_NODE_E2E_FOCUS",
		args: []string{
			"--kubeconfig=" + n.kubeconfig("admin"),
			"--provider=skeleton", "--node-os-distro=debian", "--kubectl-path=" + kubectl,
			"--container-runtime-endpoint=unix://" + n.pinrtSock,
			"--non-blocking-taints=node-role.kubernetes.io/control-plane",
		},
	}
}

// nodeE2ESuite is e2e_node.test, Kubernetes' node e2e suite, of which the
// specs in test/e2e_node itself: the rest of it is test/e2e/common, which
// conformance.test runs. Not the serial or disruptive ones, which restart
// kubelet with other configurations. The suite starts no services of its
// own here (--start-services=false): it uses this node, through the API
// server with a bearer token, and pinrt's socket for its CRI calls.
func (n *node) nodeE2ESuite() suite {
	return suite{
		name: "node e2e", binary: "e2e_node.test",
		labels: "(NodeConformance || sig-node) && (!/^Feature:/ || Feature:" +
			strings.Join(nodeE2EFeatures, " || Feature:") + ") && !Feature:OffByDefault",
		selected: `\[NodeConformance\]|\[sig-node\]`, features: nodeE2EFeatures,
		focusEnv: "PINRT_NODE_E2E_NODE_FOCUS", focusFile: "/test/e2e_node/",
		args: []string{
			"--start-services=false", "--prepull-images=false",
			fmt.Sprintf("--host=https://127.0.0.1:%d", n.apiPort), "--bearer-token=" + n.token,
			"--node-name=" + nodeName,
			"--container-runtime-endpoint=unix://" + n.pinrtSock,
			"--image-service-endpoint=unix://" + n.pinrtSock,
		},
		setup: func(t *testing.T) { n.forwardPort(t, kubeletReadOnlyPort) },
	}
}

// serialNodeE2EFocus are the serial and disruptive specs of e2e_node.test
// a run takes: the container runtime SIGKILLed six times, 20 seconds
// apart, under 100 pods, which must all stay running with no container
// restarted and no IP leaked; kubelet's garbage collection of dead
// containers and of unused images; the OOM score adjustments of the
// runtime, the infra processes and each QoS class's containers; and
// those that restart kubelet, most with another configuration: OOM kills
// and their reason, log rotation (ReopenContainerLog), static and mirror
// pods, sidecars and init containers, pod phases and unknown pods across
// a restart of kubelet. Not those that stop and start the runtime's unit
// through systemd's D-Bus API, nor those that need a feature gate, a
// device, a credential provider or kubelet's own managers (CPU, memory,
// topology, eviction, density).
const serialNodeE2EFocus = `\[sig-node\] (Restart Container Runtime Network should recover from ip leak|GarbageCollect|ImageGarbageCollect|Container Manager Misc|OOMKiller|ContainerLogRotation|MirrorPod |StaticPod|Pods status phase|Restart Kubelet|Containers Lifecycle when|Unknown Pods)`

// deselectedSerial is what the serial suite never selects: flaky specs.
const deselectedSerial = `\[Flaky\]`

// hostKubeletState are the files of the host's /var/lib/kubelet that the
// node e2e specs remove when they update kubelet's configuration.
func hostKubeletState() []string {
	m, _ := filepath.Glob(filepath.Join(hostKubeletDir, "pods/*/userns"))
	for _, f := range []string{"cpu_manager_state", "memory_manager_state"} {
		if _, err := os.Stat(filepath.Join(hostKubeletDir, f)); err == nil {
			m = append(m, filepath.Join(hostKubeletDir, f))
		}
	}
	return m
}

// nodeE2ESerialSuite is e2e_node.test's serial specs, one at a time, on
// the same node after the others. They find pinrt by its pid file and
// run `sudo kill -SIGKILL` and `sudo ps`: the test is root, and sudo
// is a shim in the node's bin directory that runs its arguments. Those
// that change kubelet's configuration write it to kubelet-config in
// their working directory, a link to the node kubelet's, and restart
// kubelet through `sudo systemctl` (systemctl_test.go) without systemd.
func (n *node) nodeE2ESerialSuite() suite {
	s := n.nodeE2ESuite()
	s.name, s.key, s.serial = "node e2e serial", "e2e_node.serial", true
	s.labels = "Serial && (NodeConformance || sig-node)"
	s.selected, s.features = serialNodeE2EFocus, []string{"OOMScoreAdj"}
	s.focusEnv = "PINRT_NODE_E2E_SERIAL_FOCUS"
	s.args = append(s.args, "--container-runtime-process-name=pinrt",
		"--container-runtime-pid-file="+n.pidFile(pinrtService))
	cwd := n.path("serial")
	s.cwd = cwd
	s.setup = func(t *testing.T) {
		n.forwardPort(t, kubeletReadOnlyPort)
		n.forwardPort(t, kubeletHealthzPort)
		n.write("bin/sudo", "#!/bin/sh\nexec \"$@\"\n")
		if err := os.Chmod(n.path("bin/sudo"), 0o755); err != nil {
			t.Fatal(err)
		}
		// The config updates also rm -f kubelet's state files under the
		// host's /var/lib/kubelet, hard-coded: not where a kubelet of the
		// host has some.
		if m := hostKubeletState(); len(m) > 0 {
			t.Fatalf("the host's kubelet state files %v would be removed by the serial specs' kubelet config updates", m)
		}
		if !n.systemd {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(self, n.path("bin/systemctl")); err != nil {
				t.Fatal(err)
			}
			n.serveSystemctl(t)
		}
		if err := os.MkdirAll(cwd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(n.kubeletConfig, filepath.Join(cwd, "kubelet-config")); err != nil {
			t.Fatal(err)
		}
	}
	s.env = []string{"PATH=" + n.path("bin") + ":" + os.Getenv("PATH"), systemctlEnv + "=" + n.systemctlSock()}
	return s
}

// TestNodeConformance runs Kubernetes' own [NodeConformance], SIG Node
// and SIG CLI e2e specs (build/conformance: test/e2e/common, node and
// kubectl of the pinned release, run by the ginkgo CLI, in parallel;
// selectedLabels) against a node whose runtime is pinrt: the
// control plane, a scheduler and kubelet of that release, and the
// stand-in images of test/standin through pinrt's registry mirrors.
// test/k8snode/node-e2e.sh builds what it needs and runs it; `make
// node-e2e` runs that.
//
// With PINRT_NODE_E2E_USERNS=1 a MutatingAdmissionPolicy puts every pod
// that can have one in a user namespace (hostUsers: false), and the test
// counts the pods and containers that ran with a non-identity uid_map,
// read from /proc while they ran, so a policy that silently did nothing
// fails the run.
//
// It fails on any failed spec, and on any spec that skipped itself
// unless node-e2e-skip.txt names it with a reason.
func TestNodeConformance(t *testing.T) {
	dir := os.Getenv("PINRT_NODE_E2E_DIR")
	if dir == "" {
		t.Skip("PINRT_NODE_E2E_DIR is not set: make node-e2e (test/k8snode/node-e2e.sh) runs this test with what it builds")
	}
	userns := os.Getenv("PINRT_NODE_E2E_USERNS") == "1"
	out := os.Getenv("PINRT_NODE_E2E_OUT")
	if out == "" {
		out = t.TempDir()
	}
	skips, err := readSkipList("node-e2e-skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	skips = append(skips, hostSkips()...)
	n := startNodeOpts(t, imageSource(t), nodeOpts{conformance: true, pinrtConf: testHandlerConf})
	mode := "host user namespace"
	if userns {
		n.forceUserns(t)
		mode = "every pod that can have one in its own user namespace"
	}
	w := n.watchUserns(t)
	t.Logf("node conformance: %s", mode)
	kubectl := n.kubectl(t)
	var res []*conformanceResult
	suites, err := pickSuites([]suite{n.conformanceSuite(kubectl), n.nodeE2ESuite(), n.nodeE2ESerialSuite()}, envOr("PINRT_NODE_E2E_SUITES", defaultSuites))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range suites {
		if s.setup != nil {
			s.setup(t)
		}
		res = append(res, n.runSuite(t, s, dir, filepath.Join(out, strings.TrimSuffix(s.id(), ".test")), skips))
	}
	seen := w.stop()
	t.Logf("node conformance (%s): %s", mode, seen)
	if userns && seen.userns == 0 {
		t.Errorf("no pod ran in a user namespace: the admission policy took no effect")
	}
	// In host mode only the specs' own hostUsers: false pods (the user
	// namespace and proc mount specs) may have one.
	if !userns && seen.unasked != 0 {
		t.Errorf("%d pods ran in a user namespace although their spec has no hostUsers: false", seen.unasked)
	}
	for _, r := range res {
		r.report(t)
	}
}

// defaultSuites are the suites a run takes, in order, by their keys.
const defaultSuites = "conformance.test e2e_node.test e2e_node.serial"

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// hostSkips are the specs this host cannot pass, whatever the runtime:
// the skip list's entries that depend on what the host lets root do.
func hostSkips() []skipEntry {
	if hasCap(unix.CAP_SYS_RESOURCE) {
		return nil
	}
	// pinrt's unit (OOMScoreAdjust=-999) and kubelet (--oom-score-adj,
	// default -999) lower their own oom_score_adj, which the kernel
	// allows only with CAP_SYS_RESOURCE; the test gives pinrt its unit's
	// setting as systemd would, and both stay at 0 without it.
	return []skipEntry{oomScoreHostSkip}
}

var oomScoreHostSkip = skipEntry{
	re:     regexp.MustCompile(`\[sig-node\] Container Manager Misc .* (container runtime|Kubelet)'s oom-score-adj should be -999`),
	reason: "(host) the test host lacks CAP_SYS_RESOURCE, without which no process may lower its oom_score_adj",
}

// hasCap says whether this process has capability c in its effective set.
func hasCap(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && eff&(1<<uint(c)) != 0
		}
	}
	return false
}

// skipEntry is one line of a skip list: "REGEXP # reason".
type skipEntry struct {
	re     *regexp.Regexp
	reason string
}

func readSkipList(path string) ([]skipEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []skipEntry
	for i, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pat, reason, ok := strings.Cut(line, " # ")
		if !ok || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("%s:%d: entry without a reason: %q", path, i+1, line)
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, skipEntry{re: re, reason: reason})
	}
	return out, nil
}

// deselection is deselected, plus PINRT_NODE_E2E_SKIP: specs a narrower
// run leaves out (make test's subset leaves out the probe specs that
// watch a container for minutes).
func deselection() string {
	if extra := os.Getenv("PINRT_NODE_E2E_SKIP"); extra != "" {
		return deselected + "|" + extra
	}
	return deselected
}

func skipPattern(deselected string, skips []skipEntry) string {
	p := []string{deselected}
	for _, s := range skips {
		p = append(p, s.re.String())
	}
	return strings.Join(p, "|")
}

// usernsPolicy sets hostUsers: false on every pod created without a
// hostUsers of its own that may have it: a Linux pod (the API server
// refuses hostUsers on a Windows pod) with no host namespace (nor with a
// user namespace), no privileged container, no raw block device.
const usernsPolicy = `!(has(object.spec.hostUsers)) &&
  !(has(object.spec.os) && object.spec.os.name == 'windows') &&
  !(has(object.spec.hostNetwork) && object.spec.hostNetwork) &&
  !(has(object.spec.hostPID) && object.spec.hostPID) &&
  !(has(object.spec.hostIPC) && object.spec.hostIPC) &&
  !object.spec.containers.exists(c, (has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged) || has(c.volumeDevices)) &&
  !(has(object.spec.initContainers) && object.spec.initContainers.exists(c, (has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged) || has(c.volumeDevices)))`

// forceUserns installs the MutatingAdmissionPolicy and its binding, and
// waits until the API server applies it to a dry-run pod.
func (n *node) forceUserns(t *testing.T) {
	ctx := t.Context()
	fail := admissionv1.Fail
	never := admissionv1.NeverReinvocationPolicy
	policy := &admissionv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "pinrt-userns"},
		Spec: admissionv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionv1.MatchResources{
				ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Create},
						Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
					},
				}},
			},
			MatchConditions:    []admissionv1.MatchCondition{{Name: "can-have-userns", Expression: usernsPolicy}},
			FailurePolicy:      &fail,
			ReinvocationPolicy: never,
			Mutations: []admissionv1.Mutation{{
				PatchType:          admissionv1.PatchTypeApplyConfiguration,
				ApplyConfiguration: &admissionv1.ApplyConfiguration{Expression: "Object{spec: Object.spec{hostUsers: false}}"},
			}},
		},
	}
	if _, err := n.cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("MutatingAdmissionPolicy: %v", err)
	}
	binding := &admissionv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pinrt-userns"},
		Spec:       admissionv1.MutatingAdmissionPolicyBindingSpec{PolicyName: "pinrt-userns"},
	}
	if _, err := n.cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("MutatingAdmissionPolicyBinding: %v", err)
	}
	probe := func(hostNetwork bool) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "userns-probe-", Namespace: "default"},
			Spec: corev1.PodSpec{
				HostNetwork: hostNetwork,
				Containers:  []corev1.Container{{Name: "c", Image: n.images.busybox()}},
			},
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	n.poll(t, "the user-namespace policy in effect", 2*time.Minute, func() (bool, error) {
		p, err := n.cs.CoreV1().Pods("default").Create(ctx, probe(false), dry)
		if err != nil {
			return false, err
		}
		if p.Spec.HostUsers == nil || *p.Spec.HostUsers {
			return false, errors.New("a dry-run pod still has no hostUsers: false")
		}
		return true, nil
	})
	// A host-network pod must be left alone: with hostUsers: false the
	// API server would refuse it.
	p, err := n.cs.CoreV1().Pods("default").Create(ctx, probe(true), dry)
	if err != nil {
		t.Fatalf("a host-network pod under the policy: %v", err)
	}
	if p.Spec.HostUsers != nil {
		t.Fatalf("the policy set hostUsers on a host-network pod")
	}
}

// usernsWatch records, while the specs run, which pods' containers ran
// in a user namespace: each running container's /proc/<pid>/uid_map.
type usernsWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	pods   map[string]bool // sandbox ID: a non-identity uid_map
	// unasked are the sandboxes with a non-identity uid_map whose pod,
	// as the API server has it, did not ask for one (hostUsers: false).
	unasked map[string]bool
	ctrs    int
	// asked says whether the pod of a sandbox asked for a user namespace.
	asked func(ctx context.Context, sandbox string) bool
}

type usernsSeen struct{ pods, userns, unasked, containers int }

func (s usernsSeen) String() string {
	return fmt.Sprintf("%d pods seen running, %d of them with a non-identity uid_map, %d of those without hostUsers: false (%d containers read)", s.pods, s.userns, s.unasked, s.containers)
}

// podAsksUserns reads a sandbox's pod from the API server: whether its
// spec has hostUsers: false (its own, or the admission policy's). A pod
// gone already counts as having asked: nothing says otherwise.
func (n *node) podAsksUserns(rs runtimeapi.RuntimeServiceClient) func(context.Context, string) bool {
	return func(ctx context.Context, sandbox string) bool {
		st, err := rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandbox})
		if err != nil {
			return true
		}
		md := st.GetStatus().GetMetadata()
		pod, err := n.cs.CoreV1().Pods(md.GetNamespace()).Get(ctx, md.GetName(), metav1.GetOptions{})
		if err != nil {
			return true
		}
		return pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers
	}
}

func (n *node) watchUserns(t *testing.T) *usernsWatch {
	conn, err := grpc.NewClient("unix://"+n.pinrtSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	w := &usernsWatch{cancel: cancel, done: make(chan struct{}), pods: map[string]bool{}, unasked: map[string]bool{}, asked: n.podAsksUserns(rs)}
	seen := map[string]bool{}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			w.poll(ctx, rs, seen)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

func (w *usernsWatch) poll(ctx context.Context, rs runtimeapi.RuntimeServiceClient, seen map[string]bool) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := rs.ListContainers(cctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}},
	})
	if err != nil {
		return
	}
	for _, c := range l.Containers {
		if seen[c.Id] {
			continue
		}
		st, err := rs.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.Id, Verbose: true})
		if err != nil {
			continue
		}
		var info struct {
			Pid int `json:"pid"`
		}
		if json.Unmarshal([]byte(st.Info["info"]), &info) != nil || info.Pid <= 0 {
			continue
		}
		m, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(info.Pid), "uid_map"))
		if err != nil {
			continue // gone already
		}
		seen[c.Id] = true
		userns := !identityMap(string(m))
		unasked := userns && !w.asked(cctx, c.PodSandboxId)
		w.mu.Lock()
		w.ctrs++
		w.pods[c.PodSandboxId] = w.pods[c.PodSandboxId] || userns
		if unasked {
			w.unasked[c.PodSandboxId] = true
		}
		w.mu.Unlock()
	}
}

// identityMap reports whether a uid_map is the initial user namespace's.
func identityMap(m string) bool {
	return strings.Join(strings.Fields(m), " ") == "0 0 4294967295"
}

func (w *usernsWatch) stop() usernsSeen {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	s := usernsSeen{pods: len(w.pods), unasked: len(w.unasked), containers: w.ctrs}
	for _, u := range w.pods {
		if u {
			s.userns++
		}
	}
	return s
}

// conformanceResult is what the ginkgo run left: its summary lines and
// each spec's outcome from the JUnit report.
type conformanceResult struct {
	name     string // the suite's
	exit     error
	summary  []string
	log      string
	passed   []string
	failed   []string
	flaked   []string // failed, then passed on a retry (--flake-attempts)
	listed   int
	unlisted []string // spec text, then the reason it gave
	elapsed  time.Duration
}

// kubectl is the node's release of kubectl, which the specs run (exec,
// cp, port-forward, logs, debug): the node binary by that name.
func (n *node) kubectl(t *testing.T) string {
	kubectl := n.path("bin/kubectl")
	if err := os.MkdirAll(filepath.Dir(kubectl), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(n.k8s, kubectl); err != nil {
		t.Fatal(err)
	}
	return kubectl
}

// runSuite runs the suite under the ginkgo CLI and reads its JUnit
// report.
func (n *node) runSuite(t *testing.T, s suite, dir, out string, skips []skipEntry) *conformanceResult {
	// The framework labels every spec with what its name says
	// (s.labels); the focus narrows that selection further.
	focus := envOr(s.focusEnv, s.selected)
	procs, timeout := envOr("PINRT_NODE_E2E_PROCS", "8"), envOr("PINRT_NODE_E2E_TIMEOUT", "60m")
	if s.serial {
		// About 47 minutes in full, one spec at a time.
		procs, timeout = "1", envOr("PINRT_NODE_E2E_TIMEOUT", "90m")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(out, "junit.xml")
	logPath := filepath.Join(out, "ginkgo.log")
	args := []string{
		"--procs=" + procs, "--no-color", "--timeout=" + timeout,
		"--label-filter=" + s.labels,
		"--focus=" + focus, "--skip=" + skipPattern(s.deselected(), skips),
		// An absolute path: with --output-dir ginkgo mangles it into a
		// name made of the binary's path.
		"--junit-report=" + junit,
		"--poll-progress-after=5m",
		// CI's subset retries a failed spec once; one that then passes
		// is named in the report as flaked, one that fails again fails.
		"--flake-attempts=" + envOr("PINRT_NODE_E2E_FLAKE_ATTEMPTS", "1"),
	}
	if s.focusFile != "" {
		args = append(args, "--focus-file="+s.focusFile)
	}
	// ginkgo runs a compiled suite in the binary's directory, where the
	// node e2e specs write files of their own (kubelet-config, static
	// pod manifests, scratch directories): a link to the binary there
	// keeps them out of the build cache.
	cwd := out
	if s.cwd != "" {
		cwd = s.cwd
	}
	bin := filepath.Join(cwd, s.binary)
	if err := os.Symlink(filepath.Join(dir, s.binary), bin); err != nil {
		t.Fatal(err)
	}
	args = append(append(args, bin, "--"), s.args...)
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(dir, "ginkgo"), args...)
	cmd.Dir = cwd
	// The suite's output goes to the log as it comes: its progress marks
	// (one per spec) are not lines.
	cmd.Stdout, cmd.Stderr = f, f
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 30 * time.Second
	res := &conformanceResult{name: s.name, log: logPath}
	start := time.Now()
	t.Logf("%s: ginkgo %s (log %s)", s.name, strings.Join(args, " "), logPath)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// SIGINT or SIGTERM (a CI timeout, ^C) stops the suite, not the test:
	// the test then reports and its cleanups remove the node, which a
	// test binary killed outright would leave running.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case res.exit = <-waited:
	case sg := <-sig:
		t.Errorf("%s: %v: stopping the suite", s.name, sg)
		_ = cmd.Process.Signal(syscall.SIGINT)
		res.exit = <-waited
	}
	res.elapsed = time.Since(start)
	for _, line := range strings.Split(readFile(logPath), "\n") {
		if isSummaryLine(line) {
			res.summary = append(res.summary, strings.TrimSpace(line))
		}
	}
	res.readJUnit(t, junit, skips, s, regexp.MustCompile(focus))
	return res
}

func isSummaryLine(l string) bool {
	l = strings.TrimSpace(l)
	return strings.HasPrefix(l, "Ran ") && strings.Contains(l, " Specs in ") ||
		strings.HasPrefix(l, "SUCCESS!") || strings.HasPrefix(l, "FAIL!") ||
		strings.HasPrefix(l, "Ginkgo ran ") || strings.HasPrefix(l, "Test Suite ")
}

type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	// ginkgo reports a failed, timed out or aborted spec's failure, and
	// an interrupted or panicked one's as an error.
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
	// The spec's timeline, where a retried spec's earlier failures are.
	SystemErr string `xml:"system-err"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
}

// flakedCase names a passed spec that failed before a retry, with the
// first line of its first failure; "" for one that passed at once.
func flakedCase(c junitCase) string {
	if !strings.Contains(c.SystemErr, "Attempt #1 Failed.") {
		return ""
	}
	_, after, ok := strings.Cut(c.SystemErr, "[FAILED] Failure recorded during attempt 1:\n")
	if !ok {
		return c.Name
	}
	return failedCase(junitCase{Name: c.Name, Failure: &junitMessage{Message: after}})
}

// failedCase names a failed spec with the first line of its failure,
// so that a summary that has only this line still says what went wrong.
func failedCase(c junitCase) string {
	f := c.Failure
	if f == nil {
		f = c.Error
	}
	if f == nil || strings.TrimSpace(f.Message) == "" {
		return c.Name
	}
	msg, _, _ := strings.Cut(strings.TrimSpace(f.Message), "\n")
	const max = 400
	if len(msg) > max {
		msg = msg[:max] + "..."
	}
	return c.Name + ": " + msg
}

// readJUnit sorts the specs into passed, failed, skipped by the skip
// list, and skipped by themselves (unlisted). ginkgo reports the specs
// the run did not select (outside the labels or the focus, deselected,
// or on the skip list) as skipped with no reason, and a spec that skips
// itself always with one: those without a reason are counted only when
// the skip list names them, and any other outcome is a selected spec's
// (or, failed, the suite's set-up).
func (r *conformanceResult) readJUnit(t *testing.T, path string, skips []skipEntry, s suite, focus *regexp.Regexp) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("no JUnit report: %v", err)
		return
	}
	var js junitSuites
	if err := xml.Unmarshal(b, &js); err != nil {
		t.Errorf("JUnit report %s: %v", path, err)
		return
	}
	desel, sel := regexp.MustCompile(s.deselected()), regexp.MustCompile(s.selected)
	for _, ts := range js.Suites {
		for _, c := range ts.Cases {
			switch c.Status {
			case "passed":
				// Not the suite's set-up and tear-down nodes, which
				// every process reports; a failed one counts below.
				if strings.HasPrefix(c.Name, "[It] ") {
					r.passed = append(r.passed, c.Name)
					if f := flakedCase(c); f != "" {
						r.flaked = append(r.flaked, f)
					}
				}
			case "failed", "panicked", "interrupted", "timedout", "aborted":
				r.failed = append(r.failed, failedCase(c))
			case "skipped", "pending":
				why := ""
				if c.Skipped != nil {
					why = c.Skipped.Message
				}
				if why == "skipped" {
					if listed(skips, c.Name) && sel.MatchString(c.Name) && focus.MatchString(c.Name) && !desel.MatchString(c.Name) && selectedFeatures(c.Name, s.features) {
						r.listed++
					}
					continue
				}
				r.unlisted = append(r.unlisted, c.Name+": "+why)
			}
		}
	}
}

func listed(skips []skipEntry, name string) bool {
	for _, s := range skips {
		if s.re.MatchString(name) {
			return true
		}
	}
	return false
}

func (r *conformanceResult) report(t *testing.T) {
	t.Logf("%s: %d passed (%d flaked), %d failed, %d skipped by node-e2e-skip.txt, %d unlisted skips, in %s",
		r.name, len(r.passed), len(r.flaked), len(r.failed), r.listed, len(r.unlisted), r.elapsed.Round(time.Second))
	for _, l := range r.summary {
		t.Logf("ginkgo: %s", l)
	}
	for _, f := range r.failed {
		t.Errorf("%s: FAILED: %s", r.name, f)
	}
	for _, f := range r.flaked {
		t.Logf("%s: FLAKED (failed, then passed on its retry): %s", r.name, f)
	}
	for _, u := range r.unlisted {
		t.Errorf("%s: UNLISTED SKIP (the spec skipped itself; fix it or name it in node-e2e-skip.txt with a reason): %s", r.name, u)
	}
	if len(r.passed) == 0 {
		t.Errorf("no spec passed: the selection ran nothing")
	}
	if r.exit != nil && len(r.failed) == 0 {
		t.Errorf("ginkgo: %v with no failed spec in its report; its log:\n%s", r.exit, tail(readFile(r.log), 80))
	}
	if t.Failed() {
		t.Logf("ginkgo's log: %s; its last lines:\n%s", r.log, tail(readFile(r.log), 150))
	}
}
