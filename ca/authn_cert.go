package ca

import (
	"context"
	"crypto/x509"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
)

// CertAuthenticator authenticates a renewal by the caller's still-valid
// SVID, verified against the current trust bundle at request time. Such a
// caller gets at most Config.CertRenewalTTL and at most the validity of the
// certificate it presents (Caller.CertLifetime), so that renewing never
// lengthens a certificate; the cluster's authorizer requires a live Pod of
// its service account.
type CertAuthenticator struct {
	TrustDomain spiffeid.TrustDomain
	Bundles     x509bundle.Source
	// Retired, when set, names the issuing certificates of retired
	// authorities whose root is still trusted (an intermediate retired
	// under a root another authority signs under): their leaves verify
	// against the bundle, and renew nothing.
	Retired RetiredIssuers
}

// VerifiesInProcess marks a as deciding without asking anyone
// (limit.Verifier): a client certificate is not reviewed, and spends none
// of its address's failures.
func (a *CertAuthenticator) VerifiesInProcess() {}

// RetiredIssuers tells the issuing certificate of a retired authority.
// keymgr.Manager and keymgr.ExternalTrust implement it.
type RetiredIssuers interface {
	RetiredIssuer(c *x509.Certificate) bool
}

// Authenticate implements Authenticator.
func (a *CertAuthenticator) Authenticate(_ context.Context, c *Credentials) (*Caller, error) {
	if len(c.PeerCerts) == 0 {
		return nil, ErrNoCredentials
	}
	id, chains, err := x509svid.Verify(c.PeerCerts, a.Bundles)
	if err != nil {
		return nil, refuse(codes.Unauthenticated, "cert_invalid", "client certificate is not a valid SVID of this trust domain", err)
	}
	if a.Retired != nil && !issuedByLiveAuthority(chains, a.Retired) {
		return nil, refuse(codes.Unauthenticated, "cert_retired_issuer", "client certificate was issued by a retired authority: authenticate with a token", nil)
	}
	if !id.MemberOf(a.TrustDomain) {
		return nil, refuse(codes.Unauthenticated, "cert_foreign_trust_domain", "client certificate belongs to another trust domain", nil)
	}
	ns, sa, ok := parseWorkloadID(id)
	if !ok {
		return nil, refuse(codes.Unauthenticated, "cert_not_workload", "client certificate is not a workload SVID (spiffe://<td>/ns/<ns>/sa/<sa>)", nil)
	}
	leaf := c.PeerCerts[0]
	return &Caller{ID: id, Namespace: ns, ServiceAccount: sa, Method: MethodCertificate,
		CertLifetime: leaf.NotAfter.Sub(leaf.NotBefore)}, nil
}

// issuedByLiveAuthority reports whether one of the verified chains (leaf
// first, root last) has an issuer that is not retired.
func issuedByLiveAuthority(chains [][]*x509.Certificate, retired RetiredIssuers) bool {
	for _, ch := range chains {
		if len(ch) > 1 && !retired.RetiredIssuer(ch[1]) {
			return true
		}
	}
	return false
}
