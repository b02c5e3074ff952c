package ca

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/big"

	"github.com/meshca/meshca/keymgr"

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
	// Revoked, when set, names the certificates revoked in the CA state
	// (meshca revoke): a revoked leaf, or one under a revoked
	// intermediate, renews nothing, or revoking it would be undone by
	// the next renewal.
	Revoked RevokedCerts
}

// RevokedCerts tells a revoked certificate by its serial and the ID
// (keymgr.Fingerprint) of the CA certificate that signed it. The server
// asks on every renewal: an implementation answers from memory.
type RevokedCerts interface {
	Revoked(serial *big.Int, issuer string) bool
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
	if a.Revoked != nil && !unrevokedChain(chains, a.Revoked) {
		return nil, refuse(codes.Unauthenticated, "cert_revoked", "client certificate is revoked: authenticate with a service-account token",
			fmt.Errorf("serial %s, or a CA above it, is revoked in the CA state", c.PeerCerts[0].SerialNumber.Text(16)))
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

// unrevokedChain reports whether one of the verified chains (leaf first,
// root last) has no certificate revoked by the one above it.
func unrevokedChain(chains [][]*x509.Certificate, revoked RevokedCerts) bool {
	for _, ch := range chains {
		ok := true
		for i := 0; ok && i+1 < len(ch); i++ {
			ok = !revoked.Revoked(ch[i].SerialNumber, keymgr.Fingerprint(ch[i+1]))
		}
		if ok {
			return true
		}
	}
	return false
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
