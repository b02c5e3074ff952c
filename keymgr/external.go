package keymgr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshca/meshca/keymgr/certs"
)

// ExternalTrust serves the trust bundle of a CA state whose keys live in
// an external backend (Vault, cfssl): meshca manages which roots are
// trusted, the backend signs. It is the Follower's Target for those
// backends, and tells the signing path which authority a leaf the backend
// returned was issued under (Judge).
type ExternalTrust struct {
	td     spiffeid.TrustDomain
	guards Guards
	cur    atomic.Pointer[externalState]
}

type externalState struct {
	state   *State
	bundle  *x509bundle.Bundle
	retired []*x509.Certificate
}

// NewExternalTrust returns an ExternalTrust for td that serves nothing
// until a Follower gives it a state. g is the activation guard applied to
// leaves signed under a prepared authority (see Judge).
func NewExternalTrust(td spiffeid.TrustDomain, g Guards) *ExternalTrust {
	return &ExternalTrust{td: td, guards: g}
}

// Use implements Target: it needs an active authority and trusts the
// state's bundle. Keys are not needed.
func (e *ExternalTrust) Use(s *State, _ time.Time) error {
	if s.Active() == nil {
		return errors.New("keymgr: the CA state has no active authority")
	}
	roots := s.Bundle()
	e.cur.Store(&externalState{state: s.Clone(), bundle: x509bundle.FromX509Authorities(e.td, roots), retired: s.View().RetiredIssuers()})
	return nil
}

// Signing is the signing certificate of the active authority of the
// state in use, the one the backend should sign with now; nil before a
// state is.
func (e *ExternalTrust) Signing() *x509.Certificate {
	c := e.cur.Load()
	if c == nil {
		return nil
	}
	return c.state.Active().Cert
}

// RetiredIssuer reports whether c signs for a retired authority of the
// state in use (see View.RetiredIssuers).
func (e *ExternalTrust) RetiredIssuer(c *x509.Certificate) bool {
	cur := e.cur.Load()
	return cur != nil && containsCert(cur.retired, c)
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (e *ExternalTrust) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	c := e.cur.Load()
	switch {
	case td != e.td:
		return nil, fmt.Errorf("keymgr: no bundle for trust domain %q", td)
	case c == nil:
		return nil, errors.New("keymgr: no CA state loaded yet")
	}
	return c.bundle, nil
}

// RootNotAfter is when the earliest trusted root expires.
func (e *ExternalTrust) RootNotAfter() time.Time {
	if c := e.cur.Load(); c != nil {
		return certs.EarliestExpiry(c.bundle.X509Authorities()...)
	}
	return time.Time{}
}

// ChainNotAfter is when the active authority's signing path expires.
func (e *ExternalTrust) ChainNotAfter() time.Time {
	c := e.cur.Load()
	if c == nil {
		return time.Time{}
	}
	a := c.state.Active()
	return certs.PathExpiry(a.Cert, append(append([]*x509.Certificate(nil), a.Chain...), a.Root)...)
}

// Judge returns the authority of the served state that issued leaf (with
// intermediates, nearest first, as the backend returned them), or an
// error an operator can act on when the leaf must not be handed out: no
// trusted authority issued it, the authority is retired, or it is a
// prepared one whose root has not been served long enough for workloads
// to trust it (the activation guard at now). A backend switched to a new
// key before `meshca root activate` allows it is caught here, and its
// leaves are refused rather than break handshakes. The authority returned
// is one whose signing certificate's key Judge has seen sign leaf, not
// merely the one the backend named.
func (e *ExternalTrust) Judge(leaf *x509.Certificate, intermediates []*x509.Certificate, now time.Time) (*AuthorityRecord, error) {
	c := e.cur.Load()
	if c == nil {
		return nil, errors.New("keymgr: no CA state loaded yet")
	}
	rec := issuerOf(c.state, leaf, intermediates)
	switch {
	case rec == nil:
		return nil, fmt.Errorf("keymgr: the backend signed under %q, which is no authority of the CA state: prepare and activate its root with `meshca root`", leaf.Issuer)
	case rec.Phase == PhaseRetired:
		return nil, fmt.Errorf("keymgr: the backend signed under retired authority %.16s, which workloads no longer trust", rec.ID())
	case rec.Phase == PhasePrepared:
		r := rules{c.state, e.guards}
		if at := r.activationSafeAt(rec); now.Before(at) {
			return nil, &GuardError{Verb: VerbActivate, ID: rec.ID(), SafeAt: at, Now: now,
				Reason: "the backend already signs under this prepared authority; " + r.activationWhy(rec)}
		}
	}
	// The backend bounds a leaf by the chain it believes in (a reissued
	// issuer on the same key may outlive the one the state holds); the
	// leaf is handed out with the state's path, and must not outlive it.
	if end := certs.PathExpiry(rec.Cert, append(slices.Clone(rec.Chain), rec.Root)...); leaf.NotAfter.After(end) {
		return nil, fmt.Errorf("keymgr: the backend's leaf is valid until %s, past the end of authority %.16s's path to its root (%s): "+
			"renew the authority, or make the backend cut its leaves at its issuer's expiry",
			leaf.NotAfter.UTC().Format(time.RFC3339), rec.ID(), end.UTC().Format(time.RFC3339))
	}
	return rec, nil
}

// issuerOf is the authority of s whose signing certificate's key signed
// leaf: the one the backend named (the first of intermediates) when its
// key did, or else the one whose key did. A name alone proves nothing: a
// backend signing under a prepared root while naming the active
// authority would pass the server's check of the chain, which takes any
// root of the bundle. An intermediate renewed with its key is two
// authorities with one key; of those, the one named, or else the active
// one, then a prepared, then a previous one is taken, and a retired one
// last.
func issuerOf(s *State, leaf *x509.Certificate, intermediates []*x509.Certificate) *AuthorityRecord {
	if len(intermediates) > 0 {
		for _, a := range s.Authorities {
			if intermediates[0].Equal(a.Cert) && leaf.CheckSignatureFrom(a.Cert) == nil {
				return a
			}
		}
	}
	for _, p := range []Phase{PhaseActive, PhasePrepared, PhasePrevious, PhaseRetired} {
		for _, a := range s.Authorities {
			if a.Phase == p && leaf.CheckSignatureFrom(a.Cert) == nil {
				return a
			}
		}
	}
	return nil
}

// Intermediates is the path from r's signing certificate up to its root,
// without the root: what a leaf issued under r is sent with.
func (r *AuthorityRecord) Intermediates() []*x509.Certificate {
	if r.SignsWithRoot() {
		return nil
	}
	return append([]*x509.Certificate{r.Cert}, r.Chain...)
}
