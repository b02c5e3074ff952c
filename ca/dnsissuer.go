package ca

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/signer"
	"google.golang.org/grpc/codes"
)

// EventIstiodCertificate is one certificate issued to istiod (or refused
// while meshca tried to issue it).
const EventIstiodCertificate = "istiod_certificate"

// AuthnKeeper is the Authn of an istiod certificate's audit event: meshca's
// own keeper of the Secret asked, no client.
const AuthnKeeper = "keeper"

// DNSIssuer issues istiod's serving certificate with the server's key
// policy, signer, issuance slots, audit sink and metrics: steps 4 to 7 of
// a CreateCertificate, for a CSR meshca's keeper made itself
// (ca/istiodcert). Only the checks differ where the certificate does: the
// CSR names exactly the DNS names (csr.Policy.CheckDNS), and the issued
// chain verifies to the trust bundle for each of them, as a server and
// as a client (istiod serves xDS with it and dials with it).
type DNSIssuer struct{ s *Server }

var _ istiodcert.Issuer = (*DNSIssuer)(nil)

// NewDNSIssuer returns the issuer of istiod's certificate through s.
func NewDNSIssuer(s *Server) *DNSIssuer { return &DNSIssuer{s: s} }

// Backend is the name of the signing backend, for the keeper's log.
func (d *DNSIssuer) Backend() string { return d.s.c.SignerName }

// IssueDNS implements istiodcert.Issuer. Every answer is audited, one
// event, as every CreateCertificate is.
func (d *DNSIssuer) IssueDNS(ctx context.Context, r *istiodcert.IssueRequest) (*istiodcert.Issued, error) {
	s := d.s
	start := s.c.Now()
	out, err := d.issue(ctx, r)
	e := &AuditEvent{Time: start, Event: EventIstiodCertificate, Decision: DecisionIssued, Message: "istiod certificate",
		RequestID: r.Secret, Caller: "meshca", Authn: AuthnKeeper, Identity: strings.Join(r.DNSNames, ","),
		Backend: s.c.SignerName, Latency: s.c.Now().Sub(start)}
	if out != nil {
		e.Serial, e.NotAfter = out.Leaf.SerialNumber.Text(16), out.Leaf.NotAfter
		e.Issuer = leafIssuer(&signer.Response{Leaf: out.Leaf, Intermediates: out.Intermediates}, out.Roots)
	}
	if err != nil {
		o := classify(err)
		e.Decision, e.Code, e.Reason, e.Detail = DecisionDenied, o.Code.String(), o.Reason, o.Detail
	}
	s.c.Audit.Audit(ctx, e)
	return out, err
}

func (d *DNSIssuer) issue(ctx context.Context, r *istiodcert.IssueRequest) (*istiodcert.Issued, error) {
	s := d.s
	releaseSlot, err := s.limits.TakeSlot()
	if err != nil {
		return nil, err
	}
	defer releaseSlot()
	req, err := csr.ParseFor(r.CSR, &s.c.Policy.Keys)
	if err != nil {
		return nil, err
	}
	if err := s.c.Policy.CheckDNS(req, r.DNSNames); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.RequestTimeout)
	defer cancel()
	res, err := s.c.Signer.Sign(ctx, &signer.Request{CSR: req, DNSNames: r.DNSNames, TTL: r.TTL, Usages: csr.WorkloadUsages(req.PublicKey)})
	if err != nil {
		return nil, err
	}
	bundle, err := s.c.Bundles.GetX509BundleForTrustDomain(s.c.TrustDomain)
	if err != nil {
		return nil, refuse(codes.Unavailable, "no_trust_bundle", "CA has no trust bundle yet, retry later", err)
	}
	roots := bundle.X509Authorities()
	if err := verifyDNS(res, r.DNSNames, roots, s.c.Now()); err != nil {
		return nil, refuse(codes.Internal, "issued_chain_invalid", "issued certificate failed verification", err)
	}
	return &istiodcert.Issued{Leaf: res.Leaf, Intermediates: res.Intermediates, Roots: roots}, nil
}

// verifyDNS checks that res's chain verifies to roots at now for each of
// names, as a server and as a client, with no root among its
// intermediates (wire-contract: a root travels only in the bundle).
func verifyDNS(res *signer.Response, names []string, roots []*x509.Certificate, now time.Time) error {
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range res.Intermediates {
		for _, r := range roots {
			if c.Equal(r) {
				return fmt.Errorf("root %q among the intermediates", c.Subject)
			}
		}
		inter.AddCert(c)
	}
	for _, name := range names {
		// One usage at a time: Verify accepts a chain that allows any of
		// the usages it is given.
		for _, use := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := res.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, Intermediates: inter,
				CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{use}}); err != nil {
				return fmt.Errorf("for %s: %w", name, err)
			}
		}
	}
	return nil
}
