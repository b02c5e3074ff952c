// Package cfssl signs workload certificates with CloudFlare's cfssl: in
// process with cfssl's local signer and a cfssl signing policy, or through
// a remote `cfssl serve` (or multirootca), authenticated when an auth key
// is configured.
//
// meshca's rules hold on top of cfssl's (signer.CheckIssued): the subject
// is empty, the SPIFFE ID is the only SAN, the usages are exactly those
// meshca derives from the key, the validity is requested explicitly and
// never reaches past the issuer. In process meshca makes cfssl issue just
// that: every profile takes only the key from a CSR and lets meshca's
// usages through. A remote server decides from its profile alone, so a
// profile that copies the CSR's subject or grants other usages is refused
// rather than silently issued.
package cfssl

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	cflog "github.com/cloudflare/cfssl/log"
	cfsigner "github.com/cloudflare/cfssl/signer"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
)

const name = "cfssl"

// backend is one way of reaching cfssl: in process or over HTTP.
type backend interface {
	// sign returns the PEM certificate cfssl issued for req, whose
	// certificate must carry exactly usages.
	sign(ctx context.Context, req cfsigner.SignRequest, usages csr.Usages) ([]byte, error)
	// issuer returns the certificate cfssl signs with.
	issuer(ctx context.Context) (*x509.Certificate, error)
	// reissuer forgets stale, a certificate cfssl no longer signs with
	// (its key was changed, for a root rotation), and reads the current one.
	reissuer(ctx context.Context, stale *x509.Certificate) (*x509.Certificate, error)
}

// Signer is a cfssl backend.
type Signer struct {
	backend backend
	chain   []*x509.Certificate
	profile string
	// keProfile, when set, replaces profile for requests whose usages hold
	// key encipherment (RSA keys).
	keProfile string
	// dnsProfile signs DNS requests (istiod's certificate); empty: they
	// are refused.
	dnsProfile string
	label      string
	backdate   time.Duration
	now        func() time.Time
}

var _ signer.Signer = (*Signer)(nil)

// Sign implements signer.Signer.
func (s *Signer) Sign(ctx context.Context, req *signer.Request) (*signer.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: err}
	}
	profile, err := s.profileFor(req)
	if err != nil {
		return nil, err
	}
	issuer, err := s.backend.issuer(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	limit := certs.PathExpiry(issuer, s.chain...)
	notBefore, notAfter := certs.Window(certs.WindowOptions{Now: now, TTL: req.TTL, Lifetime: req.Lifetime, Backdate: s.backdate}, issuer, s.chain...)
	out, err := s.backend.sign(ctx, cfsigner.SignRequest{
		Hosts:     hosts(req),
		Request:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		Profile:   profile,
		Label:     s.label,
		NotBefore: notBefore.UTC().Truncate(time.Second),
		NotAfter:  notAfter.UTC().Truncate(time.Second),
	}, req.Usages)
	if err != nil {
		return nil, err
	}
	parsed, err := pemutil.ParseCertificates(out)
	if err != nil || len(parsed) != 1 {
		return nil, signer.Errorf(name, signer.KindInternal, "cfssl returned no single certificate: %v", err)
	}
	leaf := parsed[0]
	if leaf.CheckSignatureFrom(issuer) != nil {
		// The server signs with another key than the one meshca read: an
		// operator changed it. Learn the new certificate (once per change).
		if fresh, err := s.backend.reissuer(ctx, issuer); err == nil && leaf.CheckSignatureFrom(fresh) == nil {
			issuer, limit = fresh, certs.PathExpiry(fresh, s.chain...)
		}
	}
	if err := signer.CheckIssued(name, req, leaf, signer.Lifetime{Start: now, IssuerNotAfter: limit}); err != nil {
		return nil, withHint(err, leaf)
	}
	return &signer.Response{Leaf: leaf, Intermediates: s.intermediates(issuer)}, nil
}

// profileFor names the profile for req: the DNS profile for a DNS
// request, which is refused without one; for a workload, the key
// encipherment profile when its usages hold key encipherment and one is
// set, else the profile.
func (s *Signer) profileFor(req *signer.Request) (string, error) {
	switch {
	case req.DNS() && s.dnsProfile == "":
		return "", signer.Errorf(name, signer.KindRefused, "no cfssl profile is set aside for DNS certificates (istiod's): name one with --cfssl-istiod-profile")
	case req.DNS():
		return s.dnsProfile, nil
	case s.keProfile != "" && req.Usages.Key&x509.KeyUsageKeyEncipherment != 0:
		return s.keProfile, nil
	}
	return s.profile, nil
}

// hosts are what cfssl puts in the SAN: a spiffe:// entry becomes a URI
// SAN, a name a DNS SAN.
func hosts(req *signer.Request) []string {
	if req.DNS() {
		return req.DNSNames
	}
	return []string{req.ID.String()}
}

// subjectWhitelist is the cfssl profile setting that keeps a CSR's
// subject (and names and extensions) out of the certificates a cfssl
// server issues: only the key is taken from the CSR.
const subjectWhitelist = `"CSRWhitelist": {"PublicKey": true, "PublicKeyAlgorithm": true, "SignatureAlgorithm": true}`

// withHint tells the operator how to fix a profile that copied the CSR's
// subject, the one refusal whose cure is not obvious from cfssl's docs, or
// that issued for longer than asked: a remote cfssl ignores the requested
// validity, its profile's expiry decides.
func withHint(err error, leaf *x509.Certificate) error {
	var se *signer.Error
	if len(leaf.Subject.Names) != 0 && errors.As(err, &se) {
		se.Err = fmt.Errorf("%w; add %s to the cfssl profile", se.Err, subjectWhitelist)
		return err
	}
	return signer.HintLifetime(err, "set the profile's expiry to at most the TTL clients request (24h for ztunnel and istio-agent)")
}

// intermediates is the issuer (unless it is a root) and the configured
// chain above it.
func (s *Signer) intermediates(issuer *x509.Certificate) []*x509.Certificate {
	if certs.IsSelfSigned(issuer) {
		return s.chain
	}
	for _, c := range s.chain {
		if c.Equal(issuer) {
			return s.chain
		}
	}
	return append([]*x509.Certificate{issuer}, s.chain...)
}

func nowOr(f func() time.Time) func() time.Time {
	if f == nil {
		return time.Now
	}
	return f
}

var quietOnce sync.Once

// quiet turns cfssl's own logging down to critical: cfssl's library logs
// through its global logger, and what it would say meshca already returns
// as errors, which ca logs once with the request.
func quiet() {
	quietOnce.Do(func() { cflog.Level = cflog.LevelCritical })
}
