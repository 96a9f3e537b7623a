package nsmgr

import (
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BlockSize is the number of host IDs pinrt allocates to a pod. Host
// IDs are cut into blocks of this size; block 0 belongs to the host.
const BlockSize = 65536

// Allocator records which pod holds which host IDs. It is kept in memory
// only: the sandbox package persists each pod's mappings and calls Restore
// at start-up. It is safe for concurrent use.
//
// Ranges it hands out itself follow kubelet's user-namespace manager
// (pkg/kubelet/userns): one 65536-ID block per pod, identical uid and gid
// mappings, container ID 0. Ranges a caller chooses need only be valid
// for the kernel (one mapping each for uids and gids, from container ID 0,
// of any length) and must not overlap a live pod's: the CRI conformance
// suite sends host ID 1000 with length 100000.
type Allocator struct {
	minBlock, maxBlock uint32 // Allocate hands out blocks in [minBlock, maxBlock)
	limit              int

	mu      sync.Mutex
	byOwner map[string]held
}

// held is what one pod holds.
type held struct {
	uid, gid specs.LinuxIDMapping
}

// NewAllocator returns an allocator that hands out blocks with host IDs
// in the half-open range [minHostID, maxHostID). Both bounds must be
// multiples of BlockSize and minHostID at least BlockSize (block 0 is the
// host's). An aligned uint32 maxHostID is at most 2^32-BlockSize, so the
// exclusive bound alone keeps the block holding UINT32_MAX out. limit
// bounds how many pods may hold a range at once; limit <= 0 means only the
// range bounds it.
func NewAllocator(minHostID, maxHostID uint32, limit int) (*Allocator, error) {
	switch {
	case minHostID%BlockSize != 0 || maxHostID%BlockSize != 0:
		return nil, fmt.Errorf("user namespace host range [%d, %d) is not aligned to %d: %w",
			minHostID, maxHostID, BlockSize, errdefs.ErrInvalidArgument)
	case minHostID < BlockSize:
		return nil, fmt.Errorf("user namespace host range starts at %d, inside block 0 which is reserved for the host: %w",
			minHostID, errdefs.ErrInvalidArgument)
	case maxHostID <= minHostID:
		return nil, fmt.Errorf("user namespace host range [%d, %d) is empty: %w",
			minHostID, maxHostID, errdefs.ErrInvalidArgument)
	}
	return &Allocator{
		minBlock: minHostID / BlockSize,
		maxBlock: maxHostID / BlockSize,
		limit:    limit,
		byOwner:  map[string]held{},
	}, nil
}

// Allocate hands the lowest free block to owner: one that overlaps no
// pod's uid or gid range. The returned mapping is used for both uids and
// gids.
func (a *Allocator) Allocate(owner string) (specs.LinuxIDMapping, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkNew(owner); err != nil {
		return specs.LinuxIDMapping{}, err
	}
	if err := a.checkLimit(); err != nil {
		return specs.LinuxIDMapping{}, err
	}
	for b := a.minBlock; b < a.maxBlock; b++ {
		m := specs.LinuxIDMapping{ContainerID: 0, HostID: b * BlockSize, Size: BlockSize}
		if a.overlap(m, m) == nil {
			a.byOwner[owner] = held{uid: m, gid: m}
			return m, nil
		}
	}
	return specs.LinuxIDMapping{}, fmt.Errorf("no free user namespace range in host IDs [%d, %d): %w",
		a.minBlock*BlockSize, uint64(a.maxBlock)*BlockSize, errdefs.ErrResourceExhausted)
}

// Reserve validates the mappings a caller (kubelet) chose for owner and
// records them. They need not lie inside [min, max) of this allocator, but
// they must not overlap another pod's.
func (a *Allocator) Reserve(owner string, uids, gids []specs.LinuxIDMapping) error {
	h, err := validatePodMappings(uids, gids)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkNew(owner); err != nil {
		return err
	}
	if err := a.overlap(h.uid, h.gid); err != nil {
		return err
	}
	if err := a.checkLimit(); err != nil {
		return err
	}
	a.byOwner[owner] = h
	return nil
}

// Restore records mappings persisted before a restart, allocated or
// chosen by the caller. It validates like Reserve and is idempotent for
// the same owner and mappings. It ignores the pod limit: a pod that
// already exists must be restorable even if the limit was lowered since.
func (a *Allocator) Restore(owner string, uids, gids []specs.LinuxIDMapping) error {
	h, err := validatePodMappings(uids, gids)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.byOwner[owner]; ok {
		if cur == h {
			return nil
		}
		return fmt.Errorf("pod %q already holds host uids %s, can't restore %s: %w",
			owner, span(cur.uid), span(h.uid), errdefs.ErrAlreadyExists)
	}
	if err := a.overlap(h.uid, h.gid); err != nil {
		return err
	}
	a.byOwner[owner] = h
	return nil
}

// Release frees owner's ranges. Releasing an owner that holds nothing is
// not an error, so rollback and RemovePodSandbox can both call it.
func (a *Allocator) Release(owner string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.byOwner, owner)
}

func (a *Allocator) checkNew(owner string) error {
	if h, ok := a.byOwner[owner]; ok {
		return fmt.Errorf("pod %q already holds host uids %s: %w", owner, span(h.uid), errdefs.ErrAlreadyExists)
	}
	return nil
}

func (a *Allocator) checkLimit() error {
	if a.limit > 0 && len(a.byOwner) >= a.limit {
		return fmt.Errorf("%d pods already hold a user namespace, the limit is %d: %w",
			len(a.byOwner), a.limit, errdefs.ErrResourceExhausted)
	}
	return nil
}

// overlap reports the first live pod whose uid range overlaps uid or
// whose gid range overlaps gid, naming the pod and its range. Two pods
// sharing host IDs could reach each other's files and processes.
func (a *Allocator) overlap(uid, gid specs.LinuxIDMapping) error {
	owners := make([]string, 0, len(a.byOwner))
	for o := range a.byOwner {
		owners = append(owners, o)
	}
	sort.Strings(owners) // a deterministic message
	for _, o := range owners {
		h := a.byOwner[o]
		for _, c := range []struct {
			kind       string
			mine, them specs.LinuxIDMapping
		}{{"uids", uid, h.uid}, {"gids", gid, h.gid}} {
			if overlaps(c.mine, c.them) {
				return fmt.Errorf("host %s %s overlap the range of pod %s (host %s %s): %w",
					c.kind, span(c.mine), o, c.kind, span(c.them), errdefs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

func overlaps(x, y specs.LinuxIDMapping) bool {
	return uint64(x.HostID) < uint64(y.HostID)+uint64(y.Size) && uint64(y.HostID) < uint64(x.HostID)+uint64(x.Size)
}

// span formats a mapping's host IDs as "first-last".
func span(m specs.LinuxIDMapping) string {
	return fmt.Sprintf("%d-%d", m.HostID, uint64(m.HostID)+uint64(m.Size)-1)
}

// validatePodMappings checks a pod's mappings against what the kernel and
// pinrt's pod model accept, and returns them. The checks run in an order
// where each one's message is reachable.
func validatePodMappings(uids, gids []specs.LinuxIDMapping) (held, error) {
	inval := func(format string, args ...any) (held, error) {
		return held{}, fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	if len(uids) != 1 {
		return inval("pod user namespace needs exactly one uid mapping, got %d", len(uids))
	}
	if len(gids) != 1 {
		return inval("pod user namespace needs exactly one gid mapping, got %d", len(gids))
	}
	for _, c := range []struct {
		kind string
		m    specs.LinuxIDMapping
	}{{"uid", uids[0]}, {"gid", gids[0]}} {
		m := c.m
		// The pod's root must be mapped: the pod files, shm and the
		// idmapped image tree are owned by container ID 0.
		if m.ContainerID != 0 {
			return inval("%s mapping must start at container ID 0, got %d", c.kind, m.ContainerID)
		}
		if m.Size == 0 {
			return inval("%s mapping length is 0", c.kind)
		}
		end := uint64(m.HostID) + uint64(m.Size) // exclusive
		if end > math.MaxUint32+1 {
			return inval("host %ss %d-%d run past %d", c.kind, m.HostID, end-1, uint32(math.MaxUint32))
		}
		// (uid_t)-1 means "no ID" to the kernel and must stay unmapped;
		// kubelet once handed out the block ending there (bug 139916).
		if end == math.MaxUint32+1 {
			return inval("host %ss %d-%d end at %d (UINT32_MAX), which must stay unmapped", c.kind, m.HostID, end-1, uint32(math.MaxUint32))
		}
		// The kernel would map the host's root into the pod, which is
		// what a user namespace exists to prevent.
		if m.HostID == 0 {
			return inval("%s mapping includes host ID 0 (root)", c.kind)
		}
	}
	return held{uid: uids[0], gid: gids[0]}, nil
}
