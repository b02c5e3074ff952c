package dirstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// FileLock is the lock file LockDir creates (0600) inside a state
// directory. It is left in place on unlock: removing it would let a waiter
// that already opened the old file and a newcomer that creates a new one
// hold "the" lock at the same time.
const FileLock = ".lock"

// DefaultLockTimeout is how long LoadOrCreate waits for another process
// holding the state directory's lock when StateOptions.LockTimeout is zero.
const DefaultLockTimeout = 30 * time.Second

// Poll intervals while waiting for a lock someone else holds: short at
// first, since holders keep it for milliseconds, then capped.
const (
	lockPollMin = 5 * time.Millisecond
	lockPollMax = 100 * time.Millisecond
)

// ErrLockUnsupported is returned by LockDir on platforms without flock(2).
var ErrLockUnsupported = errors.New("keymgr: state directory locking is not supported on this platform")

// LockedError reports that the context ended while LockDir waited for a
// lock another holder kept. Err is the context's error.
type LockedError struct {
	Dir string
	Err error
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("keymgr: state directory %s is locked by another meshca process: %v", e.Dir, e.Err)
}

func (e *LockedError) Unwrap() error { return e.Err }

// LockDir takes an advisory exclusive lock (flock(2)) on the file FileLock
// in the existing directory dir, creating the file 0600 if needed. It waits
// while another holder keeps the lock, until ctx ends; then it returns a
// *LockedError wrapping ctx.Err(). It returns the same error without trying
// when ctx has already ended.
//
// The lock is held by the open file, not by the process or goroutine: two
// LockDir calls exclude each other even within one process, so a holder
// must not call LockDir on dir again before unlocking. unlock releases the
// lock; calling it more than once is harmless. Readers need not lock:
// every file in a state directory is replaced atomically.
func LockDir(ctx context.Context, dir string) (unlock func() error, err error) {
	if err := ctx.Err(); err != nil {
		return nil, &LockedError{Dir: dir, Err: err}
	}
	path := filepath.Join(dir, FileLock)
	f, err := openLockFile(path)
	if errors.Is(err, ErrLockUnsupported) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("keymgr: lock state directory: %w", err)
	}
	if err := waitLock(ctx, f, dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	var once sync.Once
	var uerr error
	return func() error {
		once.Do(func() {
			uerr = errors.Join(unlockFile(f), f.Close())
			if uerr != nil {
				uerr = fmt.Errorf("keymgr: unlock %s: %w", path, uerr)
			}
		})
		return uerr
	}, nil
}

// waitLock polls a non-blocking lock on f until it is taken, it fails, or
// ctx ends. Polling, rather than a blocking flock in a goroutine, leaves
// nothing behind that could take the lock after the caller gave up.
func waitLock(ctx context.Context, f *os.File, dir string) error {
	wait := lockPollMin
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		taken, err := tryLockFile(f)
		switch {
		case err != nil:
			return fmt.Errorf("keymgr: lock %s: %w", f.Name(), err)
		case taken:
			return nil
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return &LockedError{Dir: dir, Err: ctx.Err()}
		case <-t.C:
		}
		wait = min(2*wait, lockPollMax)
	}
}
