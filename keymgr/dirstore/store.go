// Package dirstore keeps a CA state in a local directory (meshca serve
// --state-dir): Store, a keymgr.StateStore with compare-and-swap under the
// directory's lock (LockDir), which keeps Istio's cacerts layout in step
// and migrates the single-root layout of LoadOrCreate in place; and
// PluggedDir, a plugged-in CA directory as a read-only keymgr.StateStore.
package dirstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshca/meshca/internal/atomicfile"
	"github.com/meshca/meshca/keymgr"
)

// FileState is the CA state document in a state directory; the keys sit
// beside it, one file per keymgr.KeyEntry.
const FileState = keymgr.EntryState

// File modes in a state directory.
const (
	dirMode    = 0o700
	keyMode    = 0o600
	publicMode = 0o644
)

// loadAttempts bounds how often Load starts over when the files it read
// do not fit together because a writer replaced state.json meanwhile: a
// reader among saves in quick succession (a slow machine, a burst of
// rotation steps) may lose several rounds in a row, and each round lost
// is a save made, so the bound only stops a reader starved forever.
const loadAttempts = 64

// Store is a keymgr.StateStore on a local state directory (meshca serve
// --state-dir). The directory holds the keymgr.EncodeState entries as files
// (FileState, 0644, and the keys, 0600), every one written atomically, and
// keeps Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem,
// root-cert.pem) in step with the active authority and the trust bundle,
// for keymgr.LoadCACerts, LoadOrCreate and older meshca versions.
//
// The keymgr.Version is the hex SHA-256 of FileState. A directory in the
// single-root layout of LoadOrCreate, without FileState, loads as a
// keymgr.State of one active authority at the zero keymgr.Version, so that the
// first Save migrates it in place (see loadSingleRoot); an empty or missing
// directory is keymgr.ErrNoState.
type Store struct {
	Dir string
	// LockTimeout bounds Save's wait for the directory's lock (LockDir)
	// while another writer holds it; DefaultLockTimeout when zero or
	// negative. The context passed to Save bounds it too.
	LockTimeout time.Duration
	// MigrationTTL is, for a directory in the single-root layout, the
	// longest lifetime of the leaves its CA may have issued (meshca serve's
	// --max-ttl): the layout keeps no record of them, so its Load records
	// leaves that long, issued until now, under every root it trusts
	// (recordMigration). DefaultMigrationTTL when zero or negative.
	MigrationTTL time.Duration
}

// Load returns the state in the directory. It takes no lock: every file
// is replaced atomically, keys are written before the FileState that
// names them, and a key file is only removed once FileState no longer
// names it. So when a file Load needs is gone or does not match while
// FileState is no longer the file Load read (a writer moved on; the same
// content written back is another file), Load starts over; when
// FileState is still that file, what Load found is the directory's, and
// it reports it.
func (d Store) Load(ctx context.Context) (*keymgr.State, keymgr.Version, error) {
	var err error
	for range loadAttempts {
		if cerr := ctx.Err(); cerr != nil {
			return nil, "", cerr
		}
		s, v, moved, lerr := d.loadOnce()
		if err = lerr; !moved {
			return s, v, err
		}
	}
	return nil, "", err
}

// loadOnce reads the state once. moved: what it read did not fit
// together, and FileState is another file now than the one it read. It
// keeps that file open until it has looked: an inode still open is not
// reused by the next one written.
func (d Store) loadOnce() (s *keymgr.State, v keymgr.Version, moved bool, err error) {
	doc, read, err := d.readState()
	if err != nil {
		return nil, "", false, err
	}
	if read != nil {
		defer read.Close()
	}
	if s, v, err = d.loadFrom(doc); err == nil || errors.Is(err, keymgr.ErrNoState) || read == nil {
		return s, v, false, err
	}
	was, serr := read.Stat()
	now, nerr := os.Stat(d.path(FileState))
	return nil, "", serr != nil || nerr != nil || !os.SameFile(was, now), err
}

// readState returns FileState's content, or nil when there is none, and
// the file it read, open, which the caller closes.
func (d Store) readState() ([]byte, *os.File, error) {
	f, err := os.Open(d.path(FileState))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	var data []byte
	if err == nil {
		if data, err = io.ReadAll(f); err != nil {
			f.Close()
		}
	}
	switch {
	case err != nil:
		return nil, nil, &keymgr.FileError{Path: d.path(FileState), Err: unwrapPath(err)}
	case data == nil:
		return []byte{}, f, nil
	}
	return data, f, nil
}

// unwrapPath is err without its *fs.PathError, whose path FileError
// names already.
func unwrapPath(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	return err
}

// loadFrom decodes the state whose document is doc (nil: none, so the
// single-root layout or nothing).
func (d Store) loadFrom(doc []byte) (*keymgr.State, keymgr.Version, error) {
	if doc == nil {
		s, err := d.loadSingleRoot()
		return s, "", err
	}
	names, err := keymgr.StateKeyEntries(doc)
	if err != nil {
		return nil, "", d.fileError(err)
	}
	entries := map[string][]byte{FileState: doc}
	for _, name := range names {
		data, err := os.ReadFile(d.path(name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // keymgr.DecodeState names the missing key
		case err != nil:
			return nil, "", &keymgr.FileError{Path: d.path(name), Err: errors.Unwrap(err)}
		}
		entries[name] = data
	}
	s, err := keymgr.DecodeState(entries)
	if err != nil {
		return nil, "", d.fileError(err)
	}
	return s, docVersion(doc), nil
}

// Save stores s if the directory still holds version base. Under the
// directory's lock, it writes, each file atomically and only when changed:
//  1. the key file of every authority that has a key (new files only:
//     a key file is named for its certificate, so its content never
//     changes);
//  2. FileState: the commit. A crash before it leaves the old state,
//     every key file of which is still there;
//  3. the cacerts layout, derived from the state: a crash leaves it
//     behind the state, never ahead of it, and the next Save (a Save of
//     the loaded state on its own version will do) brings it up to date;
//  4. then it removes the key files FileState no longer names (retired
//     authorities: their keys are destroyed) and what writes cut short
//     by a crash left.
//
// An error in steps 3 and 4 comes with the new Version: the state is
// saved, and the error says so.
func (d Store) Save(ctx context.Context, s *keymgr.State, base keymgr.Version) (v keymgr.Version, err error) {
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(d.Dir, dirMode); err != nil {
		return "", fmt.Errorf("keymgr: state directory: %w", err)
	}
	timeout := d.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	unlock, err := LockDir(lctx, d.Dir)
	if err != nil {
		return "", err
	}
	defer func() {
		if uerr := unlock(); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	commit, cleanup, err := d.plan(s, entries, base)
	if err != nil {
		return "", err
	}
	for _, step := range commit {
		if err := step.run(); err != nil {
			return "", fmt.Errorf("keymgr: save CA state: %s: %w", step.name, err)
		}
	}
	v = docVersion(entries[FileState])
	var errs []error
	for _, step := range cleanup {
		if err := step.run(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", step.name, err))
		}
	}
	if len(errs) > 0 {
		return v, fmt.Errorf("keymgr: the CA state was saved as version %s, but: %w", v, errors.Join(errs...))
	}
	return v, nil
}

// saveStep is one write of a Save; a crash may stop a Save after any of
// them.
type saveStep struct {
	name string
	run  func() error
}

// plan checks, under the lock, that the directory still holds version
// base, and returns the steps that store entries: the commit (the keys,
// then FileState) and what follows it.
func (d Store) plan(s *keymgr.State, entries map[string][]byte, base keymgr.Version) (commit, cleanup []saveStep, err error) {
	doc, f, err := d.readState()
	if err != nil {
		return nil, nil, err
	}
	if f != nil {
		f.Close()
	}
	current := keymgr.Version("")
	if doc != nil {
		current = docVersion(doc)
	}
	if current != base {
		return nil, nil, keymgr.ErrConflict
	}
	if doc == nil {
		if err := d.checkSingleRootKept(s); err != nil {
			return nil, nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		if name != FileState {
			commit = append(commit, d.writeStep(name, entries[name], keyMode))
		}
	}
	commit = append(commit, d.writeStep(FileState, entries[FileState], publicMode))
	if cleanup, err = d.cacertsSteps(s); err != nil {
		return nil, nil, err
	}
	cleanup = append(cleanup, saveStep{name: "removing destroyed keys and leftovers", run: func() error { return d.removeUnnamed(entries) }})
	return commit, cleanup, nil
}

// writeStep writes data to name atomically, unless name already holds it.
func (d Store) writeStep(name string, data []byte, mode os.FileMode) saveStep {
	return saveStep{name: "writing " + name, run: func() error {
		p := d.path(name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data) {
			return os.Chmod(p, mode)
		}
		if err := atomicfile.WriteFile(p, data, mode); err != nil {
			return errors.Unwrap(err)
		}
		return nil
	}}
}

// removeStep removes name, if it exists.
func (d Store) removeStep(name string) saveStep {
	return saveStep{name: "removing " + name, run: func() error {
		if err := os.Remove(d.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return syncDir(d.Dir)
	}}
}

// removeUnnamed removes every key file that is not one of entries and
// every temporary file a cut-short atomic write left.
func (d Store) removeUnnamed(entries map[string][]byte) error {
	files, err := os.ReadDir(d.Dir)
	if err != nil {
		return err
	}
	removed := false
	for _, f := range files {
		name := f.Name()
		_, keep := entries[name]
		temp := strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-")
		if keep || !temp && !keymgr.IsKeyEntry(name) {
			continue
		}
		if err := os.Remove(d.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		removed = true
	}
	if !removed {
		return nil
	}
	return syncDir(d.Dir)
}

func (d Store) path(name string) string { return filepath.Join(d.Dir, name) }

// fileError turns a keymgr.DecodeState *keymgr.EntryError into a
// *keymgr.FileError naming the file.
func (d Store) fileError(err error) error {
	var ee *keymgr.EntryError
	if errors.As(err, &ee) {
		return &keymgr.FileError{Path: d.path(ee.Entry), Err: ee.Err}
	}
	return err
}

// docVersion is the keymgr.Version of a state directory whose FileState is doc.
func docVersion(doc []byte) keymgr.Version {
	sum := sha256.Sum256(doc)
	return keymgr.Version(hex.EncodeToString(sum[:]))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Tidy completes what a Save cut short by a crash left undone after its
// commit: the cacerts layout brought up to the state, the keys of retired
// authorities destroyed, temporary files removed. It saves the stored
// state on its own version, which writes only what differs; with nothing
// stored it does nothing.
func (d Store) Tidy(ctx context.Context) error {
	s, v, err := d.Load(ctx)
	switch {
	case errors.Is(err, keymgr.ErrNoState):
		return nil
	case err != nil:
		return err
	case v == "":
		return nil // the single-root layout: migrating it is the server's job
	}
	if _, err := d.Save(ctx, s, v); err != nil && !errors.Is(err, keymgr.ErrConflict) {
		return err
	}
	return nil
}
