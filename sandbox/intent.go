package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// Intent is an operation an object's directory records before it makes
// side effects, so a daemon killed at any instant leaves a record that the
// next start acts on:
//
//	creating: RunPodSandbox or CreateContainer is making pins, mounts, CNI
//	          state or a runtime container; the record holds the metadata
//	          known so far (the ID and what every path derives from). A
//	          start finds it only if the operation never finished, and
//	          tears down whatever of it exists.
//	removing: RemovePodSandbox or RemoveContainer has begun deleting; a
//	          start finishes the removal.
//
// An object has at most one intent. The record is removed (durably) as
// the last step of a creation; a removal ends with the directory itself.
type Intent string

// The intents.
const (
	IntentCreating Intent = "creating"
	IntentRemoving Intent = "removing"
)

// MarkIntent durably records intent in dir with md, the object's metadata
// as far as it is known. It returns only once the record and its directory
// entry are on disk.
//
// The record is written in place, not through a temp file and a rename:
// a torn record still reports its intent (ReadIntent), and a new file
// made durable costs one journal commit where a rename costs a second
// (2 of the 4 ms a RemoveContainer took on ext4).
func MarkIntent(dir string, intent Intent, md any) error {
	b, err := json.Marshal(md)
	if err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(dir, string(intent)), b); err != nil {
		return fmt.Errorf("recording %s intent: %w", intent, err)
	}
	return atomicfile.SyncDir(dir)
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// ClearIntent removes the intent record durably: once it returns, a crash
// no longer undoes the operation.
func ClearIntent(dir string, intent Intent) error {
	if err := os.Remove(filepath.Join(dir, string(intent))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(dir)
}

// ReadIntent returns the unfinished intent recorded in dir, if any, and
// decodes its metadata into md. A removal outranks a creation. An
// unreadable record still reports its intent: the object is torn down
// from what the directory name gives.
func ReadIntent(dir string, md any) (Intent, error) {
	for _, in := range []Intent{IntentRemoving, IntentCreating} {
		b, err := os.ReadFile(filepath.Join(dir, string(in)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return in, err
		}
		if err := json.Unmarshal(b, md); err != nil {
			return in, fmt.Errorf("%s record in %s: %w", in, dir, err)
		}
		return in, nil
	}
	return "", nil
}
