// Package crlverify checks a presented certificate chain against a CRL
// file (the istio-ca-crl ConfigMap's ca-crl.pem) by the rules of
// rustls-webpki's verify_for_usage with revocation options, which ztunnel
// uses, so that the tests can say what a verifier of the published file
// refuses:
//
//   - the file is PEM CRLs, concatenated, or one DER CRL; empty (or PEM
//     without a CRL block) means none, and nothing is checked; a CRL that
//     does not parse makes the whole file unusable (ztunnel refuses it);
//   - every certificate of the path (the leaf and each intermediate, not
//     the trust anchor) is checked against the CRL of its issuer: the
//     first CRL in the file whose issuer name is the certificate's issuer
//     name (as rustls-webpki 0.103, which ztunnel pins at 0.103.13, takes
//     it; webpki's main branch prefers the highest CRL number among them):
//     two CAs of one name cannot both be checked from one file;
//   - that CRL must be signed by the issuer's key, and the issuer, if it
//     has a key usage, must have cRLSign (and v2: Parse reads no other);
//   - now < nextUpdate, unless the Policy ignores expiry (webpki's
//     ExpirationPolicy::Enforce), and thisUpdate <= now, as Envoy and
//     openssl also hold;
//   - a certificate whose issuer has no CRL in the file has an unknown
//     status, refused unless the Policy allows it;
//   - a certificate whose serial the CRL lists is revoked.
//
// Strict (webpki's default status policy, with expiry enforced) is what
// Envoy's sidecars and openssl verify -crl_check_all also hold; Ztunnel
// is what ztunnel configures (istio/ztunnel src/tls/revocation.rs and
// certificate.rs: UnknownStatusPolicy::Allow, ExpirationPolicy::Ignore).
// A chain is accepted when any path to a root passes, as webpki keeps
// building paths past a revoked one. Issuing distribution points and
// delta CRLs, which meshca never writes, are not looked at.
package crlverify

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Policy is what a verifier accepts beyond the rules every one holds.
type Policy struct {
	// AllowUnknown accepts a certificate whose issuer has no CRL in the
	// file; false refuses it.
	AllowUnknown bool
	// IgnoreExpiry uses a CRL outside thisUpdate..nextUpdate; false
	// refuses the chain.
	IgnoreExpiry bool
}

var (
	// Strict refuses unknown status and expired CRLs (webpki's default
	// status policy, Envoy, openssl -crl_check_all).
	Strict = Policy{}
	// Ztunnel is ztunnel's configuration of webpki.
	Ztunnel = Policy{AllowUnknown: true, IgnoreExpiry: true}
)

// Reasons of an Error.
const (
	ReasonUntrusted    = "untrusted"                 // no path to a root, whatever the CRLs
	ReasonRevoked      = "revoked"                   // the issuer's CRL lists the serial
	ReasonUnknown      = "unknown revocation status" // the issuer has no CRL in the file
	ReasonExpired      = "CRL expired"               // now is at or past its nextUpdate
	ReasonNotYetValid  = "CRL not yet valid"         // now is before its thisUpdate
	ReasonBadSignature = "CRL signature invalid"     // not signed by the issuer's key
	ReasonNotCRLSigner = "issuer lacks cRLSign"      // the issuer's key usage forbids CRLs
)

// Error is a chain refused: Reason for the certificate Subject (Index in
// the path, 0 the leaf), whose issuer is Issuer.
type Error struct {
	Reason  string
	Index   int
	Subject string
	Issuer  string
	Serial  *big.Int
	Detail  string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("crlverify: %s (certificate %d, %q, serial %s, issuer %q)", e.Reason, e.Index, e.Subject, e.Serial, e.Issuer)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Parse reads a CRL file: PEM CRLs (other PEM blocks skipped) or one DER
// CRL. Empty, or PEM without a CRL block, is no CRL. A CRL that does not
// parse, a version 1 CRL among them (crypto/x509 and webpki read v2
// alone), is an error: the file is then unusable as a whole, as ztunnel
// refuses it.
func Parse(file []byte) ([]*x509.RevocationList, error) {
	if len(bytes.TrimSpace(file)) == 0 {
		return nil, nil
	}
	if !bytes.HasPrefix(file, []byte("-----BEGIN")) {
		c, err := x509.ParseRevocationList(file)
		if err != nil {
			return nil, fmt.Errorf("crlverify: DER CRL: %w", err)
		}
		return []*x509.RevocationList{c}, nil
	}
	var out []*x509.RevocationList
	for rest := file; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out, nil
		}
		if b.Type != "X509 CRL" {
			continue
		}
		c, err := x509.ParseRevocationList(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("crlverify: CRL %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
}

// Verifier checks chains against Roots and CRLs under Policy.
type Verifier struct {
	Roots  []*x509.Certificate
	CRLs   []*x509.RevocationList
	Policy Policy
}

// Verify checks chain (the leaf first, then the intermediates the peer
// presents) at now: nil when a path to a root passes every rule, else
// the *Error of the first path tried.
func (v Verifier) Verify(chain []*x509.Certificate, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("crlverify: no certificate")
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range v.Roots {
		roots.AddCert(r)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	paths, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return &Error{Reason: ReasonUntrusted, Subject: chain[0].Subject.String(), Issuer: chain[0].Issuer.String(),
			Serial: chain[0].SerialNumber, Detail: err.Error()}
	}
	var first error
	for _, path := range paths {
		err := v.checkPath(path, now)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// checkPath checks each certificate of path but the trust anchor.
func (v Verifier) checkPath(path []*x509.Certificate, now time.Time) error {
	if len(v.CRLs) == 0 {
		return nil // no CRL: revocation is not checked
	}
	for i := 0; i+1 < len(path); i++ {
		if err := v.checkCert(i, path[i], path[i+1], now); err != nil {
			return err
		}
	}
	return nil
}

func (v Verifier) checkCert(i int, cert, issuer *x509.Certificate, now time.Time) error {
	fail := func(reason, detail string) error {
		return &Error{Reason: reason, Index: i, Subject: cert.Subject.String(), Issuer: issuer.Subject.String(),
			Serial: cert.SerialNumber, Detail: detail}
	}
	crl, ok := v.crlOf(cert)
	switch {
	case !ok && v.Policy.AllowUnknown:
		return nil
	case !ok:
		return fail(ReasonUnknown, "no CRL of its issuer in the file")
	}
	// webpki's order: the signature, the expiry, the issuer's key usage,
	// the serial.
	if err := issuer.CheckSignature(crl.SignatureAlgorithm, crl.RawTBSRevocationList, crl.Signature); err != nil {
		return fail(ReasonBadSignature, err.Error())
	}
	if !v.Policy.IgnoreExpiry {
		switch {
		case now.Before(crl.ThisUpdate):
			return fail(ReasonNotYetValid, "thisUpdate "+crl.ThisUpdate.UTC().Format(time.RFC3339))
		case !crl.NextUpdate.IsZero() && !now.Before(crl.NextUpdate):
			return fail(ReasonExpired, "nextUpdate "+crl.NextUpdate.UTC().Format(time.RFC3339))
		}
	}
	if issuer.KeyUsage != 0 && issuer.KeyUsage&x509.KeyUsageCRLSign == 0 {
		return fail(ReasonNotCRLSigner, "")
	}
	for _, e := range crl.RevokedCertificateEntries {
		if e.SerialNumber.Cmp(cert.SerialNumber) == 0 {
			return fail(ReasonRevoked, fmt.Sprintf("revoked at %s, reason %d", e.RevocationTime.UTC().Format(time.RFC3339), e.ReasonCode))
		}
	}
	return nil
}

// crlOf is the first CRL of the file whose issuer name is cert's issuer
// name, as webpki picks it.
func (v Verifier) crlOf(cert *x509.Certificate) (*x509.RevocationList, bool) {
	for _, c := range v.CRLs {
		if bytes.Equal(c.RawIssuer, cert.RawIssuer) {
			return c, true
		}
	}
	return nil, false
}
