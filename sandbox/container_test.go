package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func testContainerMeta(id string) ContainerMetadata {
	return ContainerMetadata{
		ID: id, SandboxID: "pod1", Name: "c", Attempt: 2,
		Labels: map[string]string{"a": "b"}, Image: "busybox", ImageID: "sha256:aa", ImageRef: "busybox@sha256:bb",
		StopSignal: "SIGUSR1", LogPath: "/var/log/pods/p/c/2.log", Handler: "runc",
		Mounts: []ContainerMount{{ContainerPath: "/v", HostPath: "/h", Readonly: true,
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 65536, Size: 65536}}}},
		User:      ContainerUser{UID: 1002, GID: 1002, SupplementalGroups: []uint32{5}},
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func TestContainerSaveLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ctr1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c := NewContainer(testContainerMeta("ctr1"), dir)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	started := time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)
	if err := c.UpdateStatus(func(st *ContainerStatus) {
		st.State, st.Pid, st.StartedAt = ContainerRunning, 42, started
	}); err != nil {
		t.Fatal(err)
	}
	got, err := LoadContainer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.ContainerMetadata, c.ContainerMetadata) {
		t.Errorf("metadata = %+v, want %+v", got.ContainerMetadata, c.ContainerMetadata)
	}
	want := ContainerStatus{State: ContainerRunning, Pid: 42, StartedAt: started}
	if st := got.Status(); !st.StartedAt.Equal(want.StartedAt) || st.State != want.State || st.Pid != want.Pid {
		t.Errorf("status = %+v, want %+v", st, want)
	}
}

func TestLoadContainerErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(dir string) error
		want  error
	}{
		{"no metadata", func(string) error { return nil }, errdefs.ErrNotFound},
		{"wrong version", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"version":9,"metadata":{"id":"ctr1","sandboxId":"p"}}`), 0o600)
		}, errdefs.ErrFailedPrecondition},
		{"ID not the dir", func(dir string) error {
			return NewContainer(testContainerMeta("other"), dir).Save()
		}, errdefs.ErrFailedPrecondition},
		{"bad sandbox ID", func(dir string) error {
			md := testContainerMeta("ctr1")
			md.SandboxID = "../x"
			return NewContainer(md, dir).Save()
		}, errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ctr1")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadContainer(dir); !errors.Is(err, tc.want) {
				t.Fatalf("LoadContainer = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestLegacyContainerLayout loads the version 1 layout (meta.json and
// status.json), and refuses metadata without its status instead of
// reading it as some state: the daemon died between the two renames.
func TestLegacyContainerLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ctr1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, legacyMetaFile), `{"version":1,"metadata":{"id":"ctr1","sandboxId":"p1","name":"c"}}`)
	if _, err := LoadContainer(dir); !errors.Is(err, errdefs.ErrDataLoss) {
		t.Fatalf("LoadContainer without status.json = %v, want ErrDataLoss", err)
	}
	writeFile(t, filepath.Join(dir, legacyStatusFile), `{"version":1,"status":{"state":"running","pid":42}}`)
	writeFile(t, filepath.Join(dir, ".state.json.tmp123"), `{"vers`)
	c, err := LoadContainer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.State != ContainerRunning || st.Pid != 42 {
		t.Errorf("status = %+v, want running pid 42", st)
	}
	// A load only reads: the temp may be a write in flight.
	if _, err := os.Stat(filepath.Join(dir, ".state.json.tmp123")); err != nil {
		t.Errorf("the load removed a temp file: %v", err)
	}
	// The next write moves it to the one-file layout.
	if err := c.UpdateStatus(func(st *ContainerStatus) { st.Pid = 43 }); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{legacyMetaFile, legacyStatusFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s still there after a write: %v", f, err)
		}
	}
	if c2, err := LoadContainer(dir); err != nil || c2.Status().Pid != 43 || c2.Name != "c" {
		t.Errorf("reload = %+v, %v", c2, err)
	}
}

func TestContainerDetachStopsWrites(t *testing.T) {
	dir := t.TempDir()
	c := NewContainer(testContainerMeta("ctr1"), dir)
	if err := c.UpdateStatus(func(st *ContainerStatus) { st.State = ContainerRunning }); err != nil {
		t.Fatal(err)
	}
	c.Detach()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateStatus(func(st *ContainerStatus) { st.State = ContainerExited }); err != nil {
		t.Fatalf("a detached record's update failed: %v", err)
	}
	if c.Status().State != ContainerExited {
		t.Errorf("state %s, want exited in memory", c.Status().State)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a detached record wrote into its removed directory: %v", err)
	}
}

func TestContainerUpdateStatusFailedWriteKeepsOld(t *testing.T) {
	c := NewContainer(testContainerMeta("ctr1"), filepath.Join(t.TempDir(), "missing"))
	err := c.UpdateStatus(func(st *ContainerStatus) { st.State = ContainerRunning })
	if err == nil || c.Status().State != ContainerCreated {
		t.Fatalf("UpdateStatus into a missing dir = %v, state %s; want an error and created", err, c.Status().State)
	}
}

func TestContainerNameKey(t *testing.T) {
	if a, b := ContainerNameKey("p", "c", 0), ContainerNameKey("p", "c", 1); a == b {
		t.Errorf("attempts share a key: %q", a)
	}
	if a, b := ContainerNameKey("p1", "c", 0), ContainerNameKey("p2", "c", 0); a == b {
		t.Errorf("pods share a key: %q", a)
	}
}
