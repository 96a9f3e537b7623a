package test

import (
	"fmt"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkContainerLifecycle measures one container's whole life as
// kubelet drives it: create (rootfs mount, spec, conmon + runc create),
// start, stop with SIGKILL and remove, in a pod with and without a user
// namespace.
func BenchmarkContainerLifecycle(b *testing.B) {
	e := newCtrEnv(b)
	for _, userns := range []bool{false, true} {
		b.Run(fmt.Sprintf("userns=%v", userns), func(b *testing.B) {
			cfg := PodConfig(fmt.Sprintf("bench-%v", userns))
			if userns {
				cfg = UsernsPod(cfg, 0)
			}
			pod, podCfg := e.pod(b, cfg)
			ctx := Ctx(b)
			for i := 0; b.Loop(); i++ {
				c := e.ctr("c", "sleep", "1000")
				c.Metadata.Attempt = uint32(i)
				id := e.run(b, pod, podCfg, c)
				if _, err := e.d.Runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
					b.Fatal(err)
				}
				if _, err := e.d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
