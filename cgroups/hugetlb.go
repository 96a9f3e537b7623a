package cgroups

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Hugetlb is a cgroup's use of one huge page size, in bytes.
type Hugetlb struct {
	// PageSize is the size as the controller's files name it ("2MB").
	PageSize string
	Usage    uint64
	// MaxUsage is v1's peak; v2 keeps none, and it is 0 there.
	MaxUsage uint64
}

// hugePageSizes lists the host's huge page sizes, named as the hugetlb
// controller names its files, from the directories of dir
// (/sys/kernel/mm/hugepages: hugepages-2048kB, hugepages-1048576kB).
func hugePageSizes(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var sizes []string
	for _, e := range entries {
		kb, ok := strings.CutPrefix(e.Name(), "hugepages-")
		if !ok {
			continue
		}
		kb, ok = strings.CutSuffix(kb, "kB")
		n, err := strconv.ParseUint(kb, 10, 64)
		if !ok || err != nil || n == 0 {
			continue
		}
		sizes = append(sizes, pageSizeName(n))
	}
	return sizes
}

// pageSizeName names a size of n KiB as the kernel's hugetlb files do:
// in the largest unit that divides it (2048 is 2MB, 64 is 64KB).
func pageSizeName(n uint64) string {
	units := []string{"KB", "MB", "GB", "TB", "PB"}
	i := 0
	for n%1024 == 0 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return strconv.FormatUint(n, 10) + units[i]
}

// statHugetlb reads the cgroup's huge page use of every size the host
// has, for the metrics. The files are opened for each read: the metrics
// come every few seconds, and a host without huge pages has none to
// read. A size whose file the cgroup lacks (the controller not enabled
// for it on v2) is left out.
func (r *Reader) statHugetlb(group string, bp *[]byte) ([]Hugetlb, error) {
	r.hugeOnce.Do(func() {
		if r.mode == Unified || exists(r.root+"/hugetlb") {
			r.hugeSizes = hugePageSizes(r.hugepages)
		}
	})
	var out []Hugetlb
	for _, size := range r.hugeSizes {
		var usage, peak string
		if r.mode == Unified {
			usage = r.root + group + "/hugetlb." + size + ".current"
		} else {
			usage = r.root + "/hugetlb" + group + "/hugetlb." + size + ".usage_in_bytes"
			peak = r.root + "/hugetlb" + group + "/hugetlb." + size + ".max_usage_in_bytes"
		}
		h := Hugetlb{PageSize: size}
		ok, err := readUintFile(usage, bp, &h.Usage)
		if err != nil {
			return out, err
		}
		if !ok {
			continue
		}
		if peak != "" {
			if _, err := readUintFile(peak, bp, &h.MaxUsage); err != nil {
				return out, err
			}
		}
		out = append(out, h)
	}
	return out, nil
}

// readUintFile reads the number in the file at p into *v; false when
// there is no such file.
func readUintFile(p string, bp *[]byte, v *uint64) (bool, error) {
	fd, err := ignoringEINTR(func() (int, error) { return unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0) })
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	b, err := preadAll(fd, bp)
	if err != nil {
		return false, &os.PathError{Op: "read", Path: p, Err: err}
	}
	if *v, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	return true, nil
}
