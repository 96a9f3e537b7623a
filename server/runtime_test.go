package server

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestUpdateRuntimeConfig(t *testing.T) {
	tests := []struct {
		name    string
		cidrs   []string
		want    string
		wantErr error
	}{
		{"nothing sent", nil, "", nil},
		{"one CIDR", []string{"10.244.1.0/24"}, "10.244.1.0/24", nil},
		{"dual stack", []string{"10.244.1.0/24,fd00:1::/64"}, "10.244.1.0/24,fd00:1::/64", nil},
		{"empty keeps the last", []string{"10.244.1.0/24", ""}, "10.244.1.0/24", nil},
		{"bad CIDR", []string{"10.244.1.0/33"}, "", errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newPodFixture(t)
			ctx := context.Background()
			var err error
			for _, c := range tc.cidrs {
				_, err = f.srv.UpdateRuntimeConfig(ctx, &runtimeapi.UpdateRuntimeConfigRequest{
					RuntimeConfig: &runtimeapi.RuntimeConfig{NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: c}},
				})
			}
			if tc.wantErr != nil {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.srv.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Info["podCIDR"]; got != tc.want {
				t.Errorf("verbose Status podCIDR = %q, want %q", got, tc.want)
			}
			// The next CNI ADD gets it as ipRanges, and so does its DEL,
			// which may run without the ADD's cached configuration
			// (after a crash in the ADD) and with an IPAM that takes its
			// ranges from it alone.
			pod, err := f.srv.RunPodSandbox(ctx, unitPod("cidr", false))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
				t.Fatal(err)
			}
			calls := f.net.Calls()
			for _, c := range calls[len(calls)-2:] {
				if got := strings.Join(c.Pod.IPRanges, ","); got != tc.want {
					t.Errorf("CNI %s ipRanges = %q, want %q", c.Op, got, tc.want)
				}
			}
		})
	}
}
