package dirstore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// MigratedReason is the history reason of the authorities a Store
// makes of a directory in the single-root layout.
const MigratedReason = "migrated from the single-root layout"

// singleRootFiles are the files of the single-root layout LoadOrCreate
// writes; cert-chain.pem is optional.
var singleRootFiles = []string{keymgr.FileCAKey, keymgr.FileCACert, keymgr.FileRootCert}

// loadSingleRoot returns the keymgr.State of a directory without FileState: the
// single-root layout (ca-key.pem, ca-cert.pem, root-cert.pem and maybe
// cert-chain.pem) becomes one active authority, Generated when its
// signing certificate is a root (LoadOrCreate generated it), with Sequence
// 1 and one transition at the signing certificate's NotBefore. Every
// other root of root-cert.pem stays in the bundle as a previous,
// External authority (meshca does not hold its key). No file at all is
// keymgr.ErrNoState; some of them only, an error. The layout is checked as
// keymgr.LoadCACerts does, but at the signing certificate's NotBefore rather
// than now: a store loads an expired CA too, and leaves the judgement to
// its caller. Nothing of the single-root layout says which leaves were
// issued: d.MigrationTTL says how long they may live.
func (d Store) loadSingleRoot() (*keymgr.State, error) {
	present, err := d.singleRootPresent()
	if err != nil || !present {
		return nil, err
	}
	certs, err := readCerts(d.path(keymgr.FileCACert))
	if err != nil {
		return nil, err
	}
	a, err := keymgr.LoadCACerts(d.Dir, certs[0].NotBefore) // the cacerts layout: ca-cert.pem is there
	if err != nil {
		return nil, err
	}
	s, err := stateOfAuthority(a, a.Cert.NotBefore.UTC(), MigratedReason, true)
	if err != nil {
		return nil, &keymgr.FileError{Path: d.path(keymgr.FileRootCert), Err: err}
	}
	ttl := d.MigrationTTL
	if ttl <= 0 {
		ttl = DefaultMigrationTTL
	}
	recordMigration(s, ttl, time.Now())
	s.Sequence = 1
	return s, nil
}

// DefaultMigrationTTL is a Store's MigrationTTL when none is set:
// meshca's default --max-ttl, the longest a workload certificate of
// Istio's may live.
const DefaultMigrationTTL = 90 * 24 * time.Hour

// recordMigration records in s, a state made of the single-root layout,
// that leaves of up to ttl may have been issued until now under each
// authority it trusts (nothing says otherwise, and none outlives its
// issuer), so that no guard passes early.
func recordMigration(s *keymgr.State, ttl time.Duration, now time.Time) {
	for _, a := range s.Authorities {
		s.RecordPrior(a.ID(), ttl, now)
	}
}

// Unmigrated reports whether store is a directory in the single-root
// layout that was never saved as a state.
func Unmigrated(ctx context.Context, store keymgr.StateStore) (bool, error) {
	s, v, err := store.Load(ctx)
	switch {
	case errors.Is(err, keymgr.ErrNoState):
		return false, nil
	case err != nil:
		return false, err
	}
	return v == "" && s.Active() != nil, nil
}

// MigrateSingleRoot saves a directory found in the single-root layout as
// a state, with the record of its leaves its Load made (see
// Store.MigrationTTL). It reports whether it migrated; a store already
// holding a state is left alone.
func MigrateSingleRoot(ctx context.Context, store keymgr.StateStore) (bool, error) {
	if ok, err := Unmigrated(ctx, store); err != nil || !ok {
		return false, err
	}
	_, err := keymgr.Update(ctx, store, func(*keymgr.State) error { return nil })
	return err == nil, err
}

// stateOfAuthority is the keymgr.State of a CA directory holding a: a's signing
// path as the active authority (Generated when its root signs and
// generated says so), and every other root of a.Roots as a previous,
// External one (meshca does not hold its key), in a.Roots' order, each
// with one transition at at for reason. The Sequence is left to the
// caller.
func stateOfAuthority(a *keymgr.Authority, at time.Time, reason string, generated bool) (*keymgr.State, error) {
	root := authorityRoot(a)
	if root == nil {
		return nil, errors.New("holds no root that signs the chain of the signing certificate")
	}
	history := func(p keymgr.Phase) []keymgr.Transition { return []keymgr.Transition{{To: p, At: at, Reason: reason}} }
	s := &keymgr.State{}
	for _, r := range a.Roots { // in the directory's order, which the bundle keeps
		switch {
		case containsRoot(s, r):
		case r.Equal(root):
			s.Authorities = append(s.Authorities, &keymgr.AuthorityRecord{
				Phase: keymgr.PhaseActive, Root: root, Cert: a.Cert, Chain: a.Chain, Key: a.Key,
				Generated: generated && a.Cert.Equal(root), History: history(keymgr.PhaseActive),
			})
		default:
			s.Authorities = append(s.Authorities, &keymgr.AuthorityRecord{
				Phase: keymgr.PhasePrevious, Root: r, Cert: r, External: true, History: history(keymgr.PhasePrevious),
			})
		}
	}
	return s, nil
}

// singleRootPresent reports whether the directory holds the single-root
// layout, and refuses one holding only some of its files: it may be the
// remains of a CA that workloads still trust.
func (d Store) singleRootPresent() (bool, error) {
	var present []string
	for _, f := range singleRootFiles {
		if exists(d.path(f)) {
			present = append(present, f)
		}
	}
	switch len(present) {
	case 0:
		return false, keymgr.ErrNoState
	case len(singleRootFiles):
		return true, nil
	}
	return false, &keymgr.FileError{Path: d.Dir, Err: fmt.Errorf("has no %s and holds only %v of %v: restore the missing files, or move the directory away", FileState, present, singleRootFiles)}
}

// checkSingleRootKept is Save's check on a directory without FileState:
// when it holds the single-root layout, s must keep that layout's
// authority, or the saver never saw it (it loaded an empty directory that
// LoadOrCreate filled since), and Save must not overwrite a CA that
// workloads may trust.
func (d Store) checkSingleRootKept(s *keymgr.State) error {
	if _, err := d.singleRootPresent(); errors.Is(err, keymgr.ErrNoState) {
		return nil
	} else if err != nil {
		return err
	}
	certs, err := readCerts(d.path(keymgr.FileCACert))
	if err != nil {
		return err
	}
	for _, r := range s.Authorities {
		if r.Cert.Equal(certs[0]) {
			return nil
		}
	}
	return keymgr.ErrConflict
}

// cacertsSteps are the writes that keep the cacerts layout in step with s:
// root-cert.pem holds the trust bundle (keymgr.State.Bundle); ca-cert.pem,
// cert-chain.pem and ca-key.pem are the active authority's (as Store writes
// them), and are removed when there is no active authority, as ca-key.pem is
// when the active authority has no key here (an external one). The roots come
// first and the key last, so that a crash between the steps leaves a layout
// that keymgr.LoadCACerts loads as the old or the new active authority, or
// refuses (a key that does not match ca-cert.pem), never one that signs with
// the wrong key.
func (d Store) cacertsSteps(s *keymgr.State) ([]saveStep, error) {
	var steps []saveStep
	if roots := s.Bundle(); len(roots) > 0 {
		steps = append(steps, d.writeStep(keymgr.FileRootCert, pemutil.EncodeCertificates(roots...), publicMode))
	} else {
		steps = append(steps, d.removeStep(keymgr.FileRootCert))
	}
	active := s.Active()
	if active == nil {
		return append(steps, d.removeStep(keymgr.FileCertChain), d.removeStep(keymgr.FileCACert), d.removeStep(keymgr.FileCAKey)), nil
	}
	chain := append([]*x509.Certificate{active.Cert}, active.Chain...)
	steps = append(steps,
		d.writeStep(keymgr.FileCertChain, pemutil.EncodeCertificates(chain...), publicMode),
		d.writeStep(keymgr.FileCACert, pemutil.EncodeCertificates(active.Cert), publicMode))
	if active.Key == nil {
		return append(steps, d.removeStep(keymgr.FileCAKey)), nil
	}
	key, err := pemutil.EncodePrivateKey(active.Key)
	if err != nil {
		return nil, fmt.Errorf("keymgr: encode key: %w", err)
	}
	return append(steps, d.writeStep(keymgr.FileCAKey, key, keyMode)), nil
}

// authorityRoot is the root among a.Roots that a's signing path ends in.
func authorityRoot(a *keymgr.Authority) *x509.Certificate {
	top := a.Cert
	if len(a.Chain) > 0 {
		top = a.Chain[len(a.Chain)-1]
	}
	for _, r := range a.Roots {
		if r.Equal(top) {
			return r
		}
	}
	for _, r := range a.Roots {
		if top.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	return nil
}

func containsRoot(s *keymgr.State, c *x509.Certificate) bool {
	for _, r := range s.Authorities {
		if r.Root.Equal(c) {
			return true
		}
	}
	return false
}
