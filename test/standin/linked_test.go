package standin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkLinked on real Debian binaries: the host's true (loader and
// libc.so.6) and a glibc gconv module, which finds its helper library
// beside it through DT_RUNPATH $ORIGIN.
func TestCheckLinked(t *testing.T) {
	trueBin, err := exec.LookPath("true")
	if err != nil {
		t.Skipf("no true on the host: %v", err)
	}
	if n, ok, err := readELF(trueBin); err != nil || !ok || n.interp == "" {
		t.Skipf("the host's %s is not a dynamically linked ELF file (%+v, %v)", trueBin, n, err)
	}
	const gconv = "/usr/lib/x86_64-linux-gnu/gconv"
	euckr := filepath.Join(gconv, "EUC-KR.so")
	if _, err := os.Stat(euckr); err != nil {
		t.Skipf("no glibc gconv module on the host: %v", err)
	}
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	// A text file is a library here: checkLinked looks for names only.
	lib := func(p string) func(*tree) { return func(t *tree) { t.file(p, 0o644, "a library\n") } }
	bin := func(p, src string) func(*tree) { return func(t *tree) { t.copyFile(p, 0o755, src) } }
	loader := func(t *tree) { t.symlink("/lib64/ld-linux-x86-64.so.2", libc) }

	for _, tc := range []struct {
		name    string
		layers  [][]func(*tree) // lower layer first
		missing []string        // in the error, or none
	}{
		{"nothing but the program", [][]func(*tree){{bin("/bin/true", trueBin)}},
			[]string{"/bin/true: loader /lib64/ld-linux-x86-64.so.2", "/bin/true: libc.so.6"}},
		{"libc in the layer below", [][]func(*tree){{lib(libc), loader}, {bin("/bin/true", trueBin)}}, nil},
		{"libc in /usr/lib's multiarch directory", [][]func(*tree){{lib("/usr/lib/x86_64-linux-gnu/libc.so.6"), loader, bin("/bin/true", trueBin)}}, nil},
		{"libc outside the library path", [][]func(*tree){{lib("/opt/libc.so.6"), loader, bin("/bin/true", trueBin)}},
			[]string{"/bin/true: libc.so.6"}},
		{"gconv helper beside the module", [][]func(*tree){{lib(libc), bin(gconv+"/EUC-KR.so", euckr), lib(gconv + "/libKSC.so")}}, nil},
		{"gconv helper missing", [][]func(*tree){{lib(libc), bin(gconv+"/EUC-KR.so", euckr)}},
			[]string{gconv + "/EUC-KR.so: libKSC.so"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Builder{work: t.TempDir()}
			var roots []string
			for i, l := range tc.layers {
				tr, err := b.newTree("l")
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range l {
					f(tr)
				}
				if tr.err != nil {
					t.Fatalf("layer %d: %v", i, tr.err)
				}
				roots = append(roots, tr.root)
			}
			err := b.checkLinked(roots)
			if len(tc.missing) == 0 {
				if err != nil {
					t.Errorf("checkLinked: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("checkLinked: nil, want %v missing", tc.missing)
			}
			for _, m := range tc.missing {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("checkLinked: %v, want %q in it", err, m)
				}
			}
		})
	}
}
