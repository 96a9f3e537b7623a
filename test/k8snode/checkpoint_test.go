package k8snode

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// TestNodeCheckpoint: kubelet's forensic checkpoint of a container in a
// pod with its own user namespace, asked through the API server's node
// proxy as the Kubernetes docs (and e2e_node's Checkpoint Container
// spec) do, POST /checkpoint/<namespace>/<pod>/<container>. kubelet
// names the archive under its checkpoints directory; the archive holds
// the dump of that container, and the container keeps running, without
// a restart. node-e2e.sh runs it after the conformance runs.
func TestNodeCheckpoint(t *testing.T) {
	if os.Getenv("PINRT_K8S_BINARY") == "" {
		t.Skip("PINRT_K8S_BINARY is not set: make node-e2e (test/k8snode/node-e2e.sh) runs this test with what it builds")
	}
	// The container's image comes from a registry of the test's own, as
	// in TestNodeSignaturePolicy: the node's stand-in set has no
	// busybox:1.29-2.
	reg := testimage.StartRegistry(t)
	image := reg.Ref("checkpoint/busybox:1")
	reg.Push(t, "checkpoint/busybox:1", testimage.Busybox(t))
	n := startNode(t, imageSource(t))
	ctx := t.Context()
	ckNS := ns
	cs := n.cs
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ckNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.poll(t, "service account default", time.Minute, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(ckNS).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_ = cs.CoreV1().Pods(ckNS).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
		for ctx.Err() == nil {
			if l, err := cs.CoreV1().Pods(ckNS).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) == 0 {
				return
			}
			time.Sleep(time.Second)
		}
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "counter"},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			HostUsers:                     ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "count", Image: image, Command: []string{"sh", "-c",
				`echo started > /started; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done`}}},
		},
	}
	if _, err := cs.CoreV1().Pods(ckNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.poll(t, "pod counter Running", 3*time.Minute, func() (bool, error) {
		p, err := cs.CoreV1().Pods(ckNS).Get(ctx, "counter", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})

	b, err := cs.CoreV1().RESTClient().Post().AbsPath("/api/v1/nodes", nodeName, "proxy/checkpoint", ckNS, "counter", "count").DoRaw(ctx)
	if err != nil {
		t.Fatalf("POST checkpoint: %v: %s", err, b)
	}
	var answer struct {
		Items []string `json:"items"`
	}
	if err := json.Unmarshal(b, &answer); err != nil || len(answer.Items) != 1 {
		t.Fatalf("kubelet answered %s (%v), want one archive", b, err)
	}
	archive := answer.Items[0]
	t.Logf("kubelet's archive: %s", archive)
	if dir := filepath.Join(n.kubeletRoot, "checkpoints"); filepath.Dir(archive) != dir {
		t.Errorf("archive %s is not in kubelet's %s", archive, dir)
	}
	files := testimage.TarFileAt(t, archive)
	for _, f := range []string{"checkpoint/pstree.img", "checkpoint/inventory.img", "dump.log", "rootfs-diff.tar"} {
		if _, ok := files[f]; !ok {
			t.Errorf("no %s in the archive", f)
		}
	}
	var cfg struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(files["config.dump"], &cfg); err != nil || cfg.Name != "count" {
		t.Errorf("config.dump = %s (%v), want the container count", files["config.dump"], err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
		Linux       struct {
			UIDMappings []struct {
				HostID uint32 `json:"hostID"`
			} `json:"uidMappings"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(files["spec.dump"], &spec); err != nil {
		t.Fatalf("spec.dump: %v", err)
	}
	if spec.Annotations["io.kubernetes.cri.sandbox-name"] != "counter" || spec.Annotations["io.kubernetes.cri.sandbox-namespace"] != ckNS {
		t.Errorf("spec.dump names pod %q in %q", spec.Annotations["io.kubernetes.cri.sandbox-name"], spec.Annotations["io.kubernetes.cri.sandbox-namespace"])
	}
	if !strings.Contains(string(files["dump.log"]), "Dumping finished successfully") {
		t.Errorf("dump.log does not say the dump finished:\n%s", tail(string(files["dump.log"]), 20))
	}

	// Still running, never restarted, and still counting.
	count := func() string { return strings.TrimSpace(n.mustExec(t, "counter", "count", "cat", "/tmp/count")) }
	before := count()
	time.Sleep(2 * time.Second)
	if after := count(); after == before {
		t.Errorf("the counter stood at %s after the checkpoint", before)
	}
	p, err := cs.CoreV1().Pods(ckNS).Get(ctx, "counter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Status.ContainerStatuses; len(st) != 1 || st[0].State.Running == nil || st[0].RestartCount != 0 {
		t.Errorf("container status after the checkpoint: %+v", st)
	}
}
