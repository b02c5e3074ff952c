package keymgr

import (
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
)

// checkNew checks that rec may join s at now, by Prepare or Bootstrap.
func (s *State) checkNew(verb string, rec *AuthorityRecord, now time.Time) error {
	if rec == nil || rec.Root == nil {
		return &StateError{Verb: verb, Reason: "the authority has no root certificate"}
	}
	id := rec.ID()
	if why := recordRule(rec); why != "" {
		return &StateError{Verb: verb, ID: id, Reason: why}
	}
	if why := validityAt(rec, now); why != "" {
		return &StateError{Verb: verb, ID: id, Reason: why}
	}
	if why := chainRule(rec, now); why != "" {
		return &StateError{Verb: verb, ID: id, Reason: why}
	}
	for _, a := range s.Authorities {
		if a.ID() == id {
			return &StateError{Verb: verb, ID: id, Reason: fmt.Sprintf("this signing certificate is already in the state (%s)", a.Phase)}
		}
	}
	for _, a := range s.Authorities {
		if !csr.SamePublicKey(a.Cert.PublicKey, rec.Cert.PublicKey) {
			continue
		}
		if a.Phase == PhaseRetired {
			return &StateError{Verb: verb, ID: id, Reason: fmt.Sprintf("its signing key is that of retired authority %.16s, which no longer signs: give a new key", a.ID())}
		}
		return &StateError{Verb: verb, ID: id, Reason: fmt.Sprintf("its signing key is that of authority %.16s (%s): renew with a new key, "+
			"or retiring one would destroy nothing and stop no leaf", a.ID(), a.Phase)}
	}
	if at, retired := s.View().rootRetiredAt(rec.Root); retired {
		return &StateError{Verb: verb, ID: id, Reason: fmt.Sprintf("its root was retired at %s and a retired root is not trusted again: prepare a new root",
			at.UTC().Format(time.RFC3339))}
	}
	return nil
}

// rootRetiredAt reports whether root, or another root with its key, left
// the trust bundle: authorities of s have it, and all of them are retired;
// at is when the last one was.
func (v View) rootRetiredAt(root *x509.Certificate) (at time.Time, retired bool) {
	for _, a := range v.State.Authorities {
		if !a.Root.Equal(root) && !csr.SamePublicKey(a.Root.PublicKey, root.PublicKey) {
			continue
		}
		if a.Phase != PhaseRetired {
			return time.Time{}, false
		}
		retired = true
		if a.Since().After(at) {
			at = a.Since()
		}
	}
	return at, retired
}

// recordRule is the first rule a new record breaks, or "".
func recordRule(rec *AuthorityRecord) string {
	switch {
	case rec.Cert == nil:
		return "the authority has no signing certificate"
	case rec.Phase != "" || len(rec.History) > 0:
		return "the record already has a phase or a history: give a new authority"
	case !rec.Root.BasicConstraintsValid || !rec.Root.IsCA:
		return "the root is not a CA certificate (basicConstraints CA:true is missing)"
	case !certs.IsSelfSigned(rec.Root):
		return "the root is not self-signed"
	case !rec.Cert.BasicConstraintsValid || !rec.Cert.IsCA:
		return "the signing certificate is not a CA (basicConstraints CA:true is missing)"
	case rec.Cert.KeyUsage != 0 && rec.Cert.KeyUsage&x509.KeyUsageCertSign == 0:
		return "the signing certificate lacks the keyCertSign key usage"
	case containsCert(rec.Chain, rec.Root):
		return "the chain holds the root: it lists only the intermediates between the signing certificate and the root"
	case containsCert(rec.Chain, rec.Cert):
		return "the chain repeats the signing certificate: it lists only the intermediates above it"
	case rec.SignsWithRoot() && len(rec.Chain) > 0:
		return "a root that signs by itself has no chain"
	case rec.External && rec.Key != nil:
		return "an external authority's key lives in its backend: give no key"
	}
	if why := CAKeyRule(rec.Cert.PublicKey); why != "" {
		return "the signing certificate: " + why
	}
	if why := upstreamRule(rec); why != "" {
		return why
	}
	return keyRule(rec)
}

// upstreamRule is the rule an authority renewed from an upstream, or
// one that holds a root key, breaks, or "".
func upstreamRule(rec *AuthorityRecord) string {
	switch {
	case rec.Renewed() && rec.SignsWithRoot():
		return "an authority renewed from an upstream signs with an intermediate, not with its root"
	case rec.Renewed() && rec.External:
		return "an authority renewed from an upstream holds its intermediate's key: it is not external"
	case rec.RootKey == nil:
		return ""
	case !rec.Renewed():
		return "the CA state keeps a root key only for the upstream that signs with it"
	case rec.Phase == PhaseRetired:
		return "a retired authority still has its root's key"
	case !csr.SamePublicKey(rec.RootKey.Public(), rec.Root.PublicKey):
		return "the root key does not match the root certificate"
	}
	return ""
}

// keyRule is the key rule rec breaks, or "": a non-external authority that
// is not retired holds its signing certificate's key.
func keyRule(rec *AuthorityRecord) string {
	switch {
	case rec.External || rec.Phase == PhaseRetired:
		return ""
	case rec.Key == nil:
		return "the authority has no private key (a certificate alone is for an external backend)"
	case !csr.SamePublicKey(rec.Key.Public(), rec.Cert.PublicKey):
		return "the private key does not match the signing certificate's public key"
	}
	return ""
}

// validityAt is why rec's signing path (Cert, Chain, Root) is not valid at
// now, or "".
func validityAt(rec *AuthorityRecord, now time.Time) string {
	for _, c := range append([]*x509.Certificate{rec.Cert, rec.Root}, rec.Chain...) {
		switch {
		case now.Before(c.NotBefore):
			return fmt.Sprintf("%q is not valid before %s", c.Subject.String(), c.NotBefore.UTC().Format(time.RFC3339))
		case !now.Before(c.NotAfter):
			return fmt.Sprintf("%q expired at %s", c.Subject.String(), c.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return ""
}

// chainRule is why rec's signing certificate does not chain to its root
// through its chain at now, or "".
func chainRule(rec *AuthorityRecord, now time.Time) string {
	if rec.SignsWithRoot() {
		return ""
	}
	_, err := rec.Cert.Verify(x509.VerifyOptions{
		Roots:         certs.Pool(rec.Root),
		Intermediates: certs.Pool(rec.Chain...),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Sprintf("the signing certificate does not chain to the root through the chain: %v", err)
	}
	return ""
}

// phaseRank orders the phases; -1 for an unknown one.
func phaseRank(p Phase) int {
	switch p {
	case PhasePrepared:
		return 0
	case PhaseActive:
		return 1
	case PhasePrevious:
		return 2
	case PhaseRetired:
		return 3
	}
	return -1
}

// Validate checks a state as loaded from a store, before it is used: every
// authority has a root, a signing certificate and a history that only
// moves forward and ends in its phase; keys are destroyed once retired and
// present otherwise (unless external) and match; no signing certificate
// appears twice;
// exactly one authority is active once there is any; the sequence has
// started. It checks no validity period: an old state may hold expired
// roots.
func (s *State) Validate() error {
	seen := make(map[string]bool, len(s.Authorities))
	active := 0
	for i, a := range s.Authorities {
		if a == nil || a.Root == nil {
			return &StateError{Verb: verbValidate, Reason: fmt.Sprintf("authority %d has no root certificate", i+1)}
		}
		id := a.ID()
		if why := storedRule(a); why != "" {
			return &StateError{Verb: verbValidate, ID: id, Reason: why}
		}
		if seen[id] {
			return &StateError{Verb: verbValidate, ID: id, Reason: "the signing certificate appears twice"}
		}
		seen[id] = true
		if a.Phase == PhaseActive {
			active++
		}
	}
	switch {
	case len(s.Authorities) > 0 && active != 1:
		return &StateError{Verb: verbValidate, Reason: fmt.Sprintf("%d authorities are active, want exactly one", active)}
	case len(s.Authorities) > 0 && s.Sequence == 0:
		return &StateError{Verb: verbValidate, Reason: "the bundle sequence is 0 although there are authorities"}
	}
	return s.validateRevocations()
}

// storedRule is the first rule a stored record breaks, or "".
func storedRule(a *AuthorityRecord) string {
	switch {
	case a.Cert == nil:
		return "the authority has no signing certificate"
	case phaseRank(a.Phase) < 0:
		return fmt.Sprintf("unknown phase %q", a.Phase)
	case len(a.History) == 0:
		return "the authority has no history"
	case a.History[len(a.History)-1].To != a.Phase:
		return fmt.Sprintf("the history ends in %s, the phase is %s", a.History[len(a.History)-1].To, a.Phase)
	case !forward(a.History):
		return "the history goes back to an earlier phase"
	case a.Phase == PhaseRetired && a.Key != nil:
		return "a retired authority still has its key"
	case a.External && a.Key != nil:
		return "an external authority holds a key"
	}
	if why := upstreamRule(a); why != "" {
		return why
	}
	return keyRule(a)
}

// forward reports whether every transition of h moves to a later phase.
func forward(h []Transition) bool {
	last := -1
	for _, t := range h {
		r := phaseRank(t.To)
		if r <= last {
			return false
		}
		last = r
	}
	return true
}

// Clone returns a copy of s that a caller may change, try a step on and
// save, without touching s: records, histories, chains, revocations,
// blocks and CRL records are copied; certificates, keys, serial numbers
// and CRLs' DER, never modified, are shared.
func (s *State) Clone() *State {
	c := &State{
		Sequence:    s.Sequence,
		Authorities: make([]*AuthorityRecord, 0, len(s.Authorities)),
		Revocations: slices.Clone(s.Revocations),
		Blocked:     slices.Clone(s.Blocked),
		CRLs:        slices.Clone(s.CRLs),
	}
	for _, a := range s.Authorities {
		if a == nil {
			c.Authorities = append(c.Authorities, nil)
			continue
		}
		r := *a
		r.Chain = append([]*x509.Certificate(nil), a.Chain...)
		r.History = append([]Transition(nil), a.History...)
		c.Authorities = append(c.Authorities, &r)
	}
	return c
}
