// Package local is the built-in CA backend: it signs with a key held in
// meshca's memory, taken from a keymgr authority at each request so that a
// rotation takes effect at once.
package local

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"net/url"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
)

const name = "local"

// AuthoritySource returns the current signing authority.
type AuthoritySource interface {
	Authority() *keymgr.Authority
}

// Config of the built-in signer.
type Config struct {
	Authorities AuthoritySource
	// Record, when set, is told of every certificate before it is handed
	// out, with the certificate that signed it: the CA state records how
	// long leaves under each authority may live (keymgr.IssuanceLog). A
	// leaf it cannot record is never handed out.
	Record func(ctx context.Context, issuer, leaf *x509.Certificate) error
	// Backdate is how far before now leaves start, to tolerate clock
	// skew; as in certs.WindowOptions, zero means certs.Backdate and
	// certs.NoBackdate means none.
	Backdate time.Duration
	// Renewal, when set, says why the signing path was not renewed in
	// time (signer.ExpiringError's Why and Err), when a request is
	// refused because it ends too soon: the renewer's last failure.
	Renewal func() (why string, err error)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Signer signs with the current authority of its source.
type Signer struct {
	src      AuthoritySource
	record   func(ctx context.Context, issuer, leaf *x509.Certificate) error
	backdate time.Duration
	renewal  func() (string, error)
	now      func() time.Time
}

var _ signer.Signer = (*Signer)(nil)

// New returns a built-in signer.
func New(c Config) *Signer {
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Signer{src: c.Authorities, record: c.Record, backdate: c.Backdate, renewal: c.Renewal, now: c.Now}
}

// Sign issues a certificate whose only SAN is req.ID (or whose SANs are
// req.DNSNames: the built-in CA issues istiod's certificate as it issues
// workloads'), valid from the
// configured backdate before now for req.TTL but never past the signing
// path's expiry, with a random 128-bit serial and the key identifier of the
// CSR's key. When the signing path ends sooner than
// signer.MinLifetime(req.TTL) from now (an intermediate expired, or about
// to), it signs nothing and returns a signer.ExpiringError as an
// unavailable backend.
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	a := s.src.Authority()
	if a == nil {
		return nil, signer.Errorf(name, signer.KindUnavailable, "no signing authority loaded")
	}
	now := s.now()
	if end := a.NotAfter(); end.Sub(now) < signer.MinLifetime(req.TTL) {
		e := &signer.ExpiringError{End: end}
		if s.renewal != nil {
			e.Why, e.Err = s.renewal()
		}
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: e}
	}
	serial, err := certs.NewSerial()
	if err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: err}
	}
	skid, err := certs.SubjectKeyID(req.CSR.PublicKey)
	if err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: err}
	}
	notBefore, notAfter := certs.Window(certs.WindowOptions{Now: now, TTL: req.TTL, Lifetime: req.Lifetime, Backdate: s.backdate}, a.Cert, a.Chain...)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              req.Usages.Key,
		ExtKeyUsage:           req.Usages.Ext,
		BasicConstraintsValid: true,
		SubjectKeyId:          skid,
	}
	if req.DNS() {
		tmpl.DNSNames = req.DNSNames
	} else {
		tmpl.URIs = []*url.URL{req.ID.URL()}
	}
	// With an empty subject, crypto/x509 marks the SAN extension critical,
	// as RFC 5280 requires.
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, req.CSR.PublicKey, a.Key)
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, signer.Errorf(name, signer.KindInternal, "parse issued certificate: %w", err)
	}
	if s.record != nil {
		if err := s.record(ctx, a.Cert, leaf); err != nil {
			return nil, signer.Errorf(name, signer.KindUnavailable, "recording the issuance in the CA state: %w", err)
		}
	}
	// CreateCertificate refuses a key that does not match a.Cert's and
	// checks the signature it made: the leaf verifies under a.Cert.
	return &signer.Response{Leaf: leaf, Intermediates: a.Intermediates(), VerifiedIssuer: a.Cert}, nil
}
