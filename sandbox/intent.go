package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

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
// entry are on disk, and for a creation the entry of dir itself.
//
// The record is written atomically (temp file, fsync, rename, fsync of the
// directory), never truncated in place: a daemon killed between the open
// and the write of an in-place record left it empty, and the next start
// tore a removed pod down from defaults, its pause process and its netns
// unknown. An earlier record stays whole until the new one replaces it.
func MarkIntent(dir string, intent Intent, md any) error {
	b, err := json.Marshal(md)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, string(intent)), b, 0o600); err != nil {
		return fmt.Errorf("recording %s intent: %w", intent, err)
	}
	if intent == IntentCreating {
		// dir is new: its own entry must outlast a power cut too, or
		// the record goes with it while the IPs and ID ranges the
		// creation takes stay recorded elsewhere.
		if err := atomicfile.SyncDir(filepath.Dir(dir)); err != nil {
			return fmt.Errorf("recording %s intent: %w", intent, err)
		}
	}
	return nil
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
// unreadable record still reports its intent, with the error: the object
// is then torn down from what else its directory holds.
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

// RemoveDir removes an object's directory so that a daemon killed at any
// instant leaves a directory the next start either restores whole or
// tears down, never one it restores as a ghost: the records restore loads
// (state.json, config.json, the version 1 files) go first, the intent
// records last, then the directory. os.RemoveAll alone deletes in
// directory order, and a kill after it took the removal's intent record
// but before state.json brought the removed object back. (A journaling
// filesystem commits the unlinks of one directory in order, so a power
// cut keeps the order too.) A directory already gone is not an error.
func RemoveDir(dir string) error {
	intents := []string{string(IntentRemoving), string(IntentCreating)}
	for _, name := range []string{stateFile, legacyStatusFile, legacyMetaFile, specFile} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !slices.Contains(intents, e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for _, name := range intents {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.RemoveAll(dir)
}
