// Package atomicfile replaces files so that readers and crashes see either
// the old or the new content, never a mix: every state file pinrt writes
// goes through it.
package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
)

// WriteFile replaces path with data durably: temp file, fsync, rename,
// fsync of the directory.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	return WriteFiles(filepath.Dir(path), map[string][]byte{filepath.Base(path): data}, mode, true)
}

// WriteFiles replaces several files of one directory, each atomically.
// The set is not atomic: a crash can leave some files new and others old
// or missing, so state that must change together belongs in one file.
// With durable, each temp file is synced before its rename and the
// directory once after all of them: one directory sync for the set instead
// of one per file. Without it the files are atomic but may be lost in a
// crash, which suits files under /run.
func WriteFiles(dir string, files map[string][]byte, mode os.FileMode, durable bool) error {
	for name, data := range files {
		if err := writeTemp(dir, name, data, mode, durable); err != nil {
			return err
		}
	}
	if !durable {
		return nil
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of dir (creations, renames) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// IsTemp reports whether name is the temp file of a write: one in
// progress, or one a crash interrupted before its rename.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp")
}

// RemoveTemps deletes the temp files in dir of writes a crash interrupted
// before their rename: they were never part of the state. Call it only
// when no write into dir can be in progress.
func RemoveTemps(dir string) {
	temps, _ := filepath.Glob(filepath.Join(dir, ".*.tmp*"))
	for _, t := range temps {
		_ = os.Remove(t)
	}
}

func writeTemp(dir, name string, data []byte, mode os.FileMode, durable bool) (retErr error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp*") // see IsTemp
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, name))
}
