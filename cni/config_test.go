package cni

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

// fakePlugin is a CNI plugin in sh. It appends one line per call to
// calls.log next to itself, keeps the last stdin per command, answers ADD
// with a v4 and a v6 address inside the sandbox, and fails ADD and STATUS
// with a CNI error when a file "<name>.fail" exists beside it.
const fakePlugin = `#!/bin/sh
d=$(dirname "$0"); n=$(basename "$0")
cat > "$d/$n.$CNI_COMMAND.stdin"
echo "$n $CNI_COMMAND $CNI_CONTAINERID netns=$CNI_NETNS $CNI_IFNAME $CNI_ARGS" >> "$d/calls.log"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
STATUS)
  if [ -e "$d/$n.fail" ]; then
    echo '{"cniVersion":"1.1.0","code":50,"msg":"plugin not available"}'; exit 1
  fi ;;
DEL)
  if [ -e "$d/$n.delfail" ]; then
    echo '{"cniVersion":"1.0.0","code":11,"msg":"injected del failure"}'; exit 1
  fi ;;
ADD)
  if [ -e "$d/$n.fail" ]; then
    echo '{"cniVersion":"1.0.0","code":999,"msg":"injected failure"}'; exit 1
  fi
  echo '{"cniVersion":"1.0.0","interfaces":[{"name":"br0"},{"name":"eth0","sandbox":"'"$CNI_NETNS"'"}],"ips":[{"address":"fd00::5/64","interface":1},{"address":"10.199.0.1/24","interface":0},{"address":"10.199.0.5/24","interface":1}]}' ;;
esac
`

// testEnv is a conf dir, a plugin dir with fake plugins and a cache dir.
type testEnv struct {
	conf, plugins, cache string
}

func newEnv(t *testing.T, plugins ...string) *testEnv {
	t.Helper()
	root := t.TempDir()
	e := &testEnv{
		conf:    filepath.Join(root, "net.d"),
		plugins: filepath.Join(root, "bin"),
		cache:   filepath.Join(root, "cache"),
	}
	for _, d := range []string{e.conf, e.plugins} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range plugins {
		writeFile(t, filepath.Join(e.plugins, p), fakePlugin, 0o755)
	}
	return e
}

func (e *testEnv) config() Config {
	return Config{ConfDir: e.conf, PluginDirs: []string{e.plugins}, CacheDir: e.cache}
}

func (e *testEnv) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func writeFile(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func conflist(name string, types ...string) string {
	var plugins []map[string]any
	for _, typ := range types {
		plugins = append(plugins, map[string]any{"type": typ})
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": plugins})
	return string(b)
}

func TestLoadNetworkSelection(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		wantFile string // chosen file; "" means an error
		wantNet  string
		wantErr  string // exact message, the conf dir written as DIR
	}{
		{
			name:    "empty dir",
			wantErr: "no network config found in DIR: failed precondition",
		},
		{
			name: "lexical order wins over creation order",
			files: map[string]string{
				"20-b.conflist": conflist("b", "bridge"),
				"10-a.conflist": conflist("a", "bridge"),
			},
			wantFile: "10-a.conflist", wantNet: "a",
		},
		{
			name: "single plugin conf is upgraded to a list",
			files: map[string]string{
				"05-single.conf": `{"cniVersion":"1.0.0","name":"single","type":"ptp"}`,
				"10-a.conflist":  conflist("a", "bridge"),
			},
			wantFile: "05-single.conf", wantNet: "single",
		},
		{
			name: "json extension is a single plugin conf",
			files: map[string]string{
				"01-j.json": `{"cniVersion":"1.0.0","name":"j","type":"ptp"}`,
			},
			wantFile: "01-j.json", wantNet: "j",
		},
		{
			name: "invalid file is skipped for the next valid one",
			files: map[string]string{
				"00-bad.conflist": `{"name": `,
				"10-a.conflist":   conflist("a", "bridge"),
			},
			wantFile: "10-a.conflist", wantNet: "a",
		},
		{
			name: "other extensions and directories are ignored",
			files: map[string]string{
				"00-x.conflist.bak": conflist("bak", "bridge"),
				"01-notes.txt":      "hello",
				"00-dir.conf/":      "",
				"99-z.conflist":     conflist("z", "bridge"),
			},
			wantFile: "99-z.conflist", wantNet: "z",
		},
		{
			name: "bad JSON names the file",
			files: map[string]string{
				"10-bad.conflist": `{"name": `,
			},
			wantErr: "no valid network config in DIR: DIR/10-bad.conflist: error parsing configuration list: unexpected end of JSON input: failed precondition",
		},
		{
			name: "every invalid file is named",
			files: map[string]string{
				"10-bad.conflist": `{"cniVersion":"1.0.0","plugins":[]}`,
				"20-bad.conf":     `{"cniVersion":"1.0.0","name":"x"}`,
			},
			wantErr: "no valid network config in DIR: DIR/10-bad.conflist: error parsing configuration list: no name; DIR/20-bad.conf: error parsing configuration: missing 'type': failed precondition",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			for name, content := range tc.files {
				p := filepath.Join(e.conf, name)
				if name[len(name)-1] == '/' {
					if err := os.Mkdir(p, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				writeFile(t, p, content, 0o644)
			}
			nw, err := loadNetwork(e.conf)
			if tc.wantErr != "" {
				want := strings.ReplaceAll(tc.wantErr, "DIR", e.conf)
				if err == nil || err.Error() != want {
					t.Fatalf("err = %v\nwant %s", err, want)
				}
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("err %v is not ErrFailedPrecondition", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if nw.file != filepath.Join(e.conf, tc.wantFile) || nw.list.Name != tc.wantNet {
				t.Fatalf("chose %s (%s), want %s (%s)", nw.file, nw.list.Name, tc.wantFile, tc.wantNet)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	tests := []struct {
		name    string
		plugins []string
		files   map[string]string
		wantErr string // exact; DIR is the conf dir, BIN the plugin dir
	}{
		{
			name:    "empty dir",
			plugins: []string{"bridge", "loopback"},
			wantErr: "no network config found in DIR: failed precondition",
		},
		{
			name:    "bad json names the file",
			plugins: []string{"bridge", "loopback"},
			files:   map[string]string{"10-x.conflist": "{"},
			wantErr: "no valid network config in DIR: DIR/10-x.conflist: error parsing configuration list: unexpected end of JSON input: failed precondition",
		},
		{
			name:    "missing plugin binary",
			plugins: []string{"loopback"},
			files:   map[string]string{"10-x.conflist": conflist("x", "bridge")},
			wantErr: `network "x": plugin "bridge" not found in [BIN]: failed precondition`,
		},
		{
			name:    "missing second plugin of a list",
			plugins: []string{"bridge", "loopback"},
			files:   map[string]string{"10-x.conflist": conflist("x", "bridge", "portmap")},
			wantErr: `network "x": plugin "portmap" not found in [BIN]: failed precondition`,
		},
		{
			name:    "plugin type with a slash is never found",
			plugins: []string{"bridge", "loopback"},
			files:   map[string]string{"10-x.conflist": conflist("x", "../bin/bridge")},
			wantErr: `network "x": plugin "../bin/bridge" not found in [BIN]: failed precondition`,
		},
		{
			// pinrt skips loopback entries, so the binary is not needed.
			name:    "loopback listed but not installed",
			plugins: []string{"bridge"},
			files:   map[string]string{"10-x.conflist": conflist("x", "loopback", "bridge")},
		},
		{
			name:    "a lone loopback is no pod network",
			plugins: []string{"loopback"},
			files:   map[string]string{"10-x.conf": `{"cniVersion":"1.0.0","name":"x","type":"loopback"}`},
			wantErr: `no valid network config in DIR: DIR/10-x.conf: no plugins in network "x": failed precondition`,
		},
		{
			name:    "ready",
			plugins: []string{"bridge", "loopback"},
			files:   map[string]string{"10-x.conflist": conflist("x", "bridge")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.plugins...)
			for name, content := range tc.files {
				writeFile(t, filepath.Join(e.conf, name), content, 0o644)
			}
			err := e.manager(t).Status()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Status() = %v, want nil", err)
				}
				return
			}
			want := strings.ReplaceAll(tc.wantErr, "DIR", e.conf)
			want = strings.ReplaceAll(want, "BIN", e.plugins)
			if err == nil || err.Error() != want {
				t.Fatalf("Status() = %v\nwant %s", err, want)
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("Status() = %v, not ErrFailedPrecondition", err)
			}
		})
	}
}

func TestStatusNonExecutablePlugin(t *testing.T) {
	e := newEnv(t, "loopback")
	writeFile(t, filepath.Join(e.plugins, "bridge"), fakePlugin, 0o644)
	writeFile(t, filepath.Join(e.conf, "10-x.conflist"), conflist("x", "bridge"), 0o644)
	want := `network "x": plugin "bridge" not found in [` + e.plugins + `]: failed precondition`
	if err := e.manager(t).Status(); err == nil || err.Error() != want {
		t.Fatalf("Status() = %v, want %s", err, want)
	}
}

// TestStatusVerb: a CNI 1.1 network is ready only if its plugins say so.
func TestStatusVerb(t *testing.T) {
	e := newEnv(t, "fakenet", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-x.conflist"),
		`{"cniVersion":"1.1.0","name":"x","plugins":[{"type":"fakenet"}]}`, 0o644)
	m := e.manager(t)
	if err := m.Status(); err != nil {
		t.Fatalf("Status() = %v", err)
	}
	if got := e.calls(t); len(got) != 1 || !strings.HasPrefix(got[0], "fakenet STATUS ") {
		t.Fatalf("calls = %q, want one STATUS", got)
	}
	writeFile(t, filepath.Join(e.plugins, "fakenet.fail"), "", 0o644)
	err := m.Status()
	want := `network "x" is not ready: unavailable: plugin not available`
	if err == nil || err.Error() != want || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Status() = %v, want %s (ErrUnavailable)", err, want)
	}
}

func TestStatusAfterClose(t *testing.T) {
	e := newEnv(t, "bridge", "loopback")
	writeFile(t, filepath.Join(e.conf, "10-x.conflist"), conflist("x", "bridge"), 0o644)
	m := e.manager(t)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Status(); err == nil || err.Error() != "cni manager is closed: failed precondition" {
		t.Fatalf("Status() after Close = %v", err)
	}
}

func TestDefaultNetwork(t *testing.T) {
	tests := []struct {
		name      string
		enabled   bool
		existing  map[string]string
		noConfDir bool
		wantWrite bool
	}{
		{name: "on and empty", enabled: true, wantWrite: true},
		{name: "on and conf dir missing", enabled: true, noConfDir: true, wantWrite: true},
		{name: "off and empty", enabled: false},
		{name: "on with a config", enabled: true, existing: map[string]string{"99-mine.conf": `{"cniVersion":"1.0.0","name":"m","type":"ptp"}`}},
		{name: "on with only an invalid config", enabled: true, existing: map[string]string{"99-broken.json": "{"}},
		{name: "on with only unrelated files", enabled: true, existing: map[string]string{"README": "x"}, wantWrite: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "bridge", "portmap", "loopback")
			if tc.noConfDir {
				if err := os.Remove(e.conf); err != nil {
					t.Fatal(err)
				}
			}
			for name, content := range tc.existing {
				writeFile(t, filepath.Join(e.conf, name), content, 0o644)
			}
			cfg := e.config()
			cfg.DefaultNetwork = tc.enabled
			m, err := New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()

			path := filepath.Join(e.conf, DefaultConfName)
			got, err := os.ReadFile(path)
			if !tc.wantWrite {
				if !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("default config written (err %v)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(defaultConflist) {
				t.Fatalf("default config = %s", got)
			}
			for _, p := range []string{path, e.conf} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				want := os.FileMode(0o644)
				if fi.IsDir() {
					want = 0o755 | os.ModeDir
				}
				if fi.Mode() != want {
					t.Fatalf("%s mode = %v, want %v", p, fi.Mode(), want)
				}
			}
			// Only the config: the temp file is gone.
			entries, _ := os.ReadDir(e.conf)
			if len(entries) != 1+len(tc.existing) {
				t.Fatalf("conf dir holds %d entries, want %d", len(entries), 1+len(tc.existing))
			}
			if err := m.Status(); err != nil {
				t.Fatalf("Status() with default network = %v", err)
			}
			nw, err := loadNetwork(e.conf)
			if err != nil {
				t.Fatal(err)
			}
			if nw.list.Name != DefaultNetworkName || nw.list.CNIVersion != "1.0.0" || pluginTypes(nw.list) != `["bridge","portmap"]` {
				t.Fatalf("default network = %s %s %s", nw.list.Name, nw.list.CNIVersion, pluginTypes(nw.list))
			}
			// A second start keeps the file as it is.
			writeFile(t, path, conflist("edited", "bridge"), 0o644)
			if _, err := New(context.Background(), cfg); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(path); string(got) != conflist("edited", "bridge") {
				t.Fatalf("second New rewrote the config: %s", got)
			}
		})
	}
}

func TestNewInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no conf dir", Config{PluginDirs: []string{"/b"}, CacheDir: "/c"}},
		{"no plugin dirs", Config{ConfDir: "/a", CacheDir: "/c"}},
		{"no cache dir", Config{ConfDir: "/a", PluginDirs: []string{"/b"}}},
		{"relative cache dir", Config{ConfDir: "/a", PluginDirs: []string{"/b"}, CacheDir: "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(context.Background(), tc.cfg); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("New() = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestHotReload(t *testing.T) {
	e := newEnv(t, "bridge", "loopback")
	m := e.manager(t)
	if err := m.Status(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Status() on empty dir = %v", err)
	}
	path := filepath.Join(e.conf, "10-x.conflist")
	writeFile(t, path, conflist("x", "bridge"), 0o644)
	if err := m.Status(); err != nil {
		t.Fatalf("Status() after writing a config = %v", err)
	}
	// Rewritten in place with a missing plugin: seen at once.
	writeFile(t, path, conflist("x", "macvlan"), 0o644)
	if err := m.Status(); err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Status() after rewriting = %v", err)
	}
	writeFile(t, path, conflist("x", "bridge"), 0o644)
	if err := m.Status(); err != nil {
		t.Fatalf("Status() after fixing = %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	want := "no network config found in " + e.conf + ": failed precondition"
	if err := m.Status(); err == nil || err.Error() != want {
		t.Fatalf("Status() after removing = %v", err)
	}
}

// TestConcurrentReload runs Status and Setup while the config is replaced
// and removed; run with -race. Every Status must see either no config or a
// whole one, never a torn read.
func TestConcurrentReload(t *testing.T) {
	e := newEnv(t, "bridge", "loopback")
	m := e.manager(t)
	path := filepath.Join(e.conf, "10-x.conflist")
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Writers that care about readers write atomically; so do we.
			tmp := filepath.Join(e.conf, ".tmp")
			if err := os.WriteFile(tmp, []byte(conflist("x", "bridge")), 0o644); err != nil {
				t.Error(err)
				return
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Error(err)
				return
			}
			if i%2 == 0 {
				os.Remove(path)
			}
		}
	}()
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for range 200 {
				err := m.Status()
				if err != nil && err.Error() != "no network config found in "+e.conf+": failed precondition" {
					t.Errorf("Status() = %v", err)
					return
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	<-writerDone
}

func BenchmarkStatus(b *testing.B) {
	root := b.TempDir()
	conf, bin := filepath.Join(root, "net.d"), filepath.Join(root, "bin")
	for _, d := range []string{conf, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "portmap", "loopback"} {
		if err := os.WriteFile(filepath.Join(bin, p), []byte(fakePlugin), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, DefaultConfName), defaultConflist, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "99-other.conf"), []byte(`{"cniVersion":"1.0.0","name":"o","type":"ptp"}`), 0o644); err != nil {
		b.Fatal(err)
	}
	m, err := New(context.Background(), Config{ConfDir: conf, PluginDirs: []string{bin}, CacheDir: filepath.Join(root, "cache")})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := m.Status(); err != nil {
			b.Fatal(err)
		}
	}
}
