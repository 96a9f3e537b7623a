package nsmgr

import (
	"fmt"
	"math"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BlockSize is the number of host IDs a pod's user namespace maps. Host
// IDs are cut into blocks of this size; block 0 belongs to the host.
const BlockSize = 65536

// Allocator records which pod holds which block of host IDs. It is kept
// in memory only: the sandbox package persists each pod's mapping and
// calls Restore at start-up. It is safe for concurrent use.
//
// Kubelet's user-namespace manager (pkg/kubelet/userns) is the model:
// one 65536-ID block per pod, identical uid and gid mappings, container
// ID 0.
type Allocator struct {
	minBlock, maxBlock uint32 // Allocate hands out blocks in [minBlock, maxBlock)
	limit              int

	mu      sync.Mutex
	byBlock map[uint32]string               // block index -> owner
	byOwner map[string]specs.LinuxIDMapping // owner -> its mapping
}

// NewAllocator returns an allocator that hands out blocks with host IDs
// in the half-open range [minHostID, maxHostID). Both bounds must be
// multiples of BlockSize and minHostID at least BlockSize (block 0 is the
// host's). An aligned uint32 maxHostID is at most 2^32-BlockSize, so the
// exclusive bound alone keeps the block holding UINT32_MAX out. limit bounds how many pods may hold a range at once; limit <= 0
// means only the range bounds it.
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
		byBlock:  map[uint32]string{},
		byOwner:  map[string]specs.LinuxIDMapping{},
	}, nil
}

// Allocate hands the lowest free block to owner. The returned mapping is
// used for both uids and gids.
func (a *Allocator) Allocate(owner string) (specs.LinuxIDMapping, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.byOwner[owner]; ok {
		return specs.LinuxIDMapping{}, fmt.Errorf("pod %q already holds host IDs %d-%d: %w",
			owner, m.HostID, m.HostID+m.Size-1, errdefs.ErrAlreadyExists)
	}
	if err := a.checkLimit(); err != nil {
		return specs.LinuxIDMapping{}, err
	}
	for b := a.minBlock; b < a.maxBlock; b++ {
		if _, used := a.byBlock[b]; !used {
			m := specs.LinuxIDMapping{ContainerID: 0, HostID: b * BlockSize, Size: BlockSize}
			a.record(owner, m)
			return m, nil
		}
	}
	return specs.LinuxIDMapping{}, fmt.Errorf("no free user namespace range in host IDs [%d, %d): %w",
		a.minBlock*BlockSize, uint64(a.maxBlock)*BlockSize, errdefs.ErrResourceExhausted)
}

// Reserve validates the mappings kubelet chose for owner and records them.
// Kubelet's range need not lie inside [min, max) of this allocator, but it
// must not collide with block 0 or another pod.
func (a *Allocator) Reserve(owner string, uids, gids []specs.LinuxIDMapping) error {
	m, err := validatePodMappings(uids, gids)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if held, ok := a.byOwner[owner]; ok {
		return fmt.Errorf("pod %q already holds host IDs %d-%d: %w",
			owner, held.HostID, held.HostID+held.Size-1, errdefs.ErrAlreadyExists)
	}
	if err := a.checkFree(m); err != nil {
		return err
	}
	if err := a.checkLimit(); err != nil {
		return err
	}
	a.record(owner, m)
	return nil
}

// Restore records a mapping persisted before a restart. It validates like
// Reserve and is idempotent for the same owner and mapping. It ignores the
// pod limit: a pod that already exists must be restorable even if the
// limit was lowered since.
func (a *Allocator) Restore(owner string, m specs.LinuxIDMapping) error {
	if _, err := validatePodMappings([]specs.LinuxIDMapping{m}, []specs.LinuxIDMapping{m}); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if held, ok := a.byOwner[owner]; ok {
		if held == m {
			return nil
		}
		return fmt.Errorf("pod %q already holds host IDs %d-%d, can't restore %d-%d: %w",
			owner, held.HostID, held.HostID+held.Size-1, m.HostID, m.HostID+m.Size-1, errdefs.ErrAlreadyExists)
	}
	if err := a.checkFree(m); err != nil {
		return err
	}
	a.record(owner, m)
	return nil
}

// Release frees owner's block. Releasing an owner that holds nothing is
// not an error, so rollback and RemovePodSandbox can both call it.
func (a *Allocator) Release(owner string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.byOwner[owner]; ok {
		delete(a.byBlock, m.HostID/BlockSize)
		delete(a.byOwner, owner)
	}
}

func (a *Allocator) record(owner string, m specs.LinuxIDMapping) {
	a.byBlock[m.HostID/BlockSize] = owner
	a.byOwner[owner] = m
}

func (a *Allocator) checkLimit() error {
	if a.limit > 0 && len(a.byOwner) >= a.limit {
		return fmt.Errorf("%d pods already hold a user namespace, the limit is %d: %w",
			len(a.byOwner), a.limit, errdefs.ErrResourceExhausted)
	}
	return nil
}

func (a *Allocator) checkFree(m specs.LinuxIDMapping) error {
	if other, ok := a.byBlock[m.HostID/BlockSize]; ok {
		return fmt.Errorf("host IDs %d-%d overlap the range of pod %q: %w",
			m.HostID, m.HostID+m.Size-1, other, errdefs.ErrAlreadyExists)
	}
	return nil
}

// validatePodMappings checks a pod's mappings against the rules kubelet's
// userns manager enforces and returns the single mapping. The checks run
// in an order where each one's message is reachable.
func validatePodMappings(uids, gids []specs.LinuxIDMapping) (specs.LinuxIDMapping, error) {
	inval := func(format string, args ...any) (specs.LinuxIDMapping, error) {
		return specs.LinuxIDMapping{}, fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	if len(uids) != 1 {
		return inval("pod user namespace needs exactly one uid mapping, got %d", len(uids))
	}
	if len(gids) != 1 {
		return inval("pod user namespace needs exactly one gid mapping, got %d", len(gids))
	}
	m := uids[0]
	if m != gids[0] {
		return inval("uid mapping %+v differs from gid mapping %+v", m, gids[0])
	}
	if m.ContainerID != 0 {
		return inval("mapping must start at container ID 0, got %d", m.ContainerID)
	}
	if m.Size != BlockSize {
		return inval("mapping length is %d, must be %d", m.Size, BlockSize)
	}
	end := uint64(m.HostID) + uint64(m.Size) // exclusive
	if end > math.MaxUint32+1 {
		return inval("host IDs %d-%d run past %d", m.HostID, end-1, uint32(math.MaxUint32))
	}
	// (uid_t)-1 means "no ID" to the kernel and must stay unmapped;
	// kubelet once handed out the block ending there (bug 139916).
	if end == math.MaxUint32+1 {
		return inval("host IDs %d-%d end at %d (UINT32_MAX), which must stay unmapped", m.HostID, end-1, uint32(math.MaxUint32))
	}
	if m.HostID%BlockSize != 0 {
		return inval("host ID %d is not a multiple of %d", m.HostID, BlockSize)
	}
	if m.HostID == 0 {
		return inval("host IDs 0-%d overlap block 0, which is reserved for the host", BlockSize-1)
	}
	return m, nil
}
