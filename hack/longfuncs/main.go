// Command longfuncs fails when a function in the repository's Go source
// is longer than 80 lines, unless its doc comment has a line starting
// with "Kept whole:" that says why splitting it would only scatter it
// (STYLE.md 13: handlers and the code under them stay short, and a long
// function is a step list waiting for names). Test files are not
// checked: a table test is long by nature. Directories with their own
// go.mod (the builds under test/ that fetch other modules), testdata,
// vendor and hidden directories are not part of the repository's code.
//
//	go run ./hack/longfuncs [DIR]   (make lint; DIR defaults to .)
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// maxLines is the longest a function may be, counted from its func
// keyword to its closing brace, both included.
const maxLines = 80

// exemptPrefix starts the doc comment line that keeps a function whole.
const exemptPrefix = "Kept whole:"

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	n, err := check(root, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "longfuncs:", err)
		os.Exit(2)
	}
	if n > 0 {
		fmt.Printf("longfuncs: %d function(s) over %d lines; split each where a step has a name of its own, or add a doc comment line %q saying why it stays whole\n", n, maxLines, exemptPrefix+" <reason>")
		os.Exit(1)
	}
}

// finding is one function over the limit.
type finding struct {
	pos   token.Position
	name  string
	lines int
}

// check walks the Go files under root, writes one line per function over
// the limit to w, and returns how many there were.
func check(root string, w io.Writer) (int, error) {
	var found []finding
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			name := d.Name()
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		found = append(found, longFuncs(fset, f)...)
		return nil
	})
	if err != nil {
		return 0, err
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].pos.Filename != found[j].pos.Filename {
			return found[i].pos.Filename < found[j].pos.Filename
		}
		return found[i].pos.Line < found[j].pos.Line
	})
	for _, fd := range found {
		rel := fd.pos.Filename
		if r, err := filepath.Rel(root, rel); err == nil {
			rel = r
		}
		fmt.Fprintf(w, "%s:%d: %s is %d lines (limit %d)\n", filepath.ToSlash(rel), fd.pos.Line, fd.name, fd.lines, maxLines)
	}
	return len(found), nil
}

// longFuncs returns the functions in f over the limit and not exempt.
func longFuncs(fset *token.FileSet, f *ast.File) []finding {
	var out []finding
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		start := fset.Position(fn.Pos())
		lines := fset.Position(fn.End()).Line - start.Line + 1
		if lines <= maxLines || keptWhole(fn.Doc) {
			continue
		}
		out = append(out, finding{pos: start, name: funcName(fn), lines: lines})
	}
	return out
}

// keptWhole reports whether doc has a line starting with exemptPrefix
// followed by a reason: a bare marker would exempt without saying why.
func keptWhole(doc *ast.CommentGroup) bool {
	if doc == nil {
		return false
	}
	for _, line := range strings.Split(doc.Text(), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), exemptPrefix); ok && strings.TrimSpace(rest) != "" {
			return true
		}
	}
	return false
}

// funcName is fn's name as a reader searches for it: Name, or
// (*T).Name / T.Name for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	// A generic receiver: T[K] or T[K, V].
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	name := "?"
	if id, ok := t.(*ast.Ident); ok {
		name = id.Name
	}
	if star != "" {
		return "(*" + name + ")." + fn.Name.Name
	}
	return name + "." + fn.Name.Name
}
