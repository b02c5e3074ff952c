//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package dirstore

import "os"

// Without flock(2) LockDir refuses rather than pretend: an unlocked state
// directory is the race the lock exists to close.

func openLockFile(path string) (*os.File, error) { return nil, ErrLockUnsupported }

func tryLockFile(*os.File) (bool, error) { return false, ErrLockUnsupported }

func unlockFile(*os.File) error { return ErrLockUnsupported }
