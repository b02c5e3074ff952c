package keymgr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshca/meshca/keymgr/certs"
)

// Manager holds the current signing authority of one trust domain and
// serves its trust bundle. Readers always see a complete Authority; a
// rotation swaps it in one step.
type Manager struct {
	td      spiffeid.TrustDomain
	current atomic.Pointer[managed]
	// hold: a new authority signs only this long after it entered the
	// state (HeldAuthority); zero: at once.
	hold time.Duration
}

// managed is an authority and its trust bundle, built once: every reader
// of one authority gets the same *x509bundle.Bundle, so that what is
// derived from a bundle can be kept per bundle (the server's reply
// layout, its verified issuing paths).
type managed struct {
	a      *Authority
	bundle *x509bundle.Bundle
	// retired are the State's RetiredIssuers when a state is in use.
	retired []*x509.Certificate
	// until is when a held authority may sign: the state must be used
	// again then (zero: nothing is held).
	until time.Time
}

// NewManager returns a Manager for td whose current authority is a.
func NewManager(td spiffeid.TrustDomain, a *Authority) *Manager {
	m := &Manager{td: td}
	m.Set(a)
	return m
}

// Authority returns the current signing authority.
func (m *Manager) Authority() *Authority { return m.current.Load().a }

// Signing is the certificate the current authority signs with; nil
// without one.
func (m *Manager) Signing() *x509.Certificate {
	if a := m.Authority(); a != nil {
		return a.Cert
	}
	return nil
}

// Set makes a the current signing authority.
func (m *Manager) Set(a *Authority) { m.set(a, nil, time.Time{}) }

// HoldNew makes a new authority of the states m uses sign only hold
// after it entered the state, the one it replaced signing meanwhile
// (HeldAuthority): the time its CRL takes to reach every verifier. Call
// it before m uses a state.
func (m *Manager) HoldNew(hold time.Duration) { m.hold = hold }

// set makes a current, with the retired issuers of the state it came
// from, until which a held authority waits.
func (m *Manager) set(a *Authority, retired []*x509.Certificate, until time.Time) {
	c := &managed{a: a, retired: retired, until: until}
	if a != nil {
		c.bundle = a.Bundle(m.td)
	}
	m.current.Store(c)
}

// Use implements Target: it signs with s's active authority, which must
// hold its key, and trusts s's bundle. While the active authority is held
// (HoldNew), the one it replaced signs, and RecheckAt says until when.
func (m *Manager) Use(s *State, now time.Time) error {
	a, until, err := HeldAuthority(s, now, m.hold)
	if err != nil {
		return err
	}
	m.set(a, s.View().RetiredIssuers(), until)
	return nil
}

// RecheckAt implements Rechecker: when a held authority may sign.
func (m *Manager) RecheckAt() time.Time {
	if c := m.current.Load(); c != nil {
		return c.until
	}
	return time.Time{}
}

// RetiredIssuer reports whether c signs for a retired authority of the
// state in use (see View.RetiredIssuers).
func (m *Manager) RetiredIssuer(c *x509.Certificate) bool {
	cur := m.current.Load()
	return cur != nil && containsCert(cur.retired, c)
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (m *Manager) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != m.td {
		return nil, fmt.Errorf("keymgr: no bundle for trust domain %q", td)
	}
	c := m.current.Load()
	if c.bundle == nil {
		return nil, errors.New("keymgr: no signing authority loaded")
	}
	return c.bundle, nil
}

// RootNotAfter is when the earliest trusted root expires.
func (m *Manager) RootNotAfter() time.Time {
	return certs.EarliestExpiry(m.Authority().Roots...)
}

// ChainNotAfter is when the signing path expires.
func (m *Manager) ChainNotAfter() time.Time { return m.Authority().NotAfter() }
