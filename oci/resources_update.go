package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// Limits runc and the kernel enforce, checked before runc sees a value so
// a bad request is InvalidArgument with a reason instead of runc's stderr.
const (
	// MinCPUShares and MaxCPUShares bound cgroup v1 cpu.shares; runc maps
	// the same range onto cgroup v2 cpu.weight and refuses values outside.
	MinCPUShares = 2
	MaxCPUShares = 262144
	// MinCPUPeriod and MaxCPUPeriod bound cpu.cfs_period_us (1 ms to 1 s).
	MinCPUPeriod = 1000
	MaxCPUPeriod = 1000000
	// MinCPUQuota and MaxCPUQuota bound cpu.cfs_quota_us: the kernel's
	// smallest quota (1 ms) and its largest bandwidth (MAX_BW, 2^44-1 µs).
	MinCPUQuota = 1000
	MaxCPUQuota = 1<<44 - 1
	// MinMemoryLimit is the smallest memory limit accepted, as Docker
	// does: below it a container cannot even start its init.
	MinMemoryLimit = 6 << 20
)

// ValidateResources checks res the way runc and the kernel would, with
// the CRI's conventions: 0 means unset, -1 means unlimited for quota and
// swap. The values come signed from the CRI request, before conversion.
func ValidateResources(cpuShares, cpuQuota, cpuPeriod, memory, swap, oomScoreAdj int64, cpusetCpus, cpusetMems string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case cpuShares < 0 || cpuShares != 0 && (cpuShares < MinCPUShares || cpuShares > MaxCPUShares):
		return bad("cpu_shares %d is outside [%d, %d]", cpuShares, MinCPUShares, MaxCPUShares)
	case cpuPeriod < 0 || cpuPeriod != 0 && (cpuPeriod < MinCPUPeriod || cpuPeriod > MaxCPUPeriod):
		return bad("cpu_period %d is outside [%d, %d] microseconds", cpuPeriod, MinCPUPeriod, MaxCPUPeriod)
	case cpuQuota < -1 || cpuQuota > 0 && (cpuQuota < MinCPUQuota || cpuQuota > MaxCPUQuota):
		return bad("cpu_quota %d must be -1 (unlimited), 0 (unset) or in [%d, %d] microseconds", cpuQuota, MinCPUQuota, MaxCPUQuota)
	case memory < 0:
		return bad("memory_limit_in_bytes %d is negative", memory)
	case memory > 0 && memory < MinMemoryLimit:
		return bad("memory_limit_in_bytes %d is below the minimum of %d (6 MiB)", memory, MinMemoryLimit)
	case swap < -1:
		return bad("memory_swap_limit_in_bytes %d must be -1 (unlimited), 0 (unset) or positive", swap)
	// Memory plus swap under an unlimited memory is below it (cgroup v1
	// refuses the write); runc refuses it on v2.
	case swap > 0 && memory == 0:
		return bad("memory_swap_limit_in_bytes %d needs a memory_limit_in_bytes", swap)
	case swap > 0 && swap < memory:
		return bad("memory_swap_limit_in_bytes %d (memory plus swap) is below memory_limit_in_bytes %d", swap, memory)
	case oomScoreAdj < -1000 || oomScoreAdj > 1000:
		return bad("oom_score_adj %d is outside [-1000, 1000]", oomScoreAdj)
	}
	for _, c := range []struct{ name, v string }{{"cpuset_cpus", cpusetCpus}, {"cpuset_mems", cpusetMems}} {
		if err := validCPUList(c.v); err != nil {
			return bad("%s %q: %v", c.name, c.v, err)
		}
	}
	return nil
}

// validCPUList checks the kernel's list format: "0-3,5,7-8".
func validCPUList(s string) error {
	if s == "" {
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return fmt.Errorf("%q is not a number or range", part)
		}
		if isRange {
			b, err := strconv.ParseUint(hi, 10, 32)
			if err != nil || b < a {
				return fmt.Errorf("%q is not a valid range", part)
			}
		}
	}
	return nil
}

// UpdateBundleResources records res, just applied by `runc update`, in the
// bundle's config.json, so the spec on disk (crictl inspect, a restart)
// shows the limits in force. runc update changes only the fields it is
// given and leaves the rest of the cgroup as it was, so res is laid over
// the recorded limits field by field: an update of the CPU shares alone
// must not erase the memory limit from the record while the cgroup keeps
// it. Device rules are not part of an update and are kept.
func UpdateBundleResources(bundle string, res *specs.LinuxResources) error {
	p := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bundle %s has no config.json: %w", bundle, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("parse %s: %w: %w", p, err, errdefs.ErrDataLoss)
	}
	if spec.Linux == nil {
		spec.Linux = &specs.Linux{}
	}
	if spec.Linux.Resources == nil {
		spec.Linux.Resources = &specs.LinuxResources{}
	}
	upd := *res
	upd.Devices = nil
	overlay(reflect.ValueOf(spec.Linux.Resources).Elem(), reflect.ValueOf(&upd).Elem())
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p, out, 0o600)
}

// overlay copies into dst every field that src sets, as runc update reads
// its input: a nil pointer, an empty slice or map and a zero value mean
// "unchanged". Structs and pointers to structs are merged field by field,
// maps key by key; anything else set in src replaces dst's value.
func overlay(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Struct:
		for i := 0; i < src.NumField(); i++ {
			overlay(dst.Field(i), src.Field(i))
		}
	case reflect.Pointer:
		switch {
		case src.IsNil():
		case dst.IsNil() || src.Elem().Kind() != reflect.Struct:
			dst.Set(src)
		default:
			overlay(dst.Elem(), src.Elem())
		}
	case reflect.Map:
		if src.Len() == 0 {
			return
		}
		if dst.IsNil() {
			dst.Set(reflect.MakeMap(src.Type()))
		}
		for _, k := range src.MapKeys() {
			dst.SetMapIndex(k, src.MapIndex(k))
		}
	default:
		if !src.IsZero() {
			dst.Set(src)
		}
	}
}
