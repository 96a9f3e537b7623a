package oci

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestUpdateBundleResourcesMergesLikeRuncUpdate(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	recorded := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		Memory:  &specs.LinuxMemory{Limit: i64(256 << 20), Swap: i64(512 << 20)},
		CPU:     &specs.LinuxCPU{Shares: u64(512), Quota: i64(50000), Period: u64(100000), Cpus: "0"},
		Pids:    &specs.LinuxPids{Limit: i64(100)},
		Unified: map[string]string{"memory.high": "200000000"},
	}
	tests := []struct {
		name   string
		update *specs.LinuxResources
		check  func(t *testing.T, got *specs.LinuxResources)
	}{{
		name:   "cpu shares alone keep the memory limit",
		update: &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(1024)}},
		check: func(t *testing.T, got *specs.LinuxResources) {
			if *got.CPU.Shares != 1024 || *got.CPU.Quota != 50000 || got.CPU.Cpus != "0" {
				t.Errorf("cpu = %+v, want shares 1024 over quota 50000 and cpus 0", got.CPU)
			}
			if got.Memory == nil || *got.Memory.Limit != 256<<20 || *got.Memory.Swap != 512<<20 {
				t.Errorf("memory = %+v, want the recorded limit and swap", got.Memory)
			}
			if got.Pids == nil || *got.Pids.Limit != 100 {
				t.Errorf("pids = %+v, want 100", got.Pids)
			}
		},
	}, {
		name:   "memory replaces memory only",
		update: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(128 << 20)}},
		check: func(t *testing.T, got *specs.LinuxResources) {
			if *got.Memory.Limit != 128<<20 || *got.Memory.Swap != 512<<20 {
				t.Errorf("memory = limit %d swap %d, want %d and the recorded swap", *got.Memory.Limit, *got.Memory.Swap, 128<<20)
			}
			if *got.CPU.Shares != 512 {
				t.Errorf("cpu shares = %d, want 512", *got.CPU.Shares)
			}
		},
	}, {
		name:   "unified keys merge, device rules stay",
		update: &specs.LinuxResources{Unified: map[string]string{"memory.max": "300000000"}, Devices: []specs.LinuxDeviceCgroup{{Allow: true}}},
		check: func(t *testing.T, got *specs.LinuxResources) {
			if got.Unified["memory.high"] != "200000000" || got.Unified["memory.max"] != "300000000" {
				t.Errorf("unified = %v, want both keys", got.Unified)
			}
			if len(got.Devices) != 1 || got.Devices[0].Allow {
				t.Errorf("devices = %+v, want the recorded deny-all rule", got.Devices)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := json.Marshal(&specs.Spec{Version: "1.2.0", Linux: &specs.Linux{Resources: recorded}})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := UpdateBundleResources(dir, tt.update); err != nil {
				t.Fatal(err)
			}
			b, err = os.ReadFile(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var got specs.Spec
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			tt.check(t, got.Linux.Resources)
		})
	}
}
