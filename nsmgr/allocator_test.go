package nsmgr

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func mapping(host uint32) specs.LinuxIDMapping {
	return specs.LinuxIDMapping{ContainerID: 0, HostID: host, Size: BlockSize}
}

func one(m specs.LinuxIDMapping) []specs.LinuxIDMapping { return []specs.LinuxIDMapping{m} }

func newTestAllocator(t *testing.T, minID, maxID uint32, limit int) *Allocator {
	t.Helper()
	a, err := NewAllocator(minID, maxID, limit)
	if err != nil {
		t.Fatalf("NewAllocator(%d, %d, %d): %v", minID, maxID, limit, err)
	}
	return a
}

func TestNewAllocatorRejects(t *testing.T) {
	for _, tc := range []struct {
		name     string
		min, max uint32
		want     string
	}{
		{"unaligned min", BlockSize + 1, 4 * BlockSize, "user namespace host range [65537, 262144) is not aligned to 65536: invalid argument"},
		{"unaligned max", BlockSize, 4*BlockSize - 1, "user namespace host range [65536, 262143) is not aligned to 65536: invalid argument"},
		{"block 0", 0, 4 * BlockSize, "user namespace host range starts at 0, inside block 0 which is reserved for the host: invalid argument"},
		{"empty", 4 * BlockSize, 4 * BlockSize, "user namespace host range [262144, 262144) is empty: invalid argument"},
		{"max 0 is not 2^32", BlockSize, 0, "user namespace host range [65536, 0) is empty: invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAllocator(tc.min, tc.max, 0)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("got %v, want %q (InvalidArgument)", err, tc.want)
			}
		})
	}
	// The largest accepted end leaves the block holding UINT32_MAX out.
	const maxEnd = 1<<32 - BlockSize
	if _, err := NewAllocator(BlockSize, maxEnd, 0); err != nil {
		t.Fatalf("NewAllocator up to %d: %v", uint32(maxEnd), err)
	}
}

func TestReserveRejects(t *testing.T) {
	ok := mapping(5 * BlockSize)
	for _, tc := range []struct {
		name       string
		uids, gids []specs.LinuxIDMapping
		class      error
		want       string
	}{
		{"no uid mapping", nil, one(ok), errdefs.ErrInvalidArgument,
			"pod user namespace needs exactly one uid mapping, got 0: invalid argument"},
		{"two uid mappings", []specs.LinuxIDMapping{ok, mapping(6 * BlockSize)}, one(ok), errdefs.ErrInvalidArgument,
			"pod user namespace needs exactly one uid mapping, got 2: invalid argument"},
		{"no gid mapping", one(ok), nil, errdefs.ErrInvalidArgument,
			"pod user namespace needs exactly one gid mapping, got 0: invalid argument"},
		{"two gid mappings", one(ok), []specs.LinuxIDMapping{ok, ok}, errdefs.ErrInvalidArgument,
			"pod user namespace needs exactly one gid mapping, got 2: invalid argument"},
		{"container ID not 0", one(specs.LinuxIDMapping{ContainerID: 1, HostID: 5 * BlockSize, Size: BlockSize}),
			one(specs.LinuxIDMapping{ContainerID: 1, HostID: 5 * BlockSize, Size: BlockSize}), errdefs.ErrInvalidArgument,
			"uid mapping must start at container ID 0, got 1: invalid argument"},
		{"gid container ID not 0", one(ok), one(specs.LinuxIDMapping{ContainerID: 1, HostID: 5 * BlockSize, Size: BlockSize}), errdefs.ErrInvalidArgument,
			"gid mapping must start at container ID 0, got 1: invalid argument"},
		{"length 0", one(specs.LinuxIDMapping{HostID: 5 * BlockSize}), one(ok), errdefs.ErrInvalidArgument,
			"uid mapping length is 0: invalid argument"},
		{"runs past 2^32-1", one(mapping(0xFFFFF000)), one(mapping(0xFFFFF000)), errdefs.ErrInvalidArgument,
			"host uids 4294963200-4295028735 run past 4294967295: invalid argument"},
		{"ends at UINT32_MAX", one(mapping(0xFFFF0000)), one(mapping(0xFFFF0000)), errdefs.ErrInvalidArgument,
			"host uids 4294901760-4294967295 end at 4294967295 (UINT32_MAX), which must stay unmapped: invalid argument"},
		{"host root", one(specs.LinuxIDMapping{HostID: 0, Size: 1000}), one(ok), errdefs.ErrInvalidArgument,
			"uid mapping includes host ID 0 (root): invalid argument"},
		{"overlaps another pod", one(mapping(3 * BlockSize)), one(mapping(3 * BlockSize)), errdefs.ErrInvalidArgument,
			"host uids 196608-262143 overlap the range of pod other (host uids 196608-262143): invalid argument"},
		{"straddles another pod's start", one(specs.LinuxIDMapping{HostID: 3*BlockSize - 10, Size: 11}), one(ok), errdefs.ErrInvalidArgument,
			"host uids 196598-196608 overlap the range of pod other (host uids 196608-262143): invalid argument"},
		{"gids overlap another pod", one(ok), one(specs.LinuxIDMapping{HostID: 4*BlockSize - 1, Size: 1}), errdefs.ErrInvalidArgument,
			"host gids 262143-262143 overlap the range of pod other (host gids 196608-262143): invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAllocator(t, BlockSize, 16*BlockSize, 0)
			if err := a.Reserve("other", one(mapping(3*BlockSize)), one(mapping(3*BlockSize))); err != nil {
				t.Fatalf("Reserve other: %v", err)
			}
			err := a.Reserve("pod", tc.uids, tc.gids)
			if !errors.Is(err, tc.class) || err.Error() != tc.want {
				t.Fatalf("Reserve = %v, want %q (%v)", err, tc.want, tc.class)
			}
			// A rejected reservation records nothing: the block is free.
			if m, err := a.Allocate("probe"); err != nil || m != mapping(BlockSize) {
				t.Fatalf("Allocate after rejected Reserve = %+v, %v", m, err)
			}
		})
	}
}

// A caller's mappings need only be valid for the kernel: any length from
// container ID 0, any alignment, uids and gids apart. The conformance
// suite sends host ID 1000 with length 100000.
func TestReserveAcceptsKernelValidRanges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		uid, gid specs.LinuxIDMapping
	}{
		{"critest", specs.LinuxIDMapping{HostID: 1000, Size: 100000}, specs.LinuxIDMapping{HostID: 1000, Size: 100000}},
		{"one ID", specs.LinuxIDMapping{HostID: 5000, Size: 1}, specs.LinuxIDMapping{HostID: 5000, Size: 1}},
		{"unaligned block", mapping(5*BlockSize + 1), mapping(5*BlockSize + 1)},
		{"two blocks", specs.LinuxIDMapping{HostID: 5 * BlockSize, Size: 2 * BlockSize}, specs.LinuxIDMapping{HostID: 5 * BlockSize, Size: 2 * BlockSize}},
		{"uids and gids apart", mapping(5 * BlockSize), mapping(7 * BlockSize)},
		{"up to UINT32_MAX-1", specs.LinuxIDMapping{HostID: 1, Size: 0xFFFFFFFE}, specs.LinuxIDMapping{HostID: 1, Size: 0xFFFFFFFE}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTestAllocator(t, BlockSize, 16*BlockSize, 0)
			if err := a.Reserve("pod", one(tc.uid), one(tc.gid)); err != nil {
				t.Fatalf("Reserve = %v, want success", err)
			}
			// Restore after a restart takes the same mappings.
			b := newTestAllocator(t, BlockSize, 16*BlockSize, 0)
			if err := b.Restore("pod", one(tc.uid), one(tc.gid)); err != nil {
				t.Fatalf("Restore = %v, want success", err)
			}
			// What the allocator hands out next overlaps neither.
			m, err := a.Allocate("next")
			if err == nil && (overlaps(m, tc.uid) || overlaps(m, tc.gid)) {
				t.Fatalf("Allocate = %+v overlaps the reserved ranges", m)
			}
		})
	}
}

// Allocate steps around a caller's unaligned range.
func TestAllocateSkipsCallerRange(t *testing.T) {
	a := newTestAllocator(t, BlockSize, 8*BlockSize, 0)
	r := specs.LinuxIDMapping{HostID: 1000, Size: 100000} // ends in block 1
	if err := a.Reserve("critest", one(r), one(r)); err != nil {
		t.Fatal(err)
	}
	if m, err := a.Allocate("pod"); err != nil || m != mapping(2*BlockSize) {
		t.Fatalf("Allocate = %+v, %v; want host %d", m, err, 2*BlockSize)
	}
}

func TestReserveOutsideAllocatorRange(t *testing.T) {
	// Kubelet picks its own ranges; they need not lie in [min, max).
	a := newTestAllocator(t, BlockSize, 4*BlockSize, 0)
	if err := a.Reserve("pod", one(mapping(100*BlockSize)), one(mapping(100*BlockSize))); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	err := a.Reserve("pod", one(mapping(101*BlockSize)), one(mapping(101*BlockSize)))
	if want := `pod "pod" already holds host uids 6553600-6619135: already exists`; !errors.Is(err, errdefs.ErrAlreadyExists) || err.Error() != want {
		t.Fatalf("second Reserve for the same pod = %v, want %q", err, want)
	}
}

func TestAllocateLowestFreeAndExhaustion(t *testing.T) {
	a := newTestAllocator(t, 2*BlockSize, 5*BlockSize, 0)
	for i, want := range []uint32{2 * BlockSize, 3 * BlockSize, 4 * BlockSize} {
		m, err := a.Allocate(fmt.Sprint("pod", i))
		if err != nil || m != mapping(want) {
			t.Fatalf("Allocate #%d = %+v, %v; want host %d", i, m, err, want)
		}
	}
	_, err := a.Allocate("pod3")
	if want := "no free user namespace range in host IDs [131072, 327680): resource exhausted"; !errors.Is(err, errdefs.ErrResourceExhausted) || err.Error() != want {
		t.Fatalf("Allocate on a full range = %v, want %q", err, want)
	}
	// A released block in the middle is handed out again.
	a.Release("pod1")
	if m, err := a.Allocate("pod4"); err != nil || m != mapping(3*BlockSize) {
		t.Fatalf("Allocate after Release = %+v, %v; want host %d", m, err, 3*BlockSize)
	}
	_, err = a.Allocate("pod4")
	if want := `pod "pod4" already holds host uids 196608-262143: already exists`; !errors.Is(err, errdefs.ErrAlreadyExists) || err.Error() != want {
		t.Fatalf("Allocate twice = %v, want %q", err, want)
	}
}

func TestAllocateSkipsReserved(t *testing.T) {
	a := newTestAllocator(t, BlockSize, 4*BlockSize, 0)
	if err := a.Reserve("kubelet", one(mapping(BlockSize)), one(mapping(BlockSize))); err != nil {
		t.Fatal(err)
	}
	if m, err := a.Allocate("pod"); err != nil || m != mapping(2*BlockSize) {
		t.Fatalf("Allocate = %+v, %v; want host %d", m, err, 2*BlockSize)
	}
}

func TestLimit(t *testing.T) {
	a := newTestAllocator(t, BlockSize, 100*BlockSize, 2)
	if _, err := a.Allocate("a"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve("b", one(mapping(50*BlockSize)), one(mapping(50*BlockSize))); err != nil {
		t.Fatal(err)
	}
	want := "2 pods already hold a user namespace, the limit is 2: resource exhausted"
	if _, err := a.Allocate("c"); !errors.Is(err, errdefs.ErrResourceExhausted) || err.Error() != want {
		t.Fatalf("Allocate over limit = %v, want %q", err, want)
	}
	if err := a.Reserve("c", one(mapping(60*BlockSize)), one(mapping(60*BlockSize))); !errors.Is(err, errdefs.ErrResourceExhausted) || err.Error() != want {
		t.Fatalf("Reserve over limit = %v, want %q", err, want)
	}
	// Restore ignores the limit: pods that exist must come back.
	if err := a.Restore("c", one(mapping(60*BlockSize)), one(mapping(60*BlockSize))); err != nil {
		t.Fatalf("Restore over limit: %v", err)
	}
	a.Release("a")
	a.Release("c")
	if _, err := a.Allocate("d"); err != nil {
		t.Fatalf("Allocate after Release: %v", err)
	}
}

func TestRestore(t *testing.T) {
	a := newTestAllocator(t, BlockSize, 4*BlockSize, 0)
	if err := a.Restore("pod", one(mapping(2*BlockSize)), one(mapping(2*BlockSize))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := a.Restore("pod", one(mapping(2*BlockSize)), one(mapping(2*BlockSize))); err != nil {
		t.Fatalf("Restore again (idempotent): %v", err)
	}
	for _, tc := range []struct {
		name, owner string
		m           specs.LinuxIDMapping
		class       error
		want        string
	}{
		{"same owner, other range", "pod", mapping(3 * BlockSize), errdefs.ErrAlreadyExists,
			`pod "pod" already holds host uids 131072-196607, can't restore 196608-262143: already exists`},
		{"other owner, same range", "other", mapping(2 * BlockSize), errdefs.ErrInvalidArgument,
			`host uids 131072-196607 overlap the range of pod pod (host uids 131072-196607): invalid argument`},
		{"invalid mapping", "other", specs.LinuxIDMapping{HostID: 3 * BlockSize, Size: 0}, errdefs.ErrInvalidArgument,
			"uid mapping length is 0: invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.Restore(tc.owner, one(tc.m), one(tc.m))
			if !errors.Is(err, tc.class) || err.Error() != tc.want {
				t.Fatalf("Restore = %v, want %q", err, tc.want)
			}
		})
	}
	// Allocate steps around the restored block.
	if m, err := a.Allocate("new"); err != nil || m != mapping(BlockSize) {
		t.Fatalf("Allocate = %+v, %v", m, err)
	}
	if m, err := a.Allocate("new2"); err != nil || m != mapping(3*BlockSize) {
		t.Fatalf("Allocate = %+v, %v", m, err)
	}
}

func TestReleaseIdempotent(t *testing.T) {
	a := newTestAllocator(t, BlockSize, 2*BlockSize, 0)
	a.Release("nobody")
	if _, err := a.Allocate("pod"); err != nil {
		t.Fatal(err)
	}
	a.Release("pod")
	a.Release("pod")
	if m, err := a.Allocate("pod"); err != nil || m != mapping(BlockSize) {
		t.Fatalf("Allocate after double Release = %+v, %v", m, err)
	}
}

func TestAllocateConcurrent(t *testing.T) {
	const n = 50
	a := newTestAllocator(t, BlockSize, (n+1)*BlockSize, n)
	var wg sync.WaitGroup
	got := make([]specs.LinuxIDMapping, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = a.Allocate(fmt.Sprint("pod", i))
		}()
	}
	wg.Wait()
	seen := map[uint32]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Allocate pod%d: %v", i, errs[i])
		}
		if prev, dup := seen[got[i].HostID]; dup {
			t.Fatalf("pod%d and pod%d both got host ID %d", prev, i, got[i].HostID)
		}
		seen[got[i].HostID] = i
	}
	for b := uint32(1); b <= n; b++ {
		if _, ok := seen[b*BlockSize]; !ok {
			t.Fatalf("block %d not handed out; the %d allocations must fill the range", b, n)
		}
	}
	if _, err := a.Allocate("one-more"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Allocate past the limit = %v, want ResourceExhausted", err)
	}
}
