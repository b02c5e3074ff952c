package upstream

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/meshca/meshca/csr"
)

// CRLSigner is an upstream that signs CRLs with a CA key it holds, for
// the CAs of a CA state whose keys are not in it (meshca serve --crl):
// a root in a PKCS#11 token or in Vault Transit.
type CRLSigner interface {
	// SignCRL signs tmpl as the CRL of issuer, whose key ref names, and
	// returns its DER. It honours ctx's deadline. A failure is an *Error.
	SignCRL(ctx context.Context, tmpl *x509.RevocationList, issuer *x509.Certificate, ref Ref) ([]byte, error)
}

var _ CRLSigner = (*KeySigned)(nil)

// CRLSource is an upstream that keeps the CRLs of the CA keys it holds
// itself (a Vault PKI issuer): meshca publishes the CRL it makes, and has
// it revoke what meshca revokes under that CA (an intermediate).
type CRLSource interface {
	// CRL returns issuer's current CRL, DER, from the upstream that keeps
	// the key ref names; reissued first once half its validity has
	// passed. A failure is an *Error.
	CRL(ctx context.Context, issuer *x509.Certificate, ref Ref) ([]byte, error)
	// Revoke revokes cert, which the key ref names signed; revoking it
	// again succeeds. A failure is an *Error.
	Revoke(ctx context.Context, cert *x509.Certificate, ref Ref) error
}

// SignCRL implements CRLSigner with the key Key returns for ref, which
// must be issuer's.
func (k *KeySigned) SignCRL(ctx context.Context, tmpl *x509.RevocationList, issuer *x509.Certificate, ref Ref) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, k.fail(KindUnavailable, err)
	}
	if tmpl == nil || issuer == nil {
		return nil, k.fail(KindInternal, errors.New("the CRL request has no template or no issuer"))
	}
	key, err := k.Key(ctx, &Request{Root: issuer, Ref: ref})
	if err != nil {
		return nil, k.wrap(ctx, KindRefused, err)
	}
	if !csr.SamePublicKey(key.Public(), issuer.PublicKey) {
		return nil, k.fail(KindRefused, fmt.Errorf("the key %s names is not the key of %q", describe(ref), issuer.Subject))
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, issuer, key)
	if err != nil {
		return nil, k.wrap(ctx, KindInternal, fmt.Errorf("sign the CRL of %q: %w", issuer.Subject, err))
	}
	return der, nil
}
