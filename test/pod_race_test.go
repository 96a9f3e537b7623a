package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podCgroupDirs lists the cgroup directories of a pod under pinrt's
// default cgroup parent, in every hierarchy.
func podCgroupDirs(id string) []string {
	var left []string
	cands := []string{filepath.Join("/sys/fs/cgroup", "pinrt", id)}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		cands = append(cands, filepath.Join("/sys/fs/cgroup", e.Name(), "pinrt", id))
	}
	for _, c := range cands {
		if _, err := os.Stat(c); err == nil {
			left = append(left, c)
		}
	}
	return left
}

// CreateContainer racing StopPodSandbox or RemovePodSandbox on the same
// pod leaves no container, mount or cgroup directory behind: once 30 of
// 100 containers outlived their pod and every pod's cgroup directories
// stayed in every hierarchy.
func TestCreateContainerRacesPodRemoval(t *testing.T) {
	e := newCtrEnv(t)
	d := e.d
	const tries = 100
	var pods []string
	for i := range tries {
		// A deadline per try: 100 of them may take longer than one
		// call's on a loaded machine.
		ctx := Ctx(t)
		cfg := PodConfig(fmt.Sprintf("race-%d", i))
		cfg.LogDirectory = filepath.Join(d.Dir, "logs", cfg.Metadata.Name)
		pod := d.RunPod(t, cfg)
		pods = append(pods, pod)
		var wg sync.WaitGroup
		var createErr, podErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, createErr = d.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("c", "sleep", "60"), SandboxConfig: cfg})
		}()
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_, podErr = d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
			} else {
				_, podErr = d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
			}
		}()
		wg.Wait()
		if podErr != nil {
			t.Errorf("try %d: stop/remove: %v", i, podErr)
		}
		// The create either won (its container is then cleaned up with the
		// pod) or saw the pod stopped or removed.
		if c := status.Code(createErr); createErr != nil && c != codes.FailedPrecondition && c != codes.NotFound {
			t.Errorf("try %d: CreateContainer: %v, want success, FailedPrecondition or NotFound", i, createErr)
		}
		if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
			t.Errorf("try %d: RemovePodSandbox: %v", i, err)
		}
	}
	resp, err := d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.Containers {
		t.Errorf("container %s of pod %s outlived its pod", c.Id, c.PodSandboxId)
	}
	left := append(e.containerLeftovers(), d.Leftovers()...)
	for _, p := range pods {
		left = append(left, podCgroupDirs(p)...)
	}
	for ip := range d.LeasedIPs(t) {
		left = append(left, "IP "+ip)
	}
	if len(left) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
	}
}
