package dirstore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshca/meshca/internal/atomicfile"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// StateOptions configure LoadOrCreate.
type StateOptions struct {
	// KeyType of a root generated on first start.
	KeyType certs.KeyType
	// Organization of a generated root's subject (the trust domain).
	Organization string
	// RootTTL of a generated root; keymgr.DefaultRootTTL when zero.
	RootTTL time.Duration
	Now     time.Time
	// LockTimeout bounds the wait for the state directory's lock while
	// another process holds it; DefaultLockTimeout when zero or negative.
	LockTimeout time.Duration
}

// LoadOrCreate is the single-root state directory of meshca before root
// rotation: meshca serve now runs on a Store, which migrates such a
// directory in place, and LoadOrCreate remains to write and read that
// layout (the migration's tests make their directories with it).
//
// It loads the self-signed CA kept in the state directory dir, in
// the cacerts layout, or on first start generates a root and stores it
// there (the key 0600, every file written atomically, the directory 0700).
// A directory holding only some of the files is refused rather than
// overwritten: it may be the remains of a CA that workloads still trust.
// created reports whether a new root was generated.
//
// The whole decision runs under the directory's lock (LockDir), so that
// processes starting together on an empty directory agree on one root.
// LoadOrCreate waits o.LockTimeout for a holder to let go, then returns a
// *LockedError.
func LoadOrCreate(dir string, o StateOptions) (a *keymgr.Authority, created bool, err error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("keymgr: state directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.LockTimeout)
	defer cancel()
	unlock, err := LockDir(ctx, dir)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if uerr := unlock(); uerr != nil && err == nil {
			a, created, err = nil, false, uerr
		}
	}()
	return loadOrCreate(dir, o)
}

// loadOrCreate is LoadOrCreate for a caller holding the directory's lock.
func loadOrCreate(dir string, o StateOptions) (a *keymgr.Authority, created bool, err error) {
	files := []string{keymgr.FileCAKey, keymgr.FileCACert, keymgr.FileRootCert}
	var present []string
	for _, f := range files {
		if exists(filepath.Join(dir, f)) {
			present = append(present, f)
		}
	}
	switch len(present) {
	case len(files):
		a, err := keymgr.LoadCACerts(dir, o.Now)
		return a, false, err
	case 0:
	default:
		return nil, false, &keymgr.FileError{Path: dir, Err: fmt.Errorf("holds only %v of %v: restore the missing files, or move the directory away to start a new root", present, files)}
	}
	a, err = keymgr.NewRoot(keymgr.RootOptions{KeyType: o.KeyType, Organization: o.Organization, TTL: o.RootTTL, Now: o.Now})
	if err != nil {
		return nil, false, err
	}
	if err := WriteCACerts(dir, a); err != nil {
		return nil, false, err
	}
	return a, true, nil
}

// WriteCACerts writes a to dir in the cacerts layout. The key file is written
// last so that a crash leaves a directory LoadOrCreate refuses, never a key
// without its certificate chain. The caller must hold the directory's lock
// (LockDir) across the read that decided to store and the store itself.
func WriteCACerts(dir string, a *keymgr.Authority) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("keymgr: state directory: %w", err)
	}
	keyPEM, err := pemutil.EncodePrivateKey(a.Key)
	if err != nil {
		return fmt.Errorf("keymgr: encode key: %w", err)
	}
	chain := append([]*x509.Certificate{a.Cert}, a.Chain...)
	writes := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{keymgr.FileRootCert, pemutil.EncodeCertificates(a.Roots...), 0o644},
		{keymgr.FileCertChain, pemutil.EncodeCertificates(chain...), 0o644},
		{keymgr.FileCACert, pemutil.EncodeCertificates(a.Cert), 0o644},
		{keymgr.FileCAKey, keyPEM, 0o600},
	}
	for _, w := range writes {
		if err := atomicfile.WriteFile(filepath.Join(dir, w.name), w.data, w.perm); err != nil {
			return fmt.Errorf("keymgr: store %s: %w", w.name, errors.Unwrap(err))
		}
	}
	return nil
}
