// Package certs holds the certificate primitives every part of meshca
// that issues shares: the validity window of an issued certificate and
// its backdate, key types and key generation, serial numbers, key
// identifiers, and pure checks on certificates and paths. It imports
// nothing of keymgr, so that signer backends take these without the CA
// lifecycle.
package certs

import (
	"crypto/x509"
	"fmt"
	"time"
)

// Backdate is how far before "now" issued certificates start, to tolerate
// clock skew between meshca and the workloads that verify them.
const Backdate = 2 * time.Minute

// NoBackdate, as a WindowOptions.Backdate, starts certificates at now.
const NoBackdate time.Duration = -1

// WindowOptions are the inputs of Window.
type WindowOptions struct {
	// Now is when the certificate is issued.
	Now time.Time
	// TTL is its requested lifetime, counted from Now.
	TTL time.Duration
	// Backdate is how far before Now it starts: zero means the default
	// Backdate, a negative value (NoBackdate) means not at all.
	Backdate time.Duration
	// Lifetime, when set, ends it Lifetime after it starts instead of TTL
	// after Now (signer.Request.Lifetime).
	Lifetime time.Duration
}

// backdate is the effective o.Backdate.
func (o WindowOptions) backdate() time.Duration {
	switch {
	case o.Backdate == 0:
		return Backdate
	case o.Backdate < 0:
		return 0
	default:
		return o.Backdate
	}
}

// Window is the validity of a certificate issued as o says under issuer,
// whose own path to a root is chain: it starts o.Backdate before o.Now,
// but not before issuer does, and it ends o.TTL after o.Now (o.Lifetime
// after its start, when set), but never after any certificate of the path.
// Both are whole seconds, as a certificate holds them, so that a Lifetime
// is exact.
func Window(o WindowOptions, issuer *x509.Certificate, chain ...*x509.Certificate) (notBefore, notAfter time.Time) {
	notBefore = o.Now.Add(-o.backdate()).Truncate(time.Second)
	if notBefore.Before(issuer.NotBefore) {
		notBefore = issuer.NotBefore
	}
	notAfter = o.Now.Add(o.TTL).Truncate(time.Second)
	if o.Lifetime > 0 {
		notAfter = notBefore.Add(o.Lifetime.Truncate(time.Second))
	}
	if limit := PathExpiry(issuer, chain...); notAfter.After(limit) {
		notAfter = limit
	}
	return notBefore, notAfter
}

// PathExpiry is when the first certificate of a signing path, issuer and
// the chain above it, expires: nothing it signs may outlive it. It
// allocates nothing, as it runs for every leaf.
func PathExpiry(issuer *x509.Certificate, chain ...*x509.Certificate) time.Time {
	t := issuer.NotAfter
	for _, c := range chain {
		if c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// EarliestExpiry is the earliest NotAfter of certs; zero when there are
// none.
func EarliestExpiry(certs ...*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range certs {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// CanIssueLeaves reports whether a leaf signed by chain[0] passes the path
// length constraints of chain (the signing certificate first, its root
// last, as x509.Certificate.Verify returns it). Verifying the signing
// certificate itself counts one CA fewer below each certificate above it
// than verifying its leaves does: a root with pathlen:0 over an issuing
// intermediate verifies the intermediate but refuses every leaf.
func CanIssueLeaves(chain []*x509.Certificate) error {
	for j, c := range chain {
		if j > 0 && c.BasicConstraintsValid && c.MaxPathLen >= 0 && j > c.MaxPathLen {
			return fmt.Errorf("%s has pathlen %d, and a leaf of %s would have %d CA certificates below it", c.Subject, c.MaxPathLen, chain[0].Subject, j)
		}
	}
	return nil
}

// IsSelfSigned reports whether c is issued by itself and its signature
// verifies with its own key: a root.
func IsSelfSigned(c *x509.Certificate) bool {
	return string(c.RawIssuer) == string(c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

// Pool returns a certificate pool holding certs.
func Pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// SameCerts reports whether a and b hold the same certificates in the
// same order.
func SameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}
