package standin

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// libDirs are where the loader looks for a library when the image has no
// /etc/ld.so.cache (none of ours has): Debian's glibc searches its
// multiarch directories before the classic ones.
var libDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "lib", "usr/lib"}

// elfNeeds is what one ELF file asks of the loader.
type elfNeeds struct {
	file   string   // path in the image
	interp string   // PT_INTERP, for an executable linked dynamically
	libs   []string // DT_NEEDED
	// dirs are DT_RUNPATH and DT_RPATH, searched first; glibc's gconv
	// modules find their helpers beside them through $ORIGIN.
	dirs []string
}

// scanELF lists what the ELF files under root need, each inode once (the
// busybox applets are hard links of one file).
func scanELF(root string) ([]elfNeeds, error) {
	var out []elfNeeds
	seen := map[uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		n, ok, err := readELF(p)
		if err != nil || !ok {
			return err
		}
		n.file = "/" + strings.TrimPrefix(p, root+"/")
		for i, d := range n.dirs {
			d = strings.ReplaceAll(d, "${ORIGIN}", "$ORIGIN")
			n.dirs[i] = strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(n.file))
		}
		out = append(out, n)
		return nil
	})
	return out, err
}

// readELF reads the loader and libraries an ELF file needs; ok is false
// for a file that is not ELF.
func readELF(p string) (n elfNeeds, ok bool, err error) {
	f, err := os.Open(p)
	if err != nil {
		return n, false, err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || !bytes.Equal(magic, []byte(elf.ELFMAG)) {
		return n, false, nil // short or not ELF
	}
	ef, err := elf.NewFile(f) // its Close would do nothing: f is ours
	if err != nil {
		return n, false, fmt.Errorf("%s: %w", p, err)
	}
	for _, prog := range ef.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return n, false, fmt.Errorf("%s: PT_INTERP: %w", p, err)
		}
		n.interp = string(bytes.TrimRight(b, "\x00"))
	}
	// A static file has no dynamic section, so no DT_NEEDED either.
	if n.libs, err = ef.ImportedLibraries(); err != nil {
		return n, false, fmt.Errorf("%s: DT_NEEDED: %w", p, err)
	}
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		paths, err := ef.DynString(tag)
		if err != nil {
			return n, false, fmt.Errorf("%s: %v: %w", p, tag, err)
		}
		for _, ps := range paths {
			n.dirs = append(n.dirs, strings.Split(ps, ":")...)
		}
	}
	return n, true, nil
}

// checkLinked returns an error naming every loader or library that an
// ELF file of the stacked trees needs and none of the trees holds. A
// missing library surfaces here instead of as "not found" in a spec that
// runs the program on a node.
func (b *Builder) checkLinked(roots []string) error {
	var missing []string
	for _, r := range roots {
		needs, ok := b.needs[r]
		if !ok {
			var err error
			if needs, err = scanELF(r); err != nil {
				return err
			}
			if b.needs == nil {
				b.needs = map[string][]elfNeeds{}
			}
			b.needs[r] = needs
		}
		for _, n := range needs {
			if n.interp != "" && !inTrees(roots, []string{n.interp}) {
				missing = append(missing, n.file+": loader "+n.interp)
			}
			for _, lib := range n.libs {
				var cands []string
				for _, d := range n.dirs {
					cands = append(cands, filepath.Join("/", d, lib))
				}
				for _, d := range libDirs {
					cands = append(cands, "/"+d+"/"+lib)
				}
				if !inTrees(roots, cands) {
					missing = append(missing, n.file+": "+lib)
				}
			}
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("not in the image: %s", strings.Join(missing, "; "))
	}
	return nil
}

// inTrees reports whether any of the paths exists in any of the trees;
// a symbolic link counts as there (its target is the package's business).
func inTrees(roots, paths []string) bool {
	for _, r := range roots {
		for _, p := range paths {
			if _, err := os.Lstat(filepath.Join(r, p)); err == nil {
				return true
			}
		}
	}
	return false
}
