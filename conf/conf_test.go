package conf

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	if got := c.SocketPath(); got != "/run/pinrt/pinrt.sock" {
		t.Errorf("SocketPath() = %q, want /run/pinrt/pinrt.sock", got)
	}
	if got := c.RuntimeRoot("runc"); got != "/run/pinrt/runtime/runc" {
		t.Errorf("RuntimeRoot(runc) = %q", got)
	}
	if !c.CNI.DefaultNetwork {
		t.Error("default_network must be on by default")
	}
	if !c.NRI.Enable || c.NRI.SocketPath != "/var/run/nri/nri.sock" || c.NRI.PluginRequestTimeout.Std() != 2*time.Second || c.NRI.PluginRegistrationTimeout.Std() != 5*time.Second {
		t.Errorf("NRI defaults = %+v, want enabled on /var/run/nri/nri.sock with containerd's timeouts", c.NRI)
	}
	if got := strings.Join(c.CDI.SpecDirs, ","); got != "/etc/cdi,/var/run/cdi" {
		t.Errorf("cdi.spec_dirs default = %q", got)
	}
}

func TestNRIDisabledSkipsItsChecks(t *testing.T) {
	dir := t.TempDir()
	f := write(t, dir, "pinrt.toml", "[nri]\nenable = false\nsocket_path = \"\"\n")
	c, err := Load(f, "", true)
	if err != nil {
		t.Fatalf("a disabled NRI with no socket: %v", err)
	}
	if c.NRI.Enable {
		t.Error("nri.enable = false was not read")
	}
}

func TestLoadMissingFile(t *testing.T) {
	dir := t.TempDir()
	c, err := Load(filepath.Join(dir, "nope.toml"), filepath.Join(dir, "nope.d"), false)
	if err != nil {
		t.Fatalf("Load of a missing optional file: %v", err)
	}
	if c.Root != DefaultRoot {
		t.Errorf("Root = %q, want default", c.Root)
	}
	if _, err := Load(filepath.Join(dir, "nope.toml"), "", true); err == nil || !strings.Contains(err.Error(), "nope.toml") {
		t.Errorf("Load of a missing required file = %v, want an error naming it", err)
	}
}

func TestDropInPrecedence(t *testing.T) {
	dir := t.TempDir()
	main := write(t, dir, "pinrt.toml", `
root = "/srv/main"
log_level = "debug"
[cni]
plugin_dirs = ["/a", "/b"]
`)
	write(t, dir, "pinrt.d/20-b.toml", `log_level = "warn"`+"\n")
	write(t, dir, "pinrt.d/10-a.toml", "log_level = \"error\"\nrunroot = \"/run/x\"\n")
	write(t, dir, "pinrt.d/30-c.toml", "[runtime.runtimes.kata]\nbinary = \"/usr/bin/kata\"\n")
	write(t, dir, "pinrt.d/ignored.conf", "this is not toml")

	c, err := Load(main, filepath.Join(dir, "pinrt.d"), true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Root != "/srv/main" {
		t.Errorf("Root = %q, want /srv/main from the main file", c.Root)
	}
	if c.LogLevel != "warn" {
		t.Errorf("LogLevel = %q, want warn (20-b.toml is applied after 10-a.toml)", c.LogLevel)
	}
	if c.RunRoot != "/run/x" {
		t.Errorf("RunRoot = %q, want /run/x", c.RunRoot)
	}
	if got := strings.Join(c.CNI.PluginDirs, ","); got != "/a,/b" {
		t.Errorf("PluginDirs = %q", got)
	}
	if c.Runtime.Runtimes["kata"].Binary != "/usr/bin/kata" || c.Runtime.Runtimes["runc"].Binary != "runc" {
		t.Errorf("Runtimes = %+v, want kata added next to the defaults", c.Runtime.Runtimes)
	}
	if c.LogFormat != "text" {
		t.Errorf("LogFormat = %q, an untouched key keeps its default", c.LogFormat)
	}
}

func TestUnknownKeyNamesFileAndKey(t *testing.T) {
	dir := t.TempDir()
	main := write(t, dir, "pinrt.toml", "root = \"/x\"\n")
	bad := write(t, dir, "pinrt.d/50-bad.toml", "[cni]\nconf_dri = \"/etc/cni\"\n")
	_, err := Load(main, filepath.Join(dir, "pinrt.d"), true)
	if err == nil {
		t.Fatal("want an error for an unknown key")
	}
	for _, want := range []string{bad, `"cni.conf_dri"`, "unknown key", "line 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestBadTypeNamesFileAndKey(t *testing.T) {
	dir := t.TempDir()
	main := write(t, dir, "pinrt.toml", "[userns]\nmax_pods = \"many\"\n")
	_, err := Load(main, "", true)
	if err == nil || !strings.Contains(err.Error(), main) || !strings.Contains(err.Error(), "max_pods") {
		t.Fatalf("error = %v, want it to name %s and userns.max_pods", err, main)
	}
}

func TestInvalidValues(t *testing.T) {
	tests := []struct {
		name    string
		toml    string
		wantKey string
	}{
		{"relative root", `root = "var/lib/pinrt"`, "root"},
		{"relative runroot", `runroot = "run"`, "runroot"},
		{"relative listen", `listen = "pinrt.sock"`, "listen"},
		{"socket path too long", `listen = "/` + strings.Repeat("s", 120) + `"`, "listen"},
		{"default socket under a long run dir", `runroot = "/` + strings.Repeat("r", 100) + `"`, "runroot"},
		{"log level", `log_level = "loud"`, "log_level"},
		{"log format", `log_format = "xml"`, "log_format"},
		{"negative shutdown", `shutdown_timeout = "-1s"`, "shutdown_timeout"},
		{"negative socket group", `socket_group = "-5"`, "socket_group"},
		{"socket group over 2^31", `socket_group = "4294967295"`, "socket_group"},
		{"bad duration", `shutdown_timeout = "soon"`, "shutdown_timeout"},
		{"relative cni conf", "[cni]\nconf_dir = \"net.d\"", "cni.conf_dir"},
		{"no plugin dirs", "[cni]\nplugin_dirs = []", "cni.plugin_dirs"},
		{"relative plugin dir", "[cni]\nplugin_dirs = [\"bin\"]", "cni.plugin_dirs"},
		{"systemd driver with a path parent", "[runtime]\ncgroup_driver = \"systemd\"\ncgroup_parent = \"/kubepods/x\"", "runtime.cgroup_parent"},
		{"cgroupfs driver with a slice parent", "[runtime]\ncgroup_parent = \"pinrt.slice\"", "runtime.cgroup_parent"},
		{"unknown driver", "[runtime]\ncgroup_driver = \"nope\"", "runtime.cgroup_driver"},
		{"cgroup parent escape", "[runtime]\ncgroup_parent = \"/a/../..\"", "runtime.cgroup_parent"},
		{"unknown default runtime", "[runtime]\ndefault_runtime = \"kata\"", "runtime.default_runtime"},
		{"handler without binary", "[runtime.runtimes.x]\ntype = \"oci\"", "runtime.runtimes.x.binary"},
		{"handler type", "[runtime.runtimes.x]\nbinary = \"x\"\ntype = \"vm\"", "runtime.runtimes.x.type"},
		{"handler name", "[runtime.runtimes.\"a/b\"]\nbinary = \"x\"", "runtime.runtimes.a/b"},
		{"unaligned min", "[userns]\nmin_host_id = 1000", "userns.min_host_id"},
		{"min in block 0", "[userns]\nmin_host_id = 0", "userns.min_host_id"},
		{"unaligned max", "[userns]\nmax_host_id = 100000", "userns.max_host_id"},
		{"max below min", "[userns]\nmin_host_id = 131072\nmax_host_id = 65536", "userns.max_host_id"},
		{"no pods", "[userns]\nmax_pods = 0", "userns.max_pods"},
		{"negative pull timeout", "[image]\npull_timeout = \"-1s\"", "image.pull_timeout"},
		{"no progress timeout", "[image]\npull_progress_timeout = \"0s\"", "image.pull_progress_timeout"},
		{"no downloads", "[image]\nmax_concurrent_downloads = 0", "image.max_concurrent_downloads"},
		{"too many downloads", "[image]\nmax_concurrent_downloads = 1000", "image.max_concurrent_downloads"},
		{"relative auth file", "[image]\nauth_file = \"auth.json\"", "image.auth_file"},
		{"relative ca", "[image.registries.\"r.io\"]\nca_file = \"ca.pem\"", "image.registries.r.io.ca_file"},
		{"skip origin without mirror", "[image.registries.\"r.io\"]\nskip_origin = true", "image.registries.r.io.skip_origin"},
		{"empty pin", "[image]\npinned_images = [\"\"]", "image.pinned_images"},
		{"pin everything", "[image]\npinned_images = [\"*\"]", "image.pinned_images"},
		{"pin glob in the middle", "[image]\npinned_images = [\"reg/*/pause\"]", "image.pinned_images"},
		{"pin two stars", "[image]\npinned_images = [\"reg/pause**\"]", "image.pinned_images"},
		{"pin char class", "[image]\npinned_images = [\"reg/pause:[0-9]\"]", "image.pinned_images"},
		{"pin with space", "[image]\npinned_images = [\"reg/pause :1\"]", "image.pinned_images"},
		{"streaming host name", "[streaming]\naddress = \"localhost\"", "streaming.address"},
		{"streaming port", "[streaming]\nport = 70000", "streaming.port"},
		{"streaming cert without key", "[streaming]\ntls_cert_file = \"/etc/pinrt/c.pem\"", "streaming.tls_cert_file"},
		{"streaming relative tls", "[streaming]\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"", "streaming.tls_cert_file"},
		{"streaming idle timeout", "[streaming]\nidle_timeout = \"0s\"", "streaming.idle_timeout"},
		{"streaming max streams", "[streaming]\nmax_streams = 0", "streaming.max_streams"},
		{"metrics address without port", "[metrics]\naddress = \"127.0.0.1\"", "metrics.address"},
		{"pprof without address", "[metrics]\nenable_pprof = true", "metrics.enable_pprof"},
		{"disk usage interval too short", "[metrics]\ndisk_usage_interval = \"1ms\"", "metrics.disk_usage_interval"},
		{"relative cdi spec dir", "[cdi]\nspec_dirs = [\"cdi\"]", "cdi.spec_dirs"},
		{"relative nri socket", "[nri]\nsocket_path = \"nri.sock\"", "nri.socket_path"},
		{"empty nri socket", "[nri]\nsocket_path = \"\"", "nri.socket_path"},
		{"nri socket too long", "[nri]\nsocket_path = \"/" + strings.Repeat("s", 120) + "\"", "nri.socket_path"},
		{"relative nri plugin path", "[nri]\nplugin_path = \"plugins\"", "nri.plugin_path"},
		{"nri registration timeout", "[nri]\nplugin_registration_timeout = \"0s\"", "nri.plugin_registration_timeout"},
		{"nri request timeout", "[nri]\nplugin_request_timeout = \"-1s\"", "nri.plugin_request_timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := write(t, dir, "pinrt.toml", tc.toml+"\n")
			_, err := Load(f, "", true)
			if err == nil {
				t.Fatalf("Load(%q) succeeded, want an error about %s", tc.toml, tc.wantKey)
			}
			if !strings.Contains(err.Error(), tc.wantKey) || !strings.Contains(err.Error(), f) {
				t.Errorf("error %q should name the file and %q", err, tc.wantKey)
			}
		})
	}
}

func TestPinnedImagesValid(t *testing.T) {
	c := Default()
	c.Image.PinnedImages = []string{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause*", "sha256:" + strings.Repeat("a", 64), "docker.io/library/busybox@sha256:" + strings.Repeat("b", 64)}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate(%v) = %v, want valid", c.Image.PinnedImages, err)
	}
	if len(Default().Image.PinnedImages) != 0 {
		t.Errorf("Default pins %v, want nothing", Default().Image.PinnedImages)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	c := Default()
	c.Listen = "/tmp/x.sock"
	c.Image.Registries = map[string]Registry{"docker.io": {Mirrors: []string{"127.0.0.1:5000"}}}
	out, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "# Persistent state") {
		t.Errorf("encoded config has no field comments:\n%s", out)
	}
	var back Config
	if err := toml.NewDecoder(strings.NewReader(string(out))).DisallowUnknownFields().Decode(&back); err != nil {
		t.Fatalf("decoding our own output: %v\n%s", err, out)
	}
	if back.Listen != c.Listen || back.ShutdownTimeout.Std() != 10*time.Second ||
		back.Image.Registries["docker.io"].Mirrors[0] != "127.0.0.1:5000" || back.Runtime.Runtimes["runc"].Binary != "runc" {
		t.Errorf("round trip lost values: %+v", back)
	}
}

func TestImageDefaults(t *testing.T) {
	c := Default().Image
	if c.PullTimeout != 0 || c.PullProgressTimeout.Std() != time.Minute || c.MaxConcurrentDownloads != 3 || c.AuthFile != "" {
		t.Errorf("image defaults = %+v, want no total timeout, 1m progress timeout, 3 downloads, no auth file", c)
	}
}

// The commented registry example in `pinrt config --default` must be
// valid config once uncommented, or users copy a broken snippet.
func TestDefaultShowsRegistryExample(t *testing.T) {
	out, err := Default().Encode()
	if err != nil {
		t.Fatal(err)
	}
	var example []string
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "# [image.registries.") {
			in = true
		}
		if in {
			if !strings.HasPrefix(l, "#") {
				break
			}
			example = append(example, strings.TrimPrefix(l, "# "))
		}
	}
	if len(example) == 0 {
		t.Fatalf("no commented [image.registries.\"host\"] example in the default config:\n%s", out)
	}
	dir := t.TempDir()
	c, err := Load(write(t, dir, "pinrt.toml", strings.Join(example, "\n")+"\n"), "", true)
	if err != nil {
		t.Fatalf("uncommented example does not load: %v\n%s", err, strings.Join(example, "\n"))
	}
	r := c.Image.Registries["docker.io"]
	if len(r.Mirrors) != 2 || !r.SkipOrigin || !c.Image.Registries["backup.example.internal"].Insecure ||
		c.Image.Registries["mirror.example.internal:5000"].CAFile == "" {
		t.Errorf("example decoded to %+v", c.Image.Registries)
	}
}

// A duration written as a bare number is an error naming the file, the
// key and the line, not that many nanoseconds.
func TestDurationNeedsAUnit(t *testing.T) {
	for _, tc := range []struct {
		name, body, key string
		line            int
	}{
		{"bare integer", "[image]\npull_timeout = 5\n", "image.pull_timeout", 2},
		{"float", "\n\nshutdown_timeout = 1.5\n", "shutdown_timeout", 3},
		{"dotted key", "image.pull_timeout = 300\n", "image.pull_timeout", 1},
		{"inline table", "image = { pull_timeout = 7 }\n", "image.pull_timeout", 1},
		{"boolean", "[image]\n# comment\npull_timeout = true\n", "image.pull_timeout", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			main := write(t, t.TempDir(), "pinrt.toml", tc.body)
			_, err := Load(main, "", true)
			if err == nil {
				t.Fatal("want an error for a duration without a unit")
			}
			for _, want := range []string{main, tc.key, "not a duration", "line " + strconv.Itoa(tc.line)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
	main := write(t, t.TempDir(), "pinrt.toml", "[image]\npull_timeout = \"5s\"\n")
	cfg, err := Load(main, "", true)
	if err != nil || cfg.Image.PullTimeout.Std() != 5*time.Second {
		t.Fatalf("pull_timeout = \"5s\": %v, %v", cfg.Image.PullTimeout.Std(), err)
	}
}

func TestMetricsDefaultsAndValues(t *testing.T) {
	d := Default().Metrics
	if d.Address != "" || d.EnablePprof || d.DiskUsageInterval.Std() != time.Minute {
		t.Errorf("default metrics = %+v, want off and a one-minute disk usage interval", d)
	}
	dir := t.TempDir()
	f := write(t, dir, "pinrt.toml", "[metrics]\naddress = \"127.0.0.1:9090\"\nenable_pprof = true\ndisk_usage_interval = \"5s\"\n")
	cfg, err := Load(f, "", true)
	if err != nil {
		t.Fatal(err)
	}
	want := MetricsConfig{Address: "127.0.0.1:9090", EnablePprof: true, DiskUsageInterval: Duration(5 * time.Second)}
	if cfg.Metrics != want {
		t.Errorf("metrics = %+v, want %+v", cfg.Metrics, want)
	}
}
