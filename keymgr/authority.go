// Package keymgr owns meshca's CA key material: it generates, loads and
// stores signing authorities and derives the trust bundle from them.
//
// The package does no logging; errors name the file and the rule that
// failed so that an operator can fix the input.
package keymgr

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Authority is a signing CA: the certificate and key that sign workload
// certificates, the intermediates between it and a root, and the roots that
// workloads trust.
type Authority struct {
	// Cert signs workload certificates. It is a root for a self-signed CA.
	Cert *x509.Certificate
	// Key is Cert's private key.
	Key crypto.Signer
	// Chain holds the intermediates above Cert, nearest first, without any
	// root. It is empty when Cert is a root or is signed by one directly.
	Chain []*x509.Certificate
	// Roots is the trust bundle: every root a workload must trust. During a
	// root rotation it holds more than one.
	Roots []*x509.Certificate
}

// Validate checks that a is usable at time now: the key matches Cert, Cert
// is a CA allowed to sign certificates and currently valid, every root is a
// self-signed CA, and Cert chains to one of the roots through Chain.
func (a *Authority) Validate(now time.Time) error {
	switch {
	case a.Cert == nil:
		return errors.New("keymgr: authority has no signing certificate")
	case a.Key == nil:
		return errors.New("keymgr: authority has no signing key")
	case len(a.Roots) == 0:
		return errors.New("keymgr: authority has no trusted roots")
	}
	if err := checkSigningCert(a.Cert, now); err != nil {
		return err
	}
	if !csr.SamePublicKey(a.Key.Public(), a.Cert.PublicKey) {
		return errors.New("keymgr: private key does not match the signing certificate's public key")
	}
	for i, r := range a.Roots {
		if err := checkRoot(r); err != nil {
			return fmt.Errorf("keymgr: root %d (%s): %w", i+1, r.Subject, err)
		}
	}
	if err := a.verifyChain(now); err != nil {
		return fmt.Errorf("keymgr: signing certificate does not chain to a trusted root: %w", err)
	}
	return nil
}

func (a *Authority) verifyChain(now time.Time) error {
	roots, inter := certs.Pool(a.Roots...), certs.Pool(a.Chain...)
	chains, err := a.Cert.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return err
	}
	for _, c := range chains {
		if err = certs.CanIssueLeaves(c); err == nil {
			return nil
		}
	}
	return fmt.Errorf("its leaves would break a path length constraint: %w", err)
}

// CAKeyRule is why pub is too weak, or of a kind too rare, to sign
// workload certificates, or "": ECDSA on P-256, P-384 or P-521, RSA of
// 2048 bits or more, and Ed25519 sign.
func CAKeyRule(pub any) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return ""
		}
		return fmt.Sprintf("its ECDSA key is on curve %s: a CA key is on P-256, P-384 or P-521", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Sprintf("its RSA key has %d bits: a CA key has 2048 or more", k.N.BitLen())
		}
		return ""
	case ed25519.PublicKey:
		return ""
	}
	return fmt.Sprintf("its key, a %T, is not one a CA signs with (ECDSA, RSA of 2048 bits or more, Ed25519)", pub)
}

func checkSigningCert(c *x509.Certificate, now time.Time) error {
	if why := CAKeyRule(c.PublicKey); why != "" {
		return errors.New("keymgr: signing certificate: " + why)
	}
	switch {
	case !c.BasicConstraintsValid || !c.IsCA:
		return errors.New("keymgr: signing certificate is not a CA (basicConstraints CA:true is missing)")
	case c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0:
		return errors.New("keymgr: signing certificate lacks the keyCertSign key usage")
	case now.Before(c.NotBefore):
		return fmt.Errorf("keymgr: signing certificate is not valid before %s", c.NotBefore.UTC().Format(time.RFC3339))
	case !now.Before(c.NotAfter):
		return fmt.Errorf("keymgr: signing certificate expired at %s", c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func checkRoot(c *x509.Certificate) error {
	switch {
	case !c.BasicConstraintsValid || !c.IsCA:
		return errors.New("not a CA certificate")
	case !bytes.Equal(c.RawIssuer, c.RawSubject):
		return errors.New("not self-issued: put intermediates in the chain, not among the roots")
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		return fmt.Errorf("self-signature does not verify: %w", err)
	}
	return nil
}

// IsRoot reports whether Cert is itself one of the roots.
func (a *Authority) IsRoot() bool {
	for _, r := range a.Roots {
		if r.Equal(a.Cert) {
			return true
		}
	}
	return false
}

// Intermediates returns the certificates a leaf signed by a is sent with,
// leaf-side first: Cert (unless it is a root) and then Chain. Roots are never
// included; they travel as the trust bundle.
func (a *Authority) Intermediates() []*x509.Certificate {
	if a.IsRoot() {
		return nil
	}
	out := make([]*x509.Certificate, 0, 1+len(a.Chain))
	out = append(out, a.Cert)
	return append(out, a.Chain...)
}

// Bundle returns the trust bundle for td.
func (a *Authority) Bundle(td spiffeid.TrustDomain) *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(td, a.Roots)
}

// NotAfter is the time the first certificate in the signing path expires:
// nothing a signs may outlive it.
func (a *Authority) NotAfter() time.Time {
	return certs.PathExpiry(a.Cert, a.Chain...)
}
