package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/pinrt/pinrt/conf"
)

// TestReferenceUpToDate fails when docs/config.md is not what the
// generator writes from today's conf package: a config field added,
// removed or re-commented without `make docs`.
func TestReferenceUpToDate(t *testing.T) {
	want, err := generate(filepath.Join("..", "..", "conf"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatalf("%v: generate it with `make docs`", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < len(gl) && i < len(wl) && gl[i] == wl[i] {
			i++
		}
		line := func(l []string) string {
			if i < len(l) {
				return l[i]
			}
			return "(end of file)"
		}
		t.Fatalf("docs/config.md is stale: regenerate it with `make docs`\nfirst difference, line %d:\n  file:      %s\n  generated: %s",
			i+1, line(gl), line(wl))
	}
}

// TestEveryKeyDocumented checks the generator on the real config: every
// key `pinrt config --default` writes has a heading with its type and
// default, and a comment.
func TestEveryKeyDocumented(t *testing.T) {
	ref, err := generate(filepath.Join("..", "..", "conf"))
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := toml.Unmarshal(mustEncode(t), &keys); err != nil {
		t.Fatal(err)
	}
	var check func(prefix string, m map[string]any)
	check = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			switch key {
			case "runtime.runtimes":
				// A map of tables: documented once as <name>.
				for _, h := range v.(map[string]any) {
					check(key+".<name>.", h.(map[string]any))
				}
				continue
			case "image.registries":
				continue // empty by default; its fields are checked below
			}
			if sub, ok := v.(map[string]any); ok {
				if !bytes.Contains(ref, []byte("## `["+key+"]`\n")) {
					t.Errorf("no section for [%s]", key)
				}
				check(key+".", sub)
				continue
			}
			i := bytes.Index(ref, []byte("### `"+key+"`\n\n"))
			if i < 0 {
				t.Errorf("no heading for %s", key)
				continue
			}
			entry, _, _ := strings.Cut(string(ref[i:]), "\n### ")
			_, rest, _ := strings.Cut(entry, "\n\n")
			desc, _, ok := strings.Cut(rest, "Type: ")
			if !ok {
				t.Errorf("%s: no type in %q", key, entry)
			}
			if strings.TrimSpace(desc) == "" {
				t.Errorf("%s: no description in %q", key, entry)
			}
		}
	}
	check("", keys)
	for _, k := range []string{"mirrors", "skip_origin", "insecure", "ca_file"} {
		if !bytes.Contains(ref, []byte("### `image.registries.<name>."+k+"`")) {
			t.Errorf("no heading for image.registries.<name>.%s", k)
		}
	}
	if !bytes.HasSuffix(ref, append(append([]byte("```toml\n"), mustEncode(t)...), "```\n"...)) {
		t.Error("the reference does not end with `pinrt config --default`")
	}
}

func mustEncode(t *testing.T) []byte {
	t.Helper()
	b, err := conf.Default().Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sample is a config shape for the rendering tests; its doc comments
// are read from this file.
type sample struct {
	// Plain restates its tag.
	Plain string `toml:"plain" comment:"Plain restates its tag."`
	// Wait bounds the wait, because the kernel keeps the socket for
	// a while after Plain closes it.
	Wait conf.Duration `toml:"wait" comment:"How long to wait."`
	// Skipped has no toml key.
	Skipped int `toml:"-"`
	// Hosts by name.
	Hosts map[string]sampleHost `toml:"hosts" comment:"Hosts by name.\nExample:\n[hosts.a]\n  port = 1"`
}

// sampleHost is one host.
type sampleHost struct {
	Port int `toml:"port" comment:"TCP port of <host>, or * for any."`
}

func TestRender(t *testing.T) {
	d, err := parseFiles([]string{"configref_test.go"})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	g := &gen{b: &b, docs: d}
	g.section("", "Keys", "", reflect.ValueOf(sample{
		Plain: "x", Wait: conf.Duration(1500000000),
		Hosts: map[string]sampleHost{"b": {Port: 2}, "a": {Port: 1}},
	}))
	out := b.String()
	for _, want := range []string{
		"### `plain`\n\nPlain restates its tag.\n\nType: string. Default: `\"x\"`.\n\n",
		// A doc comment that says more follows the tag, in TOML names.
		"How long to wait.\n\n`wait` bounds the wait, because the kernel keeps the socket for a while after `plain` closes it.\n\nType: duration. Default: `\"1.5s\"`.",
		"## `[hosts.<name>]`\n\nHosts by name. Example:\n\n```toml\n[hosts.a]\n  port = 1\n```\n\n",
		"Default: `{ a = { port = 1 }, b = { port = 2 } }`.",
		// Markdown would swallow <host> as HTML and take * for emphasis.
		"### `hosts.<name>.port`\n\nTCP port of \\<host\\>, or \\* for any.\n\nType: integer. Unset: `0`.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "Plain restates its tag.\n\nPlain restates") || strings.Contains(out, "`plain` restates") {
		t.Errorf("a doc comment that only restates the tag is printed:\n%s", out)
	}
	if strings.Contains(out, "Skipped") || strings.Contains(out, "skipped") {
		t.Errorf("a field without a toml key is documented:\n%s", out)
	}
}

func TestRunWritesFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "config.md")
	if err := run(out, filepath.Join("..", "..", "conf")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("<!-- Code generated")) {
		t.Errorf("output starts %q", got[:min(len(got), 40)])
	}
	if _, err := os.Stat(out + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	if err := run(out, t.TempDir()); err == nil {
		t.Error("run on a directory without Go files succeeded")
	}
}
