package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// body returns n lines of statements, so a function with it is n+2 lines
// long (the func line and the closing brace).
func body(n int) string {
	return strings.Repeat("\t_ = 0\n", n)
}

func TestCheck(t *testing.T) {
	at80 := "func short() {\n" + body(78) + "}\n"
	at81 := "func long() {\n" + body(79) + "}\n"
	tests := []struct {
		name  string
		files map[string]string
		want  []string // output lines, in order; none means the check passes
	}{
		{"exactly 80 lines", map[string]string{"a.go": "package a\n\n" + at80}, nil},
		{"81 lines", map[string]string{"a.go": "package a\n\n" + at81},
			[]string{"a.go:3: long is 81 lines (limit 80)"}},
		{"method names", map[string]string{"a.go": "package a\n\ntype T struct{}\ntype G[K any] struct{}\n\n" +
			"func (t *T) Ptr() {\n" + body(79) + "}\n" +
			"func (T) Val() {\n" + body(79) + "}\n" +
			"func (g G[K]) Gen() {\n" + body(79) + "}\n"},
			[]string{"a.go:6: (*T).Ptr is 81 lines (limit 80)", "a.go:87: T.Val is 81 lines (limit 80)", "a.go:168: G.Gen is 81 lines (limit 80)"}},
		{"kept whole with a reason", map[string]string{"a.go": "package a\n\n// long does one thing.\n//\n// Kept whole: the steps share six locals.\n" + at81}, nil},
		{"marker without a reason", map[string]string{"a.go": "package a\n\n// Kept whole:\n" + at81},
			[]string{"a.go:4: long is 81 lines (limit 80)"}},
		{"marker outside the doc comment", map[string]string{"a.go": "package a\n\n// Kept whole: not attached.\n\n" + at81},
			[]string{"a.go:5: long is 81 lines (limit 80)"}},
		{"test files are not checked", map[string]string{"a_test.go": "package a\n\n" + at81}, nil},
		{"nested module, testdata and hidden dirs are skipped", map[string]string{
			"a.go":              "package a\n",
			"sub/go.mod":        "module example.com/sub\n",
			"sub/b.go":          "package sub\n\n" + at81,
			"x/testdata/c.go":   "package c\n\n" + at81,
			".cache/d.go":       "package d\n\n" + at81,
			"pkg/deeper/e.go":   "package e\n\n" + at81,
			"pkg/deeper/e2.go":  "package e\n\n" + at80,
			"vendor/m/vend.go":  "package m\n\n" + at81,
			"pkg/deeper/go.sum": "",
		}, []string{"pkg/deeper/e.go:3: long is 81 lines (limit 80)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tt.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var out bytes.Buffer
			n, err := check(dir, &out)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if s := strings.TrimSpace(out.String()); s != "" {
				got = strings.Split(s, "\n")
			}
			if n != len(tt.want) || strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("check found %d:\n%s\nwant:\n%s", n, out.String(), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestCheckParseError makes sure a file the checker cannot read fails
// the check rather than passing it unchecked.
func TestCheckParseError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.go"), []byte("package a\nfunc {"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := check(dir, &bytes.Buffer{}); err == nil {
		t.Fatal("check passed a file that does not parse")
	}
}
