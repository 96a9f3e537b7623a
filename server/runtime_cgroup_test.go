package server

import (
	"context"
	"testing"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/conf"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeConfig must report the driver the daemon really runs, or kubelet
// refuses to start (or, worse, splits pods across two cgroup trees).
func TestRuntimeConfigReportsDriver(t *testing.T) {
	for _, tc := range []struct {
		driver string
		want   runtimeapi.CgroupDriver
	}{
		{cgroups.DriverCgroupfs, runtimeapi.CgroupDriver_CGROUPFS},
		{cgroups.DriverSystemd, runtimeapi.CgroupDriver_SYSTEMD},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			cfg := conf.Default()
			d, err := cgroups.New(tc.driver, cfg.Runtime.CgroupParent)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := New(cfg, Deps{CgroupDriver: d}).RuntimeConfig(context.Background(), &runtimeapi.RuntimeConfigRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetLinux().GetCgroupDriver(); got != tc.want {
				t.Errorf("driver %v, want %v", got, tc.want)
			}
		})
	}
}
