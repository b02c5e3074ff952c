// Package bundleendpoint serves a trust domain's SPIFFE bundle over HTTPS:
// the bundle endpoint of the SPIFFE Federation specification, from which
// another SPIFFE control plane (a SPIRE server, say) fetches meshca's
// roots to trust its workloads.
//
// The document is go-spiffe's spiffebundle encoding of the trust bundle
// meshca serves (a JWK Set: one "x509-svid" key per root, with x5c), with
// spiffe_sequence and spiffe_refresh_hint; the handler is go-spiffe's
// federation.NewHandler. The endpoint presents an X509-SVID of meshca's
// own CA (profile https_spiffe) or the operator's certificate
// (https_web), and never asks the client for one.
package bundleendpoint

import (
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultRefreshHint is the spiffe_refresh_hint a Source advertises when
// given none: the five minutes both specifications recommend to clients
// that are told nothing.
const DefaultRefreshHint = 5 * time.Minute

// Source is the spiffebundle.Source a bundle endpoint serves: the X.509
// bundle that Bundles holds at the time of each request, numbered.
//
// The number is the one Observe was last told (the CA state's Sequence,
// which grows with every change of the bundle), but never one already
// given to other content: when the roots change before Observe hears of
// it, the Source counts one up on its own, so the number a client sees
// only grows and always changes with the roots. Without Observe, the
// Source numbers the bundles it sees from 1: a pinned bundle stays 1.
type Source struct {
	td       spiffeid.TrustDomain
	bundles  x509bundle.Source
	hint     time.Duration
	observed atomic.Uint64

	mu    sync.Mutex
	seq   uint64
	roots []*x509.Certificate
}

var _ spiffebundle.Source = (*Source)(nil)

// NewSource returns the Source of td's bundle as bundles holds it,
// advertising refreshHint (DefaultRefreshHint when not positive; clients
// read it in whole seconds, rounded up).
func NewSource(td spiffeid.TrustDomain, bundles x509bundle.Source, refreshHint time.Duration) *Source {
	if refreshHint <= 0 {
		refreshHint = DefaultRefreshHint
	}
	return &Source{td: td, bundles: bundles, hint: refreshHint}
}

// Observe tells the Source the sequence number of the bundle now served.
// Call it after the bundle changed (a CA state put in service), with a
// number that only grows; a smaller one is ignored.
func (s *Source) Observe(sequence uint64) {
	for {
		cur := s.observed.Load()
		if sequence <= cur || s.observed.CompareAndSwap(cur, sequence) {
			return
		}
	}
}

// GetBundleForTrustDomain implements spiffebundle.Source: the bundle with
// its sequence number and refresh hint, a fresh copy on every call.
func (s *Source) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if td != s.td {
		return nil, fmt.Errorf("bundleendpoint: no bundle for trust domain %q", td)
	}
	// The number first, then the roots: whoever calls Observe changed the
	// roots before, so roots read now are at least that new.
	observed := s.observed.Load()
	xb, err := s.bundles.GetX509BundleForTrustDomain(td)
	if err != nil {
		return nil, fmt.Errorf("bundleendpoint: %w", err)
	}
	roots := xb.X509Authorities()
	if len(roots) == 0 {
		return nil, errors.New("bundleendpoint: the trust bundle is empty")
	}
	b := spiffebundle.FromX509Authorities(td, roots)
	b.SetSequenceNumber(s.number(observed, roots))
	b.SetRefreshHint(s.hint)
	return b, nil
}

// number is the sequence number of roots, given the last observed one.
func (s *Source) number(observed uint64, roots []*x509.Certificate) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.seq == 0:
		s.seq = max(observed, 1)
	case !certs.SameCerts(roots, s.roots):
		s.seq = max(observed, s.seq+1)
	default:
		s.seq = max(observed, s.seq)
	}
	s.roots = roots
	return s.seq
}
