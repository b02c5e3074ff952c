package keymgr

import (
	"crypto/x509"
	"time"
)

// Backdate is how far before "now" issued certificates start, to tolerate
// clock skew between meshca and the workloads that verify them.
const Backdate = 2 * time.Minute

// Window is the validity of a certificate issued at now for ttl under
// issuer, whose own path to a root is chain: it starts Backdate early, but
// not before issuer does, and it ends after ttl, but never after any
// certificate of the path.
func Window(now time.Time, ttl time.Duration, issuer *x509.Certificate, chain ...*x509.Certificate) (notBefore, notAfter time.Time) {
	notBefore = now.Add(-Backdate)
	if notBefore.Before(issuer.NotBefore) {
		notBefore = issuer.NotBefore
	}
	notAfter = now.Add(ttl)
	if limit := EarliestExpiry(append([]*x509.Certificate{issuer}, chain...)...); notAfter.After(limit) {
		notAfter = limit
	}
	return notBefore, notAfter
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
