package k8snode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/cosign"
	"github.com/pinrt/pinrt/test/testimage"
)

// TestNodeSignaturePolicy: on a node whose pinrt trusts one key for the
// images under <registry>/signed, a pod of an image signed with it runs,
// and the same pod with an unsigned image shows SignatureValidationFailed
// in its status, as kubelet reports pinrt's refusal; the refused image
// leaves nothing in pinrt's store. node-e2e.sh runs it after the
// conformance runs.
func TestNodeSignaturePolicy(t *testing.T) {
	if os.Getenv("PINRT_K8S_BINARY") == "" {
		t.Skip("PINRT_K8S_BINARY is not set: make node-e2e (test/k8snode/node-e2e.sh) runs this test with what it builds")
	}
	reg := testimage.StartRegistry(t)
	key := cosign.NewKey(t)
	signed, unsigned := reg.Ref("signed/busybox:1"), reg.Ref("signed/unsigned:1")
	reg.Push(t, "signed/busybox:1", testimage.Busybox(t))
	cosign.Sign(t, signed, key, cosign.Options{})
	reg.Push(t, "signed/unsigned:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "unsigned", Content: []byte("x")}}}}))

	dir := t.TempDir()
	keyPath, policy := filepath.Join(dir, "key.pub"), filepath.Join(dir, "policy.json")
	key.WritePublic(t, keyPath)
	// Everything else the node pulls stays accepted.
	if err := os.WriteFile(policy, fmt.Appendf(nil, `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{%q:[
		{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"matchRepository"}}]}}}`, reg.Addr+"/signed", keyPath), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNodeOpts(t, imageSource(t), nodeOpts{pinrtConf: fmt.Sprintf("[image]\nsignature_policy = %q\n", policy)})
	ctx := t.Context()
	const sigNS = "sigpolicy"
	cs := n.cs
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sigNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.poll(t, "service account default", time.Minute, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(sigNS).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_ = cs.CoreV1().Pods(sigNS).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
		for ctx.Err() == nil {
			if l, err := cs.CoreV1().Pods(sigNS).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) == 0 {
				return
			}
			time.Sleep(time.Second)
		}
	})
	pod := func(name, image string) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName:                      nodeName,
				TerminationGracePeriodSeconds: ptr(int64(1)),
				Containers:                    []corev1.Container{{Name: "c", Image: image, Command: []string{"sleep", "3600"}}},
			},
		}
		if _, err := cs.CoreV1().Pods(sigNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("signed", signed)
	pod("unsigned", unsigned)

	n.poll(t, "pod signed Running", 3*time.Minute, func() (bool, error) {
		p, err := cs.CoreV1().Pods(sigNS).Get(ctx, "signed", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	var waiting *corev1.ContainerStateWaiting
	n.poll(t, "pod unsigned refused with SignatureValidationFailed", 3*time.Minute, func() (bool, error) {
		p, err := cs.CoreV1().Pods(sigNS).Get(ctx, "unsigned", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodRunning {
			return false, fmt.Errorf("the pod of the unsigned image runs")
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && w.Reason == "SignatureValidationFailed" {
				waiting = w
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("pod unsigned: %s: %s", waiting.Reason, waiting.Message)
	if !strings.Contains(waiting.Message, unsigned) {
		t.Errorf("waiting message %q does not name the image %s", waiting.Message, unsigned)
	}

	conn, err := grpc.NewClient("unix://"+n.pinrtSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	is := runtimeapi.NewImageServiceClient(conn)
	for ref, want := range map[string]bool{signed: true, unsigned: false} {
		st, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			t.Fatal(err)
		}
		if got := st.GetImage() != nil; got != want {
			t.Errorf("pinrt holds %s: %v, want %v", ref, got, want)
		}
	}
}
