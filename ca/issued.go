package ca

import (
	"bytes"
	"crypto/x509"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// issuedChains verifies issued chains to the trust bundle (step 6) and
// keeps, per trust bundle, what does not change from one request to the
// next: the bundle's PEM, and the issuing paths (the certificate that
// signs leaves and the intermediates sent with them) already verified to
// it, with their PEM. A leaf under a known path then costs at most one
// signature check (none when the backend checked it: VerifiedIssuer)
// instead of one per certificate of the chain, and its reply encodes only
// the leaf.
//
// A new bundle (a rotation) starts afresh. A path whose certificates carry
// name or policy constraints is never kept: a leaf under it is verified in
// full, as is a leaf that carries such constraints itself and any leaf the
// fast checks do not pass, so that every refusal comes from
// x509svid.Verify.
type issuedChains struct {
	mu  sync.Mutex // serializes additions; readers only load cur
	cur atomic.Pointer[bundleChains]
}

// bundleChains is what is kept for one bundle; never changed once stored
// (additions replace it).
type bundleChains struct {
	bundle *x509bundle.Bundle
	pem    string
	paths  map[string]*issuingPath // by the DER of the issuer
}

// maxPaths bounds the issuing paths kept per bundle.
const maxPaths = 16

// issuingPath is a CA certificate that signs leaves, with the
// intermediates a reply carries, verified to the bundle.
type issuingPath struct {
	issuer        *x509.Certificate
	intermediates [][]byte // DER, as sent
	pem           []string // PEM of each intermediate
	// notBefore and notAfter bound the time every certificate of the
	// verified path is valid.
	notBefore, notAfter time.Time
}

// forBundle returns what is kept for b, starting afresh when b is not the
// bundle of the last call.
func (c *issuedChains) forBundle(b *x509bundle.Bundle) *bundleChains {
	if bc := c.cur.Load(); bc != nil && bc.bundle == b {
		return bc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bc := c.cur.Load(); bc != nil && bc.bundle == b {
		return bc
	}
	bc := &bundleChains{bundle: b, pem: string(pemutil.EncodeCertificates(b.X509Authorities()...)), paths: map[string]*issuingPath{}}
	c.cur.Store(bc)
	return bc
}

// verify checks the chain of res, leaf first, against bc's bundle at now
// and returns the leaf's SPIFFE ID and the reply's PEM elements: leaf,
// intermediates, bundle.
func (c *issuedChains) verify(bc *bundleChains, res *signer.Response, now time.Time) (spiffeid.ID, []string, error) {
	if p := c.path(bc, res, now); p != nil {
		if id, ok := p.verifyLeaf(res, now); ok {
			out := make([]string, 0, len(p.pem)+2)
			out = append(out, string(pemutil.EncodeCertificates(res.Leaf)))
			out = append(append(out, p.pem...), bc.pem)
			return id, out, nil
		}
	}
	chain := append([]*x509.Certificate{res.Leaf}, res.Intermediates...)
	id, _, err := x509svid.Verify(chain, bc.bundle, x509svid.WithTime(now))
	if err != nil {
		return spiffeid.ID{}, nil, err
	}
	out := make([]string, 0, len(chain)+1)
	for _, cert := range chain {
		out = append(out, string(pemutil.EncodeCertificates(cert)))
	}
	return id, append(out, bc.pem), nil
}

// path returns the verified issuing path of res, verifying and keeping it
// on first sight; nil when res names no issuer, its path does not verify
// or carries constraints, or its intermediates differ from the kept ones.
func (c *issuedChains) path(bc *bundleChains, res *signer.Response, now time.Time) *issuingPath {
	issuer := res.VerifiedIssuer
	if issuer == nil {
		if len(res.Intermediates) == 0 {
			return nil
		}
		issuer = res.Intermediates[0]
	}
	if p := bc.paths[string(issuer.Raw)]; p != nil {
		if !p.sends(res.Intermediates) {
			return nil
		}
		return p
	}
	p := newIssuingPath(bc.bundle, issuer, res.Intermediates, now)
	if p == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.cur.Load()
	if cur == nil || cur.bundle != bc.bundle || len(cur.paths) >= maxPaths {
		return p // a rotation came between, or too many paths: use, don't keep
	}
	paths := make(map[string]*issuingPath, len(cur.paths)+1)
	for k, v := range cur.paths {
		paths[k] = v
	}
	paths[string(issuer.Raw)] = p
	c.cur.Store(&bundleChains{bundle: cur.bundle, pem: cur.pem, paths: paths})
	return p
}

// newIssuingPath verifies that issuer may sign leaves and chains to b
// through intermediates at now; nil when it does not, or when a
// certificate of the path carries constraints a leaf must be checked
// against.
func newIssuingPath(b *x509bundle.Bundle, issuer *x509.Certificate, intermediates []*x509.Certificate, now time.Time) *issuingPath {
	if !issuer.BasicConstraintsValid || !issuer.IsCA || (issuer.KeyUsage != 0 && issuer.KeyUsage&x509.KeyUsageCertSign == 0) {
		return nil
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range b.X509Authorities() {
		roots.AddCert(r)
	}
	for _, i := range intermediates {
		inter.AddCert(i)
	}
	chains, err := issuer.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil
	}
	p := &issuingPath{issuer: issuer}
	for i, chain := range chains {
		if certs.CanIssueLeaves(chain) != nil {
			return nil // x509svid.Verify of each leaf refuses it, and says why
		}
		for j, cert := range chain {
			if constrained(cert) {
				return nil
			}
			if i == 0 && (j == 0 || cert.NotBefore.After(p.notBefore)) {
				p.notBefore = cert.NotBefore
			}
			if i == 0 && (j == 0 || cert.NotAfter.Before(p.notAfter)) {
				p.notAfter = cert.NotAfter
			}
		}
	}
	for _, i := range intermediates {
		p.intermediates = append(p.intermediates, i.Raw)
		p.pem = append(p.pem, string(pemutil.EncodeCertificates(i)))
	}
	return p
}

// constrained reports whether c carries name or policy constraints, which
// x509 checks against every certificate below it, the leaf included.
func constrained(c *x509.Certificate) bool {
	return len(c.PermittedDNSDomains) > 0 || len(c.ExcludedDNSDomains) > 0 ||
		len(c.PermittedIPRanges) > 0 || len(c.ExcludedIPRanges) > 0 ||
		len(c.PermittedEmailAddresses) > 0 || len(c.ExcludedEmailAddresses) > 0 ||
		len(c.PermittedURIDomains) > 0 || len(c.ExcludedURIDomains) > 0 ||
		c.RequireExplicitPolicy > 0 || c.RequireExplicitPolicyZero ||
		c.InhibitPolicyMapping > 0 || c.InhibitPolicyMappingZero ||
		c.InhibitAnyPolicy > 0 || c.InhibitAnyPolicyZero || len(c.PolicyMappings) > 0
}

// sends reports whether intermediates are the ones the path was verified
// with.
func (p *issuingPath) sends(intermediates []*x509.Certificate) bool {
	if len(intermediates) != len(p.intermediates) {
		return false
	}
	for i, c := range intermediates {
		if !bytes.Equal(c.Raw, p.intermediates[i]) {
			return false
		}
	}
	return true
}

// verifyLeaf makes the checks x509svid.Verify makes of a leaf under a
// verified, unconstrained path: one SPIFFE ID and no CA powers, no
// critical extension x509 does not handle, no name or policy constraints
// of its own (x509 applies a leaf's policy constraints: such a leaf is
// verified in full), valid now with its path, and issued by the path's
// issuer (its name, and its signature unless the backend checked it). ok
// is false when any check fails.
func (p *issuingPath) verifyLeaf(res *signer.Response, now time.Time) (spiffeid.ID, bool) {
	leaf := res.Leaf
	id, err := x509svid.IDFromCert(leaf)
	switch {
	case err != nil, leaf.IsCA, leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0,
		len(leaf.UnhandledCriticalExtensions) > 0, constrained(leaf),
		now.Before(leaf.NotBefore), now.After(leaf.NotAfter), now.Before(p.notBefore), now.After(p.notAfter),
		!bytes.Equal(leaf.RawIssuer, p.issuer.RawSubject):
		return spiffeid.ID{}, false
	case res.VerifiedIssuer != nil: // the path was found by its DER
		return id, true
	}
	return id, leaf.CheckSignatureFrom(p.issuer) == nil
}
