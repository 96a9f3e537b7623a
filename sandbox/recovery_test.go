package sandbox

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// TestMarkIntentReplacesWhole: a record marked again is replaced, never
// truncated in place. Written in place, a daemon killed between the open
// (O_TRUNC) and the write left an empty removal record, and the restart
// tore the pod down from defaults: its pause process never removed, its
// DEL run without the netns. A reader holding the old record still reads
// it whole, and no temp file is left.
func TestMarkIntentReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	first := Metadata{ID: "p1", InfraID: "p1", Handler: "runc"}
	if err := MarkIntent(dir, IntentRemoving, first); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(filepath.Join(dir, string(IntentRemoving)))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := MarkIntent(dir, IntentRemoving, Metadata{ID: "p1", Name: "again"}); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(old)
	if err != nil {
		t.Fatal(err)
	}
	var seen Metadata
	if err := json.Unmarshal(b, &seen); err != nil || seen.InfraID != "p1" || seen.Handler != "runc" {
		t.Errorf("the earlier record read %q (%v) once marked again: rewritten in place", b, err)
	}
	var md Metadata
	if in, err := ReadIntent(dir, &md); in != IntentRemoving || err != nil || md.Name != "again" || md.InfraID != "" {
		t.Errorf("ReadIntent = %q, %+v, %v; want the new record whole", in, md, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the record", len(entries))
	}
}

// TestMetadataFromSpec: a sandbox whose state.json cannot be read is torn
// down from its config.json: pins, modes, cgroup parent, ID range and IPs
// come back; a spec naming another sandbox, or none, gives nothing.
func TestMetadataFromSpec(t *testing.T) {
	const id = "abc123"
	t.Run("as Save wrote it", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), id)
		want := testMetadata(id)
		want.CgroupParent = "/kubepods/besteffort/podu1"
		if err := New(want, dir).Save(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, stateFile), []byte("{garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := MetadataFromSpec(dir)
		if err != nil {
			t.Fatal(err)
		}
		wantModes := NamespaceModes{Network: ModePod, IPC: ModePod, User: ModePod}
		if got.ID != id || got.Name != "web" || got.Namespace != "default" || got.UID != "u1" || got.Modes != wantModes ||
			got.CgroupParent != want.CgroupParent || !slices.Equal(got.UIDMappings, want.UIDMappings) ||
			!slices.Equal(got.GIDMappings, want.GIDMappings) || !slices.Equal(got.IPs, want.IPs) || len(got.Pins) != 4 {
			t.Errorf("MetadataFromSpec = %+v, want %+v", got, want)
		}
	})
	// As an older pinrt wrote a host-network pod's: no pins but IPC's.
	hostNet := `{"ociVersion":"1.0.2","hostname":"h","annotations":{"io.kubernetes.cri.sandbox-id":"abc123",
		"io.kubernetes.cri.sandbox-name":"web","io.kubernetes.cri.sandbox-namespace":"ns","io.kubernetes.cri.sandbox-uid":"u"},
		"linux":{"namespaces":[{"type":"ipc","path":"/run/pinrt/ns/ipc/abc123"}]}}`
	tests := []struct {
		name, spec string
		modes      NamespaceModes
		err        error
	}{
		{"host network", hostNet, NamespaceModes{Network: ModeNode, IPC: ModePod, User: ModeNode}, nil},
		{"another sandbox's", strings.ReplaceAll(hostNet, `"abc123"`, `"def456"`), NamespaceModes{}, errdefs.ErrFailedPrecondition},
		{"torn mappings", strings.Replace(hostNet, `"io.kubernetes.cri.sandbox-uid":"u"`, `"io.kubernetes.cri.sandbox-uid":"u","io.pinrt.sandbox.uid-mappings":"[{"`, 1),
			NamespaceModes{}, errdefs.ErrDataLoss},
		{"none", "", NamespaceModes{}, errdefs.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), id)
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.spec != "" {
				if err := os.WriteFile(filepath.Join(dir, specFile), []byte(tc.spec), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := MetadataFromSpec(dir)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("MetadataFromSpec = %+v, %v; want %v", got, err, tc.err)
				}
				return
			}
			if err != nil || got.ID != id || got.Modes != tc.modes || got.Hostname != "h" {
				t.Fatalf("MetadataFromSpec = %+v, %v; want modes %+v", got, err, tc.modes)
			}
		})
	}
}

// TestRemoveDir removes everything, nested or not, and a directory that is
// gone already; the order of its deletions is TestRemoveDirOrder's.
func TestRemoveDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "abc123")
	for _, f := range []string{"state.json", "config.json", "removing", "creating", "infra/config.json", "rootfs/etc/x"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory still there: %v", err)
	}
	if err := RemoveDir(dir); err != nil {
		t.Fatalf("RemoveDir of a removed directory = %v", err)
	}
}
