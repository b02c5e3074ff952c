// Package atomicfile writes files so that readers see either the old content
// or the new content, never a partial write.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile writes data to a temporary file in the directory of path with
// mode perm, syncs it, renames it over path and syncs the directory. The
// file never exists with a looser mode than perm, even briefly.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	// CreateTemp uses 0600; tighten or widen to perm before any data lands.
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("atomicfile: sync %s: %w", dir, err)
	}
	return nil
}
