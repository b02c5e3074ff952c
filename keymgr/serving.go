package keymgr

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshca/meshca/keymgr/certs"
)

// ServingOptions describe the TLS certificate meshca serves its API with.
type ServingOptions struct {
	// Names become DNS SANs, or IP SANs when they parse as IP addresses.
	Names []string
	TTL   time.Duration
	Now   time.Time
	// Backdate is as in certs.WindowOptions: zero means the default
	// certs.Backdate.
	Backdate time.Duration
	// ID, when not zero, is the certificate's one URI SAN: it is then an
	// X509-SVID (the SPIFFE bundle endpoint's https_spiffe profile serves
	// with one), and Names may be empty.
	ID spiffeid.ID
}

// DefaultServingTTL is the lifetime of a serving certificate.
const DefaultServingTTL = 30 * 24 * time.Hour

// IssueServing signs a fresh ECDSA P-256 serving certificate with a. Clients
// verify it against the trust bundle they are given, like any workload peer
// (and, when o.ID is set, as the X509-SVID of that ID).
func IssueServing(a *Authority, o ServingOptions) (*tls.Certificate, error) {
	if len(o.Names) == 0 && o.ID.IsZero() {
		return nil, errors.New("keymgr: serving certificate needs at least one DNS name or IP, or a SPIFFE ID")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultServingTTL
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	key, serial, skid, err := newKeySerialID(certs.KeyECP256)
	if err != nil {
		return nil, err
	}
	notBefore, notAfter := certs.Window(certs.WindowOptions{Now: o.Now, TTL: o.TTL, Backdate: o.Backdate}, a.Cert, a.Chain...)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		SubjectKeyId:          skid,
	}
	if len(o.Names) > 0 {
		tmpl.Subject = pkix.Name{CommonName: o.Names[0]}
	}
	if !o.ID.IsZero() {
		tmpl.URIs = []*url.URL{o.ID.URL()}
	}
	for _, n := range o.Names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.Key)
	if err != nil {
		return nil, fmt.Errorf("keymgr: sign serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("keymgr: parse serving certificate: %w", err)
	}
	chain := [][]byte{der}
	for _, c := range a.Intermediates() {
		chain = append(chain, c.Raw)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

// ServingRotator keeps a serving certificate fresh: it re-issues it from the
// current authority once two thirds of its lifetime have passed.
type ServingRotator struct {
	// OnError, when set before Run, hears of every failed renewal (each
	// is retried a minute later); the package itself does not log.
	OnError func(error)
	src     interface{ Authority() *Authority }
	opts    ServingOptions
	now     func() time.Time
	current atomic.Pointer[tls.Certificate]
}

// NewServingRotator issues the first certificate at once.
func NewServingRotator(src interface{ Authority() *Authority }, o ServingOptions, now func() time.Time) (*ServingRotator, error) {
	if now == nil {
		now = time.Now
	}
	r := &ServingRotator{src: src, opts: o, now: now}
	if err := r.rotate(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate is a tls.Config.GetCertificate.
func (r *ServingRotator) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current.Load(), nil
}

// Renew issues a new serving certificate from the current authority now:
// when the authority changes, the serving certificate follows at once.
func (r *ServingRotator) Renew() error { return r.rotate() }

func (r *ServingRotator) rotate() error {
	o := r.opts
	o.Now = r.now()
	c, err := IssueServing(r.src.Authority(), o)
	if err != nil {
		return err
	}
	r.current.Store(c)
	return nil
}

// renewAt is when the current certificate should be replaced.
func (r *ServingRotator) renewAt() time.Time {
	leaf := r.current.Load().Leaf
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
}

// Run re-issues the certificate on time until ctx ends, and returns nil
// then; a failure is reported to OnError and retried a minute later, the
// current certificate serving meanwhile.
func (r *ServingRotator) Run(ctx context.Context) error {
	for {
		wait := r.renewAt().Sub(r.now())
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if err := r.rotate(); err != nil {
			if r.OnError != nil {
				r.OnError(err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Minute):
			}
		}
	}
}
