// Package secretvolume writes a directory as the kubelet writes a Secret
// or ConfigMap volume: every file a symlink to ..data/<name>, ..data a
// symlink to a hidden directory holding the current version, replaced by
// one rename. A reader sees all the files of one version or all of the
// next, never a mix. Tests use it to renew what meshca follows as a
// cluster renews it.
package secretvolume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// dataDir is the symlink to the current version.
const dataDir = "..data"

// Write makes files (names without a slash) the next version of the
// volume in dir, created if need be, and removes the previous one.
func Write(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	version, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(version, name), data, 0o644); err != nil {
			return err
		}
	}
	old, err := os.Readlink(filepath.Join(dir, dataDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tmp := filepath.Join(dir, dataDir+"_tmp")
	if err := os.Symlink(filepath.Base(version), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataDir)); err != nil {
		return fmt.Errorf("secretvolume: swap %s: %w", dataDir, err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join(dataDir, name), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return removeOld(dir, old, files)
	}
	return nil
}

// removeOld removes the previous version and the links to files the new
// one no longer has.
func removeOld(dir, old string, files map[string][]byte) error {
	entries, err := os.ReadDir(filepath.Join(dir, old))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, kept := files[e.Name()]; !kept {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return os.RemoveAll(filepath.Join(dir, old))
}
