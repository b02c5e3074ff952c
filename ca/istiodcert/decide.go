package istiodcert

import (
	"crypto/x509"
	"slices"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
)

// Reasons the keeper writes the Secret: a metric label and a log field.
const (
	ReasonMissing          = "missing"            // no Secret, or no certificate in it
	ReasonKeyMismatch      = "key_mismatch"       // tls.key is not the leaf's key
	ReasonNamesChanged     = "names_changed"      // the leaf names other DNS names than configured
	ReasonRootsChanged     = "roots_changed"      // ca.crt is not the trust bundle (prepare, retire)
	ReasonAuthorityChanged = "authority_changed"  // another certificate signs for the CA now (activate)
	ReasonUntrusted        = "untrusted"          // the chain does not verify to the trust bundle
	ReasonRenewal          = "renewal"            // two thirds of its life are past
	ReasonRestarter        = "deployment_changed" // the Deployment restarted for new roots is another
	ReasonAdopted          = "adopted"            // an operator handed the Secret over (AnnotationAdopt)
	ReasonOwnerMark        = "owner_mark"         // a Secret an older meshca wrote, without AnnotationOwner
)

// Now is the state of the CA the Secret must match.
type Now struct {
	Time time.Time
	// Bundle is the trust bundle in service: ca.crt must hold exactly it.
	Bundle []*x509.Certificate
	// Signing is the fingerprint of the certificate that signs for the CA
	// now (keymgr.Fingerprint); empty when it is not known (a pinned
	// bundle in front of an external backend), which never reissues.
	Signing string
	// Names are the DNS names the leaf must carry.
	Names []string
	// Deployment is the Deployment restarted for new roots, recorded on
	// the Secret for the guards; empty: none.
	Deployment string
}

// decide says why h must be written anew at now, or "" when it serves
// as it is.
func decide(h *Held, now Now) string {
	leaf := h.Leaf()
	switch {
	case leaf == nil:
		return ReasonMissing
	case !h.KeyMatches:
		return ReasonKeyMismatch
	case !sameNames(leaf.DNSNames, now.Names):
		return ReasonNamesChanged
	case !sameCerts(h.Roots, now.Bundle):
		return ReasonRootsChanged
	case now.Signing != "" && h.IssuedUnder != now.Signing:
		return ReasonAuthorityChanged
	case !verifies(h.Chain, now.Bundle, now.Time):
		return ReasonUntrusted
	case !now.Time.Before(RenewAt(leaf)):
		return ReasonRenewal
	case h.Deployment != now.Deployment:
		return ReasonRestarter
	}
	return ""
}

// sameNames reports whether a and b hold the same names, in any order.
func sameNames(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// sameCerts reports whether a and b hold the same certificates, in any
// order.
func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.ContainsFunc(b, c.Equal) {
			return false
		}
	}
	return true
}

// verifies reports whether chain (leaf first) verifies to roots at now as
// a server certificate.
func verifies(chain, roots []*x509.Certificate, now time.Time) bool {
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: certs.Pool(roots...), Intermediates: certs.Pool(chain[1:]...),
		CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err == nil
}
