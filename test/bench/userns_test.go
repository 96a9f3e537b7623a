package bench

import (
	"errors"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestIDAllocatorHandsOutDisjointAlignedBlocks(t *testing.T) {
	a, err := NewIDAllocator(3*UsernsBlock, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{3 << 16, 4 << 16, 5 << 16, 6 << 16}
	seen := map[uint32]bool{}
	for i, w := range want {
		got, err := a.Acquire()
		if err != nil {
			t.Fatalf("Acquire #%d: %v", i, err)
		}
		if got != w {
			t.Fatalf("Acquire #%d = %d, want %d", i, got, w)
		}
		if got%UsernsBlock != 0 || got == 0 || seen[got] {
			t.Fatalf("block %d not aligned, zero or repeated", got)
		}
		seen[got] = true
	}
	if _, err := a.Acquire(); !errors.Is(err, ErrNoMappings) {
		t.Fatalf("Acquire on a full allocator: %v, want ErrNoMappings", err)
	}
	a.Release(5 << 16)
	a.Release(12345) // not a block start: ignored
	a.Release(1 << 16)
	if got, err := a.Acquire(); err != nil || got != 5<<16 {
		t.Fatalf("Acquire after release = %d, %v; want %d", got, err, 5<<16)
	}
}

func TestIDAllocatorReusesLast(t *testing.T) {
	// The cursor rotates, so a released block is handed out again only
	// after the others: a runtime that frees a range lazily is not hit by
	// an immediate reuse.
	a, err := NewIDAllocator(UsernsBlock, 3)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.Acquire()
	a.Release(first)
	second, _ := a.Acquire()
	if second == first {
		t.Fatalf("released block %d handed out again immediately", first)
	}
}

func TestNewIDAllocatorLimits(t *testing.T) {
	tests := []struct {
		name  string
		base  uint32
		count int
		ok    bool
	}{
		{"block 0 is the host's", 0, 1, false},
		{"unaligned", UsernsBlock + 1, 1, false},
		{"zero count", UsernsBlock, 0, false},
		{"block 1", UsernsBlock, 1, true},
		{"last usable block 65534", 65534 * UsernsBlock, 1, true},
		{"block 65535 reaches 2^32-1", 65535 * UsernsBlock, 1, false},
		{"range running into 2^32-1", 65534 * UsernsBlock, 2, false},
		{"all usable blocks", UsernsBlock, 65534, true},
		{"one too many", UsernsBlock, 65535, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewIDAllocator(tc.base, tc.count)
			if (err == nil) != tc.ok {
				t.Fatalf("NewIDAllocator(%d, %d) error = %v, want ok=%v", tc.base, tc.count, err, tc.ok)
			}
			if !tc.ok {
				return
			}
			// Drain it: every block must end strictly below 2^32-1.
			for range tc.count {
				id, err := a.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				if end := uint64(id) + UsernsBlock - 1; end >= 1<<32-1 || id == 0 {
					t.Fatalf("block %d ends at %d", id, end)
				}
			}
		})
	}
}

func TestUsernsOption(t *testing.T) {
	o := UsernsOption(7 << 16)
	if o.GetMode() != runtimeapi.NamespaceMode_POD || len(o.GetUids()) != 1 || len(o.GetGids()) != 1 {
		t.Fatalf("option = %v", o)
	}
	for _, m := range []*runtimeapi.IDMapping{o.GetUids()[0], o.GetGids()[0]} {
		if m.GetHostId() != 7<<16 || m.GetContainerId() != 0 || m.GetLength() != 65536 {
			t.Fatalf("mapping = %v, want host 458752, container 0, length 65536", m)
		}
	}
}
