package signer

import (
	"crypto"
	"crypto/x509"
	"slices"
	"time"
)

// CheckIssued holds a certificate an external backend issued to meshca's
// rules, so that a permissive profile or role cannot widen what workloads
// get: the CSR's key; exactly one SAN, the URI of req.ID; not a CA; key
// usages within and including what req.Usages grants; NotAfter not past
// notAfterLimit. A violation is KindRefused: the backend's configuration
// must change.
func CheckIssued(backend string, req *Request, leaf *x509.Certificate, notAfterLimit time.Time) error {
	refused := func(format string, args ...any) error { return Errorf(backend, KindRefused, format, args...) }
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	switch {
	case !ok || !pub.Equal(req.CSR.PublicKey):
		return refused("issued certificate does not certify the CSR's key")
	case len(leaf.URIs) != 1 || leaf.URIs[0].String() != req.ID.String():
		return refused("issued certificate names %v, want exactly the URI %s", leaf.URIs, req.ID)
	case len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0:
		return refused("issued certificate carries extra SANs (DNS %v, IP %v, email %v)", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	case leaf.IsCA:
		return refused("issued certificate is a CA")
	case leaf.KeyUsage&^req.Usages.Key != 0:
		return refused("issued key usage %b goes beyond the allowed %b: remove the extra usages from the profile or role", leaf.KeyUsage, req.Usages.Key)
	case leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0:
		return refused("issued certificate lacks the digital signature key usage")
	case len(leaf.UnknownExtKeyUsage) != 0:
		return refused("issued certificate carries extended key usages %v that workloads may not have", leaf.UnknownExtKeyUsage)
	case !notAfterLimit.IsZero() && leaf.NotAfter.After(notAfterLimit):
		return refused("issued certificate expires at %s, after its issuer (%s)", leaf.NotAfter.UTC().Format(time.RFC3339), notAfterLimit.UTC().Format(time.RFC3339))
	}
	for _, e := range leaf.ExtKeyUsage {
		if !slices.Contains(req.Usages.Ext, e) {
			return refused("issued extended key usage %v is not allowed for workloads", e)
		}
	}
	for _, e := range req.Usages.Ext {
		if !slices.Contains(leaf.ExtKeyUsage, e) {
			return refused("issued certificate lacks extended key usage %v", e)
		}
	}
	return nil
}
