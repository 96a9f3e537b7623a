package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

func TestIntentRecord(t *testing.T) {
	dir := t.TempDir()
	var md Metadata
	if in, err := ReadIntent(dir, &md); in != "" || err != nil {
		t.Fatalf("ReadIntent of a clean dir = %q, %v", in, err)
	}
	if err := MarkIntent(dir, IntentCreating, Metadata{ID: "p1", Name: "n", Modes: NamespaceModes{Network: ModePod}}); err != nil {
		t.Fatal(err)
	}
	if in, err := ReadIntent(dir, &md); in != IntentCreating || err != nil || md.ID != "p1" || md.Modes.Network != ModePod {
		t.Fatalf("ReadIntent = %q, %+v, %v; want creating p1", in, md, err)
	}
	// A removal outranks a creation left behind.
	if err := MarkIntent(dir, IntentRemoving, Metadata{ID: "p1"}); err != nil {
		t.Fatal(err)
	}
	if in, _ := ReadIntent(dir, &md); in != IntentRemoving {
		t.Errorf("ReadIntent with both = %q, want removing", in)
	}
	// Marked again (a removal retried), the record is replaced whole: a
	// shorter one must not keep the longer's tail.
	if err := MarkIntent(dir, IntentRemoving, Metadata{ID: "p1", Name: "a-much-longer-name-than-the-first"}); err != nil {
		t.Fatal(err)
	}
	if err := MarkIntent(dir, IntentRemoving, Metadata{ID: "p2"}); err != nil {
		t.Fatal(err)
	}
	md = Metadata{}
	if in, err := ReadIntent(dir, &md); in != IntentRemoving || err != nil || md.ID != "p2" || md.Name != "" {
		t.Errorf("ReadIntent after marking twice = %q, %+v, %v; want removing p2", in, md, err)
	}
	for _, in := range []Intent{IntentCreating, IntentRemoving} {
		if err := ClearIntent(dir, in); err != nil {
			t.Fatal(err)
		}
		if err := ClearIntent(dir, in); err != nil {
			t.Errorf("second ClearIntent(%s) = %v, want nil", in, err)
		}
	}
	if in, err := ReadIntent(dir, &md); in != "" || err != nil {
		t.Errorf("ReadIntent after clearing = %q, %v", in, err)
	}
	// A torn record still says what was intended.
	if err := os.WriteFile(filepath.Join(dir, string(IntentCreating)), []byte(`{"id":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if in, err := ReadIntent(dir, &md); in != IntentCreating || err == nil {
		t.Errorf("ReadIntent of a torn record = %q, %v; want creating and an error", in, err)
	}
}
