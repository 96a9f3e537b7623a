package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func testMetadata(id string) Metadata {
	return Metadata{
		ID: id, Name: "web", Namespace: "default", UID: "u1", Attempt: 2,
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"},
		LogDirectory: "/var/log/pods/x", Handler: "runc", Hostname: "web",
		CreatedAt: time.Unix(1700000000, 42).UTC(),
		Modes:     NamespaceModes{Network: ModePod, IPC: ModePod, PID: ModeContainer, User: ModePod},
		Pins: map[string]string{
			"user": "/run/pinrt/ns/user/" + id, "net": "/run/pinrt/ns/net/" + id,
			"ipc": "/run/pinrt/ns/ipc/" + id, "uts": "/run/pinrt/ns/uts/" + id,
		},
		UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 131072, Size: 65536}},
		GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 131072, Size: 65536}},
		Allocated:   true,
		IPs:         []string{"10.1.0.2", "fd00::2"},
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	id := "abc123"
	dir := filepath.Join(t.TempDir(), id)
	sb := New(testMetadata(id), dir)
	if err := sb.Save(); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := testMetadata(id)
	if got.ID != id || got.Name != want.Name || got.Attempt != 2 || got.Labels["app"] != "web" ||
		got.UIDMappings[0] != want.UIDMappings[0] || strings.Join(got.IPs, ",") != "10.1.0.2,fd00::2" ||
		!got.CreatedAt.Equal(want.CreatedAt) || got.Modes != want.Modes {
		t.Errorf("loaded metadata = %+v, want %+v", got.Metadata, want)
	}
	for kind, p := range want.Pins {
		if got.Pins[kind] != p {
			t.Errorf("pin %s = %q, want %q (read from config.json)", kind, got.Pins[kind], p)
		}
	}
	if got.Status().State != StateReady {
		t.Errorf("state = %v, want ready", got.Status().State)
	}
}

// The namespace paths restore uses are those in config.json, the file an
// OCI runtime would join.
func TestConfigJSONIsTheNamespaceRecord(t *testing.T) {
	id := "cfg1"
	dir := filepath.Join(t.TempDir(), id)
	sb := New(testMetadata(id), dir)
	if err := sb.Save(); err != nil {
		t.Fatal(err)
	}
	spec := sb.Spec()
	types := map[specs.LinuxNamespaceType]string{}
	for _, ns := range spec.Linux.Namespaces {
		types[ns.Type] = ns.Path
	}
	if types[specs.NetworkNamespace] != "/run/pinrt/ns/net/"+id || types[specs.UserNamespace] != "/run/pinrt/ns/user/"+id {
		t.Errorf("spec namespaces = %v", spec.Linux.Namespaces)
	}
	if spec.Annotations[AnnotationName] != "web" || spec.Annotations[AnnotationIPs] != `["10.1.0.2","fd00::2"]` ||
		spec.Annotations[AnnotationUIDMappings] != `[{"containerID":0,"hostID":131072,"size":65536}]` {
		t.Errorf("annotations = %v", spec.Annotations)
	}
}

func TestLoadRefusesBadState(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  error
	}{
		{"no meta", func(t *testing.T, dir string) {}, errdefs.ErrNotFound},
		{"unknown version", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, stateFile), `{"version": 99, "metadata": {"id": "x1"}, "status": {"state": "ready"}}`)
		}, errdefs.ErrFailedPrecondition},
		{"id differs from dir", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, legacyMetaFile), `{"version": 1, "metadata": {"id": "other"}}`)
			writeFile(t, filepath.Join(dir, specFile), `{}`)
		}, errdefs.ErrFailedPrecondition},
		{"no config.json", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, stateFile), `{"version": 2, "metadata": {"id": "x1"}, "status": {"state": "ready"}}`)
		}, errdefs.ErrNotFound},
		{"legacy meta without status", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, legacyMetaFile), `{"version": 1, "metadata": {"id": "x1"}}`)
			writeFile(t, filepath.Join(dir, specFile), `{}`)
		}, errdefs.ErrDataLoss},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "x1")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			if _, err := Load(dir); !errors.Is(err, tc.want) {
				t.Errorf("Load = %v, want %v", err, tc.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUpdateStatusPersistsOrKeepsOld(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s1")
	sb := New(testMetadata("s1"), dir)
	if err := sb.Save(); err != nil {
		t.Fatal(err)
	}
	if err := sb.UpdateStatus(func(st *Status) { st.State = StateNotReady; st.Reason = "pins closed" }); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := loaded.Status(); st.State != StateNotReady || st.Reason != "pins closed" {
		t.Errorf("persisted status = %+v", st)
	}
	// A write that fails leaves the in-memory status as it was.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := sb.UpdateStatus(func(st *Status) { st.State = StateReady }); err == nil {
		t.Fatal("UpdateStatus into a removed directory succeeded")
	}
	if sb.Status().State != StateNotReady {
		t.Errorf("status changed although persisting failed: %+v", sb.Status())
	}
}

func TestNames(t *testing.T) {
	n := NewNames()
	key := NameKey("web", "default", "u1", 0)
	if key != `"web" "default" "u1" 0` {
		t.Errorf("NameKey = %q", key)
	}
	if err := n.Reserve(key, "a"); err != nil {
		t.Fatal(err)
	}
	if err := n.Reserve(key, "a"); err != nil {
		t.Errorf("re-reserving for the same ID: %v", err)
	}
	if err := n.Reserve(key, "b"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("reserving a held name = %v, want AlreadyExists", err)
	}
	n.Release(key, "b") // not the holder: no effect
	if err := n.Reserve(key, "b"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a non-holder released the name: %v", err)
	}
	n.Release(key, "a")
	if err := n.Reserve(key, "b"); err != nil {
		t.Errorf("name not free after release: %v", err)
	}
}

// Names that differ only in where an underscore falls are different pods
// and containers.
func TestNameKeysAreUnambiguous(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
	}{
		{"pod name vs namespace", NameKey("x_y", "z", "u", 0), NameKey("x", "y_z", "u", 0)},
		{"namespace vs uid", NameKey("x", "y_z", "u", 0), NameKey("x", "y", "z_u", 0)},
		{"uid vs attempt", NameKey("x", "y", "u_1", 0), NameKey("x", "y", "u", 1)},
		{"quote in name", NameKey(`x" "y`, "z", "u", 0), NameKey("x", `y" "z`, "u", 0)},
		{"container name vs pod", ContainerNameKey("p_c", "n", 0), ContainerNameKey("p", "c_n", 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.a == tc.b {
				t.Errorf("keys collide: %q", tc.a)
			}
			n := NewNames()
			if err := n.Reserve(tc.a, "one"); err != nil {
				t.Fatal(err)
			}
			if err := n.Reserve(tc.b, "two"); err != nil {
				t.Errorf("second pod refused: %v", err)
			}
		})
	}
}

func TestNamesConcurrent(t *testing.T) {
	n := NewNames()
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n.Reserve("same", string(rune('a'+i%26))+strings.Repeat("x", i)) == nil {
				mu.Lock()
				won++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d reservations of one name succeeded, want 1", won)
	}
}

func TestStoreGet(t *testing.T) {
	s := NewStore[string]("sandbox")
	s.Add("abcdef", "one")
	s.Add("abcxyz", "two")
	tests := []struct {
		id   string
		want string
		err  error
	}{
		{"abcdef", "one", nil},
		{"abcx", "two", nil},
		{"abc", "", errdefs.ErrInvalidArgument},
		{"zzz", "", errdefs.ErrNotFound},
		{"", "", errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		got, err := s.Get(tc.id)
		if got != tc.want || (tc.err == nil) != (err == nil) || !errors.Is(err, tc.err) {
			t.Errorf("Get(%q) = %q, %v; want %q, %v", tc.id, got, err, tc.want, tc.err)
		}
	}
	if l := s.List(); len(l) != 2 || l[0] != "one" {
		t.Errorf("List = %v, want ordered by ID", l)
	}
	s.Delete("abcdef")
	s.Delete("abcdef")
	if _, err := s.Get("abcdef"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete = %v", err)
	}
}

func TestValidateID(t *testing.T) {
	for _, id := range []string{"", ".", "..", "../x", "a/b", "-x", strings.Repeat("a", 129), "a b"} {
		if err := ValidateID(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateID(%q) = %v, want InvalidArgument", id, err)
		}
	}
	for _, id := range []string{"a", "0123abcdef", "pod_1.x-y"} {
		if err := ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
}

func TestWritePodFiles(t *testing.T) {
	dir := t.TempDir()
	hostResolv := filepath.Join(dir, "host-resolv")
	writeFile(t, hostResolv, "nameserver 9.9.9.9\n")
	old := hostResolvConf
	hostResolvConf = hostResolv
	t.Cleanup(func() { hostResolvConf = old })

	f, err := WritePodFiles(dir, "web-0", "10.1.0.5", &DNS{Servers: []string{"10.0.0.10"}, Searches: []string{"ns.svc", "svc"}, Options: []string{"ndots:5"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	if got := read(f.Resolv); got != "nameserver 10.0.0.10\nsearch ns.svc svc\noptions ndots:5\n" {
		t.Errorf("resolv.conf = %q", got)
	}
	if got := read(f.Hostname); got != "web-0\n" {
		t.Errorf("hostname = %q", got)
	}
	if got := read(f.Hosts); !strings.HasPrefix(got, "127.0.0.1\tlocalhost\n") || !strings.HasSuffix(got, "10.1.0.5\tweb-0\n") {
		t.Errorf("hosts = %q", got)
	}
	f2, err := WritePodFiles(t.TempDir(), "h", "", nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(f2.Resolv); got != "nameserver 9.9.9.9\n" {
		t.Errorf("resolv.conf without DNS config = %q, want the host's", got)
	}
	if _, err := WritePodFiles(t.TempDir(), "h", "", &DNS{Servers: []string{"1.1.1.1\nnameserver 6.6.6.6"}}, false); err == nil {
		t.Error("a DNS server with a newline was accepted")
	}
}

// List stays ordered by ID through adds, replacements and deletes in any
// order, with each item once.
func TestStoreListOrder(t *testing.T) {
	s := NewStore[int]("container")
	ids := []string{"m", "c", "x", "a", "k", "z", "b"}
	for i, id := range ids {
		s.Add(id, i)
	}
	s.Add("c", 100) // a replacement is not a second entry
	s.Delete("x")
	s.Delete("x")
	s.Delete("nope")
	s.Add("d", 7)
	want := []int{3, 6, 100, 7, 4, 0, 5} // a b c d k m z
	if got := s.List(); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	for _, id := range []string{"a", "b", "c", "d", "k", "m", "z"} {
		s.Delete(id)
	}
	if got := s.List(); len(got) != 0 {
		t.Errorf("List after deleting everything = %v", got)
	}
}
