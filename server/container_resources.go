package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci"
)

// pageSize is a huge page size as kubelet and the hugetlb controller
// write it.
var pageSize = regexp.MustCompile(`^[1-9][0-9]*[KMGTP]B$`)

// validResources refuses what runc or the kernel would, while the values
// are still signed: toResources turns a negative cpu_shares into a huge
// unsigned one.
func validResources(r *runtimeapi.LinuxContainerResources) error {
	if r == nil {
		return nil
	}
	if err := oci.ValidateResources(r.CpuShares, r.CpuQuota, r.CpuPeriod, r.MemoryLimitInBytes,
		r.MemorySwapLimitInBytes, r.OomScoreAdj, r.CpusetCpus, r.CpusetMems); err != nil {
		return err
	}
	for _, h := range r.HugepageLimits {
		if h.PageSize == "" {
			return invalid("hugepage limit without a page size")
		}
		// It names the cgroup's file (hugetlb.2MB.limit_in_bytes).
		if !pageSize.MatchString(h.PageSize) {
			return invalid("hugepage page size %q is not a size like 2MB or 1GB", h.PageSize)
		}
	}
	// runc writes each unified entry to the file of that name in the
	// container's cgroup: a name, never a path.
	for k, v := range r.Unified {
		if k == "" || k == "." || k == ".." || strings.ContainsAny(k, "/\x00") || strings.ContainsRune(v, 0) {
			return invalid("unified cgroup setting %q=%q: the key must be a file name of the cgroup", k, v)
		}
	}
	return nil
}

// resourcesCache keeps what containerResources read from each bundle's
// config.json, with the file's identity: kubelet asks every container's
// status every second, and decoding a full OCI spec each time was half
// of a ContainerStatus. A rewritten file (UpdateContainerResources, an
// NRI update, anyone) has a new mtime or size or inode and is read again.
type resourcesCache struct {
	m sync.Map // bundle directory → *cachedResources
}

type cachedResources struct {
	path  string // the bundle's config.json
	mtime unix.Timespec
	size  int64
	ino   uint64
	res   *runtimeapi.ContainerResources
}

// get is the container's resources in force, a copy the caller may keep.
// The file is looked at with a stat into the stack: at kubelet's rate of
// status calls, os.Stat's allocations were a tenth of the garbage.
func (rc *resourcesCache) get(dir string) *runtimeapi.ContainerResources {
	var cached *cachedResources
	p := ""
	if v, ok := rc.m.Load(dir); ok {
		cached = v.(*cachedResources)
		p = cached.path
	} else {
		p = filepath.Join(dir, "config.json")
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		rc.m.Delete(dir)
		return nil
	}
	if cached != nil && cached.mtime == st.Mtim && cached.size == st.Size && cached.ino == st.Ino {
		return proto.CloneOf(cached.res)
	}
	res := containerResources(dir)
	if res == nil {
		return nil
	}
	rc.m.Store(dir, &cachedResources{path: p, mtime: st.Mtim, size: st.Size, ino: st.Ino, res: res})
	return proto.CloneOf(res)
}

// prime fills the entry of a bundle just written from spec, its
// config.json, so a new container's first ContainerStatus does not decode
// the file it was written from.
func (rc *resourcesCache) prime(dir string, spec *specs.Spec) {
	p := filepath.Join(dir, "config.json")
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return
	}
	rc.m.Store(dir, &cachedResources{path: p, mtime: st.Mtim, size: st.Size, ino: st.Ino, res: specResources(spec)})
}

// forget drops a removed container's entry.
func (rc *resourcesCache) forget(dir string) { rc.m.Delete(dir) }

// containerResources reports the limits in force, from the bundle's
// config.json: create writes it and every UpdateContainerResources
// rewrites it after runc applied the new limits. nil when it cannot be
// read (the container is being removed).
func containerResources(dir string) *runtimeapi.ContainerResources {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil
	}
	return specResources(&spec)
}

// specResources are the limits a spec sets, as CRI reports them.
func specResources(spec *specs.Spec) *runtimeapi.ContainerResources {
	out := &runtimeapi.LinuxContainerResources{}
	if spec.Process != nil && spec.Process.OOMScoreAdj != nil {
		out.OomScoreAdj = int64(*spec.Process.OOMScoreAdj)
	}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		r := spec.Linux.Resources
		if c := r.CPU; c != nil {
			out.CpusetCpus, out.CpusetMems = c.Cpus, c.Mems
			if c.Shares != nil {
				out.CpuShares = int64(*c.Shares)
			}
			if c.Quota != nil {
				out.CpuQuota = *c.Quota
			}
			if c.Period != nil {
				out.CpuPeriod = int64(*c.Period)
			}
		}
		if m := r.Memory; m != nil {
			if m.Limit != nil {
				out.MemoryLimitInBytes = *m.Limit
			}
			if m.Swap != nil {
				out.MemorySwapLimitInBytes = *m.Swap
			}
		}
		for _, h := range r.HugepageLimits {
			out.HugepageLimits = append(out.HugepageLimits, &runtimeapi.HugepageLimit{PageSize: h.Pagesize, Limit: h.Limit})
		}
		out.Unified = r.Unified
	}
	return &runtimeapi.ContainerResources{Linux: out}
}
