package bench

import (
	"errors"
	"fmt"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// UsernsBlock is the size of one pod's ID range. kubelet hands out ranges of
// exactly 65536 IDs, aligned to 65536, so the tool does the same: runtimes
// are entitled to validate that shape.
const UsernsBlock = 1 << 16

// maxUsernsBlock is the highest usable block index. Block 65535 would end at
// 2^32-1, which is (uid_t)-1, the kernel's "no ID" value; it must never be
// mapped.
const maxUsernsBlock = (1<<32)/UsernsBlock - 2

// ErrNoMappings is returned when every block of the allocator is in use.
var ErrNoMappings = errors.New("no free user namespace ID block")

// IDAllocator hands out disjoint, block-aligned host ID ranges of
// UsernsBlock IDs, the way kubelet does for pods with hostUsers: false.
// Block 0 (the host's own root range) is never handed out.
type IDAllocator struct {
	first uint32 // first block index
	count uint32

	mu   sync.Mutex
	used map[uint32]bool
	next uint32 // rotating cursor so released blocks are not reused at once
}

// NewIDAllocator returns an allocator for count blocks starting at host ID
// base. base must be a non-zero multiple of UsernsBlock, and the last block
// must end below 2^32-1.
func NewIDAllocator(base uint32, count int) (*IDAllocator, error) {
	if base == 0 || base%UsernsBlock != 0 {
		return nil, fmt.Errorf("userns base %d: must be a non-zero multiple of %d", base, UsernsBlock)
	}
	if count < 1 {
		return nil, fmt.Errorf("userns count %d: must be at least 1", count)
	}
	first := base / UsernsBlock
	if uint64(first)+uint64(count)-1 > maxUsernsBlock {
		return nil, fmt.Errorf("userns base %d + %d blocks: ends beyond host ID %d", base, count, uint64(maxUsernsBlock+1)*UsernsBlock-1)
	}
	return &IDAllocator{first: first, count: uint32(count), used: map[uint32]bool{}}, nil
}

// Acquire returns the first host ID of a free block.
func (a *IDAllocator) Acquire() (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := uint32(0); i < a.count; i++ {
		k := (a.next + i) % a.count
		if !a.used[k] {
			a.used[k] = true
			a.next = (k + 1) % a.count
			return (a.first + k) * UsernsBlock, nil
		}
	}
	return 0, fmt.Errorf("%d blocks from host ID %d: %w", a.count, a.first*UsernsBlock, ErrNoMappings)
}

// Release returns a block obtained from Acquire. Releasing an unknown or
// free block is a no-op.
func (a *IDAllocator) Release(hostID uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if hostID%UsernsBlock != 0 || hostID/UsernsBlock < a.first {
		return
	}
	delete(a.used, hostID/UsernsBlock-a.first)
}

// UsernsOption builds the pod's user namespace option for a block: one
// mapping of the whole block to container ID 0, for both UIDs and GIDs.
func UsernsOption(hostID uint32) *runtimeapi.UserNamespace {
	m := func() []*runtimeapi.IDMapping {
		return []*runtimeapi.IDMapping{{HostId: hostID, ContainerId: 0, Length: UsernsBlock}}
	}
	return &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD, Uids: m(), Gids: m()}
}
