package signer

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/big"
)

// Revoker is a backend that revokes what it issued and keeps the CRLs of
// its own CAs (Vault PKI): `meshca revoke` has it revoke, and meshca
// publishes its CRLs as they are. The built-in CA's revocations and CRLs
// are meshca's own (keymgr); cfssl and k8scsr cannot revoke
// (NoRevocationError).
type Revoker interface {
	// Revoke revokes the certificate r names. Revoking one revoked
	// already succeeds. A failure is an *Error.
	Revoke(ctx context.Context, r Revocation) error
	// CRLs returns the current CRL of each of the backend's issuers, DER,
	// each once, reissued first when half its validity has passed. A
	// failure is an *Error.
	CRLs(ctx context.Context) ([][]byte, error)
}

// Revocation names a certificate to revoke.
type Revocation struct {
	// Serial is its serial number.
	Serial *big.Int
	// Cert is the certificate itself, when known: a backend that does
	// not store what it issues (Vault's roles with no_store, as meshca
	// configures them) revokes only by the certificate.
	Cert *x509.Certificate
}

// NoRevocationError is a backend that cannot revoke the certificates it
// issues, and why.
type NoRevocationError struct {
	Backend string
	Why     string
}

func (e *NoRevocationError) Error() string {
	return fmt.Sprintf("signer %s cannot revoke certificates: %s", e.Backend, e.Why)
}

// RevokerOf is s as a Revoker, or a *NoRevocationError naming backend.
func RevokerOf(s Signer, backend string) (Revoker, error) {
	if r, ok := s.(Revoker); ok {
		return r, nil
	}
	why := "it keeps no CRL meshca can publish"
	switch backend {
	case "cfssl":
		why = "cfssl keeps its own certificate database and CRL, which meshca neither writes nor publishes; revoke there, and rotate the CA (meshca root) to drop everything it issued"
	case "k8scsr":
		why = "the Kubernetes signer behind the CertificateSigningRequests signs, and no CRL of its CA reaches meshca; rotate its CA to drop everything it issued"
	}
	return nil, &NoRevocationError{Backend: backend, Why: why}
}
